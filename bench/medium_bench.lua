-- The medium and whole-vocabulary Transformer steps of issue 25, alone, for profiling and A/B:
--   lua5.4 bench/medium_bench.lua [medium|book_full] [threads] [steps]
-- Builds the model on synthetic ids (the whole fra-eng file's vocabularies: 10,012 English and
-- 17,851 French tokens with min_freq 2; batch 64), runs `steps` training steps (forward, masked
-- softmax cross-entropy, backward, clipping at 1, Adam) and prints the seconds per step split
-- into phases, with the step's matmul FLOPs. bench/bench.lua's medium rows call `M.case`.
local attn = require "attn"
local core = attn.core
local nn = attn.nn

local M = {}

M.SRC_VOCAB, M.TGT_VOCAB = 10012, 17851

--- The two cases: sizes of the model and the batch.
M.cases = {
  medium = { h = 256, heads = 8, ffn = 1024, layers = 3, batch = 64, steps = 20 },
  book_full = { h = 32, heads = 4, ffn = 64, layers = 2, batch = 64, steps = 10 },
}

-- Ids in lo..hi, a (rows, cols) tensor, from a fixed LCG (the bench's own, so runs compare), and
-- the LCG's next state (bench/bench.lua draws all its batches from one running state).
function M.random_ids(seed, rows, cols, lo, hi)
  local ids = {}
  for i = 1, rows do
    ids[i] = {}
    for j = 1, cols do
      seed = (seed * 1103515245 + 12345) % 2147483648
      ids[i][j] = lo + seed % (hi - lo + 1)
    end
  end
  return attn.tensor(ids), seed
end
local random_ids = M.random_ids

-- The matmul FLOPs of one training step (forward and the two backward products per matmul:
-- 3 x 2 m n k), with B T rows per side and T x T attention per head.
function M.flops(c)
  local R, h, f, T, L = c.batch * c.steps, c.h, c.ffn, c.steps, c.layers
  local lin = 0
  lin = lin + L * (4 * h * h + 2 * h * f)           -- encoder: q, k, v, o and the FFN
  lin = lin + L * (8 * h * h + 2 * h * f)           -- decoder: two attentions and the FFN
  local fwd = 2 * R * lin + 2 * R * h * M.TGT_VOCAB -- projections and the output layer
  fwd = fwd + 3 * L * 2 * 2 * c.batch * T * T * h   -- scores and weighted sums, 3 attentions per block pair
  return 3 * fwd
end

--- A step function for case `c`: returns `step()` (one training step) and `phases()` (one step
-- timed per phase by `clock`, seconds in a table).
function M.case(c)
  local h = c.h
  local net = nn.EncoderDecoder(
    nn.TransformerEncoder(M.SRC_VOCAB, h, h, h, h, { h }, h, c.ffn, c.heads, c.layers, 0.1),
    nn.TransformerDecoder(M.TGT_VOCAB, h, h, h, h, { h }, h, c.ffn, c.heads, c.layers, 0.1))
  net:train()
  local src = random_ids(12345, c.batch, c.steps, 4, M.SRC_VOCAB - 1)
  local dec = random_ids(54321, c.batch, c.steps, 4, M.TGT_VOCAB - 1)
  local lens = random_ids(777, 1, c.batch, 2, c.steps):reshape { c.batch }
  local opt = attn.optim.Adam { params = net:parameters(), lr = 0.001 }
  local loss = nn.MaskedSoftmaxCELoss { label_smoothing = c.label_smoothing }
  local function step()
    opt:zero_grad()
    loss(net(src, dec, lens), dec, lens):sum():backward()
    nn.clip_grad_norm_(net, 1)
    opt:step()
  end
  local function phases(clock)
    local t = {}
    local t0 = clock()
    opt:zero_grad()
    local Y = net(src, dec, lens)
    local t1 = clock()
    local l = loss(Y, dec, lens):sum()
    local t2 = clock()
    l:backward()
    local t3 = clock()
    nn.clip_grad_norm_(net, 1)
    local t4 = clock()
    opt:step()
    local t5 = clock()
    t.forward, t.loss, t.backward, t.clip, t.adam = t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4
    t.total = t5 - t0
    return t
  end
  return step, phases, net
end

if arg and arg[0] and arg[0]:match("medium_bench%.lua$") then
  local which, threads, n = arg[1] or "medium", tonumber(arg[2] or "1"), tonumber(arg[3] or "5")
  attn.set_num_threads(threads)
  -- one thread: process CPU time (a shared machine slows it less); more: wall time
  local clock = threads == 1 and core.cpu_clock or core.clock
  local c = M.cases[which]
  local step, phases = M.case(c)
  step()
  local best = nil
  for _ = 1, n do
    collectgarbage()
    local t = phases(clock)
    if not best or t.total < best.total then best = t end
  end
  -- the same-run sgemm rate on the output layer's product
  local A, W = attn.randn { c.batch * c.steps, c.h }, attn.randn { M.TGT_VOCAB, c.h }
  local Wt = W:t()
  local rate = 0
  for _ = 1, 3 do
    local g0 = clock()
    attn.matmul(A, Wt)
    rate = math.max(rate, 2 * c.batch * c.steps * c.h * M.TGT_VOCAB / (clock() - g0))
  end
  local fl = M.flops(c)
  print(string.format("%s threads %d: step %.3f s (forward %.3f, loss %.3f, backward %.3f, clip %.3f, adam %.3f);"
    .. " %.2f GFLOP, sgemm %.1f GFLOP/s, GEMM bound %.3f s = %.0f%%", which, threads, best.total, best.forward,
    best.loss, best.backward, best.clip, best.adam, fl / 1e9, rate / 1e9, fl / rate, 100 * fl / rate / best.total))
end

return M
