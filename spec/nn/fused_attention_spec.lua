-- The fused attention layers (one autograd node per call: attn.projected_additive_attention,
-- attn.multi_head_attention) against the composition they replace (the layer's fused = false),
-- in training and evaluation, with dropout, lengths, masks, biases, and every gradient.
local attn = require "attn"
local helper = require "helper"

local nn = attn.nn

-- Runs m in both paths from the same seed and the same fresh inputs and returns, per path, the
-- output, the stored weights and the gradients of the inputs and of every parameter.
local function run(m, fused, make_inputs, extra)
  m.fused = fused
  attn.manual_seed(5)
  local inputs = make_inputs()
  attn.manual_seed(9) -- the dropout seed the kernel draws
  local out = m(inputs[1], inputs[2], inputs[3], extra and extra.valid_lens, extra and extra.opts)
  local weights = m.attention_weights
  for _, p in ipairs(m:parameters()) do p.grad = nil end
  -- a loss that weighs every output entry differently, so no gradient hides behind a sum
  local probe = attn.arange(1, out:numel() + 1, 1, out:dtype()):reshape(out:shape()):sin()
  ;(out * probe):sum():backward()
  local grads = {}
  for i, x in ipairs(inputs) do
    if x.requires_grad then grads[#grads + 1] = { "input " .. i, x.grad } end
  end
  for _, e in ipairs(m:named_parameters()) do grads[#grads + 1] = { e[1], e[2].grad } end
  return out, weights, grads
end

local function assert_same_paths(m, make_inputs, extra, tol)
  local out_f, w_f, g_f = run(m, true, make_inputs, extra)
  local out_c, w_c, g_c = run(m, false, make_inputs, extra)
  assert.close(out_f, out_c, tol)
  if w_c == nil then
    assert.is_nil(w_f)
  else
    assert.close(w_f, w_c, tol)
  end
  assert.equal(#g_c, #g_f)
  for i, e in ipairs(g_c) do
    assert.equal(e[1], g_f[i][1])
    assert.is_not_nil(e[2], e[1])
    local ok, msg = helper.compare(g_f[i][2], e[2], tol)
    assert(ok, e[1] .. ": " .. tostring(msg))
  end
end

local TOL = { float32 = { rtol = 1e-5, atol = 1e-6 }, float64 = { rtol = 1e-12, atol = 1e-12 } }

local function leaves(dtype, ...)
  local out = {}
  for i, shape in ipairs({ ... }) do out[i] = attn.randn(shape, dtype):requires_grad_() end
  return out
end

describe("nn.AdditiveAttention fused node", function()
  for _, dtype in ipairs({ "float32", "float64" }) do
    it("equals the composed layer, eval and training with dropout, every gradient (" .. dtype .. ")", function()
      attn.manual_seed(1)
      local m = nn.AdditiveAttention{ key_size = 3, query_size = 5, num_hiddens = 7, dropout = 0.3 }:to(dtype)
      local make = function() return leaves(dtype, { 2, 4, 5 }, { 2, 6, 3 }, { 2, 6, 2 }) end
      for _, mode in ipairs({ "eval", "train" }) do
        m[mode](m)
        assert_same_paths(m, make, { valid_lens = attn.tensor({ 6, 2 }) }, TOL[dtype])
        assert_same_paths(m, make, { valid_lens = attn.tensor({ { 1, 2, 0, 6 }, { 3, 3, 9, 1 } }, "int64") },
          TOL[dtype])
        assert_same_paths(m, make, nil, TOL[dtype])
      end
    end)
  end

  it("gives the gradient of the weights when a loss uses them (gradcheck, float64)", function()
    attn.manual_seed(2)
    local Wq, Wk, wv = helper.param({ 4, 3 }), helper.param({ 4, 2 }), helper.param({ 1, 4 })
    helper.gradcheck(function(q, k, v, a, b, c)
      local out, w = attn.projected_additive_attention(q, k, v, a, b, c, { valid_lens = { 2, 3 } })
      return out:sum() + (w * w):sum()
    end, { helper.param({ 2, 2, 3 }), helper.param({ 2, 3, 2 }), helper.param({ 2, 3, 2 }), Wq, Wk, wv })
  end)

  it("leaves inputs that do not fit to the composed path, whose child names the error", function()
    local m = nn.AdditiveAttention(3, 5, 7, 0)
    local ok, err = pcall(m, attn.ones({ 2, 4, 4 }), attn.ones({ 2, 6, 3 }), attn.ones({ 2, 6, 2 }))
    assert.is_false(ok)
    assert.matches("^in AdditiveAttention%.W_q %(Linear%): Linear: input %[2x4x4%] has last dim 4", err)
  end)
end)

describe("nn.MultiHeadAttention fused node", function()
  for _, dtype in ipairs({ "float32", "float64" }) do
    for _, bias in ipairs({ false, true }) do
      it(string.format("equals the composed layer, eval and training, every gradient (%s, bias %s)", dtype,
        tostring(bias)), function()
        attn.manual_seed(3)
        local m = nn.MultiHeadAttention{ key_size = 3, query_size = 5, value_size = 4, num_hiddens = 6, num_heads = 3,
          dropout = 0.25, bias = bias }:to(dtype)
        local make = function() return leaves(dtype, { 2, 4, 5 }, { 2, 5, 3 }, { 2, 5, 4 }) end
        for _, mode in ipairs({ "eval", "train" }) do
          m[mode](m)
          assert_same_paths(m, make, { valid_lens = attn.tensor({ 3, 5 }) }, TOL[dtype])
          assert_same_paths(m, make, { valid_lens = { { 1, 2, 0, 5 }, { 4, 4, 2, 1 } } }, TOL[dtype])
          assert_same_paths(m, make, { opts = { causal = true } }, TOL[dtype])
          local mask = attn.rand({ 2, 4, 5 }):gt(0.4)
          assert_same_paths(m, make, { opts = { mask = mask } }, TOL[dtype])
          m.keep_weights = true
          assert_same_paths(m, make, { valid_lens = attn.tensor({ 2, 0 }) }, TOL[dtype])
          m.keep_weights = nil
        end
      end)
    end
  end

  it("sums the gradients of keys and values given as one tensor (the book's self-attention)", function()
    attn.manual_seed(4)
    local m = nn.MultiHeadAttention(4, 4, 4, 8, 2, 0):to("float64")
    m:eval()
    local make = function()
      local X = attn.randn({ 2, 3, 4 }, "float64"):requires_grad_()
      return { X, X, X }
    end
    assert_same_paths(m, make, { valid_lens = { 2, 3 } }, TOL.float64)
    -- keys = values with other queries (the decoder's encoder-decoder attention), and queries = keys
    local make_kv = function()
      local X = attn.randn({ 2, 3, 4 }, "float64"):requires_grad_()
      return { attn.randn({ 2, 5, 4 }, "float64"):requires_grad_(), X, X }
    end
    assert_same_paths(m, make_kv, { valid_lens = { 2, 3 } }, TOL.float64)
    local make_qk = function()
      local X = attn.randn({ 2, 3, 4 }, "float64"):requires_grad_()
      return { X, X, attn.randn({ 2, 3, 4 }, "float64"):requires_grad_() }
    end
    assert_same_paths(m, make_qk, {}, TOL.float64)
  end)

  it("reads its cached transposed weights only while they are current (steps, load_state_dict, in place, to)",
    function()
      attn.manual_seed(8)
      local m = nn.MultiHeadAttention(4, 4, 4, 8, 2, 0):eval()
      local X = attn.randn({ 2, 3, 4 })
      local function both()
        m.fused = true
        local fused = m(X, X, X, { 2, 3 })
        m.fused = false
        local composed = m(X, X, X, { 2, 3 })
        m.fused = nil
        return fused, composed
      end
      local before = both()
      -- an optimizer step changes every weight in place
      local opt = attn.optim.SGD(m:parameters(), { lr = 0.5 })
      m(X, X, X, { 2, 3 }):sum():backward()
      opt:step()
      local f, c = both()
      assert.close(f, c, { rtol = 1e-5, atol = 1e-6 })
      assert.is_false(helper.compare(f, before))
      -- load_state_dict copies into the same tensors
      local other = nn.MultiHeadAttention(4, 4, 4, 8, 2, 0):eval()
      m:load_state_dict(other:state_dict())
      f, c = both()
      assert.close(f, c, { rtol = 1e-5, atol = 1e-6 })
      assert.close(f, other(X, X, X, { 2, 3 }), { rtol = 1e-5, atol = 1e-6 })
      -- an in-place write outside the optimizer
      attn.no_grad(function() m.W_o.weight:mul_(-2) end)
      f, c = both()
      assert.close(f, c, { rtol = 1e-5, atol = 1e-6 })
      -- to() makes new tensors of another dtype
      m:to("float64")
      X = X:to("float64")
      f, c = both()
      assert.equal("float64", f:dtype())
      assert.close(f, c, { rtol = 1e-12, atol = 1e-12 })
    end)

  it("stores the per-head weights in the layer and in its attention child, as the composition does", function()
    local m = nn.MultiHeadAttention(4, 4, 4, 8, 2, 0):eval()
    local X = attn.randn({ 2, 3, 4 })
    m(X, X, X, { 1, 3 })
    local w, child = m.attention_weights, m.attention.attention_weights
    assert.same({ 2, 2, 3, 3 }, w:shape())
    assert.same({ 4, 3, 3 }, child:shape())
    assert.is_false(w.requires_grad)
    m.fused = false
    m(X, X, X, { 1, 3 })
    assert.close(w, m.attention_weights, { atol = 1e-7 })
    assert.close(child, m.attention.attention_weights, { atol = 1e-7 })
  end)

  it("gives the gradient of the weights when a loss uses them (gradcheck, float64)", function()
    attn.manual_seed(6)
    local p = { W_q = helper.param({ 4, 3 }), W_k = helper.param({ 4, 2 }), W_v = helper.param({ 4, 2 }),
      W_o = helper.param({ 4, 4 }), b_q = helper.param({ 4 }), b_o = helper.param({ 4 }) }
    helper.gradcheck(function(q, k, v, wq, wk, wv, wo, bq, bo)
      local out, w = attn.multi_head_attention(q, k, v, 2, { W_q = wq, W_k = wk, W_v = wv, W_o = wo, b_q = bq,
        b_o = bo }, { valid_lens = { 2, 3 } })
      return out:sum() + (w * w):sum()
    end, { helper.param({ 2, 2, 3 }), helper.param({ 2, 3, 2 }), helper.param({ 2, 3, 2 }), p.W_q, p.W_k, p.W_v,
      p.W_o, p.b_q, p.b_o })
  end)
end)
