-- The fused Bahdanau decoder (one C call and one autograd node over the step loop,
-- src/nn/attn_decoder.h) against its composed path, the step-by-step composition
-- (Seq2SeqAttentionDecoder:composed_forward: the additive attention layer, cat and the
-- composed GRU cell ops), with the same dropout seed; plus finite differences on the node,
-- thread independence and hostile arguments. (Which path forward takes, and the two
-- paths without dropout: spec/nn/fused_paths_spec.lua.)
local attn = require "attn"
local helper = require "helper"
local seq2seq = require "attn.nn.seq2seq"
local nn = attn.nn
local core = attn.core

-- Sizes of the book's model scaled down to odd ones: batch 3, 7 source and 5 target steps.
local V, E, H, B, NK, T = 13, 6, 8, 3, 7, 5
local SEED = 424242

-- float32 within 1e-5 of the composed path's largest entry (gradients sum the steps in another
-- order, and small entries cancel), float64 within 1e-12.
local function assert_near(actual, expected, dtype, what)
  local scale = expected:abs():max():item()
  local tol = dtype == "float64" and 1e-12 or 1e-5
  local ok, msg = helper.compare(actual, expected, { atol = tol * scale + 1e-30, rtol = tol })
  assert(ok, (what or "") .. ": " .. tostring(msg))
end

-- Two identical encoder-decoder pairs (same seed), their inputs and initial state.
local function build(L, dtype, training, lens)
  attn.manual_seed(7)
  local enc = nn.Seq2SeqEncoder(V, E, H, L, 0.3)
  local dec = nn.Seq2SeqAttentionDecoder(V, E, H, L, 0.3)
  attn.manual_seed(7)
  local enc2 = nn.Seq2SeqEncoder(V, E, H, L, 0.3)
  local dec2 = nn.Seq2SeqAttentionDecoder(V, E, H, L, 0.3, { fused = false })
  for _, m in ipairs({ enc, dec, enc2, dec2 }) do
    if dtype == "float64" then m:to("float64") end
    if training then m:train() else m:eval() end
  end
  local X = attn.randint(1, V + 1, { B, NK })
  local Y = attn.randint(1, V + 1, { B, T })
  return { enc, dec, X, Y, lens }, { enc2, dec2, X, Y, lens }
end

-- Forward (the decoder's path chosen by `run`), a loss on the output and the final state,
-- backward; returns output, state, weights and every parameter's gradient by name.
local function step(setup, run)
  local enc, dec, X, Y, lens = table.unpack(setup, 1, 5)
  -- the encoder runs in eval mode so both sides get the same encoder numbers
  local enc_training = enc.training
  enc:eval()
  local state = dec:init_state(table.pack(enc(X, lens)), lens)
  if enc_training then enc:train() end
  local out, new_state = run(dec, Y, state)
  local loss = (out * out):sum() + (new_state[2] * new_state[2]):sum() * 0.5
  loss:backward()
  local grads = {}
  for _, m in ipairs({ enc, dec }) do
    for _, entry in ipairs(m:named_parameters()) do grads[m:class_name() .. "." .. entry[1]] = entry[2].grad end
  end
  return out, new_state[2], dec.attention_weights, grads
end

local function fused(dec, Y, state) return dec:fused_forward(Y, state, SEED) end
local function composed(dec, Y, state) return dec:composed_forward(Y, state, SEED) end

describe("fused Bahdanau decoder", function()
  for _, dtype in ipairs({ "float32", "float64" }) do
    for _, L in ipairs({ 1, 3 }) do
      for _, training in ipairs({ false, true }) do
        local name = string.format("%s, %d layer(s), %s", dtype, L, training and "training (dropout)" or "eval")
        it("equals the composition: outputs, state, weights and every gradient (" .. name .. ")", function()
          local lens = attn.tensor({ NK, 1, 4 }) -- full, 1 and in between
          local a, b = build(L, dtype, training, lens)
          -- both keep the weights in training only when asked
          a[2].attention.keep_weights = true
          b[2].attention.keep_weights = true
          local out, hn, weights, grads = step(a, fused)
          local out2, hn2, weights2, grads2 = step(b, composed)
          assert_near(out, out2, dtype, "output")
          assert_near(hn, hn2, dtype, "state")
          assert.are.equal(T, #weights)
          for t = 1, T do
            assert.are.same({ B, 1, NK }, weights[t]:shape())
            assert_near(weights[t], weights2[t], dtype, "weights of step " .. t)
          end
          -- sample 2 (valid length 1) attends only to its first key
          assert.are.equal(1, weights[1]:get(2, 1, 1))
          local n = 0
          for k, g in pairs(grads2) do
            n = n + 1
            assert(grads[k], "no gradient for " .. k)
            assert_near(grads[k], g, dtype, k)
          end
          assert.are.equal(2 * (1 + 4 * L) + 3 + 2, n) -- embeddings, GRUs, attention, dense
        end)
      end
    end
  end

  it("matches finite differences in every input, with dropout on (float64)", function()
    attn.manual_seed(3)
    local L, ha, dv, e, h = 2, 4, 5, 3, 6
    local W_k, values = helper.param({ ha, dv }, 0.5), helper.param({ 2, 4, dv }, 0.5)
    local emb, h0 = helper.param({ 3, 2, e }, 0.5), helper.param({ L, 2, h }, 0.5)
    local W_q, w_v = helper.param({ ha, h }, 0.5), helper.param({ 1, ha }, 0.5)
    local params = {
      helper.param({ 3 * h, dv + e }, 0.4), helper.param({ 3 * h, h }, 0.4), helper.param({ 3 * h }, 0.4),
      helper.param({ 3 * h }, 0.4), helper.param({ 3 * h, h }, 0.4), helper.param({ 3 * h, h }, 0.4), false,
      helper.param({ 3 * h }, 0.4),
    }
    local lens = attn.tensor({ 3, 1 })
    local function fn(wk, v, x, s, wq, wv, ...)
      local out, hn = seq2seq.attention_decoder(wk, v, lens, x, s, wq, wv, { ... }, 0.25, 0.25, 99)
      return attn.cat({ out:reshape({ -1 }), hn:reshape({ -1 }) })
    end
    helper.gradcheck(fn, { W_k, values, emb, h0, W_q, w_v, table.unpack(params) })
  end)

  it("keeps the weights in training only when asked, as the attention layer does", function()
    local a = build(2, "float32", true, { NK, 1, 4 })
    local enc, dec, X, Y = table.unpack(a, 1, 4)
    dec(Y, dec:init_state(table.pack(enc(X)), nil))
    assert.are.same({}, dec.attention_weights)
    dec.attention.keep_weights = true
    dec(Y, dec:init_state(table.pack(enc(X)), nil))
    assert.are.equal(T, #dec.attention_weights)
  end)

  it("gives the same bits on 1 and 2 threads", function()
    local function run(n)
      attn.set_num_threads(n)
      local a = build(2, "float32", true, { NK, 1, 4 })
      a[2].attention.keep_weights = true
      local out, hn, weights, grads = step(a, fused)
      attn.set_num_threads(2)
      return out, hn, weights, grads
    end
    local out1, hn1, w1, g1 = run(1)
    local out2, hn2, w2, g2 = run(2)
    helper.assert_identical(out2, out1)
    helper.assert_identical(hn2, hn1)
    for t = 1, T do helper.assert_identical(w2[t], w1[t]) end
    for k, g in pairs(g1) do helper.assert_identical(g2[k], g) end
  end)

  it("raises on hostile arguments with the shapes", function()
    local W_k, values, emb, h0 = attn.zeros({ 4, 5 }), attn.zeros({ 2, 3, 5 }), attn.zeros({ 4, 2, 6 }),
        attn.zeros({ 1, 2, 7 })
    local W_q, w_v = attn.zeros({ 4, 7 }), attn.zeros({ 1, 4 })
    local params = { attn.zeros({ 21, 11 }), attn.zeros({ 21, 7 }), false, false }
    local function fails(pattern, ...)
      local ok, err = pcall(core.decoder_forward, ...)
      assert.is_false(ok)
      assert.matches(pattern, err, 1, true)
    end
    assert.are.same({ 2, 4, 7 }, (core.decoder_forward(W_k, values, nil, emb, h0, W_q, w_v, params, 0, 0)):shape())
    fails("attention_decoder: weight_ih of layer 0 is [21x10], expected [21x11]", W_k, values, nil, emb, h0, W_q,
      w_v, { attn.zeros({ 21, 10 }), params[2], false, false }, 0, 0)
    fails("attention_decoder: values is [3x3x5], expected [2x3x5]", W_k, attn.zeros({ 3, 3, 5 }), nil, emb, h0, W_q,
      w_v, params, 0, 0)
    fails("attention_decoder: W_q is [4x6], expected [4x7]", W_k, values, nil, emb, h0, attn.zeros({ 4, 6 }), w_v,
      params, 0, 0)
    fails("attention_decoder: valid_lens [3] must be (B) = [2]", W_k, values, attn.tensor({ 1, 2, 3 }), emb, h0, W_q,
      w_v, params, 0, 0)
    fails("attention_decoder: state [2x2x7] must be (num_layers, B, num_hiddens) for 1 layers", W_k, values, nil,
      emb, attn.zeros({ 2, 2, 7 }), W_q, w_v, params, 0, 0)
    fails("attention_decoder: dropout 1.0 must be in [0, 1)", W_k, values, nil, emb, h0, W_q, w_v, params, 0, 1)
    fails("attention_decoder: W_k is float64, the embeddings are float32", W_k:to("float64"), values, nil,
      emb, h0, W_q, w_v, params, 0, 0)
    -- empty tensors whose other dims are huge are refused before anything is sized from them
    fails("attention_decoder: embeddings [0x4611686018427387904x6] must be (T, B, embed) with every size at least 1",
      W_k, values, nil, attn.zeros({ 0, 1 << 62, 6 }), h0, W_q, w_v, params, 0, 0)
    fails("attention_decoder: values [4611686018427387904x0x5] must be (B, Nk, dv)", W_k,
      attn.zeros({ 1 << 62, 0, 5 }), nil, emb, h0, W_q, w_v, params, 0, 0)
    fails("attention_decoder: W_k [0x4611686018427387904] must be (h, value_size) with h at least 1",
      attn.zeros({ 0, 1 << 62 }), values, nil, emb, h0, W_q, w_v, params, 0, 0)
    -- a view of 2^31 steps is refused by size, not read
    fails("attention_decoder: embeddings [2147483648x2x6], values [2x3x5] and state [1x2x7] are too large",
      W_k, values, nil, attn.zeros({ 1, 2, 6 }):expand({ 1 << 31, 2, 6 }), h0, W_q, w_v, params, 0, 0)
    assert.is_false((pcall(core.decoder_forward, W_k, values, nil, emb, h0, W_q, w_v, "params", 0, 0)))
    -- backward: a saved tensor or gradient that does not fit the operands
    local _, _, _, saved = core.decoder_forward(W_k, values, nil, emb, h0, W_q, w_v, params, 0, 0)
    local function back_fails(pattern, ...)
      local ok, err = pcall(core.decoder_backward, W_k, values, nil, emb, h0, W_q, w_v, params, 0, 0, 1, ...)
      assert.is_false(ok)
      assert.matches(pattern, err, 1, true)
    end
    back_fails("attention_decoder backward: saved must be the forward's table of parts, got a userdata",
      attn.zeros({ 7 }))
    back_fails("attention_decoder backward: output gradient is [4x2x7], expected [2x4x7]", saved,
      attn.zeros({ 4, 2, 7 }))
    back_fails("attention_decoder backward: final state gradient is [2x2x7], expected [1x2x7]", saved, nil,
      attn.zeros({ 2, 2, 7 }))
    assert.are.same({ 4, 5 }, (core.decoder_backward(W_k, values, nil, emb, h0, W_q, w_v, params, 0, 0, 1, saved,
      attn.ones({ 2, 4, 7 }))):shape())
  end)
end)
