-- Where one training step of the book's models goes: forward, loss, backward,
-- clip_grad_norm_ and the optimizer step, each timed on its own (process CPU
-- time, median of ROUNDS rounds of STEPS steps), for the bench's Bahdanau and
-- Transformer settings (batch 64 x 10, vocab 200).
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" OPENBLAS_NUM_THREADS=1 \
--     lua5.4 bench/split_bench.lua [STEPS] [ROUNDS]
local attn = require "attn"
local nn = attn.nn

local STEPS, ROUNDS = tonumber(arg[1] or "50"), tonumber(arg[2] or "5")
local BATCH, T, VOCAB = 64, 10, 200
attn.set_num_threads(1)
attn.manual_seed(1)
local function ids(lo, hi, ...) return attn.randint(lo, hi + 1, { ... }, "int64") end
local src, dec_in = ids(4, VOCAB - 1, BATCH, T), ids(4, VOCAB - 1, BATCH, T)
local lens = ids(2, T, BATCH)

local function split(name, net)
  net:train()
  local opt = attn.optim.Adam { params = net:parameters(), lr = 0.005 }
  local loss = nn.MaskedSoftmaxCELoss()
  local phases = { "forward", "loss", "backward", "clip", "opt" }
  local rounds = {}
  for r = 1, ROUNDS + 1 do -- the first round warms up
    local acc = { forward = 0, loss = 0, backward = 0, clip = 0, opt = 0 }
    for _ = 1, STEPS do
      opt:zero_grad()
      local t0 = os.clock()
      local y = net(src, dec_in, lens)
      local t1 = os.clock()
      local l = loss(y, dec_in, lens):sum()
      local t2 = os.clock()
      l:backward()
      local t3 = os.clock()
      nn.clip_grad_norm_(net, 1)
      local t4 = os.clock()
      opt:step()
      local t5 = os.clock()
      acc.forward, acc.loss, acc.backward = acc.forward + t1 - t0, acc.loss + t2 - t1, acc.backward + t3 - t2
      acc.clip, acc.opt = acc.clip + t4 - t3, acc.opt + t5 - t4
    end
    if r > 1 then rounds[#rounds + 1] = acc end
  end
  local line = { name }
  local total = 0
  for _, p in ipairs(phases) do
    local v = {}
    for i, acc in ipairs(rounds) do v[i] = acc[p] / STEPS * 1e3 end
    table.sort(v)
    local med = v[(#v + 1) // 2]
    total = total + med
    line[#line + 1] = string.format("%s %.3f", p, med)
  end
  line[#line + 1] = string.format("total %.3f ms", total)
  print(table.concat(line, "  "))
end

split("bahdanau   ", nn.EncoderDecoder(nn.Seq2SeqEncoder(VOCAB, 32, 32, 2, 0.2),
  nn.Seq2SeqAttentionDecoder(VOCAB, 32, 32, 2, 0.2)))
split("transformer", nn.EncoderDecoder(nn.TransformerEncoder(VOCAB, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0.2),
  nn.TransformerDecoder(VOCAB, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0.2)))
