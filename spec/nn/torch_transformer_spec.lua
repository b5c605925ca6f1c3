-- PyTorch's Transformer classes: PyTorch 1.13 fixtures, naive references of the layers' formulas,
-- finite-difference gradients, PyTorch's keys, the nn.TransformerEncoder / Decoder name shared
-- with the book's classes, deep copies, and bad input.
local attn = require "attn"
local helper = require "helper"
local F = require "nn.torch_fixtures"
local nn = attn.nn

-- ---------------------------------------------------------------- naive pieces (float64 tables)

local function layer_norm_rows(x, w, b, eps)
  local y = {}
  for r, row in ipairs(x) do
    local n, mean, var = #row, 0, 0
    for _, v in ipairs(row) do mean = mean + v end
    mean = mean / n
    for _, v in ipairs(row) do var = var + (v - mean) ^ 2 end
    var = var / n -- biased, as PyTorch's LayerNorm
    y[r] = {}
    for c, v in ipairs(row) do y[r][c] = (v - mean) / math.sqrt(var + eps) * w[c] + b[c] end
  end
  return y
end

local function affine(x, W, b)
  local y = {}
  for r = 1, #x do
    y[r] = {}
    for o = 1, #W do
      local s = b[o]
      for c = 1, #W[o] do s = s + x[r][c] * W[o][c] end
      y[r][o] = s
    end
  end
  return y
end

local function add_rows(a, b)
  local y = {}
  for r = 1, #a do
    y[r] = {}
    for c = 1, #a[r] do y[r][c] = a[r][c] + b[r][c] end
  end
  return y
end

-- linear2(relu(linear1(x))) on rows
local function ffn(m, x)
  local h = affine(x, m.linear1.weight:totable(), m.linear1.bias:totable())
  for _, row in ipairs(h) do
    for c, v in ipairs(row) do row[c] = math.max(v, 0) end
  end
  return affine(h, m.linear2.weight:totable(), m.linear2.bias:totable())
end

local function norm(ln, x) return layer_norm_rows(x, ln.weight:totable(), ln.bias:totable(), ln.eps) end

-- rows (T*N, E) of a (T, N, E) tensor and back
local function rows(t) return t:reshape({ -1, t:size(t:dim()) }):totable() end
local function from_rows(r, like) return attn.tensor(r, "float64"):reshape(like:shape()) end

-- PyTorch's TransformerEncoderLayer.forward (1.13), with sa(x) = self_attn(x, x, x, masks)[0]:
--   norm_first: x = x + sa(norm1(x)); x = x + ff(norm2(x))
--   else:       x = norm1(x + sa(x));  x = norm2(x + ff(x))
local function encoder_layer_reference(m, src, masks)
  local function sa(x)
    return rows((m.self_attn(from_rows(x, src), from_rows(x, src), from_rows(x, src), masks)))
  end
  local x = rows(src)
  if m.norm_first then
    x = add_rows(x, sa(norm(m.norm1, x)))
    x = add_rows(x, ffn(m, norm(m.norm2, x)))
  else
    x = norm(m.norm1, add_rows(x, sa(x)))
    x = norm(m.norm2, add_rows(x, ffn(m, x)))
  end
  return from_rows(x, src)
end

-- TransformerDecoderLayer.forward: the same with the attention over memory as its second block.
local function decoder_layer_reference(m, tgt, memory, o)
  local function sa(x)
    local t = from_rows(x, tgt)
    return rows((m.self_attn(t, t, t, { attn_mask = o.tgt_mask, key_padding_mask = o.tgt_key_padding_mask })))
  end
  local function ca(x)
    return rows((m.multihead_attn(from_rows(x, tgt), memory, memory, { attn_mask = o.memory_mask,
      key_padding_mask = o.memory_key_padding_mask })))
  end
  local x = rows(tgt)
  if m.norm_first then
    x = add_rows(x, sa(norm(m.norm1, x)))
    x = add_rows(x, ca(norm(m.norm2, x)))
    x = add_rows(x, ffn(m, norm(m.norm3, x)))
  else
    x = norm(m.norm1, add_rows(x, sa(x)))
    x = norm(m.norm2, add_rows(x, ca(x)))
    x = norm(m.norm3, add_rows(x, ffn(m, x)))
  end
  return from_rows(x, tgt)
end

local function randomise(m) return helper.randomize(m, 0.5) end

local function bool_mask(r) return attn.tensor(r, "int64") end

describe("PyTorch's Transformer classes", function()
  after_each(function() attn.set_num_threads(1) end)

  describe("PyTorch 1.13 fixtures", function()
    for _, threads in ipairs { 1, 2 } do
      for _, name in ipairs(F.transformer_cases) do
        it(name .. ", float64 to 1e-10, " .. threads .. " thread(s)", function()
          attn.set_num_threads(threads)
          F.check(name, { min_n = 14 })
        end)
      end
    end
    for _, name in ipairs { "transformer", "decoder_layer_post", "encoder_layer_pre_gelu" } do
      it(name .. " in float32, to 1e-5", function()
        F.check(name, { dtype = "float32", tol = { output = 1e-5, grad_input = 1e-4, grad_state = 1e-4 } })
      end)
    end
  end)

  describe("against the naive layer formulas (float64, 1e-12)", function()
    for _, norm_first in ipairs { false, true } do
      it("TransformerEncoderLayer, norm_first = " .. tostring(norm_first), function()
        attn.manual_seed(21)
        local m = randomise(nn.TransformerEncoderLayer(4, 2, { dim_feedforward = 6, norm_first = norm_first,
          dtype = "float64", layer_norm_eps = 1e-3 })):eval()
        local src = attn.randn({ 5, 2, 4 }, "float64")
        local masks = { src_mask = attn.randn({ 5, 5 }, "float64"),
          src_key_padding_mask = bool_mask({ { 0, 0, 0, 1, 1 }, { 0, 0, 0, 0, 0 } }) }
        local want = encoder_layer_reference(m, src, { attn_mask = masks.src_mask,
          key_padding_mask = masks.src_key_padding_mask })
        for _, threads in ipairs { 1, 2 } do
          attn.set_num_threads(threads)
          assert.close(m(src, masks), want, { atol = 1e-12, rtol = 1e-12 })
        end
      end)

      it("TransformerDecoderLayer, norm_first = " .. tostring(norm_first) .. ", batch_first", function()
        attn.manual_seed(22)
        local m = randomise(nn.TransformerDecoderLayer(4, 2, { dim_feedforward = 6, norm_first = norm_first,
          batch_first = true, dtype = "float64" })):eval()
        local tgt, memory = attn.randn({ 2, 3, 4 }, "float64"), attn.randn({ 2, 5, 4 }, "float64")
        local o = { tgt_mask = nn.Transformer.generate_square_subsequent_mask(3, "float64"),
          memory_mask = attn.randn({ 3, 5 }, "float64"),
          tgt_key_padding_mask = bool_mask({ { 0, 0, 1 }, { 0, 0, 0 } }),
          memory_key_padding_mask = bool_mask({ { 0, 1, 0, 0, 0 }, { 0, 0, 0, 0, 1 } }) }
        assert.close(m(tgt, memory, o), decoder_layer_reference(m, tgt, memory, o), { atol = 1e-12, rtol = 1e-12 })
      end)
    end

    it("TransformerEncoder: the layers in turn, then norm; Transformer: encoder then decoder", function()
      attn.manual_seed(23)
      local enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(4, 2, { dim_feedforward = 6, dtype = "float64" }),
        3, { norm = nn.LayerNorm(4, { dtype = "float64" }) })
      randomise(enc):eval()
      local src = attn.randn({ 4, 2, 4 }, "float64")
      local x = src
      for _, layer in ipairs(enc.layers) do x = encoder_layer_reference(layer, x, {}) end
      assert.close(enc(src), from_rows(norm(enc.norm, rows(x)), src), { atol = 1e-12, rtol = 1e-12 })
      local t = randomise(nn.Transformer({ d_model = 4, nhead = 2, num_encoder_layers = 1, num_decoder_layers = 2,
        dim_feedforward = 6, dtype = "float64" })):eval()
      local tgt = attn.randn({ 3, 2, 4 }, "float64")
      local mask = nn.Transformer.generate_square_subsequent_mask(3, "float64")
      local memory = t.encoder(src)
      local y = tgt
      for _, layer in ipairs(t.decoder.layers) do y = decoder_layer_reference(layer, y, memory, { tgt_mask = mask }) end
      assert.close(t(src, tgt, { tgt_mask = mask }), from_rows(norm(t.decoder.norm, rows(y)), tgt),
        { atol = 1e-12, rtol = 1e-12 })
    end)
  end)

  describe("gradients (finite differences, float64)", function()
    local function check(m, inputs, f)
      for _, p in ipairs(m:parameters()) do inputs[#inputs + 1] = p end
      helper.gradcheck(f, inputs, { atol = 1e-7, rtol = 1e-6 })
    end
    for _, norm_first in ipairs { false, true } do
      it("TransformerEncoderLayer (norm_first = " .. tostring(norm_first) .. "): input and every parameter", function()
        attn.manual_seed(31)
        local m = nn.TransformerEncoderLayer(4, 2, { dim_feedforward = 5, dropout = 0, norm_first = norm_first,
          activation = norm_first and "gelu" or "relu", dtype = "float64" })
        randomise(m)
        local src = helper.param({ 3, 2, 4 })
        local masks = { src_mask = attn.randn({ 3, 3 }, "float64"),
          src_key_padding_mask = bool_mask({ { 0, 0, 1 }, { 0, 0, 0 } }) }
        check(m, { src }, function() return m(src, masks) end)
      end)
    end

    it("TransformerDecoderLayer: target, memory and every parameter", function()
      attn.manual_seed(32)
      local m = randomise(nn.TransformerDecoderLayer(4, 2, { dim_feedforward = 5, dropout = 0, dtype = "float64" }))
      local tgt, memory = helper.param({ 3, 2, 4 }), helper.param({ 4, 2, 4 })
      local o = { tgt_mask = nn.Transformer.generate_square_subsequent_mask(3, "float64"),
        memory_key_padding_mask = bool_mask({ { 0, 0, 1, 0 }, { 0, 0, 0, 0 } }) }
      check(m, { tgt, memory }, function() return m(tgt, memory, o) end)
    end)
  end)

  describe("PyTorch's names", function()
    it("Transformer keys, exactly PyTorch's", function()
      local t = nn.Transformer({ d_model = 4, nhead = 2, num_encoder_layers = 1, num_decoder_layers = 1,
        dim_feedforward = 6 })
      local want = {}
      local function attn_keys(p)
        for _, k in ipairs { "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias" } do
          want[#want + 1] = p .. k
        end
      end
      local function rest(p, n)
        for _, k in ipairs { "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias" } do
          want[#want + 1] = p .. k
        end
        for i = 1, n do
          want[#want + 1] = p .. "norm" .. i .. ".weight"
          want[#want + 1] = p .. "norm" .. i .. ".bias"
        end
      end
      attn_keys("encoder.layers.0.self_attn.")
      rest("encoder.layers.0.", 2)
      want[#want + 1] = "encoder.norm.weight"
      want[#want + 1] = "encoder.norm.bias"
      attn_keys("decoder.layers.0.self_attn.")
      attn_keys("decoder.layers.0.multihead_attn.")
      rest("decoder.layers.0.", 3)
      want[#want + 1] = "decoder.norm.weight"
      want[#want + 1] = "decoder.norm.bias"
      assert.same(want, t:state_dict_keys())
      -- xavier_uniform_ on every parameter of more than one dim: linear1.weight (6, 4) within its bound
      local w = t.encoder.layers[1].linear1.weight
      assert.is_true(w:abs():max():item() <= math.sqrt(6 / 10))
    end)

    it("generate_square_subsequent_mask: -inf strictly above the diagonal, 0 elsewhere", function()
      local m = nn.Transformer.generate_square_subsequent_mask(4)
      assert.equal("float32", m:dtype())
      local t = m:totable()
      for i = 1, 4 do
        for j = 1, 4 do assert.equal(j > i and -math.huge or 0, t[i][j]) end
      end
      local model = nn.Transformer({ d_model = 4, nhead = 2, num_encoder_layers = 1, num_decoder_layers = 1 })
      assert.equal("float64", model:generate_square_subsequent_mask(2, "float64"):dtype())
    end)
  end)

  describe("nn.TransformerEncoder / nn.TransformerDecoder: PyTorch's or the book's by the first argument", function()
    it("a layer module builds PyTorch's class, the vocabulary size the book's", function()
      local layer = nn.TransformerEncoderLayer(4, 2, { dim_feedforward = 8 })
      local torch_enc = nn.TransformerEncoder(layer, 2)
      assert.equal(nn.TorchTransformerEncoder, getmetatable(torch_enc))
      assert.equal("layers.0.self_attn.in_proj_weight", torch_enc:state_dict_keys()[1])
      local book = nn.TransformerEncoder(20, 8, 8, 8, 8, { 8 }, 8, 16, 2, 2, 0)
      assert.equal(nn.D2LTransformerEncoder, getmetatable(book))
      assert.equal("embedding.weight", book:state_dict_keys()[1])
      local dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(4, 2, { dim_feedforward = 8 }), 1)
      assert.equal(nn.TorchTransformerDecoder, getmetatable(dec))
      assert.equal(nn.D2LTransformerDecoder, getmetatable(nn.TransformerDecoder(11, 8, 8, 8, 8, { 8 }, 8, 16, 2, 2, 0)))
    end)

    it("anything else raises, naming both forms; so does the book's class given a layer", function()
      local ok, err = pcall(nn.TransformerEncoder, 2.5, 2)
      assert.is_false(ok)
      assert.matches("first argument must be a layer module .* or the vocabulary size", err)
      ok, err = pcall(nn.D2LTransformerEncoder, nn.TransformerEncoderLayer(4, 2), 2)
      assert.is_false(ok)
      assert.matches("vocab_size must be a positive integer, got a module", err)
      assert.not_matches("Embedding", err)
      ok, err = pcall(function() return nn.TransformerDecoder:extend("Mine") end)
      assert.is_false(ok)
      assert.matches("use nn.TorchTransformerDecoder or nn.D2LTransformerDecoder", err)
    end)

    it("the layers are deep copies: equal values, their own leaves", function()
      local layer = nn.TransformerEncoderLayer(4, 2, { dim_feedforward = 8 })
      local enc = nn.TransformerEncoder(layer, 2)
      local a, b = enc.layers[1].linear1.weight, enc.layers[2].linear1.weight
      assert.close(a, layer.linear1.weight, { atol = 0, rtol = 0 })
      assert.close(b, layer.linear1.weight, { atol = 0, rtol = 0 })
      assert.is_true(a.requires_grad and a:is_leaf())
      attn.no_grad(function() a:fill_(1) end)
      assert.is_true(b:abs():max():item() < 1)
      assert.is_true(layer.linear1.weight:abs():max():item() < 1)
      assert.equal(24, #enc:parameters())
    end)
  end)

  describe("bad input", function()
    it("raises naming the option or argument", function()
      local cases = {
        { "unknown option 'dim_ff'", function() nn.TransformerEncoderLayer(4, 2, { dim_ff = 8 }) end },
        { "activation must be 'relu', 'gelu'", function() nn.TransformerDecoderLayer(4, 2, { activation = "tanh" }) end },
        { "unknown option 'd_modle'", function() nn.Transformer({ d_modle = 4 }) end },
        { "num_layers must be a positive integer", function() nn.TorchTransformerEncoder(nn.TransformerEncoderLayer(4,
          2), 0) end },
        { "TransformerDecoder: num_layers must be at most 65536 %(a deep copy of the layer each%), got 1099511627776",
          function() nn.TorchTransformerDecoder(nn.TransformerDecoderLayer(4, 2), 1 << 40) end },
        { "unknown option 'src_mask'", function()
          nn.TorchTransformerEncoder(nn.TransformerEncoderLayer(4, 2), 1)(attn.randn({ 2, 1, 4 }),
            { src_mask = attn.zeros({ 2, 2 }) })
        end },
        { "attn_mask is %[3x3%], expected %[2x2%]", function()
          nn.TransformerEncoderLayer(4, 2)(attn.randn({ 2, 1, 4 }), { src_mask = attn.zeros({ 3, 3 }) })
        end },
        { "batch number of src", function()
          nn.Transformer({ d_model = 4, nhead = 2, num_encoder_layers = 1, num_decoder_layers = 1 })(
            attn.randn({ 2, 1, 4 }), attn.randn({ 2, 3, 4 }))
        end },
      }
      for _, c in ipairs(cases) do
        local ok, err = pcall(c[2])
        assert.is_false(ok)
        assert.matches(c[1], tostring(err))
      end
    end)
  end)
end)
