-- nn.RMSNorm against its formula and finite differences, nn.SwiGLU against its definition,
-- nn.RotaryEmbedding against attn.rope, and norm_first / ffn = "swiglu" on the book's blocks.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn

describe("nn.RMSNorm", function()
  it("is x / sqrt(mean(x^2) + eps) * weight, row by row (float64)", function()
    attn.manual_seed(3)
    local m = nn.RMSNorm(5, { eps = 1e-3, dtype = "float64" })
    attn.no_grad(function() attn.core.copy_(m.weight, attn.tensor({ 1, 2, -1, 0.5, 3 }, "float64")) end)
    local x = attn.randn({ 2, 3, 5 }, "float64")
    local rows, w = attn.core.totable(x:reshape({ -1, 5 })), { 1, 2, -1, 0.5, 3 }
    for r, row in ipairs(rows) do
      local ms = 0
      for _, v in ipairs(row) do ms = ms + v * v / 5 end
      for j = 1, 5 do rows[r][j] = row[j] / math.sqrt(ms + 1e-3) * w[j] end
    end
    helper.assert_close(m(x), attn.tensor(rows, "float64"):reshape({ 2, 3, 5 }), { atol = 1e-14, rtol = 0 })
    assert.same({ "weight" }, m:state_dict_keys())
  end)

  it("defaults eps to the dtype's machine epsilon, as PyTorch", function()
    local x = attn.tensor({ { 0, 0, 1e-9 } }, "float64")
    local y = nn.RMSNorm(3, { dtype = "float64" })(x)
    local expect = 1e-9 / math.sqrt(1e-18 / 3 + 2 ^ -52)
    assert.is_true(math.abs(attn.core.totable(y)[1][3] - expect) < 1e-12 * expect)
  end)

  it("passes finite differences in x and weight", function()
    local m = nn.RMSNorm(4, { eps = 1e-5, dtype = "float64" })
    attn.no_grad(function() attn.core.copy_(m.weight, attn.tensor({ 0.5, 1, 1.5, 2 }, "float64")) end)
    helper.gradcheck(function(x, w)
      m.weight = w
      return m(x)
    end, { attn.randn({ 3, 4 }, "float64"):requires_grad_(), m.weight })
  end)

  it("raises on a wrong last dim", function()
    local ok, err = pcall(function() return nn.RMSNorm(4)(attn.randn({ 2, 3 })) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("RMSNorm: input must be a tensor (..., 4), got [2x3]", 1, true))
  end)
end)

describe("nn.SwiGLU and nn.RotaryEmbedding", function()
  it("SwiGLU is w2(silu(w1 x) * w3 x)", function()
    local m = nn.SwiGLU(4, 6, 3, { dtype = "float64" })
    local x = attn.randn({ 2, 4 }, "float64")
    local a, b = x:matmul(m.w1.weight:t()), x:matmul(m.w3.weight:t())
    local silu = a / ((-a):exp() + 1)
    helper.assert_close(m(x), (silu * b):matmul(m.w2.weight:t()), { atol = 1e-14, rtol = 0 })
  end)

  it("RotaryEmbedding is attn.rope with its settings", function()
    local r = nn.RotaryEmbedding(6, { base = 100, interleaved = true })
    local x = attn.randn({ 2, 3, 6 }, "float64")
    helper.assert_close(r(x, { 4, 5, 9 }), attn.rope(x, { base = 100, interleaved = true, positions = { 4, 5, 9 } }),
      { atol = 0, rtol = 0 })
    assert.has_error(function() nn.RotaryEmbedding(5) end, "RotaryEmbedding: dim must be even, got 5")
  end)
end)

describe("norm_first and ffn = 'swiglu' on the book's blocks", function()
  it("the encoder block is X + f(ln(X)) per sublayer with the same keys", function()
    attn.manual_seed(4)
    local blk = nn.TransformerEncoderBlock(8, 8, 8, 8, { 8 }, 8, 16, 2, 0, false, { norm_first = true, ffn = "swiglu" })
    blk:eval()
    local X, lens = attn.randn({ 2, 3, 8 }), attn.tensor({ 3, 2 })
    local ln1, ln2 = blk.addnorm1.ln, blk.addnorm2.ln
    local Z = X + blk.attention(ln1(X), ln1(X), ln1(X), lens)
    local ref = Z + blk.ffn.w2(nn.silu(blk.ffn.w1(ln2(Z))) * blk.ffn.w3(ln2(Z)))
    helper.assert_close(blk(X, lens), ref, { atol = 1e-6 })
    local post = nn.TransformerEncoderBlock(8, 8, 8, 8, { 8 }, 8, 16, 2, 0)
    local keys = post:state_dict_keys()
    table.sort(keys)
    local pre = nn.TransformerEncoderBlock(8, 8, 8, 8, { 8 }, 8, 16, 2, 0, false, { norm_first = true }):state_dict_keys()
    table.sort(pre)
    assert.same(keys, pre)
  end)

  it("a pre-norm decoder block fed step by step equals the whole sequence", function()
    attn.manual_seed(5)
    local d = nn.TransformerDecoderBlock(8, 8, 8, 8, { 8 }, 8, 16, 2, 0, 0, { norm_first = true })
    d:eval()
    local X, enc = attn.randn({ 2, 3, 8 }), attn.randn({ 2, 4, 8 })
    local full = d(X, { enc, nil, {} })
    local st, parts = { enc, nil, {} }, {}
    for t = 1, 3 do parts[t] = (d(X:narrow(2, t, 1), st)) end
    helper.assert_close(attn.cat(parts, 2), full, { atol = 1e-6 })
  end)

  it("raises on an unknown ffn", function()
    assert.has_error(function() nn.TransformerEncoderBlock(8, 8, 8, 8, { 8 }, 8, 16, 2, 0, false, { ffn = "gelu" }) end,
      "TransformerEncoderBlock: ffn must be 'relu' or 'swiglu', got 'gelu'")
  end)
end)
