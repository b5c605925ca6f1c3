-- attn.d2l.train: train_seq2seq's bookkeeping, init and progress line;
-- predict_seq2seq's stopping rule and source length; beam search at width 1
-- equal to greedy decoding; batched beam search equal to beam search per sentence.
local attn = require "attn"
local fx = require "nn.seq2seq_fixtures"
local s2s = require "attn.d2l.train"
local nn = attn.nn
require "helper" -- assert.close

local function bahdanau(sv, tv) return nn.EncoderDecoder(nn.Seq2SeqEncoder(sv, 8, 16, 2, 0.1),
    nn.Seq2SeqAttentionDecoder(tv, 8, 16, 2, 0.1)) end
local function seq2seq(sv, tv) return nn.EncoderDecoder(nn.Seq2SeqEncoder(sv, 8, 16, 2, 0.1),
    nn.Seq2SeqDecoder(tv, 8, 16, 2, 0.1)) end
local function transformer(sv, tv)
  return nn.EncoderDecoder(nn.TransformerEncoder(sv, 8, 8, 8, 8, { 8 }, 8, 16, 2, 2, 0.1),
    nn.TransformerDecoder(tv, 8, 8, 8, 8, { 8 }, 8, 16, 2, 2, 0.1))
end

-- A buffer with the file interface progress writes to.
local function buffer()
  local b = { text = {} }
  function b.write(self, ...)
    for _, s in ipairs { ... } do self.text[#self.text + 1] = s end
  end
  return b
end

describe("attn.d2l.train", function()
  before_each(function() attn.manual_seed(4) end)

  it("train_seq2seq reports the book's loss and the per-token loss, and shows them with tokens/sec and eta",
    function()
      local data_iter, sv, tv = fx.task(20, 8, 6)
      -- no dropout and lr 0: the model stays as initialised, so the loss can be recomputed
      local net = nn.EncoderDecoder(nn.Seq2SeqEncoder(#sv, 8, 16, 2), nn.Seq2SeqAttentionDecoder(#tv, 8, 16, 2))
      local out = buffer()
      local seen = {}
      local history = s2s.train_seq2seq(net, data_iter, { lr = 0, epochs = 2, tgt_vocab = tv,
        progress = { out = out, tty = false, every = 1 }, on_epoch = function(e, r) seen[e] = r end })
      local tokens, sum = 0, 0
      local loss = nn.MaskedSoftmaxCELoss()
      for X, XL, Y, YL in data_iter() do
        tokens = tokens + YL:sum():item()
        local dec_in = attn.cat({ attn.full({ Y:size(1), 1 }, tv["<bos>"]), Y:narrow(2, 1, 5) }, 2)
        sum = sum + loss(net(X, dec_in, XL), Y, YL):sum():item()
      end
      for e = 1, 2 do
        local r = history[e]
        assert.equal(seen[e], r)
        assert.equal(tokens, r.tokens)
        assert.near(sum / tokens, r.loss, 1e-6)
        assert.near(r.loss * 6, r.token_loss, 1e-12) -- num_steps = 6
        assert.is_true(r.tokens_per_sec > 0)
      end
      local text = table.concat(out.text)
      assert.matches("epoch 2/2 | loss %d%.%d+ | token_loss %d%.%d+ | %d+.* tok/s | elapsed .* | eta", text)
    end)

  it("trains the same on int64 ids as on float32 ids", function()
    local losses = {}
    for _, dtype in ipairs { "float32", "int64" } do
      attn.manual_seed(2)
      local data_iter, sv, tv = fx.task(16, 8, 6, dtype)
      local net = bahdanau(#sv, #tv)
      local history = s2s.train_seq2seq(net, data_iter, { lr = 0.01, epochs = 2, tgt_vocab = tv, progress = false })
      losses[dtype] = { history[1].loss, history[2].loss }
    end
    assert.same(losses.float32, losses.int64)
  end)

  it("initialises every Linear and GRU weight matrix Xavier-uniform, leaving biases and embeddings", function()
    local net = bahdanau(9, 9)
    local before = net:state_dict()
    local copies = {}
    for k, v in pairs(before) do copies[k] = v:clone() end
    s2s.xavier_init_weights(net)
    for _, p in ipairs(net:named_parameters()) do
      local name, t = p[1], p[2]
      local changed = (t - copies[name]):abs():max():item() > 0
      local is_matrix = name:find("weight") and not name:find("embedding")
      assert.equal(is_matrix and true or false, changed, name)
      if is_matrix then
        local fan_in, fan_out = nn.init.fans(t)
        assert.is_true(t:abs():max():item() <= math.sqrt(6 / (fan_in + fan_out)), name)
      end
    end
  end)

  it("predict_seq2seq stops at <eos> without emitting it, and otherwise runs num_steps steps", function()
    local _, sv, tv = fx.task(4, 4, 6)
    local net = bahdanau(#sv, #tv)
    local dense = net.decoder.dense
    nn.init.zeros_(dense.weight)
    nn.init.zeros_(dense.bias)
    attn.no_grad(function() dense.bias:set(1, tv["A"]) end)
    local fr, weights, ids = s2s.predict_seq2seq(net, "a b .", sv, tv, 5, { save_attention_weights = true })
    assert.equal("A A A A A", fr)
    assert.same({ tv["A"], tv["A"], tv["A"], tv["A"], tv["A"] }, ids)
    assert.equal(5, #weights)
    assert.same({ 1, 1, 5 }, weights[1][1]:shape()) -- per step: the decoder's list of (B, 1, Nk)
    attn.no_grad(function() dense.bias:set(2, tv["<eos>"]) end)
    fr, weights = s2s.predict_seq2seq(net, "a b .", sv, tv, 5, { save_attention_weights = true })
    assert.equal("", fr)
    assert.equal(1, #weights)
    assert.same({}, select(2, s2s.predict_seq2seq(net, "a .", sv, tv, 5)))
  end)

  it("predict_seq2seq takes the source length before truncation (a source longer than num_steps)", function()
    local _, sv, tv = fx.task(4, 4, 6)
    local net = bahdanau(#sv, #tv)
    local long = "a b c d e a b c d e ." -- 11 tokens + <eos> over 4 steps: length 12 > 4 keys
    local fr = s2s.predict_seq2seq(net, long, sv, tv, 4, { save_attention_weights = true })
    assert.equal("string", type(fr))
    local w = net.decoder.attention_weights[1]
    assert.is_true(w:narrow(3, 4, 1):item() > 0) -- the last key is attended: every key is valid
  end)

  for _, case in ipairs { { "Bahdanau", bahdanau }, { "seq2seq", seq2seq }, { "Transformer", transformer } } do
    it(case[1] .. ": beam search at width 1 equals greedy decoding", function()
      local data_iter, sv, tv, ps = fx.task(24, 8, 6)
      local net = case[2](#sv, #tv)
      s2s.train_seq2seq(net, data_iter, { lr = 0.01, epochs = 3, tgt_vocab = tv, progress = false })
      for i = 1, 6 do
        local src = ps[i][1]
        local greedy, _, ids = s2s.predict_seq2seq(net, src, sv, tv, 6)
        local beam, cands = s2s.beam_search(net, src, sv, tv, 6, { beam = 1 })
        assert.equal(greedy, beam)
        assert.same(ids, cands[1].ids)
        assert.equal(1, #cands)
      end
      -- wider beams: candidates best first, scored log P / L^alpha
      local _, cands = s2s.beam_search(net, ps[1][1], sv, tv, 6, { beam = 3, length_penalty = 0.75 })
      assert.is_true(#cands >= 1)
      for i = 2, #cands do assert.is_true(cands[i - 1].score >= cands[i].score) end
      for _, c in ipairs(cands) do
        local L = #c.ids + ((#c.ids < 6) and 1 or 0)
        assert.near(c.logp / L ^ 0.75, c.score, 1e-9)
      end
    end)

    it(case[1] .. ": batched beam search gives each sentence beam_search's candidates, at widths 1, 2 and 4",
      function()
        local data_iter, sv, tv, ps = fx.task(24, 8, 6)
        local net = case[2](#sv, #tv)
        s2s.train_seq2seq(net, data_iter, { lr = 0.01, epochs = 3, tgt_vocab = tv, progress = false })
        local srcs = {}
        for i = 1, 7 do srcs[i] = ps[i][1] end
        local greedy = s2s.predict_batch(net, srcs, sv, tv, 6)
        local wider = 0
        for _, k in ipairs { 1, 2, 4 } do
          -- batches of 3: the last one is short, and sentences leave their batch at different steps
          local texts, all = s2s.beam_search_batch(net, srcs, sv, tv, 6, { beam = k, batch_size = 3 })
          assert.equal(#srcs, #texts)
          for i, src in ipairs(srcs) do
            local text, cands = s2s.beam_search(net, src, sv, tv, 6, { beam = k })
            assert.equal(text, texts[i])
            assert.equal(#cands, #all[i])
            for j, c in ipairs(cands) do
              assert.same(c.ids, all[i][j].ids)
              assert.equal(c.translation, all[i][j].translation)
              assert.near(c.logp, all[i][j].logp, 1e-5)
              assert.near(c.score, all[i][j].score, 1e-5)
            end
            if k == 1 then assert.equal(greedy[i], texts[i]) end
            if k > 1 and #cands > 1 then wider = wider + 1 end
          end
        end
        assert.is_true(wider > 0) -- the wider beams kept several candidates somewhere
      end)
  end
end)
