-- End-to-end training: small attention models learn generated tasks with
-- attn.optim.Adam, and memory stays flat over 1,000 training steps.
-- Data come from Lua's generator seeded with math.randomseed; the models are
-- seeded with attn.manual_seed, so every run is the same.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn

local function log(fmt, ...) io.stderr:write(string.format(fmt, ...) .. "\n") end

-- ---------------------------------------------------------------- a self-attention reverser

-- Embedding + sinusoidal positional encoding + one multi-head self-attention
-- layer + a linear read-out: output position t must predict input token T+1-t,
-- which the attention finds through the positional encoding.
local Reverser = nn.Module:extend("Reverser")
function Reverser:init(vocab, d, heads)
  self.embedding = nn.Embedding(vocab, d)
  self.pos_encoding = nn.PositionalEncoding{ num_hiddens = d, dropout = 0 }
  self.attention = nn.MultiHeadAttention{ key_size = d, query_size = d, value_size = d, num_hiddens = d,
    num_heads = heads, dropout = 0 }
  self.dense = nn.Linear(d, vocab)
end
function Reverser:forward(ids)
  local X = self.pos_encoding(self.embedding(ids))
  return self.dense(self.attention(X, X, X))
end

local function reverse_batch(B, T, vocab)
  local x, y = {}, {}
  for b = 1, B do
    x[b], y[b] = {}, {}
    for t = 1, T do x[b][t] = math.random(vocab) end
    for t = 1, T do y[b][t] = x[b][T + 1 - t] end
  end
  return x, y
end

local function accuracy(logits, labels)
  return logits:argmax(-1):eq(attn.tensor(labels, "int64")):to(logits:dtype()):mean():item()
end

-- ---------------------------------------------------------------- a Bahdanau-style copier

-- The book's encoder-decoder with additive attention (section B), small: the
-- decoder's query is its previous last-layer state, the context is concatenated
-- with the token embedding, and a GRU step runs per target position.
local Seq2Seq = nn.Module:extend("Seq2Seq")
function Seq2Seq:init(vocab, embed, hidden)
  self.enc_embedding = nn.Embedding(vocab, embed)
  self.encoder = nn.GRU(embed, hidden, 1)
  self.dec_embedding = nn.Embedding(vocab, embed)
  self.attention = nn.AdditiveAttention(hidden, hidden, hidden, 0)
  self.decoder = nn.GRU(embed + hidden, hidden, 1)
  self.dense = nn.Linear(hidden, vocab)
end
function Seq2Seq:forward(src, src_len, dec_in)
  local enc_out, state = self.encoder(self.enc_embedding(src):permute(2, 1, 3))
  local keys = enc_out:permute(2, 1, 3) -- (B, T, h)
  local emb = self.dec_embedding(dec_in):permute(2, 1, 3) -- (T, B, e)
  local outs = {}
  for t = 1, emb:size(1) do
    local query = state:select(1, 1):unsqueeze(2) -- (B, 1, h)
    local context = self.attention(query, keys, keys, src_len)
    local x = attn.cat({ context:permute(2, 1, 3), emb:narrow(1, t, 1) }, 3)
    outs[t], state = self.decoder(x, state)
  end
  return self.dense(attn.cat(outs, 1):permute(2, 1, 3))
end

local PAD, BOS, EOS = 1, 2, 3

-- Copy task with variable lengths: source tokens (4..vocab) padded to T,
-- target = source + <eos>, decoder input = <bos> + target shifted.
local function copy_batch(B, T, vocab)
  local src, src_len, dec_in, label, label_len = {}, {}, {}, {}, {}
  for b = 1, B do
    local n = math.random(2, T - 1)
    src[b], dec_in[b], label[b] = {}, { BOS }, {}
    for t = 1, T do src[b][t] = t <= n and math.random(4, vocab) or PAD end
    for t = 1, T do label[b][t] = t <= n and src[b][t] or (t == n + 1 and EOS or PAD) end
    for t = 2, T do dec_in[b][t] = label[b][t - 1] end
    src_len[b], label_len[b] = n, n + 1
  end
  return src, src_len, dec_in, label, label_len
end

-- ---------------------------------------------------------------- specs

-- Each model trains from three seeds (the generator and the data): the asserts hold for every
-- one, with thresholds measured over 20 seeds, so no seed's luck decides them.
local SEEDS = { 1, 2, 3 }

-- Trains the reverser from `seed`: held-out cross-entropy and token accuracy.
local function train_reverser(seed)
  attn.manual_seed(seed)
  math.randomseed(seed)
  local vocab, T, B = 8, 6, 32
  local m = Reverser(vocab, 32, 4)
  local opt = attn.optim.Adam{ params = m:parameters(), lr = 0.01 }
  local criterion = nn.CrossEntropyLoss { class_dim = -1 } -- logits (B, T, V), labels (B, T)
  local last
  for _ = 1, 300 do
    local x, y = reverse_batch(B, T, vocab)
    opt:zero_grad()
    local loss = criterion(m(x), y)
    loss:backward()
    opt:step()
    last = loss:item()
  end
  m:eval()
  local x, y = reverse_batch(256, T, vocab) -- held out
  local logits = attn.no_grad(m, x)
  return criterion(logits, y):item(), accuracy(logits, y), last
end

-- Trains the copier from `seed`: held-out token-mean CE, the book's number, token accuracy.
local function train_copier(seed)
  attn.manual_seed(seed)
  math.randomseed(seed)
  local vocab, T, B = 10, 6, 32
  local m = Seq2Seq(vocab, 16, 32)
  -- d2l's train_seq2seq init: Xavier-uniform on every Linear and GRU weight matrix
  for _, p in ipairs(m:named_parameters()) do -- in order, so the draws are reproducible
    if p[1]:find("weight") and not p[1]:find("embedding") then nn.init.xavier_uniform_(p[2]) end
  end
  local opt = attn.optim.Adam{ params = m:parameters(), lr = 0.01 }
  local criterion = nn.MaskedSoftmaxCELoss()
  for step = 1, 400 do
    if step == 301 then opt.lr = 0.002 end -- a short cool-down
    local src, sl, di, lab, ll = copy_batch(B, T, vocab)
    opt:zero_grad()
    criterion(m(src, sl, di), lab, ll):sum():backward()
    nn.clip_grad_norm_(m, 1)
    opt:step()
  end
  m:eval()
  local src, sl, di, lab, ll = copy_batch(128, T, vocab)
  local pred = attn.no_grad(m, src, sl, di)
  local mean, book = nn.masked_token_mean(pred, lab, ll)
  -- accuracy over the valid target positions only
  local hits, total = 0, 0
  local argmax = pred:argmax(-1):totable()
  for b = 1, 128 do
    for t = 1, ll[b] do
      total = total + 1
      if argmax[b][t] == lab[b][t] then hits = hits + 1 end
    end
  end
  return mean:item(), book:item(), hits / total
end

describe("training", function()
  it("a multi-head self-attention model learns to reverse sequences (Adam), from any of three seeds", function()
    for _, seed in ipairs(SEEDS) do
      local loss, acc, last = train_reverser(seed)
      log("reverse, seed %d: 300 steps, last train loss %.2e, held-out loss %.2e, token accuracy %.4f", seed, last,
        loss, acc)
      -- seeds 1-20: accuracy 1 (of 1,536 tokens) every time, held-out loss 4.0e-5 to 1.8e-4
      assert.is_true(acc >= 0.99, string.format("seed %d: token accuracy %.4f", seed, acc))
      assert.is_true(loss < 0.01, string.format("seed %d: held-out loss %.2e", seed, loss))
    end
  end)

  it("a Bahdanau-style GRU encoder-decoder learns to copy (MaskedSoftmaxCELoss, clipping, Xavier init), from any of"
    .. " three seeds", function()
    for _, seed in ipairs(SEEDS) do
      local mean, book, acc = train_copier(seed)
      log("copy (seq2seq + additive attention), seed %d: 400 steps, held-out token-mean CE %.2e (book's number %.2e),"
        .. " token accuracy %.4f", seed, mean, book, acc)
      -- seeds 1-20: accuracy 1 (of ~580 target tokens) every time, token-mean CE 1.6e-4 to 4.1e-4
      assert.is_true(acc >= 0.99, string.format("seed %d: token accuracy %.4f", seed, acc))
      assert.is_true(mean < 0.01, string.format("seed %d: held-out token-mean CE %.2e", seed, mean))
    end
  end)

  it("keeps memory flat over 1,000 training steps", function()
    attn.manual_seed(2)
    math.randomseed(2)
    local vocab, T, B = 8, 5, 8
    local m = Reverser(vocab, 16, 2)
    local opt = attn.optim.Adam{ params = m:parameters(), lr = 0.01 }
    local criterion = nn.CrossEntropyLoss { class_dim = -1 } -- logits (B, T, V), labels (B, T)
    local live100, rss100
    local t0 = os.clock()
    for step = 1, 1000 do
      local x, y = reverse_batch(B, T, vocab)
      opt:zero_grad()
      local loss = criterion(m(x), y)
      loss:backward()
      nn.clip_grad_norm_(m, 1)
      opt:step()
      if step == 100 then
        collectgarbage()
        collectgarbage()
        live100, rss100 = attn.memory(), helper.rss_bytes()
      end
    end
    collectgarbage()
    collectgarbage()
    local live1000, rss1000 = attn.memory(), helper.rss_bytes()
    log("memory: live tensor bytes %d after step 100, %d after step 1000; RSS %.1f MB -> %.1f MB; %.2f s",
      live100, live1000, rss100 / 2 ^ 20, rss1000 / 2 ^ 20, os.clock() - t0)
    assert.is_true(live1000 <= live100 + 4096, string.format("live bytes grew: %d -> %d", live100, live1000))
    -- AddressSanitizer quarantines freed memory, so the process RSS says nothing there
    -- (measured from seeds 1-6 in a fresh process: 0 to 3.0 MiB, the most for the first runs)
    if not helper.sanitized then
      assert.is_true(rss1000 - rss100 < 8 * 2 ^ 20, string.format("RSS grew by %d bytes", rss1000 - rss100))
    end
  end)
end)
