-- attn.linear_attention and attn.performer_attention against their formulas written as plain
-- loops (float64, 1e-10), kernel gradients against the O(N^2) composition's and finite
-- differences, causal and not; the Performer stabilisation, the feature draw, thread-count
-- independence, the kernel's memory (attn.core.peak_memory) and bad input.
local attn = require "attn"
local helper = require "helper"
local core = attn.core

local tight = { atol = 1e-10, rtol = 0 }

-- out_i = sum_j (a_i . c_j) v_j / (sum_j a_i . c_j + eps), j over all keys or j <= i, on nested
-- tables (B, N, d) of features a, c and values v.
local function formula(a, c, v, causal, eps)
  local out = {}
  for b = 1, #a do
    out[b] = {}
    for i = 1, #a[b] do
      local num, den = {}, eps
      for e = 1, #v[b][1] do num[e] = 0 end
      for j = 1, causal and i or #c[b] do
        local s = 0
        for t = 1, #a[b][i] do s = s + a[b][i][t] * c[b][j][t] end
        den = den + s
        for e = 1, #num do num[e] = num[e] + s * v[b][j][e] end
      end
      for e = 1, #num do num[e] = num[e] / den end
      out[b][i] = num
    end
  end
  return attn.tensor(out, "float64")
end

local function map(x, f)
  local t = x:totable()
  for _, m in ipairs(t) do
    for _, row in ipairs(m) do
      for i, y in ipairs(row) do row[i] = f(y) end
    end
  end
  return t
end

local function elu1(y) return y > 0 and y + 1 or math.exp(y) end

-- Performer's features of x (B, N, d) in plain loops: exp(W x' - |x'|^2/2) / sqrt(m), the
-- exponents shifted by nothing, by each row's largest ("row") or by the largest of the item ("all").
local function favor_naive(x, W, shift)
  local w, t = W:totable(), x:totable()
  local d, m = #w[1], #w
  for _, rows in ipairs(t) do
    local big = -math.huge
    for i, row in ipairs(rows) do
      local xs, sq, f = {}, 0, {}
      for c = 1, d do
        xs[c] = row[c] * d ^ -0.25
        sq = sq + xs[c] ^ 2
      end
      for r = 1, m do
        local p = 0
        for c = 1, d do p = p + w[r][c] * xs[c] end
        f[r] = p - sq / 2
        big = math.max(big, f[r])
      end
      rows[i] = f
    end
    for _, f in ipairs(rows) do
      local c = shift == "all" and big or -math.huge
      if shift == "row" then
        for r = 1, m do c = math.max(c, f[r]) end
      end
      if shift == nil then c = 0 end
      for r = 1, m do f[r] = math.exp(f[r] - c) / math.sqrt(m) end
    end
  end
  return t
end

local function grads(f, inputs, g)
  local leaves = {}
  for i, x in ipairs(inputs) do leaves[i] = x:clone():requires_grad_() end
  local out = f(table.unpack(leaves))
  out:backward(g)
  local res = {}
  for i, x in ipairs(leaves) do res[i] = x.grad end
  return out, res
end

describe("attn.linear_attention", function()
  it("equals the formula with phi = elu + 1, causal and not, Nq ~= Nk (float64, 1e-10)", function()
    attn.manual_seed(1)
    local q, k = attn.randn({ 2, 7, 5 }, "float64"), attn.randn({ 2, 9, 5 }, "float64")
    local v = attn.randn({ 2, 9, 3 }, "float64")
    helper.assert_close(attn.linear_attention(q, k, v), formula(map(q, elu1), map(k, elu1), v:totable(), false, 1e-6), tight)
    helper.assert_close(attn.linear_attention(q, k, v, { eps = 0.5 }),
      formula(map(q, elu1), map(k, elu1), v:totable(), false, 0.5), tight)
    local k2, v2 = k:narrow(2, 1, 7), v:narrow(2, 1, 7) -- strided views go to the kernel as they are
    helper.assert_close(attn.linear_attention(q, k2, v2, { causal = true }),
      formula(map(q, elu1), map(k2:contiguous(), elu1), v2:contiguous():totable(), true, 1e-6), tight)
  end)

  it("takes (B, H, N, d) as B*H items", function()
    local q, k = attn.randn({ 2, 3, 6, 4 }, "float64"), attn.randn({ 2, 3, 6, 4 }, "float64")
    local v = attn.randn({ 2, 3, 6, 2 }, "float64")
    local out = attn.linear_attention(q, k, v, { causal = true })
    assert.are.same({ 2, 3, 6, 2 }, out:shape())
    helper.assert_close(out:reshape(6, 6, 2), attn.linear_attention(q:reshape(6, 6, 4), k:reshape(6, 6, 4),
      v:reshape(6, 6, 2), { causal = true }), { atol = 0, rtol = 0 })
  end)

  it("has the O(N^2) composition's gradients (1e-10) and passes finite differences", function()
    attn.manual_seed(2)
    for _, causal in ipairs { false, true } do
      local ins = { attn.randn({ 2, 6, 4 }, "float64"), attn.randn({ 2, 6, 4 }, "float64"), attn.randn({ 2, 6, 3 }, "float64") }
      local g = attn.randn({ 2, 6, 3 }, "float64")
      local o1, g1 = grads(function(a, b, c) return attn.linear_attention(a, b, c, { causal = causal }) end, ins, g)
      local o2, g2 = grads(function(a, b, c)
        return attn.linear_attention(a, b, c, { causal = causal, kernel = "reference" })
      end, ins, g)
      helper.assert_close(o1, o2, tight)
      for i = 1, 3 do helper.assert_close(g1[i], g2[i], tight) end
      local p = { helper.param({ 2, 5, 3 }), helper.param({ 2, 5, 3 }), helper.param({ 2, 5, 2 }) }
      helper.gradcheck(function(a, b, c) return attn.linear_attention(a, b, c, { causal = causal }) end, p)
    end
  end)

  it("float32 agrees with float64", function()
    local q, k, v = attn.randn({ 2, 40, 8 }, "float64"), attn.randn({ 2, 40, 8 }, "float64"), attn.randn({ 2, 40, 8 }, "float64")
    local ref = attn.linear_attention(q, k, v, { causal = true })
    helper.assert_close(attn.linear_attention(q:to("float32"), k:to("float32"), v:to("float32"), { causal = true }), ref,
      { atol = 1e-5, rtol = 1e-4 })
  end)

  it("gives the same bits on 1 and 2 threads, forward and backward", function()
    local ins = { attn.randn({ 6, 50, 8 }), attn.randn({ 6, 50, 8 }), attn.randn({ 6, 50, 8 }) }
    local g = attn.randn({ 6, 50, 8 })
    helper.assert_same_bits_on_threads(function()
      local o, gs = grads(function(a, b, c) return attn.linear_attention(a, b, c, { causal = true }) end, ins, g)
      return { o, gs[1], gs[2], gs[3] }
    end)
  end)

  it("needs no memory of size N x N or N x d beyond its outputs (N 16384, d 64)", function()
    local N, d = 16384, 64
    local q, k, v, g = attn.randn({ 1, N, d }), attn.randn({ 1, N, d }), attn.randn({ 1, N, d }), attn.randn({ 1, N, d })
    local row = N * d * 4 -- one (N, d) float32 tensor: 4 MiB
    for _, causal in ipairs { false, true } do
      collectgarbage()
      local live = attn.memory()
      core.peak_memory(true)
      local out = core.linear_attention_forward(q, k, v, causal, 1e-6, "elu1")
      assert.is_true(core.peak_memory() - live - row < row / 8, "forward beyond its output")
      live = attn.memory()
      core.peak_memory(true)
      local dq, dk, dv = core.linear_attention_backward(q, k, v, out, g, causal, 1e-6, "elu1")
      assert.is_true(core.peak_memory() - live - 3 * row < row / 8, "backward beyond its outputs")
      assert.are.same({ 1, N, d }, dq:shape())
      assert.are.same({ 1, N, d }, dk:shape())
      assert.are.same({ 1, N, d }, dv:shape())
    end
  end)

  it("rejects bad input naming values and shapes", function()
    local q, k, v = attn.randn({ 2, 4, 3 }), attn.randn({ 2, 5, 3 }), attn.randn({ 2, 5, 2 })
    assert.has_error(function() attn.linear_attention(q, k, v, { causal = true }) end,
      "linear_attention: causal needs as many queries as keys, got queries [2x4x3] and keys [2x5x3]")
    assert.has_error(function() attn.linear_attention(q, k, v, { eps = -1 }) end,
      "linear_attention: eps must be a finite number >= 0, got -1")
    assert.has_error(function() attn.linear_attention(q, k:narrow(3, 1, 2), v) end,
      "linear_attention: queries [2x4x3], keys [2x5x2] and values [2x5x2] must be (B, Nq, d), (B, Nk, d) and (B, Nk, dv)")
    assert.has_error(function() attn.linear_attention(q, k, v, { window = 2 }) end)
  end)
end)

describe("attn.performer_attention", function()
  it("equals the formula on unstabilised features, causal and not (float64, 1e-10)", function()
    attn.manual_seed(3)
    local q, k, v = attn.randn({ 2, 6, 4 }, "float64"), attn.randn({ 2, 8, 4 }, "float64"), attn.randn({ 2, 8, 3 }, "float64")
    local W = attn.performer_features(10, 4, { dtype = "float64" })
    helper.assert_close(attn.performer_attention(q, k, v, { features = W }),
      formula(favor_naive(q, W), favor_naive(k, W), v:totable(), false, 0), tight)
    local kc, vc = k:narrow(2, 1, 6):contiguous(), v:narrow(2, 1, 6):contiguous()
    helper.assert_close(attn.performer_attention(q, kc, vc, { features = W, causal = true }),
      formula(favor_naive(q, W), favor_naive(kc, W), vc:totable(), true, 0), tight)
  end)

  it("stabilises where the plain features overflow: the formula on features shifted by hand", function()
    -- q and k scaled by 40 send exp(W x' - |x'|^2/2) out of float64's range unstabilised (0/0 in
    -- the formula); shifting every query row by its own largest exponent and all keys by their
    -- largest one, in logs, keeps them finite, and the formula on those is what the call returns
    local q, k = attn.randn({ 1, 5, 4 }, "float64") * 40, attn.randn({ 1, 5, 4 }, "float64") * 40
    local v = attn.randn({ 1, 5, 2 }, "float64")
    local W = attn.performer_features(8, 4, { seed = 9, dtype = "float64" })
    local plain = formula(favor_naive(q, W), favor_naive(k, W), v:totable(), true, 0)
    assert.is_true(core.sum(core.ne(core.mul(plain, 0), 0)):item() > 0, "the unshifted formula should break down")
    local out = attn.performer_attention(q, k, v, { features = W, causal = true })
    helper.assert_close(out, formula(favor_naive(q, W, "row"), favor_naive(k, W, "all"), v:totable(), true, 0),
      { atol = 1e-12, rtol = 1e-10 })
  end)

  it("has the composition's gradients (1e-10) and passes finite differences", function()
    attn.manual_seed(4)
    local W = attn.performer_features(6, 3, { dtype = "float64" })
    for _, causal in ipairs { false, true } do
      local ins = { attn.randn({ 2, 5, 3 }, "float64"), attn.randn({ 2, 5, 3 }, "float64"),
        attn.randn({ 2, 5, 2 }, "float64") }
      local g = attn.randn({ 2, 5, 2 }, "float64")
      local o1, g1 = grads(function(a, b, c)
        return attn.performer_attention(a, b, c, { features = W, causal = causal })
      end, ins, g)
      local o2, g2 = grads(function(a, b, c)
        return attn.performer_attention(a, b, c, { features = W, causal = causal, kernel = "reference" })
      end, ins, g)
      helper.assert_close(o1, o2, tight)
      for i = 1, 3 do helper.assert_close(g1[i], g2[i], tight) end
      local p = { helper.param({ 1, 4, 3 }), helper.param({ 1, 4, 3 }), helper.param({ 1, 4, 2 }) }
      helper.gradcheck(function(a, b, c) return attn.performer_attention(a, b, c, { features = W, causal = causal }) end, p)
    end
  end)

  it("approximates softmax attention as m grows", function()
    attn.manual_seed(5)
    local q, k = attn.randn({ 1, 16, 8 }, "float64") * 0.5, attn.randn({ 1, 16, 8 }, "float64") * 0.5
    local v = attn.randn({ 1, 16, 4 }, "float64")
    local exact = attn.dot_product_attention(q, k, v)
    local err = {}
    for i, m in ipairs { 4, 1024 } do
      local out = attn.performer_attention(q, k, v, { features = attn.performer_features(m, 8, { seed = 7, dtype = "float64" }) })
      err[i] = (out - exact):abs():max():item()
    end
    assert.is_true(err[2] < 0.05 and err[2] < err[1] / 2, string.format("errors %g (m 4), %g (m 1024)", err[1], err[2]))
  end)

  it("draws orthogonal blocks with chi-distributed row norms, reproducibly, sparing the generator", function()
    attn.manual_seed(6)
    local state = core.rng_state()
    local W = attn.performer_features(10, 4, { seed = 11, dtype = "float64" })
    assert.are.same(state, core.rng_state())
    helper.assert_identical(W, attn.performer_features(10, 4, { seed = 11, dtype = "float64" }))
    local w = W:totable()
    for b0 = 0, 8, 4 do -- blocks rows 1-4, 5-8, 9-10: orthogonal within
      for i = b0 + 1, math.min(b0 + 4, 10) do
        for j = i + 1, math.min(b0 + 4, 10) do
          local s = 0
          for c = 1, 4 do s = s + w[i][c] * w[j][c] end
          assert.is_true(math.abs(s) < 1e-12)
        end
      end
    end
    local big = attn.performer_features(4096, 4, { seed = 2, dtype = "float64" })
    local mean_sq = (big * big):sum(2):mean():item() -- E |row|^2 = E chi^2(4) = 4
    assert.is_true(math.abs(mean_sq - 4) < 0.3, "mean squared row norm " .. mean_sq)
  end)

  it("rejects features of the wrong width and non-finite features", function()
    local q = attn.randn({ 1, 3, 4 })
    assert.has_error(function() attn.performer_attention(q, q, q, { features = attn.randn({ 8, 5 }) }) end,
      "performer_attention: features [8x5] must be (m, d) with d = 4, the width of queries [1x3x4]")
    local W = attn.randn({ 8, 4 })
    W:set(0 / 0, 2, 3)
    W:set(math.huge, 5, 1)
    assert.has_error(function() attn.performer_attention(q, q, q, { features = W }) end,
      "performer_attention: features [8x4] hold 2 non-finite value(s) (NaN or inf)")
    assert.has_error(function() attn.performer_attention(q, q, q, {}) end,
      "performer_attention: features must be a tensor (m, d), got a nil")
  end)
end)
