-- Additive attention (scores without the (B, Nq, Nk, h) tensor, the full attention) and the
-- bilinear score, against plain Lua loops and finite differences.
local attn = require "attn"
local helper = require "helper"

-- tanh in plain Lua (math.tanh is gone since Lua 5.3).
local function tanh(x)
  local e = math.exp(-2 * math.abs(x))
  local t = (1 - e) / (1 + e)
  return x < 0 and -t or t
end

local function naive_scores(Qh, Kh, w)
  local out = {}
  for b = 1, #Qh do
    out[b] = {}
    for i = 1, #Qh[b] do
      out[b][i] = {}
      for j = 1, #Kh[b] do
        local s = 0
        for c = 1, #w do s = s + w[c] * tanh(Qh[b][i][c] + Kh[b][j][c]) end
        out[b][i][j] = s
      end
    end
  end
  return out
end

-- Gradients of sum(scores * G).
local function naive_scores_backward(Qh, Kh, w, G)
  local dq, dk, dw = {}, {}, {}
  for c = 1, #w do dw[c] = 0 end
  for b = 1, #Qh do
    dq[b], dk[b] = {}, {}
    for i = 1, #Qh[b] do
      dq[b][i] = {}
      for c = 1, #w do dq[b][i][c] = 0 end
    end
    for j = 1, #Kh[b] do
      dk[b][j] = {}
      for c = 1, #w do dk[b][j][c] = 0 end
    end
    for i = 1, #Qh[b] do
      for j = 1, #Kh[b] do
        local g = G[b][i][j]
        for c = 1, #w do
          local t = tanh(Qh[b][i][c] + Kh[b][j][c])
          dw[c] = dw[c] + g * t
          dq[b][i][c] = dq[b][i][c] + g * w[c] * (1 - t * t)
          dk[b][j][c] = dk[b][j][c] + g * w[c] * (1 - t * t)
        end
      end
    end
  end
  return dq, dk, dw
end

describe("additive_scores", function()
  it("matches the naive reference, forward and backward, for both dtypes and strided inputs", function()
    for _, dtype in ipairs { "float64", "float32" } do
      attn.manual_seed(1)
      local Qh = attn.randn({ 2, 6, 3 }, dtype):transpose(2, 3):contiguous():transpose(2, 3) -- column-major
      local Kh = attn.randn({ 2, 9, 5 }, dtype):narrow(3, 2, 3)
      local w = attn.randn({ 6 }, dtype):narrow(1, 2, 3)
      Qh:requires_grad_()
      Kh:requires_grad_()
      w:requires_grad_()
      local S = attn.additive_scores(Qh, Kh, w)
      local t = dtype == "float64" and { atol = 1e-12 } or { atol = 1e-5 }
      helper.assert_close(S, naive_scores(Qh:totable(), Kh:totable(), w:totable()), t)
      local G = attn.randn({ 2, 6, 9 }, dtype)
      G:set(0, 1, 2, 3)
      ;(S * G):sum():backward()
      local dq, dk, dw = naive_scores_backward(Qh:totable(), Kh:totable(), w:totable(), G:totable())
      helper.assert_close(Qh.grad, dq, t)
      helper.assert_close(Kh.grad, dk, t)
      helper.assert_close(w.grad, dw, dtype == "float64" and { atol = 1e-11 } or { atol = 1e-4 })
    end
  end)

  it("passes gradient checks", function()
    local Qh, Kh, w = helper.param({ 2, 3, 4 }), helper.param({ 2, 5, 4 }), helper.param({ 4 })
    helper.gradcheck(attn.additive_scores, { Qh, Kh, w })
  end)

  it("validates shapes", function()
    local ok, err = pcall(attn.additive_scores, attn.randn({ 2, 3, 4 }), attn.randn({ 2, 5, 3 }), attn.randn({ 4 }))
    assert.is_false(ok)
    assert.is_truthy(err:find("[2x3x4], [2x5x3] and [4]", 1, true), err)
    ok, err = pcall(attn.additive_scores, attn.randn({ 2, 3, 4 }), attn.randn({ 2, 5, 4 }), attn.randn({ 4, 1 }))
    assert.is_false(ok)
    assert.is_truthy(err:find("w_v must be (h)", 1, true), err)
  end)
end)

describe("additive_attention", function()
  -- The book's toy: queries (2,1,20) -> W_q (20->8), keys ones (2,10,2) -> W_k (2->8), values
  -- arange(40) as (10,4) per sample, valid_lens {2, 6}, w_v (8).
  local function toy(dtype)
    attn.manual_seed(4)
    local queries = attn.randn({ 2, 1, 20 }, dtype)
    local keys = attn.ones({ 2, 10, 2 }, dtype)
    local values = attn.arange(0, 40, 1, dtype):reshape(1, 10, 4):expand(2, 10, 4)
    local W_q, W_k, w_v = attn.randn({ 20, 8 }, dtype), attn.randn({ 2, 8 }, dtype), attn.randn({ 8 }, dtype)
    return queries, keys, values, W_q, W_k, w_v
  end

  it("gives the book's toy result [[2, 3, 4, 5]] and [[10, 11, 12, 13]]", function()
    for _, dtype in ipairs { "float32", "float64" } do
      local queries, keys, values, W_q, W_k, w_v = toy(dtype)
      local out, w = attn.additive_attention(queries:matmul(W_q), keys:matmul(W_k), values, w_v,
        { valid_lens = { 2, 6 }, dropout = 0.1 })
      helper.assert_close(out, { { { 2, 3, 4, 5 } }, { { 10, 11, 12, 13 } } }, { atol = 1e-4 })
      local u = 1 / 6
      helper.assert_close(w, { { { 0.5, 0.5, 0, 0, 0, 0, 0, 0, 0, 0 } }, { { u, u, u, u, u, u, 0, 0, 0, 0 } } },
        { atol = 1e-6 })
      -- dot-product attention on the same keys and values, queries (2, 1, 2), agrees
      local dot = attn.dot_product_attention(attn.randn({ 2, 1, 2 }, dtype), keys, values, { valid_lens = { 2, 6 } })
      helper.assert_close(dot, out, { atol = 1e-4 })
    end
  end)

  it("matches the composition of its pieces and passes gradient checks for every input", function()
    attn.manual_seed(5)
    local Qh, Kh, V, w = helper.param({ 2, 3, 4 }), helper.param({ 2, 5, 4 }), helper.param({ 2, 5, 2 }),
      helper.param({ 4 })
    for _, o in ipairs { {}, { valid_lens = { 3, 0 } }, { valid_lens = { { 1, 2, 5 }, { 5, 4, 0 } } } } do
      local out, wts = attn.additive_attention(Qh, Kh, V, w, o)
      local ref = attn.masked_softmax(attn.additive_scores(Qh, Kh, w), o.valid_lens)
      helper.assert_close(wts, ref, { atol = 1e-12 })
      helper.assert_close(out, ref:matmul(V), { atol = 1e-12 })
      helper.gradcheck(function(q, k, v, ww) return (attn.additive_attention(q, k, v, ww, o)) end, { Qh, Kh, V, w })
    end
    -- through the projections of the toy
    local queries, keys, values, W_q, W_k = toy("float64")
    W_q:requires_grad_()
    W_k:requires_grad_()
    local keys2 = keys + attn.randn({ 2, 10, 2 }, "float64")
    helper.gradcheck(function(wq, wk, wv)
      return (attn.additive_attention(queries:matmul(wq), keys2:matmul(wk), values, wv, { valid_lens = { 2, 6 } }))
    end, { W_q, W_k, helper.param({ 8 }) })
  end)

  it("returns the same output without weights and drops only when training", function()
    attn.manual_seed(6)
    local Qh, Kh, V, w = attn.randn({ 2, 70, 8 }), attn.randn({ 2, 9, 8 }), attn.randn({ 2, 9, 3 }), attn.randn({ 8 })
    local out, wts = attn.additive_attention(Qh, Kh, V, w, { valid_lens = { 4, 9 }, dropout = 0.5 })
    local out2, none = attn.additive_attention(Qh, Kh, V, w, { valid_lens = { 4, 9 }, need_weights = false })
    assert.is_nil(none)
    helper.assert_close(out2, out, { atol = 0, rtol = 0 })
    helper.assert_close(out, wts:matmul(V), { atol = 1e-5 })
    local dropped = attn.additive_attention(Qh, Kh, V, w, { valid_lens = { 4, 9 }, dropout = 0.5, training = true })
    assert.is_true((dropped - out):abs():max():item() > 1e-3)
  end)
end)

describe("bilinear_scores", function()
  it("computes q^T W k for different widths and lengths", function()
    attn.manual_seed(8)
    local Q, W, K = attn.randn({ 2, 3, 4 }, "float64"), attn.randn({ 4, 6 }, "float64"), attn.randn({ 2, 5, 6 }, "float64")
    local S = attn.bilinear_scores(Q, W, K)
    local q, w, k, ref = Q:totable(), W:totable(), K:totable(), {}
    for b = 1, 2 do
      ref[b] = {}
      for i = 1, 3 do
        ref[b][i] = {}
        for j = 1, 5 do
          local s = 0
          for a = 1, 4 do
            for c = 1, 6 do s = s + q[b][i][a] * w[a][c] * k[b][j][c] end
          end
          ref[b][i][j] = s
        end
      end
    end
    helper.assert_close(S, ref, { atol = 1e-12 })
    helper.gradcheck(attn.bilinear_scores, { helper.param({ 2, 3, 4 }), helper.param({ 4, 6 }), helper.param({ 2, 5, 6 }) })
    -- composes with the masked softmax into attention over keys of another width
    local out = attn.masked_softmax(S, { 2, 5 }):matmul(attn.randn({ 2, 5, 3 }, "float64"))
    assert.same({ 2, 3, 3 }, out:shape())
  end)

  it("names the shapes when they do not fit", function()
    local ok, err = pcall(attn.bilinear_scores, attn.randn({ 2, 3, 4 }), attn.randn({ 5, 6 }), attn.randn({ 2, 5, 6 }))
    assert.is_false(ok)
    assert.is_truthy(err:find("Q [2x3x4], W [5x6], K [2x5x6]", 1, true), err)
  end)
end)

describe("additive_attention with int64 lengths", function()
  it("equals the float-length result and the composition of its pieces", function()
    attn.manual_seed(6)
    local Qh, Kh, V, w = helper.param({ 2, 3, 4 }), helper.param({ 2, 5, 4 }), helper.param({ 2, 5, 2 }),
      helper.param({ 4 })
    for _, lens in ipairs { { 3, 0 }, { { 1, 2, 5 }, { 5, 4, 0 } } } do
      local out, wts = attn.additive_attention(Qh, Kh, V, w, { valid_lens = attn.tensor(lens, "int64") })
      local ref = attn.masked_softmax(attn.additive_scores(Qh, Kh, w), lens)
      helper.assert_close(wts, ref, { atol = 1e-12 })
      helper.assert_close(out, ref:matmul(V), { atol = 1e-12 })
    end
    local o = { valid_lens = attn.tensor({ 2, 5 }, "int64") }
    helper.gradcheck(function(q, k, v, ww) return (attn.additive_attention(q, k, v, ww, o)) end, { Qh, Kh, V, w })
  end)

  it("reads lengths past Nk as all keys, 1-D and 2-D, int64 and float", function()
    attn.manual_seed(7)
    local Qh, Kh, V, w = helper.param({ 2, 3, 4 }), helper.param({ 2, 5, 4 }), helper.param({ 2, 5, 2 }),
      helper.param({ 4 })
    local cases = { { { 12, 3 }, { 5, 3 } }, { { { 1, 7, 5 }, { 6, 4, 0 } }, { { 1, 5, 5 }, { 5, 4, 0 } } } }
    for _, case in ipairs(cases) do
      local ref = attn.masked_softmax(attn.additive_scores(Qh, Kh, w), case[2])
      for _, dtype in ipairs({ "int64", "float64" }) do
        local out, wts = attn.additive_attention(Qh, Kh, V, w, { valid_lens = attn.tensor(case[1], dtype) })
        helper.assert_close(wts, ref, { atol = 1e-12 })
        helper.assert_close(out, ref:matmul(V), { atol = 1e-12 })
      end
    end
    local o = { valid_lens = attn.tensor({ 8, 2 }, "int64") }
    helper.gradcheck(function(q, k, v, ww) return (attn.additive_attention(q, k, v, ww, o)) end, { Qh, Kh, V, w })
  end)
end)
