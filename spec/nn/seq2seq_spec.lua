-- The book's seq2seq models: shape checks (d2l-facts B, C), the book's
-- state-dict keys and shapes, the Bahdanau query and masking, the v1.0 context
-- fix, and a short training run per model.
local attn = require "attn"
local helper = require "helper"
local fx = require "nn.seq2seq_fixtures"
local s2s = require "attn.d2l.train"
local nn = attn.nn

local function shape(t) return t:shape() end

-- {name, shape} in order -> the names and a state dict of random tensors.
local function book_state(spec)
  local names, sd = {}, {}
  for i, e in ipairs(spec) do
    names[i] = e[1]
    sd[e[1]] = attn.randn(e[2]) * 0.3
  end
  return names, sd
end

-- The GRU keys of torch.nn.GRU(input_size, h, num_layers=2) under `prefix`.
local function gru_keys(prefix, input_size, h)
  local out = {}
  for l = 0, 1 do
    local in_l = l == 0 and input_size or h
    out[#out + 1] = { prefix .. "weight_ih_l" .. l, { 3 * h, in_l } }
    out[#out + 1] = { prefix .. "weight_hh_l" .. l, { 3 * h, h } }
    out[#out + 1] = { prefix .. "bias_ih_l" .. l, { 3 * h } }
    out[#out + 1] = { prefix .. "bias_hh_l" .. l, { 3 * h } }
  end
  return out
end

local function concat(...)
  local out = {}
  for _, list in ipairs { ... } do
    for _, e in ipairs(list) do out[#out + 1] = e end
  end
  return out
end

-- What PyTorch's state_dict() of the book's classes holds, written from their
-- __init__ (modules in assignment order; nn.GRU's flat weights per layer):
-- vocab 10, embed 8, hidden 16, 2 layers.
local ENCODER = concat({ { "encoder.embedding.weight", { 10, 8 } } }, gru_keys("encoder.rnn.", 8, 16))
local BAHDANAU = concat(ENCODER, {
  { "decoder.attention.W_k.weight", { 16, 16 } },
  { "decoder.attention.W_q.weight", { 16, 16 } },
  { "decoder.attention.w_v.weight", { 1, 16 } },
  { "decoder.embedding.weight", { 10, 8 } },
}, gru_keys("decoder.rnn.", 8 + 16, 16), { { "decoder.dense.weight", { 10, 16 } }, { "decoder.dense.bias", { 10 } } })
local SEQ2SEQ = concat(ENCODER, { { "decoder.embedding.weight", { 10, 8 } } }, gru_keys("decoder.rnn.", 8 + 16, 16),
  { { "decoder.dense.weight", { 10, 16 } }, { "decoder.dense.bias", { 10 } } })

describe("nn seq2seq models", function()
  before_each(function() attn.manual_seed(8) end)

  it("pass the book's shape checks (vocab 10, embed 8, hidden 16, 2 layers, batch 4, 7 steps)", function()
    local encoder = nn.Seq2SeqEncoder(10, 8, 16, 2):eval()
    local X = attn.ones({ 4, 7 }) -- the book's zeros, as 1-based ids
    local output, state = encoder(X)
    assert.same({ 7, 4, 16 }, shape(output))
    assert.same({ 2, 4, 16 }, shape(state))
    local decoder = nn.Seq2SeqDecoder(10, 8, 16, 2):eval()
    local out, st = decoder(X, decoder:init_state({ output, state }))
    assert.same({ 4, 7, 10 }, shape(out))
    assert.same({ 2, 4, 16 }, shape(st))
    local adec = nn.Seq2SeqAttentionDecoder(10, 8, 16, 2):eval()
    local aout, ast = adec(X, adec:init_state({ output, state }, nil))
    assert.same({ 4, 7, 10 }, shape(aout))
    assert.is_nil(ast[3]) -- the third part, enc_valid_lens, is None in the book's check
    assert.same({ 4, 7, 16 }, shape(ast[1]))
    assert.equal(2, ast[2]:size(1)) -- len(state[1]): one hidden state per layer
    assert.same({ 4, 16 }, shape(ast[2]:select(1, 1)))
    assert.equal(7, #adec.attention_weights)
    assert.same({ 4, 1, 7 }, shape(adec.attention_weights[1]))
  end)

  for _, case in ipairs {
    { "Bahdanau", BAHDANAU, function() return nn.Seq2SeqAttentionDecoder(10, 8, 16, 2) end },
    { "seq2seq", SEQ2SEQ, function() return nn.Seq2SeqDecoder(10, 8, 16, 2) end },
  } do
    it("load the book's " .. case[1] .. " state dict unchanged (keys, order, shapes)", function()
      local net = nn.EncoderDecoder(nn.Seq2SeqEncoder(10, 8, 16, 2), case[3]())
      local names, sd = book_state(case[2])
      assert.same(names, net:state_dict_keys())
      local report = net:load_state_dict(sd)
      assert.same({}, report.missing_keys)
      assert.same({}, report.unexpected_keys)
      for _, n in ipairs(names) do assert.close(net:state_dict()[n], sd[n], { atol = 0 }) end
    end)
  end

  it("Bahdanau: the first query is the encoder's last-layer final state; weights are masked by the source lengths",
    function()
      local encoder = nn.Seq2SeqEncoder(10, 8, 16, 2):eval()
      local dec = nn.Seq2SeqAttentionDecoder(10, 8, 16, 2):eval()
      local X = attn.tensor({ { 5, 6, 7, 4, 2 }, { 8, 4, 2, 2, 2 } })
      local lens = attn.tensor({ 4, 2 })
      local output, state = encoder(X)
      dec(attn.tensor({ { 3 }, { 3 } }), dec:init_state({ output, state }, lens))
      -- by hand: w_v . tanh(W_q q + W_k k) with q = state[-1], softmax over the valid keys
      local keys = output:permute(2, 1, 3)                     -- (B, T, h)
      local q = state:select(1, 2)                             -- (B, h)
      local Wq, Wk = dec.attention.W_q.weight, dec.attention.W_k.weight
      local wv = dec.attention.w_v.weight:reshape({ 16 })
      for b = 1, 2 do
        local qh = q:select(1, b):matmul(Wq:t())                -- (h)
        local kh = keys:select(1, b):matmul(Wk:t())             -- (T, h)
        local scores = (kh + qh):tanh():matmul(wv):totable()    -- (T)
        local valid = lens:totable()[b]
        local z, want = 0, {}
        for t = 1, valid do z = z + math.exp(scores[t]) end
        for t = 1, 5 do want[t] = t <= valid and math.exp(scores[t]) / z or 0 end
        assert.close(dec.attention_weights[1]:select(1, b):reshape({ 5 }), want, { atol = 1e-6 })
      end
    end)

  it("Bahdanau: keys projected once, queries read from the GRU's output, outputs batch-major: the book's numbers",
    function()
    local encoder = nn.Seq2SeqEncoder(10, 8, 16, 2):eval()
    local dec = nn.Seq2SeqAttentionDecoder(10, 8, 16, 2):eval()
    local X, Y = attn.tensor({ { 5, 6, 7, 4, 2 }, { 8, 4, 2, 2, 2 } }), attn.tensor({ { 3, 4, 5 }, { 6, 7, 8 } })
    local lens = attn.tensor({ 4, 2 })
    local proj = attn.randn({ 2, 3, 10 })
    -- the book's loop: the attention module called with the raw keys at every step
    local function book_forward(state)
      local enc_outputs, hidden = state[1], state[2]
      local emb, outs = dec.embedding(Y), {}
      for t = 1, 3 do
        local query = hidden:select(1, 2):unsqueeze(2)
        local context = dec.attention(query, enc_outputs, enc_outputs, lens)
        local out
        out, hidden = dec.rnn(attn.cat({ context, emb:narrow(2, t, 1) }, 3):permute(2, 1, 3), hidden)
        outs[t] = out
      end
      return dec.dense(attn.cat(outs, 1)):permute(2, 1, 3)
    end
    local results = {}
    for i, run in ipairs { function(state) return (dec(Y, state)) end, book_forward } do
      encoder:zero_grad()
      dec:zero_grad()
      local out = run(dec:init_state(table.pack(encoder(X)), lens))
      ;(out * proj):sum():backward()
      local grads = {}
      for _, p in ipairs(encoder:parameters()) do grads[#grads + 1] = p.grad end
      for _, p in ipairs(dec:parameters()) do grads[#grads + 1] = p.grad end
      results[i] = { out = out, grads = grads }
    end
    -- the same forward up to rounding: the dense layer takes the rows batch-major, the book time-major,
    -- and the fused decoder adds the embeddings' and the context's share of the GRU's input
    -- projection in two products (an entry near 0 then differs by a few units of the terms' rounding)
    helper.assert_close(results[1].out, results[2].out, { atol = 1e-7, rtol = 1e-6 })
    assert.are.equal(#results[2].grads, #results[1].grads)
    for k, g in ipairs(results[2].grads) do
      helper.assert_close(results[1].grads[k], g, { atol = 1e-6, rtol = 1e-5 })
    end
  end)

  it("Seq2SeqDecoder: the book's context drifts at one-step calls; fixed_context keeps the encoder's", function()
    local encoder = nn.Seq2SeqEncoder(10, 8, 16, 2):eval()
    local book = nn.Seq2SeqDecoder(10, 8, 16, 2):eval()
    attn.manual_seed(8)
    local fixed = nn.Seq2SeqDecoder(10, 8, 16, 2, 0, { fixed_context = true }):eval()
    fixed:load_state_dict(book:state_dict())
    local X, Y = attn.tensor({ { 5, 6, 7 } }), attn.tensor({ { 3, 5, 6, 8 } })
    local enc = table.pack(encoder(X))
    -- a whole-sequence call (training): both use the encoder's final top-layer state
    assert.close(fixed(Y, fixed:init_state(enc)), book(Y, book:init_state(enc)), { atol = 1e-6 })
    -- step by step (prediction): the fixed context reproduces the whole-sequence call, the book's does not
    local function stepwise(dec)
      local st, outs = dec:init_state(enc), {}
      for t = 1, 4 do outs[t], st = dec(Y:narrow(2, t, 1), st) end
      return attn.cat(outs, 2)
    end
    local whole = book(Y, book:init_state(enc))
    assert.close(stepwise(fixed), whole, { atol = 1e-5 })
    assert.is_false(helper.compare(stepwise(book), whole, { atol = 1e-3 }))
    -- the fixed context is the encoder's last-step top-layer output
    local st = fixed:init_state(enc)
    assert.close(st[2], enc[1]:select(1, 3), { atol = 0 })
  end)

  for _, case in ipairs {
    { "Bahdanau", function(vocab_size) return nn.Seq2SeqAttentionDecoder(vocab_size, 16, 16, 2, 0.1) end },
    { "seq2seq", function(vocab_size) return nn.Seq2SeqDecoder(vocab_size, 16, 16, 2, 0.1) end },
  } do
    it(case[1] .. ": the loss falls in a short run of train_seq2seq, from any of three seeds", function()
      -- last/first epoch's loss over seeds 1-20: Bahdanau 0.22-0.33, seq2seq 0.21-0.38
      for seed = 1, 3 do
        attn.manual_seed(seed)
        local data_iter, src_vocab, tgt_vocab = fx.task(48, 16, 6)
        local net = nn.EncoderDecoder(nn.Seq2SeqEncoder(#src_vocab, 16, 16, 2, 0.1), case[2](#tgt_vocab))
        local history = s2s.train_seq2seq(net, data_iter, { lr = 0.01, epochs = 12, tgt_vocab = tgt_vocab,
          progress = false })
        assert.equal(12, #history)
        assert.is_true(history[12].loss < 0.5 * history[1].loss,
          string.format("seed %d: loss %.4f -> %.4f", seed, history[1].loss, history[12].loss))
      end
    end)
  end
end)
