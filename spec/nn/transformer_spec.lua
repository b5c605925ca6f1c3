-- The book's Transformer: section F's shape checks, the book's state-dict keys,
-- per-layer and per-head weights, incremental decoding against the full
-- causal forward, and a short training run.
local attn = require "attn"
local fx = require "nn.seq2seq_fixtures"
local s2s = require "attn.d2l.train"
local nn = attn.nn
require "helper" -- assert.close

local function all_rows_equal(t)
  local rows = t:reshape({ -1, t:size(-1) }):totable()
  for i = 2, #rows do
    for j = 1, #rows[1] do
      if math.abs(rows[i][j] - rows[1][j]) > 1e-6 then return false end
    end
  end
  return true
end

-- The keys of the book's modules, written from their __init__: num_hiddens h,
-- FFN width f, 2 blocks, vocabulary v.
local function encoder_keys(prefix, v, h, f)
  local out = { { prefix .. "embedding.weight", { v, h } } }
  for i = 0, 1 do
    local b = prefix .. "blks.block" .. i .. "."
    for _, w in ipairs { "W_q", "W_k", "W_v", "W_o" } do out[#out + 1] = { b .. "attention." .. w .. ".weight", { h, h } } end
    out[#out + 1] = { b .. "addnorm1.ln.weight", { h } }
    out[#out + 1] = { b .. "addnorm1.ln.bias", { h } }
    out[#out + 1] = { b .. "ffn.dense1.weight", { f, h } }
    out[#out + 1] = { b .. "ffn.dense1.bias", { f } }
    out[#out + 1] = { b .. "ffn.dense2.weight", { h, f } }
    out[#out + 1] = { b .. "ffn.dense2.bias", { h } }
    out[#out + 1] = { b .. "addnorm2.ln.weight", { h } }
    out[#out + 1] = { b .. "addnorm2.ln.bias", { h } }
  end
  return out
end

local function decoder_keys(prefix, v, h, f)
  local out = { { prefix .. "embedding.weight", { v, h } } }
  for i = 0, 1 do
    local b = prefix .. "blks.block" .. i .. "."
    local function attention(name)
      for _, w in ipairs { "W_q", "W_k", "W_v", "W_o" } do out[#out + 1] = { b .. name .. "." .. w .. ".weight", { h, h } } end
    end
    local function addnorm(name)
      out[#out + 1] = { b .. name .. ".ln.weight", { h } }
      out[#out + 1] = { b .. name .. ".ln.bias", { h } }
    end
    attention("attention1")
    addnorm("addnorm1")
    attention("attention2")
    addnorm("addnorm2")
    out[#out + 1] = { b .. "ffn.dense1.weight", { f, h } }
    out[#out + 1] = { b .. "ffn.dense1.bias", { f } }
    out[#out + 1] = { b .. "ffn.dense2.weight", { h, f } }
    out[#out + 1] = { b .. "ffn.dense2.bias", { h } }
    addnorm("addnorm3")
  end
  out[#out + 1] = { prefix .. "dense.weight", { v, h } }
  out[#out + 1] = { prefix .. "dense.bias", { v } }
  return out
end

-- A small Transformer (hidden 8, 2 heads, FFN 16, 2 layers), the book's argument order.
local function transformer(src_v, tgt_v, dropout, opts)
  local h = 8
  local enc = nn.TransformerEncoder(src_v, h, h, h, h, { h }, h, 16, 2, 2, dropout)
  local dec = nn.TransformerDecoder(tgt_v, h, h, h, h, { h }, h, 16, 2, 2, dropout, opts)
  return nn.EncoderDecoder(enc, dec)
end

describe("nn Transformer", function()
  before_each(function() attn.manual_seed(12) end)

  it("passes the book's shape checks (section F)", function()
    local ffn = nn.PositionWiseFFN(4, 4, 8):eval()
    local y = ffn(attn.ones({ 2, 3, 4 }))
    assert.same({ 2, 3, 8 }, y:shape())
    assert.is_true(all_rows_equal(y))
    local add_norm = nn.AddNorm({ 3, 4 }, 0.5):eval()
    assert.same({ 2, 3, 4 }, add_norm(attn.ones({ 2, 3, 4 }), attn.ones({ 2, 3, 4 })):shape())
    local X, valid_lens = attn.ones({ 2, 100, 24 }), attn.tensor({ 3, 2 })
    local encoder_blk = nn.TransformerEncoderBlock(24, 24, 24, 24, { 100, 24 }, 24, 48, 8, 0.5):eval()
    assert.same({ 2, 100, 24 }, encoder_blk(X, valid_lens):shape())
    local encoder = nn.TransformerEncoder(200, 24, 24, 24, 24, { 100, 24 }, 24, 48, 8, 2, 0.5):eval()
    assert.same({ 2, 100, 24 }, encoder(attn.ones({ 2, 100 }), valid_lens):shape())
    local decoder_blk = nn.TransformerDecoderBlock(24, 24, 24, 24, { 100, 24 }, 24, 48, 8, 0.5, 0):eval()
    local state = { encoder_blk(X, valid_lens), valid_lens, {} }
    assert.same({ 2, 100, 24 }, (decoder_blk(X, state)):shape())
    assert.same({ 2, 100, 24 }, state[3][1]:shape()) -- the block cached its input
  end)

  it("keeps weights per layer and head: the encoder's stack to (layers, heads, Nq, Nk), the decoder's per step",
    function()
      local h = 32 -- the book's translation settings: 2 layers, 4 heads, 10 steps
      local enc = nn.TransformerEncoder(12, h, h, h, h, { h }, h, 64, 4, 2, 0.1):eval()
      local dec = nn.TransformerDecoder(11, h, h, h, h, { h }, h, 64, 4, 2, 0.1):eval()
      local X, lens = attn.tensor({ { 5, 6, 7, 4, 2, 2, 2, 2, 2, 2 } }), attn.tensor({ 4 })
      local enc_out = enc(X, lens)
      assert.same({ 2, 4, 10, 10 }, enc:stacked_attention_weights():shape())
      local w = enc:stacked_attention_weights()
      assert.close(w:sum(-1), attn.ones({ 2, 4, 10 }), { atol = 1e-5 })
      assert.equal(0, w:narrow(4, 5, 6):abs():sum():item()) -- keys past the valid length get nothing
      local state = dec:init_state({ enc_out }, lens)
      local y = attn.tensor({ { 3 } })
      for t = 1, 3 do
        y, state = dec(y, state)
        y = y:argmax(3)
        local self_w, cross_w = dec.attention_weights[1], dec.attention_weights[2]
        assert.equal(2, #self_w)
        assert.same({ 1, 4, 1, t }, self_w[2]:shape())
        assert.same({ 1, 4, 1, 10 }, cross_w[1]:shape())
      end
    end)

  it("loads the book's state dict unchanged (keys, order, shapes)", function()
    local net = transformer(12, 11, 0)
    local spec = encoder_keys("encoder.", 12, 8, 16)
    for _, e in ipairs(decoder_keys("decoder.", 11, 8, 16)) do spec[#spec + 1] = e end
    local names, sd = {}, {}
    for i, e in ipairs(spec) do
      names[i] = e[1]
      sd[e[1]] = attn.randn(e[2])
    end
    assert.same(names, net:state_dict_keys())
    local report = net:load_state_dict(sd)
    assert.same({}, report.missing_keys)
    assert.same({}, report.unexpected_keys)
    assert.close(net.decoder.blks[2].ffn.dense2.weight, sd["decoder.blks.block1.ffn.dense2.weight"], { atol = 0 })
  end)

  it("decodes incrementally exactly as the full causal forward over the same prefix", function()
    local net = transformer(12, 11, 0.1, { positions = "absolute" }):eval()
    local X, lens = attn.tensor({ { 5, 6, 7, 10, 4, 2 }, { 6, 4, 2, 2, 2, 2 } }), attn.tensor({ 5, 2 })
    local enc_out = table.pack(net.encoder(X, lens))
    local Y = attn.tensor({ { 3, 5, 6, 7, 8 }, { 3, 9, 8, 5, 5 } })
    local full = net.decoder(Y, net.decoder:init_state(enc_out, lens))
    local state, steps = net.decoder:init_state(enc_out, lens), {}
    for t = 1, 5 do steps[t], state = net.decoder(Y:narrow(2, t, 1), state) end
    assert.close(attn.cat(steps, 2), full, { atol = 1e-5 })
    -- the full forward is causal: a later token does not change earlier outputs
    local Y2 = Y:clone()
    Y2:set(11, 1, 5)
    local full2 = net.decoder(Y2, net.decoder:init_state(enc_out, lens))
    assert.close(full2:narrow(2, 1, 4), full:narrow(2, 1, 4), { atol = 1e-6 })
    -- the book's positions add P[0] at every one-step call: the same first step, then different
    local book = transformer(12, 11, 0.1):eval()
    book:load_state_dict(net:state_dict())
    local bstate, bsteps = book.decoder:init_state(enc_out, lens), {}
    for t = 1, 5 do bsteps[t], bstate = book.decoder(Y:narrow(2, t, 1), bstate) end
    assert.close(bsteps[1], steps[1], { atol = 1e-6 })
    assert.is_true((bsteps[3] - steps[3]):abs():max():item() > 1e-3)
  end)

  it("the loss falls in a short run of train_seq2seq, from any of three seeds", function()
    -- last/first epoch's loss over seeds 1-20: 0.41-0.54 (seed 12, once this spec's only seed,
    -- is the lowest; seeds 1, 3, 8 and 10 of the first ten missed the old bound of 0.5)
    for seed = 1, 3 do
      attn.manual_seed(seed)
      local data_iter, src_vocab, tgt_vocab = fx.task(48, 16, 6)
      local net = transformer(#src_vocab, #tgt_vocab, 0.1)
      local history = s2s.train_seq2seq(net, data_iter, { lr = 0.01, epochs = 12, tgt_vocab = tgt_vocab,
        progress = false })
      assert.is_true(history[12].loss < 0.65 * history[1].loss,
        string.format("seed %d: loss %.4f -> %.4f", seed, history[1].loss, history[12].loss))
    end
  end)
end)
