-- Training-step costs at the book's Bahdanau settings (batch 64, 10 steps,
-- embed 32, GRU 2x32, vocab 200), one thread: the GRU encoder forward+backward,
-- a Bahdanau-style step composed from nn layers, and the Lua-side cost of one
-- differentiable op (record + backward) on a book-sized tensor.
-- Run: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" lua5.4 bench/train_step_bench.lua
local attn = require "attn"
local nn = attn.nn
-- CPU time of this process (one thread): steadier than wall time on a shared machine.
local clock = os.clock

attn.set_num_threads(1)
attn.manual_seed(0)

-- Best of five rounds of at least min_seconds / 5 each: the machine is shared,
-- and the fastest round is the least disturbed one.
local function time_it(fn, min_seconds)
  for _ = 1, 3 do fn() end -- warm-up: allocator cache, BLAS buffers
  local best = math.huge
  for _ = 1, 5 do
    local reps, t0 = 0, clock()
    repeat
      fn()
      reps = reps + 1
    until clock() - t0 >= (min_seconds or 1) / 5
    best = math.min(best, (clock() - t0) / reps)
  end
  return best
end

local B, T, E, H, V = 64, 10, 32, 32, 200

-- Ids as a Lua table from a fixed LCG (independent of the engine's generator).
local seed = 12345
local function random_ids(rows, cols, lo, hi)
  local ids = {}
  for i = 1, rows do
    ids[i] = {}
    for j = 1, cols do
      seed = (seed * 1103515245 + 12345) % 2147483648
      ids[i][j] = lo + seed % (hi - lo + 1)
    end
  end
  return attn.tensor(ids)
end

-- GRU encoder: embedding, 2-layer GRU (dropout 0.1), fwd + bwd
local enc_emb = nn.Embedding(V, E)
local enc_rnn = nn.GRU { input_size = E, num_hiddens = H, num_layers = 2, dropout = 0.1 }
enc_rnn:train()
local src = random_ids(B, T, 1, V)

local function encode()
  local X = enc_emb(src):transpose(1, 2) -- (T, B, E)
  return enc_rnn(X)
end

local gru_s = time_it(function()
  local out, state = encode()
  local loss = out:sum() + state:sum()
  loss:backward()
  for _, p in ipairs(enc_rnn:parameters()) do p.grad = nil end
  enc_emb.weight.grad = nil
end)

-- Bahdanau decoder step by step (d2l's Seq2SeqAttentionDecoder), loss, backward, Adam
local dec_emb = nn.Embedding(V, E)
local attention = nn.AdditiveAttention { key_size = H, query_size = H, num_hiddens = H, dropout = 0.1 }
local dec_rnn = nn.GRU { input_size = E + H, num_hiddens = H, num_layers = 2, dropout = 0.1 }
local dense = nn.Linear(H, V)
local loss_fn = nn.MaskedSoftmaxCELoss()
local params = {}
for _, m in ipairs { enc_emb, enc_rnn, dec_emb, attention, dec_rnn, dense } do
  m:train()
  for _, p in ipairs(m:parameters()) do params[#params + 1] = p end
end
local opt = attn.optim.Adam { params = params, lr = 0.005 }
local tgt = random_ids(B, T, 1, V)
local valid = random_ids(1, B, 2, T):reshape({ B })

local function bahdanau_step()
  local enc_out, state = encode()
  local keys = enc_out:transpose(1, 2) -- (B, T, H)
  local X = dec_emb(tgt):transpose(1, 2) -- (T, B, E)
  local outs = {}
  for t = 1, T do
    local query = state:select(1, 2):unsqueeze(2) -- (B, 1, H)
    local context = attention(query, keys, keys, valid) -- (B, 1, H)
    local x = attn.cat({ context, X:select(1, t):unsqueeze(2) }, 3) -- (B, 1, H + E)
    local out
    out, state = dec_rnn(x:transpose(1, 2), state)
    outs[t] = out
  end
  local pred = dense(attn.cat(outs, 1)):transpose(1, 2) -- (B, T, V)
  local l = loss_fn(pred, tgt, valid):sum()
  opt:zero_grad()
  l:backward()
  nn.clip_grad_norm(params, 1)
  opt:step()
end
local step_s = time_it(bahdanau_step)

-- One differentiable op from Lua: tanh of a (64, 32) tensor, record + backward.
local x = attn.randn({ B, H }, { requires_grad = true })
local op_s = time_it(function()
  local y = x:tanh()
  y:backward(y)
  x.grad = nil
end, 0.5)
local fwd_s = time_it(function() return attn.core.tanh(x) end, 0.5)

print(string.format("%-44s %10.3f ms", "GRU encoder fwd+bwd (B 64, T 10, 2x32)", gru_s * 1e3))
print(string.format("%-44s %10.3f ms", "Bahdanau training step (book settings)", step_s * 1e3))
print(string.format("%-44s %10.2f us", "one op (tanh 64x32) record + backward", op_s * 1e6))
print(string.format("%-44s %10.2f us", "  of which the bare kernel call", fwd_s * 1e6))
