-- Real runs (attn.d2l.run): a resumed run's losses are an unbroken run's, bit
-- for bit, with dropout on; checkpoints refuse what does not fit; held-out
-- evaluation is corpus BLEU of the batched greedy decode. Tiny models on the
-- shipped sample, so the file stays fast.
local attn = require "attn"
local data = require "attn.d2l.data"
local metrics = require "attn.d2l.metrics"
local run = require "attn.d2l.run"
local train = require "attn.d2l.train"
local helper = require "helper"
local nn = attn.nn

local function corpus()
  return assert(data.load_corpus(16, 8, { num_examples = 200, seed = 3, valid = 20, test = 20 }))
end

local function transformer(c, dropout)
  local h = 16
  return nn.EncoderDecoder(nn.TransformerEncoder(#c.src_vocab, h, h, h, h, { h }, h, 32, 2, 1, dropout),
    nn.TransformerDecoder(#c.tgt_vocab, h, h, h, h, { h }, h, 32, 2, 1, dropout))
end

local FIT = { lr = 0.005, epochs = 2, progress = false, schedule = "noam", d_model = 16, warmup = 5,
  label_smoothing = 0.1, accum = 2, log = function() end }

local function fit(net, c, extra)
  local o = {}
  for k, v in pairs(FIT) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return run.fit(net, c, o)
end

describe("attn.d2l.run", function()
  local dir
  setup(function() dir = helper.make_tmpdir() end)
  teardown(function() helper.remove_tree(dir) end)

  it("resumes so that every later step's loss equals the unbroken run's exactly (dropout 0.3)", function()
    attn.manual_seed(5)
    local c = corpus()
    local whole = fit(transformer(c, 0.3), c)
    local steps = #whole.steps
    assert.are.equal(2 * ((#c.train + 1) // 2), steps) -- accum 2: ceil(batches / 2) steps per epoch
    -- the same run stopped mid-epoch at step 4, then resumed from its checkpoint in a fresh model
    attn.manual_seed(5)
    c = corpus()
    local first = fit(transformer(c, 0.3), c, { max_steps = 4, out = dir, name = "r" })
    assert.is_true(first.stopped)
    for i = 1, 4 do assert.are.equal(whole.steps[i], first.steps[i]) end
    -- its tokens: the target lengths of the 8 batches of its 4 steps (accum 2), from a fresh loader's plan
    local plan, y_len, want = corpus().train:plan():totable(), c.train.dataset[4]:totable(), 0
    for b = 1, 8 do
      for _, r in ipairs(plan[b]) do want = want + y_len[r] end
    end
    assert.are.equal(want, first.tokens)
    assert.are.equal(whole.epochs[1].tokens + whole.epochs[2].tokens, whole.tokens)
    local ckpt = assert(run.load_checkpoint(first.checkpoint))
    assert.are.same({ epoch = 1, batch = 8, step = 4 }, ckpt.position)
    attn.manual_seed(99) -- other weights and another generator state: the checkpoint must restore both
    c = corpus()
    local rest = fit(transformer(c, 0.3), c, { resume = ckpt })
    assert.are.equal(steps - 4, #rest.steps)
    for i = 1, #rest.steps do
      assert(whole.steps[4 + i] == rest.steps[i],
        string.format("step %d: %.17g resumed, %.17g unbroken", 4 + i, rest.steps[i], whole.steps[4 + i]))
    end
    -- without the generator state the dropout masks differ, and so do the losses
    ckpt.rng = { 1, 2, 3, 4 }
    c = corpus()
    local other = fit(transformer(c, 0.3), c, { resume = ckpt, epochs = 1 })
    assert.are_not.equal(whole.steps[5], other.steps[1])
  end)

  it("keeps the best validation checkpoint and writes one file per checkpoint", function()
    attn.manual_seed(1)
    local c = corpus()
    local r = fit(transformer(c, 0), c, { out = dir, name = "b", save_every = 1, schedule = "none", accum = 1 })
    assert.is_number(r.best)
    local best = assert(run.load_checkpoint(dir .. "/b-best.safetensors"))
    local last = assert(run.load_checkpoint(dir .. "/b-last.safetensors"))
    assert.are.equal(r.best, best.best)
    assert.are.same({ epoch = 3, batch = 0, step = 2 * #c.train }, last.position)
    local losses = { r.epochs[1].valid, r.epochs[2].valid }
    assert.are.equal(math.min(losses[1], losses[2]), r.best)
    assert.are.same(c.src_vocab.idx_to_token, last.src_vocab.idx_to_token)
    assert.are.same(c.tgt_vocab.idx_to_token, last.tgt_vocab.idx_to_token)
    assert.are.same({}, helper.temp_files(dir))
    -- the validation loss is the mean token cross-entropy, as a direct computation gives it
    local net = transformer(c, 0)
    net:load_state_dict(best.model)
    local v = run.validation_loss(net, c.valid, c.src_vocab, c.tgt_vocab, 8)
    helper.assert_close(v, r.best, { rtol = 1e-6 })
  end)

  it("returns nil and a message for truncated, damaged and foreign checkpoints, never raising", function()
    attn.manual_seed(2)
    local c = corpus()
    local net = transformer(c, 0)
    local r = fit(net, c, { out = dir, name = "t", max_steps = 1 })
    local good = r.checkpoint
    local full = helper.read_bytes(good)
    local scratch = dir .. "/scratch.safetensors"
    for _, len in ipairs { 0, 7, 8, 100, #full // 2, #full - 1 } do
      helper.write_bytes(scratch, full:sub(1, len))
      local t, msg = run.load_checkpoint(scratch)
      assert.is_nil(t)
      assert.matches("scratch%.safetensors", msg)
    end
    helper.assert_byte_flips_never_raise(good, scratch, run.load_checkpoint, "scratch%.safetensors", 7)
    assert(attn.save(scratch, net:state_dict(), { epoch = "3" }))
    local t, msg = run.load_checkpoint(scratch)
    assert.is_nil(t)
    assert.matches("is not a training checkpoint of attn.d2l.run %(format none", msg)
  end)

  it("refuses a resume into another model, and names settings and vocabularies that differ", function()
    attn.manual_seed(2)
    local c = corpus()
    local r = fit(transformer(c, 0), c, { out = dir, name = "m", max_steps = 1, config = { seed = 3, test = 20 } })
    local ckpt = assert(run.load_checkpoint(r.checkpoint))
    local bigger = nn.EncoderDecoder(nn.TransformerEncoder(#c.src_vocab, 32, 32, 32, 32, { 32 }, 32, 32, 2, 1, 0),
      nn.TransformerDecoder(#c.tgt_vocab, 32, 32, 32, 32, { 32 }, 32, 32, 2, 1, 0))
    assert.has_error(function() fit(bigger, c, { resume = ckpt }) end)
    assert.are.equal("it was made with test = 20, this run has test = 30",
      run.config_mismatch(ckpt.config, { seed = 3, test = 30 }))
    assert.is_nil(run.config_mismatch(ckpt.config, { seed = 3, test = 20 }))
    local other = assert(data.load_corpus(16, 8, { num_examples = 200, seed = 4, valid = 20, test = 20 }))
    assert.matches("^the English vocabulary differs %(%d+ tokens saved, %d+ from this data; first difference at id %d+",
      run.vocab_mismatch(ckpt.src_vocab, other.src_vocab, "English"))
    assert.is_nil(run.vocab_mismatch(ckpt.src_vocab, c.src_vocab, "English"))
  end)

  it("decodes a batch as predict_seq2seq decodes each sentence, and scores it with corpus BLEU", function()
    attn.manual_seed(4)
    local c = corpus()
    local net = transformer(c, 0.1)
    fit(net, c, { epochs = 3, schedule = "none", accum = 1 })
    local texts = train.predict_batch(net, c.test.source, c.src_vocab, c.tgt_vocab, 8, { batch_size = 7 })
    for i, src in ipairs(c.test.source) do
      assert.are.equal(train.predict_seq2seq(net, table.concat(src, " "), c.src_vocab, c.tgt_vocab, 8), texts[i])
    end
    local bleu, preds = run.evaluate(net, c.test, c.src_vocab, c.tgt_vocab, 8)
    assert.are.same(texts, preds)
    assert.are.equal(metrics.corpus_bleu(texts, c.test.target), bleu)
    -- with a beam: batched beam search, each sentence as beam_search decodes it
    local bleu2, beamed = run.evaluate(net, c.test, c.src_vocab, c.tgt_vocab, 8, { beam = 2, batch_size = 5 })
    for i, src in ipairs(c.test.source) do
      assert.are.equal(train.beam_search(net, table.concat(src, " "), c.src_vocab, c.tgt_vocab, 8, { beam = 2 }),
        beamed[i])
    end
    assert.are.equal(metrics.corpus_bleu(beamed, c.test.target), bleu2)
    -- a bahdanau model decodes the same way (its state is batch-second)
    local gru = nn.EncoderDecoder(nn.Seq2SeqEncoder(#c.src_vocab, 8, 8, 2, 0),
      nn.Seq2SeqAttentionDecoder(#c.tgt_vocab, 8, 8, 2, 0))
    train.xavier_init_weights(gru)
    local g = train.predict_batch(gru, { "go .", "i lost .", "he's calm ." }, c.src_vocab, c.tgt_vocab, 8)
    for i, s in ipairs { "go .", "i lost .", "he's calm ." } do
      assert.are.equal(train.predict_seq2seq(gru, s, c.src_vocab, c.tgt_vocab, 8), g[i])
    end
  end)

  it("makes the schedules and refuses an unknown one", function()
    local p = attn.zeros({ 1 })
    local opt = attn.optim.Adam { params = { p }, lr = 2 }
    local s = run.make_schedule(opt, "noam", { lr = 2, warmup = 4, d_model = 16 })
    helper.assert_close(opt.lr, 2 * 16 ^ -0.5 * 4 ^ -1.5, { rtol = 1e-12 }) -- step 1 of the warmup
    s:step()
    helper.assert_close(opt.lr, 2 * 16 ^ -0.5 * 2 * 4 ^ -1.5, { rtol = 1e-12 })
    assert.is_nil(run.make_schedule(opt, "none", {}))
    assert.has_error(function() run.make_schedule(opt, "linear", {}) end,
      "run: schedule must be none, noam, cosine or step, got linear")
  end)
end)
