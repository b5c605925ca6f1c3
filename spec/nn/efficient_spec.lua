-- attn.nn.efficient: Linformer against its formula in plain loops, gradients by finite
-- differences, the `attention` option of nn.MultiHeadAttention and TransformerEncoderBlock
-- (same weights: the same numbers as the functions they name), Nystromformer's convolution and
-- lengths, Performer's redraw, bad input.
local attn = require "attn"
local nn = attn.nn
local helper = require "helper"

-- softmax(q (E k)^T / sqrt(dh)) (F v) per item, in plain loops over nested tables.
local function linformer_naive(q, k, v, E, F)
  local out = {}
  for b = 1, #q do
    local function proj(P, x)
      local r = {}
      for i = 1, #P do
        r[i] = {}
        for c = 1, #x[b][1] do
          local s = 0
          for j = 1, #x[b] do s = s + P[i][j] * x[b][j][c] end
          r[i][c] = s
        end
      end
      return r
    end
    local kp, vp = proj(E, k), proj(F, v)
    out[b] = {}
    for i = 1, #q[b] do
      local sc, mx, tot = {}, -math.huge, 0
      for j = 1, #kp do
        local s = 0
        for c = 1, #q[b][i] do s = s + q[b][i][c] * kp[j][c] end
        sc[j] = s / math.sqrt(#q[b][i])
        mx = math.max(mx, sc[j])
      end
      for j = 1, #kp do
        sc[j] = math.exp(sc[j] - mx)
        tot = tot + sc[j]
      end
      local row = {}
      for c = 1, #vp[1] do
        local s = 0
        for j = 1, #kp do s = s + sc[j] / tot * vp[j][c] end
        row[c] = s
      end
      out[b][i] = row
    end
  end
  return attn.tensor(out, "float64")
end

describe("attn.nn.efficient", function()
  it("Linformer equals softmax(Q (E K)^T / sqrt(d)) (F V) (float64, 1e-10) with finite-difference gradients", function()
    attn.manual_seed(1)
    local m = nn.EfficientAttention({ "linformer", seq_len = 6, k = 3 }, 4):to("float64")
    local q, k, v = attn.randn({ 2, 6, 4 }, "float64"), attn.randn({ 2, 6, 4 }, "float64"), attn.randn({ 2, 6, 4 }, "float64")
    helper.assert_close(m(q, k, v), linformer_naive(q:totable(), k:totable(), v:totable(), m.E:totable(), m.F:totable()),
      { atol = 1e-10, rtol = 0 })
    local p = { helper.param({ 1, 6, 4 }), helper.param({ 1, 6, 4 }), helper.param({ 1, 6, 4 }) }
    helper.gradcheck(function(a, b, c) return m(a, b, c) end, p)
    helper.gradcheck(function(E) m.E = E; return m(q, k, v) end, { helper.param({ 3, 6 }) })
  end)

  it("MultiHeadAttention's attention option runs the named function on the same weights", function()
    attn.manual_seed(2)
    local x = attn.randn({ 2, 10, 8 }, "float64")
    local base = nn.MultiHeadAttention { key_size = 8, query_size = 8, value_size = 8, num_hiddens = 8, num_heads = 2 }
    base:to("float64")
    local function heads(t) return attn.split_heads(t, 2) end
    local q, k, v = heads(base.W_q(x)), heads(base.W_k(x)), heads(base.W_v(x))
    local cases = {
      { "linear", attn.linear_attention(q, k, v) },
      { { "linear", causal = true }, attn.linear_attention(q, k, v, { causal = true }) },
      { { "window", window = 2 }, (attn.dot_product_attention(q, k, v, { window = 2 })) },
      { "full", (attn.dot_product_attention(q, k, v)) },
      { { "nystrom", landmarks = 5 }, attn.nystrom_attention(q, k, v, { landmarks = 5 }) },
      { { "nystrom", landmarks = 2, pinv_iters = 3, pinv_init = "batch" },
        attn.nystrom_attention(q, k, v, { landmarks = 2, pinv_iters = 3, pinv_init = "batch" }) },
    }
    for _, c in ipairs(cases) do
      local m = nn.MultiHeadAttention { key_size = 8, query_size = 8, value_size = 8, num_hiddens = 8, num_heads = 2,
        attention = c[1] }
      m:to("float64")
      m:load_state_dict(base:state_dict())
      helper.assert_close(m(x, x, x), base.W_o(attn.merge_heads(c[2], 2)), { atol = 1e-12, rtol = 0 })
    end
    local m = nn.MultiHeadAttention { key_size = 8, query_size = 8, value_size = 8, num_hiddens = 8, num_heads = 2,
      attention = { "performer", num_features = 16 } }
    m:to("float64")
    local W = m.efficient.features
    assert.are.same({ 16, 4 }, W:shape())
    helper.assert_close(m(x, x, x), m.W_o(attn.merge_heads(attn.performer_attention(heads(m.W_q(x)), heads(m.W_k(x)),
      heads(m.W_v(x)), { features = W }), 2)), { atol = 1e-12, rtol = 0 })
  end)

  it("Nystromformer's convolution and lengths reach attn.nystrom_attention per sample and head", function()
    attn.manual_seed(4)
    local x = attn.randn({ 2, 6, 8 }, "float64")
    local m = nn.MultiHeadAttention { key_size = 8, query_size = 8, value_size = 8, num_hiddens = 8, num_heads = 2,
      attention = { "nystrom", landmarks = 3, conv_kernel_size = 3 } }
    m:to("float64")
    local conv = m.efficient.conv
    assert.are.same({ 2, 1, 3, 1 }, conv:shape())
    assert.is_true(m:state_dict()["efficient.conv"] ~= nil)
    local function heads(t) return attn.split_heads(t, 2):reshape(2, 2, 6, 4) end
    local expected = attn.nystrom_attention(heads(m.W_q(x)), heads(m.W_k(x)), heads(m.W_v(x)),
      { landmarks = 3, conv = conv, valid_lens = { 4, 6 } })
    helper.assert_close(m(x, x, x, attn.tensor { 4, 6 }), m.W_o(attn.merge_heads(expected:reshape(4, 6, 4), 2)),
      { atol = 1e-12, rtol = 0 })
    m(x, x, x):sum():backward()
    assert.is_true(conv.grad:abs():max():item() > 0)
  end)

  it("a TransformerEncoderBlock switches its self-attention by one option", function()
    local blk = nn.TransformerEncoderBlock(8, 8, 8, 8, { 8 }, 8, 16, 2, 0, false, { attention = "linear" })
    assert.are.equal("linear", blk.attention.efficient.kind)
    local y = blk(attn.randn({ 2, 5, 8 }))
    assert.are.same({ 2, 5, 8 }, y:shape())
    assert.has_error(function() nn.TransformerDecoderBlock(8, 8, 8, 8, { 8 }, 8, 16, 2, 0, 1, { attention = "linear" }) end)
  end)

  it("PerformerAttention redraws its features; LinformerAttention shares E and F on request", function()
    attn.manual_seed(3)
    local p = nn.PerformerAttention { dim = 8, heads = 2, num_features = 12 }
    local f0 = p.attention.features:clone()
    local x = attn.randn({ 1, 5, 8 })
    local y0 = p(x)
    p:redraw_features()
    assert.is_true((p.attention.features - f0):abs():max():item() > 0)
    assert.is_true((p(x) - y0):abs():max():item() > 0)
    assert.are.same({ 12, 4 }, p:state_dict()["attention.features"]:shape())
    local l = nn.LinformerAttention { dim = 8, heads = 2, seq_len = 5, k = 3, share_kv = true }
    assert.is_nil(l:state_dict()["attention.F"])
    assert.are.same({ 3, 5 }, l:state_dict()["attention.E"]:shape())
    assert.are.same({ 1, 5, 8 }, l(x):shape())
  end)

  -- errors raised inside modules carry the module path and a traceback: compare the message's start
  local function raises(f, msg)
    local ok, err = pcall(f)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find(msg, 1, true), tostring(err))
  end

  it("rejects a length mismatch and bad specs naming them", function()
    local l = nn.LinformerAttention { dim = 8, heads = 2, seq_len = 16, k = 4 }
    raises(function() l(attn.randn({ 2, 10, 8 })) end,
      "LinformerAttention: input [2x10x8] must be (B, seq_len, dim) with seq_len 16, got length 10")
    raises(function() nn.EfficientAttention("lsh", 4) end,
      "EfficientAttention: attention must be one of full, window, linear, performer, linformer, nystrom, got lsh")
    raises(function() nn.EfficientAttention({ "linear", window = 3 }, 4) end,
      "EfficientAttention: attention 'linear' takes no option 'window'")
    raises(function() nn.EfficientAttention({ "nystrom", causal = true }, 4) end,
      "EfficientAttention: nystrom attention cannot be causal (its landmarks mix positions)")
    raises(function() nn.EfficientAttention({ "nystrom", conv_kernel_size = 4 }, 4) end,
      "EfficientAttention: conv_kernel_size must be odd, got 4")
    raises(function() nn.EfficientAttention({ "nystrom", landmarks = 4 }, 4)(attn.randn({ 1, 6, 4 }),
      attn.randn({ 1, 6, 4 }), attn.randn({ 1, 6, 4 })) end,
      "nystrom_attention: sequence length N = 6 is not divisible by landmarks m = 4")
    raises(function() nn.EfficientAttention({ "linformer", seq_len = 8, causal = true }, 4) end,
      "EfficientAttention: linformer attention cannot be causal (its projection mixes positions)")
    assert.has_error(function() nn.EfficientAttention("linear", 4)(attn.randn({ 1, 3, 4 }), attn.randn({ 1, 3, 4 }),
      attn.randn({ 1, 3, 4 }), { valid_lens = attn.tensor { 2 } }) end)
  end)
end)
