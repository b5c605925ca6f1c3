-- nn.MultiHeadAttention's `rope` and `num_kv_heads` options against the same computation
-- written out by hand (projections, split_heads, attn.rope, plain attention over K/V repeated
-- per group, merge_heads, W_o), the relative-position property through the layer, and bad input.
local attn = require "attn"
local helper = require "helper"

local nn = attn.nn

local TOL = { atol = 1e-12, rtol = 1e-12 }

-- The layer's projections as (B, heads, N, dh) operands, by hand.
local function heads_of(x, lin, heads)
  local y = lin(x)
  local B, N, w = y:size(1), y:size(2), y:size(3)
  return y:reshape({ B, N, heads, w // heads }):transpose(2, 3)
end

-- The layer's output by hand: rope (a function of q/k and which) on the projected heads, K and V
-- repeated to H heads per group, plain (B, H, N, d) attention, merge, W_o.
local function by_hand(m, queries, keys, values, rope, opts)
  local H, Hkv = m.num_heads, m.num_kv_heads
  local q, k, v = heads_of(queries, m.W_q, H), heads_of(keys, m.W_k, Hkv), heads_of(values, m.W_v, Hkv)
  if rope then q, k = rope(q, "q"), rope(k, "k") end
  local idx = {}
  for h = 1, H do idx[h] = (h - 1) // (H // Hkv) + 1 end -- Llama's repeat_kv
  k = k:index_select(2, attn.tensor(idx, "int64"))
  v = v:index_select(2, attn.tensor(idx, "int64"))
  local out, w = attn.dot_product_attention(q:contiguous(), k:contiguous(), v:contiguous(), opts)
  local B, Nq = out:size(1), out:size(3)
  return m.W_o(out:transpose(2, 3):reshape({ B, Nq, -1 })), w
end

local function layer(opts)
  attn.manual_seed(7)
  local o = { key_size = 5, query_size = 6, value_size = 3, num_hiddens = 8, num_heads = 4, bias = true }
  for k, v in pairs(opts or {}) do o[k] = v end
  return nn.MultiHeadAttention(o):to("float64"):eval()
end

describe("nn.MultiHeadAttention with rope", function()
  local X = attn.randn({ 2, 5, 6 }, "float64")
  local K, V = attn.randn({ 2, 5, 5 }, "float64"), attn.randn({ 2, 5, 3 }, "float64")

  it("equals rope applied by hand to the projected q and k, then attention", function()
    for _, case in ipairs {
      { rope = true, ropts = {} },
      { rope = { base = 100, interleaved = true }, ropts = { base = 100, interleaved = true } },
      { rope = nn.RotaryEmbedding(2, { interleaved = true }), ropts = { interleaved = true } },
    } do
      local m = layer { rope = case.rope }
      local y = m(X, K, V, { 5, 3 }, { causal = true })
      local ref, w = by_hand(m, X, K, V, function(t) return attn.rope(t, case.ropts) end,
        { causal = true, valid_lens = { 5, 3 } })
      helper.assert_close(y, ref, TOL)
      helper.assert_close(m.attention_weights, w, TOL)
      assert.are.same({ 2, 4, 5, 5 }, m.attention_weights:shape())
    end
  end)

  it("takes positions and key_positions from the call's opts, per sample too", function()
    local m = layer { rope = true }
    local pos, kpos = { { 3, 4, 5, 6, 7 }, { 0, 9, 2, 1, 4 } }, { 10, 11, 12, 13, 14 }
    local y = m(X, K, V, nil, { positions = pos, key_positions = kpos })
    local ref = by_hand(m, X, K, V, function(t, which)
      return attn.rope(t, { positions = which == "q" and pos or kpos })
    end)
    helper.assert_close(y, ref, TOL)
    helper.assert_close(m(X, K, V, nil, { positions = kpos }), by_hand(m, X, K, V, function(t)
      return attn.rope(t, { positions = kpos })
    end), TOL)
  end)

  it("makes the scores depend on positions only through m - n", function()
    local m = layer { rope = true }
    local q, kv = attn.randn({ 1, 1, 6 }, "float64"), attn.randn({ 1, 3, 5 }, "float64")
    local function weights(qpos, kpos)
      m(q, kv, kv:narrow(3, 1, 3), nil, { positions = { qpos }, key_positions = kpos })
      return m.attention_weights
    end
    local base = weights(4, { 0, 2, 7 })
    helper.assert_close(weights(104, { 100, 102, 107 }), base, { atol = 1e-12, rtol = 0 })
    helper.assert_close(weights(1004, { 1000, 1002, 1007 }), base, { atol = 1e-11, rtol = 0 })
    -- and does depend on the differences
    assert.is_true((weights(5, { 0, 2, 7 }) - base):abs():max():item() > 1e-6)
  end)

  it("gives the gradients of the composition by hand", function()
    local m = layer { rope = true, num_kv_heads = 2 }
    local x = X:detach():requires_grad_()
    m(x, K, V):sum():backward()
    local gx, gk = x.grad, m.W_k.weight.grad
    x.grad = nil
    m:zero_grad()
    by_hand(m, x, K, V, function(t) return attn.rope(t) end):sum():backward()
    helper.assert_close(gx, x.grad, TOL)
    helper.assert_close(gk, m.W_k.weight.grad, TOL)
  end)
end)

describe("nn.MultiHeadAttention with num_kv_heads", function()
  local X = attn.randn({ 3, 4, 6 }, "float64")
  local K, V = attn.randn({ 3, 7, 5 }, "float64"), attn.randn({ 3, 7, 3 }, "float64")

  it("with num_kv_heads = num_heads equals the plain layer, on both of its paths", function()
    local plain, same = layer(), layer { num_kv_heads = 4 }
    assert.are.same(plain.W_k.weight:shape(), same.W_k.weight:shape())
    helper.assert_identical(same(X, K, V, { 2, 7, 4 }), plain(X, K, V, { 2, 7, 4 }))
    -- the (B, H, N, d) path the grouped layer takes, run on the plain layer
    helper.assert_close(plain:heads_forward(X, K, V, attn.tensor({ 2, 7, 4 }, "float64")),
      plain(X, K, V, { 2, 7, 4 }), TOL)
  end)

  it("with fewer key/value heads equals attention over K and V repeated per group", function()
    for _, kv in ipairs { 2, 1 } do
      local m = layer { num_kv_heads = kv }
      assert.are.same({ 2 * kv, 5 }, m.W_k.weight:shape())
      assert.are.same({ 2 * kv, 3 }, m.W_v.weight:shape())
      local mask = attn.rand({ 3, 4, 7 }, "float64"):gt(0.3)
      local y = m(X, K, V, { 7, 2, 5 }, { mask = mask })
      local ref, w = by_hand(m, X, K, V, nil, { valid_lens = { 7, 2, 5 }, mask = mask:unsqueeze(2) })
      helper.assert_close(y, ref, TOL)
      helper.assert_close(m.attention_weights, w, TOL)
    end
  end)

  it("raises on num_kv_heads not dividing num_heads, odd rope heads and positions without rope", function()
    assert.has_error(function() layer { num_kv_heads = 3 } end,
      "MultiHeadAttention: num_kv_heads 3 does not divide num_heads 4")
    assert.has_error(function() layer { num_hiddens = 12, rope = true } end,
      "MultiHeadAttention: rope needs an even head size, got num_hiddens 12 / num_heads 4 = 3")
    assert.has_error(function() layer { rope = nn.RotaryEmbedding(4) } end,
      "MultiHeadAttention: rope module of dim 4 does not fit the head size 2")
    assert.has_error(function() layer { rope = true, attention = "linear" } end,
      "MultiHeadAttention: rope and num_kv_heads work with full attention, not attention = linear")
    assert.error_matches(function() layer()(X, K, V, nil, { positions = { 0, 1, 2, 3 } }) end,
      "MultiHeadAttention: positions and key_positions need the rope option", 1, true)
  end)
end)
