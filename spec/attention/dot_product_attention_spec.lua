-- Scaled dot-product attention: the C kernel (forward, backward, every mask option) against a
-- naive reference written with plain Lua loops, plus the pitfalls it must avoid.
local attn = require "attn"
local helper = require "helper"
local core = attn.core

local FILL = -1e6

-- ------------------------------------------------------------ naive reference (plain Lua)

-- Length of row (b, i) from nil, a 1-D or a 2-D table.
local function len_of(vl, b, i, nk)
  if vl == nil then return nk end
  local v = vl[b]
  if type(v) == "table" then return v[i] end
  return v
end

-- Keep-mask entry (1-based b, i, j) of a nested table broadcast to (B, Nq, Nk), right-aligned.
local function mask_of(mask, b, i, j)
  if mask == nil then return true end
  local depth, t = 0, mask
  while type(t) == "table" do
    depth = depth + 1
    t = t[1]
  end
  local idx = { b, i, j }
  local m = mask
  for d = 4 - depth, 3 do
    local row = m
    m = #row == 1 and row[1] or row[idx[d]]
  end
  return m ~= 0
end

local function visible(o, b, i, j)
  if not mask_of(o.mask, b, i, j) then return false end
  if o.causal and j > i then return false end
  if o.window and math.abs(i - j) > o.window then return false end
  return true
end

-- Forward: returns out (B x Nq x dv) and weights (B x Nq x Nk) as nested tables.
local function naive_forward(Q, K, V, o)
  local out, P = {}, {}
  local nk, d, dv = #K[1], #Q[1][1], #V[1][1]
  local scale = o.scale or 1 / math.sqrt(d)
  for b = 1, #Q do
    out[b], P[b] = {}, {}
    for i = 1, #Q[b] do
      local z, m = {}, -math.huge
      local len = len_of(o.valid_lens, b, i, nk)
      for j = 1, nk do
        if visible(o, b, i, j) then
          if j <= len then
            local s = 0
            for c = 1, d do s = s + Q[b][i][c] * K[b][j][c] end
            z[j] = s * scale
          else
            z[j] = FILL
          end
          if z[j] > m then m = z[j] end
        end
      end
      local p, sum = {}, 0
      for j = 1, nk do
        p[j] = z[j] and math.exp(z[j] - m) or 0
        sum = sum + p[j]
      end
      for j = 1, nk do p[j] = sum > 0 and p[j] / sum or 0 end
      local row = {}
      for c = 1, dv do
        local s = 0
        for j = 1, nk do
          if p[j] ~= 0 then s = s + p[j] * V[b][j][c] end
        end
        row[c] = s
      end
      out[b][i], P[b][i] = row, p
    end
  end
  return out, P
end

-- Backward of loss = sum(out * dO) + sum(weights * dW): gradients of Q, K, V.
local function naive_backward(Q, K, V, o, dO, dW)
  local _, P = naive_forward(Q, K, V, o)
  local nk, d, dv = #K[1], #Q[1][1], #V[1][1]
  local scale = o.scale or 1 / math.sqrt(d)
  local function zeros(n1, n2, n3)
    local t = {}
    for a = 1, n1 do
      t[a] = {}
      for b = 1, n2 do
        t[a][b] = {}
        for c = 1, n3 do t[a][b][c] = 0 end
      end
    end
    return t
  end
  local dQ, dK, dV = zeros(#Q, #Q[1], d), zeros(#K, nk, d), zeros(#V, nk, dv)
  for b = 1, #Q do
    for i = 1, #Q[b] do
      local p, dp, D = P[b][i], {}, 0
      local len = len_of(o.valid_lens, b, i, nk)
      for j = 1, nk do
        local s = dW and dW[b][i][j] or 0
        for c = 1, dv do s = s + dO[b][i][c] * V[b][j][c] end
        dp[j] = s
        D = D + p[j] * s
      end
      for j = 1, nk do
        local ds = (p[j] ~= 0 and j <= len) and p[j] * (dp[j] - D) * scale or 0
        for c = 1, d do
          dQ[b][i][c] = dQ[b][i][c] + ds * K[b][j][c]
          dK[b][j][c] = dK[b][j][c] + ds * Q[b][i][c]
        end
        for c = 1, dv do dV[b][j][c] = dV[b][j][c] + p[j] * dO[b][i][c] end
      end
    end
  end
  return dQ, dK, dV
end

-- ------------------------------------------------------------ helpers

local function tol(dtype) return dtype == "float64" and { atol = 1e-10, rtol = 1e-9 } or { atol = 2e-5, rtol = 1e-4 } end

-- Keep-mask options as tensors for the API, nested tables for the reference.
local function api_opts(o, dtype)
  local a = {}
  for k, v in pairs(o) do a[k] = v end
  if o.mask then a.mask = attn.tensor(o.mask, dtype) end
  return a
end

local function no_nan(t)
  for _, x in ipairs(t:reshape(t:numel()):totable()) do
    if x ~= x or x == math.huge or x == -math.huge then return false end
  end
  return true
end

local function run_case(c, dtype)
  attn.manual_seed(c.seed or 1)
  local Q = attn.randn({ c.B, c.Nq, c.d }, dtype):requires_grad_()
  local K = attn.randn({ c.B, c.Nk, c.d }, dtype):requires_grad_()
  local V = attn.randn({ c.B, c.Nk, c.dv }, dtype):requires_grad_()
  local dO = attn.randn({ c.B, c.Nq, c.dv }, dtype)
  local dW = attn.randn({ c.B, c.Nq, c.Nk }, dtype)
  local out, w = attn.dot_product_attention(Q, K, V, api_opts(c.opts, dtype))
  local ref_out, ref_w = naive_forward(Q:totable(), K:totable(), V:totable(), c.opts)
  helper.assert_close(out, ref_out, tol(dtype))
  helper.assert_close(w, ref_w, tol(dtype))
  local loss = (out * dO):sum() + (w * dW):sum()
  loss:backward()
  local gq, gk, gv = naive_backward(Q:totable(), K:totable(), V:totable(), c.opts, dO:totable(), dW:totable())
  local gt = dtype == "float64" and { atol = 1e-9, rtol = 1e-8 } or { atol = 2e-4, rtol = 1e-3 }
  helper.assert_close(Q.grad, gq, gt)
  helper.assert_close(K.grad, gk, gt)
  helper.assert_close(V.grad, gv, gt)
end

local CASES = {
  { name = "no mask", B = 2, Nq = 3, Nk = 5, d = 4, dv = 3, opts = {} },
  { name = "1-D valid_lens incl. 0 (uniform row)", B = 3, Nq = 2, Nk = 6, d = 3, dv = 2,
    opts = { valid_lens = { 2, 0, 6 } } },
  { name = "2-D valid_lens", B = 2, Nq = 3, Nk = 4, d = 2, dv = 5, opts = { valid_lens = { { 1, 3, 0 }, { 4, 2, 1 } } } },
  { name = "causal", B = 2, Nq = 5, Nk = 5, d = 3, dv = 2, opts = { causal = true } },
  { name = "causal with more queries than keys", B = 1, Nq = 6, Nk = 3, d = 2, dv = 2, opts = { causal = true } },
  { name = "window", B = 2, Nq = 6, Nk = 7, d = 3, dv = 3, opts = { window = 1 } },
  { name = "causal window", B = 1, Nq = 7, Nk = 7, d = 2, dv = 2, opts = { window = 2, causal = true } },
  { name = "3-D keep-mask", B = 2, Nq = 2, Nk = 4, d = 3, dv = 2,
    opts = { mask = { { { 1, 0, 1, 1 }, { 0, 1, 1, 0 } }, { { 1, 1, 1, 1 }, { 0, 0, 0, 1 } } } } },
  { name = "key-padding mask (B, 1, Nk)", B = 2, Nq = 3, Nk = 5, d = 2, dv = 2,
    opts = { mask = { { { 1, 1, 0, 1, 0 } }, { { 0, 1, 1, 1, 1 } } } } },
  { name = "2-D mask (Nq, Nk) with valid_lens", B = 2, Nq = 2, Nk = 4, d = 2, dv = 3,
    opts = { mask = { { 1, 1, 0, 1 }, { 0, 1, 1, 1 } }, valid_lens = { 2, 3 } } },
  { name = "custom scale", B = 1, Nq = 3, Nk = 3, d = 5, dv = 2, opts = { scale = 0.7 } },
  { name = "several row blocks, causal, 2-D lens", B = 2, Nq = 130, Nk = 40, d = 5, dv = 3, seed = 3,
    opts = { causal = true } },
  { name = "one key, one width", B = 2, Nq = 3, Nk = 1, d = 1, dv = 1, opts = {} },
}
do -- lengths for the big case, per row
  local c = CASES[12]
  local vl = {}
  for b = 1, c.B do
    vl[b] = {}
    for i = 1, c.Nq do vl[b][i] = (i * 7 + b) % (c.Nk + 1) end
  end
  c.opts.valid_lens = vl
end

describe("dot_product_attention", function()
  describe("matches the naive reference (forward, weights, backward)", function()
    for _, dtype in ipairs { "float64", "float32" } do
      for _, c in ipairs(CASES) do
        it(c.name .. " (" .. dtype .. ")", function() run_case(c, dtype) end)
      end
    end
  end)

  it("gives the book's toy result on identical keys", function()
    attn.manual_seed(0)
    local queries = attn.randn({ 2, 1, 2 })
    local keys = attn.ones({ 2, 10, 2 })
    local values = attn.arange(0, 40, 1):reshape(1, 10, 4):expand(2, 10, 4)
    local out, w = attn.dot_product_attention(queries, keys, values, { valid_lens = { 2, 6 } })
    helper.assert_close(out, { { { 2, 3, 4, 5 } }, { { 10, 11, 12, 13 } } }, { atol = 1e-5 })
    helper.assert_close(w:select(1, 1), { { 0.5, 0.5, 0, 0, 0, 0, 0, 0, 0, 0 } }, { atol = 1e-6 })
  end)

  it("passes central-difference gradient checks for every option (float64)", function()
    attn.manual_seed(5)
    local Q, K, V = helper.param({ 2, 3, 4 }), helper.param({ 2, 5, 4 }), helper.param({ 2, 5, 3 })
    local mask = attn.tensor({ { { 1, 0, 1, 1, 0 } }, { { 1, 1, 1, 0, 1 } } }, "float64")
    for _, o in ipairs {
      {}, { valid_lens = { 3, 0 } }, { valid_lens = { { 1, 2, 5 }, { 0, 4, 3 } } }, { causal = true },
      { window = 1 }, { mask = mask }, { mask = mask, causal = true, valid_lens = { 2, 4 } }, { scale = 2 },
    } do
      helper.gradcheck(function(q, k, v) return (attn.dot_product_attention(q, k, v, o)) end, { Q, K, V })
      helper.gradcheck(function(q, k, v)
        local _, w = attn.dot_product_attention(q, k, v, o)
        return w
      end, { Q, K, V })
      local nw = {}
      for key, val in pairs(o) do nw[key] = val end
      nw.need_weights = false
      helper.gradcheck(function(q, k, v) return (attn.dot_product_attention(q, k, v, nw)) end, { Q, K, V })
    end
  end)

  it("handles non-contiguous inputs (transposed, narrowed, strided)", function()
    attn.manual_seed(7)
    for _, dtype in ipairs { "float64", "float32" } do
      local Q = attn.randn({ 2, 4, 70 }, dtype):transpose(2, 3)                    -- column-major matrices
      local K = attn.randn({ 2, 9, 6 }, dtype):narrow(2, 2, 6):narrow(3, 2, 4)   -- row stride 6
      local V = attn.randn({ 2, 6, 3, 2 }, dtype):select(4, 2)                    -- inner stride 2 (copied)
      assert.is_false(Q:is_contiguous() or K:is_contiguous() or V:is_contiguous())
      local o = { valid_lens = { 3, 6 }, causal = true }
      local out, w = attn.dot_product_attention(Q, K, V, o)
      local ref_out, ref_w = naive_forward(Q:totable(), K:totable(), V:totable(), o)
      helper.assert_close(out, ref_out, tol(dtype))
      helper.assert_close(w, ref_w, tol(dtype))
      local out2 = attn.dot_product_attention(Q:contiguous(), K:contiguous(), V:contiguous(), o)
      helper.assert_close(out, out2, tol(dtype))
      -- gradients land on the views
      Q:requires_grad_()
      K:requires_grad_()
      V:requires_grad_()
      local dO = attn.randn({ 2, 70, 3 }, dtype)
      local o2 = attn.dot_product_attention(Q, K, V, o)
      ;(o2 * dO):sum():backward()
      local gq, gk, gv = naive_backward(Q:totable(), K:totable(), V:totable(), o, dO:totable())
      local gt = dtype == "float64" and { atol = 1e-9 } or { atol = 2e-4, rtol = 1e-3 }
      helper.assert_close(Q.grad, gq, gt)
      helper.assert_close(K.grad, gk, gt)
      helper.assert_close(V.grad, gv, gt)
    end
  end)

  it("gives the same output and gradients whether or not weights are requested", function()
    attn.manual_seed(11)
    for _, dtype in ipairs { "float32", "float64" } do
      local Q, K, V = attn.randn({ 3, 150, 16 }, dtype), attn.randn({ 3, 90, 16 }, dtype), attn.randn({ 3, 90, 8 }, dtype)
      for _, o in ipairs { {}, { valid_lens = { 5, 0, 90 } }, { causal = true }, { window = 10 },
        { mask = attn.bernoulli({ 3, 1, 90 }, 0.7, dtype) } } do
        local out_w, w = attn.dot_product_attention(Q, K, V, o)
        local nw = { need_weights = false }
        for k, v in pairs(o) do nw[k] = v end
        local out_nw, none = attn.dot_product_attention(Q, K, V, nw)
        assert.is_nil(none)
        assert.is_not_nil(w)
        helper.assert_close(out_nw, out_w, { atol = 0, rtol = 0 }) -- bit for bit
        -- gradients: stored weights (need_weights) vs recomputed blocks
        local grads = {}
        for run, opts in ipairs { o, nw } do
          local q = Q:clone():requires_grad_()
          local k = K:clone():requires_grad_()
          local v = V:clone():requires_grad_()
          local out = attn.dot_product_attention(q, k, v, opts)
          out:sum():backward()
          grads[run] = { q.grad, k.grad, v.grad }
        end
        for i = 1, 3 do helper.assert_close(grads[2][i], grads[1][i], { atol = 0, rtol = 0 }) end
      end
    end
  end)

  it("applies dropout only when training = true, to the weights, deterministically", function()
    attn.manual_seed(3)
    local B, N = 4, 64
    local Q, K = attn.randn({ B, N, 8 }), attn.randn({ B, N, 8 })
    local V = attn.eye(N):unsqueeze(1):expand(B, N, N) -- output = (dropped) weights
    local base, w0 = attn.dot_product_attention(Q, K, V)
    for _, o in ipairs { { dropout = 0.5 }, { dropout = 0.5, training = false } } do
      local out, w = attn.dot_product_attention(Q, K, V, o)
      helper.assert_close(out, base, { atol = 0, rtol = 0 })
      helper.assert_close(w, w0, { atol = 0, rtol = 0 })
    end
    local out, w = attn.dot_product_attention(Q, K, V, { dropout = 0.5, training = true })
    helper.assert_close(w, w0, { atol = 0, rtol = 0 }) -- weights are reported before dropout
    local o, p = out:reshape(B * N * N):totable(), w0:reshape(B * N * N):totable()
    local dropped = 0
    for i = 1, #o do
      if o[i] == 0 then
        dropped = dropped + 1
      else
        assert(math.abs(o[i] - 2 * p[i]) <= 1e-5 * (1 + p[i]), "kept weights are scaled by 1/(1-p)")
      end
    end
    local frac = dropped / #o
    assert(frac > 0.47 and frac < 0.53, "dropped fraction " .. frac)
    -- the same seed gives the same mask; p = 1 drops everything
    attn.manual_seed(9)
    local a = attn.dot_product_attention(Q, K, V, { dropout = 0.3, training = true })
    attn.manual_seed(9)
    local b = attn.dot_product_attention(Q, K, V, { dropout = 0.3, training = true, need_weights = false })
    helper.assert_close(a, b, { atol = 0, rtol = 0 })
    local all = attn.dot_product_attention(Q, K, V, { dropout = 1, training = true })
    assert.equal(0, all:abs():sum():item())
  end)

  it("back-propagates through dropout with the forward's mask", function()
    local Q, K, V = helper.param({ 2, 4, 3 }), helper.param({ 2, 6, 3 }), helper.param({ 2, 6, 2 })
    for _, o in ipairs { { dropout = 0.4, training = true }, { dropout = 0.4, training = true, causal = true },
      { dropout = 0.4, training = true, valid_lens = { 2, 5 }, need_weights = false } } do
      helper.gradcheck(function(q, k, v)
        attn.manual_seed(21) -- the same dropout mask on every evaluation
        return (attn.dot_product_attention(q, k, v, o))
      end, { Q, K, V })
    end
  end)

  it("gives zero weights, zero output and zero gradients to a query with no visible key", function()
    local Q, K, V = helper.param({ 2, 4, 3 }), helper.param({ 2, 5, 3 }), helper.param({ 2, 5, 2 })
    local mask = attn.ones({ 2, 4, 5 }, "float64")
    for j = 1, 5 do mask:set(0, 1, 2, j) end -- query 2 of sample 1 sees nothing
    for _, o in ipairs {
      { mask = mask },
      { mask = mask, valid_lens = { 0, 3 } },
      { window = 0, causal = true, mask = attn.tensor({ 1, 0, 1, 1, 1 }, "float64") }, -- query 2 sees only key 2
    } do
      local out, w = attn.dot_product_attention(Q, K, V, o)
      assert.is_true(no_nan(out) and no_nan(w))
      helper.assert_close(w:select(1, 1):select(1, 2), { 0, 0, 0, 0, 0 }, { atol = 0 })
      helper.assert_close(out:select(1, 1):select(1, 2), { 0, 0 }, { atol = 0 })
      Q.grad, K.grad, V.grad = nil, nil, nil
      local loss = out:sum() + (w * w):sum()
      loss:backward()
      assert.is_true(no_nan(Q.grad) and no_nan(K.grad) and no_nan(V.grad))
      helper.assert_close(Q.grad:select(1, 1):select(1, 2), { 0, 0, 0 }, { atol = 0 })
      helper.gradcheck(function(q, k, v) return (attn.dot_product_attention(q, k, v, o)) end, { Q, K, V })
    end
    -- a window past the keys
    local out = attn.dot_product_attention(Q, K:narrow(2, 1, 2), V:narrow(2, 1, 2), { window = 1 })
    helper.assert_close(out:narrow(2, 4, 1), attn.zeros({ 2, 1, 2 }), { atol = 0 })
  end)

  it("keeps the batch's gradients finite when one sample is all padding", function()
    attn.manual_seed(13)
    local B, Nq, Nk = 3, 4, 6
    local Q = attn.randn({ B, Nq, 5 }, "float64"):requires_grad_()
    local K = attn.randn({ B, Nk, 5 }, "float64"):requires_grad_()
    local V = attn.randn({ B, Nk, 3 }, "float64"):requires_grad_()
    local mask = attn.ones({ B, 1, Nk }, "float64")
    for j = 1, Nk do mask:set(0, 2, 1, j) end -- sample 2: mask all zero
    mask:set(0, 3, 1, 6)
    local out = attn.dot_product_attention(Q, K, V, { mask = mask })
    out:pow(2):sum():backward()
    for _, g in ipairs { Q.grad, K.grad, V.grad } do
      assert.is_true(no_nan(g))
      assert.equal(0, g:select(1, 2):abs():sum():item())
    end
    assert.is_true(Q.grad:select(1, 1):abs():sum():item() > 0)
    helper.gradcheck(function(q, k, v) return (attn.dot_product_attention(q, k, v, { mask = mask })) end,
      { Q, K, V })
  end)

  it("never lets NaN in a masked-out key or value reach the output or the gradients", function()
    attn.manual_seed(17)
    local function with_nan(t, b, j)
      local c = t:clone()
      for col = 1, c:size(3) do c:set(0 / 0, b, j, col) end
      return c
    end
    for _, dtype in ipairs { "float32", "float64" } do
      local Q = attn.randn({ 2, 5, 4 }, dtype)
      local K0, V0 = attn.randn({ 2, 8, 4 }, dtype), attn.randn({ 2, 8, 3 }, dtype)
      local mask = attn.ones({ 2, 1, 8 }, dtype)
      mask:set(0, 1, 1, 3) -- key 3 of sample 1 is padding (in the middle)
      -- keys that no query sees: everything stays finite
      for n, c in ipairs {
        { opts = { mask = mask }, b = 1, j = 3 },
        { opts = { causal = true }, b = 2, j = 7 },
        { opts = { window = 1 }, b = 1, j = 8 },
        { opts = { valid_lens = { 8, 2 } }, b = 2, j = 4 }, -- d2l fill: weight exactly 0
      } do
        local where = " (case " .. n .. ", " .. dtype .. ")"
        local K, V = with_nan(K0, c.b, c.j), with_nan(V0, c.b, c.j)
        local q = Q:clone():requires_grad_()
        local k = K:clone():requires_grad_()
        local v = V:clone():requires_grad_()
        local out, w = attn.dot_product_attention(q, k, v, c.opts)
        assert.is_true(no_nan(out), "NaN reached the output" .. where)
        helper.assert_close(out, attn.dot_product_attention(Q, K0, V0, c.opts), tol(dtype))
        ;(out:sum() + (w * w):sum()):backward()
        assert.is_true(no_nan(q.grad), "NaN reached dQ" .. where)
        assert.is_true(no_nan(v.grad), "NaN reached dV" .. where)
        helper.assert_close(k.grad:select(1, c.b):select(1, c.j), attn.zeros({ 4 }, dtype), { atol = 0 })
        assert.is_true(no_nan(k.grad), "NaN reached dK" .. where)
      end
      -- a key hidden from query 1 but seen by query 2 of the same block: query 1 stays finite
      local m3 = attn.ones({ 2, 5, 8 }, dtype)
      m3:set(0, 1, 1, 6)
      local K, V = with_nan(K0, 1, 6), with_nan(V0, 1, 6)
      local q = Q:clone():requires_grad_()
      local out = attn.dot_product_attention(q, K, V, { mask = m3 })
      local row = out:select(1, 1):select(1, 1)
      assert.is_true(no_nan(row))
      helper.assert_close(row, attn.dot_product_attention(Q, K0, V0, { mask = m3 }):select(1, 1):select(1, 1),
        tol(dtype))
      row:sum():backward()
      assert.is_true(no_nan(q.grad:select(1, 1):select(1, 1)), "NaN reached dQ of the query that does not see it")
    end
  end)

  it("gives per-sample results in a batch with different valid lengths", function()
    attn.manual_seed(19)
    local Q, K, V = attn.randn({ 3, 70, 8 }), attn.randn({ 3, 9, 8 }), attn.randn({ 3, 9, 4 })
    for _, vl in ipairs { { 1, 4, 9 }, { { 1, 2, 3 }, { 9, 0, 4 }, { 5, 5, 5 } } } do
      local lens = vl
      if type(vl[1]) == "table" then -- (B, Nq) rows from a pattern
        lens = {}
        for b = 1, 3 do
          lens[b] = {}
          for i = 1, 70 do lens[b][i] = vl[b][(i - 1) % 3 + 1] end
        end
      end
      local out, w = attn.dot_product_attention(Q, K, V, { valid_lens = lens })
      for b = 1, 3 do
        local one, w1 = attn.dot_product_attention(Q:narrow(1, b, 1), K:narrow(1, b, 1), V:narrow(1, b, 1),
          { valid_lens = { lens[b] } })
        helper.assert_close(out:narrow(1, b, 1), one, { atol = 1e-6 })
        helper.assert_close(w:narrow(1, b, 1), w1, { atol = 1e-6 })
      end
    end
  end)

  it("gives the same results for 1 and 2 threads", function()
    attn.manual_seed(23)
    local Q = attn.randn({ 2, 300, 16 }, "float64"):requires_grad_()
    local K = attn.randn({ 2, 200, 16 }, "float64"):requires_grad_()
    local V = attn.randn({ 2, 200, 8 }, "float64"):requires_grad_()
    local before = attn.get_num_threads()
    local results = {}
    for run, n in ipairs { 1, 2 } do
      attn.set_num_threads(n)
      Q.grad, K.grad, V.grad = nil, nil, nil
      local out = attn.dot_product_attention(Q, K, V, { causal = true, need_weights = false })
      out:pow(2):sum():backward()
      results[run] = { out, Q.grad, K.grad, V.grad }
    end
    attn.set_num_threads(before)
    for i = 1, 4 do helper.assert_close(results[2][i], results[1][i], { atol = 0, rtol = 0 }) end
  end)

  it("matches the reference gradients with many row blocks and one sample (grouped backward)", function()
    attn.manual_seed(29)
    local c = { B = 1, Nq = 300, Nk = 37, d = 3, dv = 2, opts = { window = 40 }, seed = 29 }
    run_case(c, "float64")
  end)

  it("stays finite for huge logits (float32 and float64)", function()
    for _, dtype in ipairs { "float32", "float64" } do
      attn.manual_seed(31)
      local Q = attn.randn({ 2, 3, 4 }, dtype) * 100
      local K = attn.randn({ 2, 6, 4 }, dtype) * 200 -- scores of magnitude ~1e4
      local V = attn.randn({ 2, 6, 3 }, dtype)
      local out, w = attn.dot_product_attention(Q, K, V, { valid_lens = { 4, 6 } })
      assert.is_true(no_nan(out) and no_nan(w))
      local ref_out, ref_w = naive_forward(Q:totable(), K:totable(), V:totable(), { valid_lens = { 4, 6 } })
      helper.assert_close(w, ref_w, { atol = 1e-4 })
      helper.assert_close(out, ref_out, { atol = 1e-3 })
      helper.assert_close(w:sum(3), attn.ones({ 2, 3 }), { atol = 1e-5 })
      -- one huge score in a row
      local Kh = attn.zeros({ 1, 4, 1 }, dtype)
      Kh:set(1e4, 1, 3, 1)
      local _, w1 = attn.dot_product_attention(attn.ones({ 1, 1, 1 }, dtype), Kh, attn.ones({ 1, 4, 1 }, dtype),
        { scale = 1 })
      helper.assert_close(w1, { { { 0, 0, 1, 0 } } }, { atol = 0 })
    end
  end)

  describe("validates its arguments", function()
    local Q, K, V = attn.randn({ 2, 3, 4 }), attn.randn({ 2, 5, 4 }), attn.randn({ 2, 5, 2 })
    local function fails(pattern, q, k, v, o)
      local ok, err = pcall(attn.dot_product_attention, q, k, v, o)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(pattern, 1, true), "message '" .. tostring(err) .. "' lacks " .. pattern)
      return err
    end
    it("treats a valid length above the number of keys as all keys valid (PyTorch, the book's predict)", function()
      local q, k, v = attn.randn({ 2, 3, 4 }), attn.randn({ 2, 5, 4 }), attn.randn({ 2, 5, 4 })
      local out, w = attn.dot_product_attention(q, k, v, { valid_lens = attn.tensor({ 12, 2 }) })
      local all, wall = attn.dot_product_attention(q, k, v, { valid_lens = attn.tensor({ 5, 2 }) })
      assert.close(out, all, { atol = 0 })
      assert.close(w, wall, { atol = 0 })
      local plain = attn.dot_product_attention(q:narrow(1, 1, 1), k:narrow(1, 1, 1), v:narrow(1, 1, 1))
      assert.close(out:narrow(1, 1, 1), plain, { atol = 1e-6 })
      assert.close(attn.masked_softmax(attn.ones({ 1, 1, 3 }), { 7 }), { { { 1 / 3, 1 / 3, 1 / 3 } } }, { atol = 1e-7 })
      assert.close(attn.sequence_mask(attn.ones({ 1, 3 }), { 4 }), { { 1, 1, 1 } }, { atol = 0 })
    end)

    it("valid_lens shape, range and integrality, naming the argument and the shapes", function()
      local e = fails("valid_lens", Q, K, V, { valid_lens = { 1, 2, 3 } })
      assert.is_truthy(e:find("[3]", 1, true) and e:find("[2x3x4]", 1, true) and e:find("[2x5x4]", 1, true))
      fails("[2x2]", Q, K, V, { valid_lens = { { 1, 2 }, { 3, 4 } } })
      e = fails("valid_lens", Q, K, V, { valid_lens = { 1, -1 } })
      assert.is_truthy(e:find("a negative length", 1, true))
      fails("a negative length", Q, K, V, { valid_lens = attn.tensor({ 2, -6 }, "int64") })
      fails("not an integer", Q, K, V, { valid_lens = { 1.5, 2 } })
      fails("valid_lens", Q, K, V, { valid_lens = "3" })
    end)
    it("masks, options and operand shapes", function()
      fails("mask [4x5] does not broadcast to (B, Nq, Nk) = [2x3x5]", Q, K, V, { mask = attn.ones({ 4, 5 }) })
      fails("0 or 1", Q, K, V, { mask = attn.full({ 5 }, 0.5) })
      fails("window", Q, K, V, { window = -1 })
      fails("dropout", Q, K, V, { dropout = 1.5, training = true })
      fails("unknown option 'valid_len'", Q, K, V, { valid_len = { 1, 2 } })
      fails("causal must be a boolean", Q, K, V, { causal = 1 })
      fails("keys must have the queries' width 4", Q, attn.randn({ 2, 5, 3 }), V)
      fails("values must have one row per key", Q, K, attn.randn({ 2, 4, 2 }))
      fails("batch sizes differ", Q, attn.randn({ 1, 5, 4 }), attn.randn({ 1, 5, 2 }))
      fails("dtypes differ", Q, K:to("float64"), V)
      fails("(B, Nq, d)", attn.randn({ 3, 4 }), K, V)
    end)
    it("checks each option once, in the core: the raw binding and evaluation mode get the same checks", function()
      local function raw_fails(pattern, f, ...)
        local ok, err = pcall(f, ...)
        assert.is_false(ok)
        assert.is_truthy(tostring(err):find(pattern, 1, true), "message '" .. tostring(err) .. "' lacks " .. pattern)
      end
      local bad = "dot_product_attention: dropout must be a probability in [0, 1], got 1.5"
      fails(bad, Q, K, V, { dropout = 1.5 }) -- checked when not training too
      raw_fails(bad, core.sdpa_forward, Q, K, V, { dropout = 1.5, training = false })
      raw_fails("additive_attention: dropout must be a probability in [0, 1], got -1", core.scores_attention_forward,
        attn.randn({ 2, 3, 5 }), V, { dropout = -1, name = "additive_attention" })
      fails("need_weights must be a boolean, got yes", Q, K, V, { need_weights = "yes" })
      fails("mask must be a keep-mask tensor or nested table", Q, K, V, { mask = 5 })
      raw_fails("queries must be (B, Nq, d), got [3x4]", core.sdpa_forward, attn.randn({ 3, 4 }), K, V)
      -- a nested-table mask with extra leading size-1 dims, straight to the binding
      local m = { { { { 1, 1, 0, 1, 1 } } } }
      local a = core.sdpa_forward(Q, K, V, { mask = m })
      local b = core.sdpa_forward(Q, K, V, { mask = attn.tensor({ 1, 1, 0, 1, 1 }) })
      assert.close(a, b, { atol = 0 })
    end)
  end)
end)

describe("dot_product_attention with int64 lengths and masks", function()
  it("equals the naive reference for 1-D and 2-D int64 lengths, with gradients", function()
    attn.manual_seed(11)
    local Q, K, V = attn.randn({ 2, 3, 4 }, "float64"), attn.randn({ 2, 5, 4 }, "float64"), attn.randn({ 2, 5, 2 }, "float64")
    for _, lens in ipairs({ { 3, 5 }, { { 1, 2, 5 }, { 0, 4, 3 } } }) do
      local eo, ew = naive_forward(Q:totable(), K:totable(), V:totable(), { valid_lens = lens })
      local out, w = attn.dot_product_attention(Q, K, V, { valid_lens = attn.tensor(lens, "int64") })
      assert.close(out, eo, { atol = 1e-12 })
      assert.close(w, ew, { atol = 1e-12 })
    end
    helper.gradcheck(function(q, k, v)
      return (attn.dot_product_attention(q, k, v, { valid_lens = attn.tensor({ 2, 4 }, "int64") }))
    end, { helper.param({ 2, 3, 4 }), helper.param({ 2, 5, 4 }), helper.param({ 2, 5, 2 }) })
  end)

  it("reads lengths past Nk as all keys, 1-D and 2-D, int64 and float, with gradients", function()
    attn.manual_seed(13)
    local Q, K, V = attn.randn({ 2, 3, 4 }, "float64"), attn.randn({ 2, 5, 4 }, "float64"), attn.randn({ 2, 5, 2 }, "float64")
    local cases = { { { 10, 3 }, { 5, 3 } }, { { { 6, 1, 5 }, { 2, 99, 0 } }, { { 5, 1, 5 }, { 2, 5, 0 } } } }
    for _, case in ipairs(cases) do
      local eo, ew = naive_forward(Q:totable(), K:totable(), V:totable(), { valid_lens = case[2] })
      for _, dtype in ipairs({ "int64", "float32", "float64" }) do
        local out, w = attn.dot_product_attention(Q, K, V, { valid_lens = attn.tensor(case[1], dtype) })
        assert.close(out, eo, { atol = 1e-12 })
        assert.close(w, ew, { atol = 1e-12 })
      end
    end
    helper.gradcheck(function(q, k, v)
      return (attn.dot_product_attention(q, k, v, { valid_lens = attn.tensor({ 9, 4 }, "int64") }))
    end, { helper.param({ 2, 3, 4 }), helper.param({ 2, 5, 4 }), helper.param({ 2, 5, 2 }) })
  end)

  it("takes an int64 keep-mask (a comparison of ids) like a float one", function()
    attn.manual_seed(12)
    local Q, K, V = attn.randn({ 1, 2, 3 }), attn.randn({ 1, 3, 3 }), attn.randn({ 1, 3, 2 })
    local ids = attn.tensor({ { 5, 0, 7 } }, "int64")
    local keep = ids:ne(0):unsqueeze(2) -- (1, 1, 3): padding id 0 is ignored
    local a = attn.dot_product_attention(Q, K, V, { mask = keep })
    local b = attn.dot_product_attention(Q, K, V, { mask = keep:to("float32") })
    assert.close(a, b, { atol = 0 })
  end)
end)
