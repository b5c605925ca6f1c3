local attn = require "attn"

-- One worker pool for everything: OpenBLAS stays on one thread inside it, and
-- results do not depend on how many threads run.
describe("threads", function()
  after_each(function() attn.set_num_threads(2) end)

  it("keeps OpenBLAS at one thread whatever set_num_threads says", function()
    for _, n in ipairs { 1, 2, 4 } do
      attn.set_num_threads(n)
      assert.are.equal(n, attn.get_num_threads())
      assert.are.equal(1, attn.core.blas_threads())
    end
    assert.has_error(function() attn.set_num_threads(0) end, "set_num_threads: n = 0 must be in 1..64")
  end)

  it("gives the same seeded numbers and results on 1 and 2 threads", function()
    local function run(n)
      attn.set_num_threads(n)
      attn.manual_seed(99)
      local x = attn.randn({ 300, 200 }, "float64")
      local q = attn.randn({ 4, 70, 16 })
      local out = attn.dot_product_attention(q, q, q, { dropout = 0.3, training = true, need_weights = false })
      return { x:sum():item(), x:softmax(2):max():item(), x:matmul(x:t()):sum():item(), out:sum():item(),
        attn.bernoulli({ 1000 }, 0.5):sum():item() }
    end
    assert.are.same(run(1), run(2))
  end)

  it("splits a decoder step's (256, 1, 32) LayerNorm rows with the bits of one thread and the row formula", function()
    local helper = require "helper"
    local ln = attn.nn.LayerNorm(32)
    ln.weight = attn.randn({ 32 }):requires_grad_()
    ln.bias = attn.randn({ 32 }):requires_grad_()
    local x = attn.randn { 256, 1, 32 }
    local before = attn.get_num_threads()
    local first
    for _, n in ipairs { 1, 2, 3 } do
      attn.set_num_threads(n)
      local y = attn.no_grad(function() return ln(x) end)
      if n == 1 then first = y else helper.assert_identical(y, first) end
    end
    attn.set_num_threads(before)
    -- (x - mean) / sqrt(var + eps) * weight + bias, row by row in Lua numbers
    local xs, ys, w, b = x:reshape(256, 32):totable(), first:reshape(256, 32):totable(), ln.weight:totable(),
      ln.bias:totable()
    for r = 1, 256 do
      local mu, var = 0, 0
      for j = 1, 32 do mu = mu + xs[r][j] / 32 end
      for j = 1, 32 do var = var + (xs[r][j] - mu) ^ 2 / 32 end
      for j = 1, 32 do
        local want = (xs[r][j] - mu) / math.sqrt(var + 1e-5) * w[j] + b[j]
        assert(math.abs(ys[r][j] - want) <= 1e-5 * (1 + math.abs(want)), string.format("row %d col %d", r, j))
      end
    end
  end)

  -- The pool hands out ranges of items to whichever thread is free, so how the work is cut and
  -- who runs what change from call to call and with the thread count; the bits must not.
  it("gives bit-identical seeded tensors on 1, 2 and 3 threads: attention, GRU, LayerNorm, matmul", function()
    local helper = require "helper"
    local nn = attn.nn
    local function run(n)
      attn.set_num_threads(n)
      attn.manual_seed(7)
      local res = {}
      local q = attn.randn({ 4, 200, 32 }):requires_grad_()
      local k = attn.randn({ 4, 200, 32 }):requires_grad_()
      local v = attn.randn({ 4, 200, 32 }):requires_grad_()
      for _, o in ipairs {
        { causal = true, need_weights = false },
        { valid_lens = attn.tensor({ 200, 1, 65, 0 }), dropout = 0.2, training = true, need_weights = false },
      } do
        q.grad, k.grad, v.grad = nil, nil, nil
        local out = attn.dot_product_attention(q, k, v, o)
        out:sum():backward()
        for _, t in ipairs { out, q.grad, k.grad, v.grad } do res[#res + 1] = t:detach() end
      end
      local q64 = q:detach():to("float64")
      res[#res + 1] = attn.dot_product_attention(q64, q64, q64, { causal = true, need_weights = false })
      local gru, ln = nn.GRU(16, 32, 2), nn.LayerNorm(32)
      local x = attn.randn({ 10, 24, 16 }):requires_grad_()
      local y, h = gru(x)
      local z = ln(y)
      local loss = (z * z):sum() + h:sum()
      loss:backward()
      for _, t in ipairs { z, h, x.grad, gru.weight_hh_l0.grad, ln.weight.grad } do res[#res + 1] = t:detach() end
      local a = attn.randn({ 300, 200 })
      res[#res + 1] = a:matmul(a:t()):tanh()
      return res
    end
    local one = run(1)
    for _, n in ipairs { 2, 3 } do
      local other = run(n)
      assert.are.equal(#one, #other)
      for i = 1, #one do
        local ok, err = pcall(helper.assert_identical, other[i], one[i])
        assert(ok, string.format("result %d on %d threads: %s", i, n, tostring(err)))
      end
    end
  end)
end)
