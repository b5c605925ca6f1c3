-- LayerNorm cost: the C kernel node (linear.layer_norm) against the node
-- composed from core ops (linear.layer_norm_reference), forward+backward at
-- the Transformer's book size (batch 64 x 10 steps x 32 hidden), and a whole
-- Transformer training step (d2l 11.7 settings) with either path. One thread,
-- CPU time (os.clock), best of five rounds: the machine is shared.
-- Run: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" lua5.4 bench/layernorm_bench.lua
local attn = require "attn"
local linear = require "attn.nn.linear"
local nn = attn.nn

attn.set_num_threads(1)
attn.manual_seed(0)

local function time_it(fn, min_seconds)
  for _ = 1, 3 do fn() end -- warm-up: allocator cache
  local best = math.huge
  for _ = 1, 5 do
    local reps, t0 = 0, os.clock()
    repeat
      fn()
      reps = reps + 1
    until os.clock() - t0 >= min_seconds / 5
    best = math.min(best, (os.clock() - t0) / reps)
  end
  return best
end

local kernel, reference = linear.layer_norm, linear.layer_norm_reference
local paths = { { "kernel", kernel }, { "composed", reference } }

local ln = nn.LayerNorm(32)
local x = attn.randn({ 64, 10, 32 }, { requires_grad = true })
local g = attn.randn { 64, 10, 32 }
local times = {}
for _, p in ipairs(paths) do
  linear.layer_norm = p[2]
  times[p[1]] = time_it(function()
    x.grad, ln.weight.grad, ln.bias.grad = nil, nil, nil
    ln(x):backward(g)
  end, 2)
end
print(string.format("LayerNorm(32) fwd+bwd (64, 10, 32) float32: kernel %.1f us, composed %.1f us (%.2fx)",
  times.kernel * 1e6, times.composed * 1e6, times.composed / times.kernel))

-- Transformer training step, batch 64 x 10, 32 hidden, 4 heads, FFN 64, 2 blocks, vocab 200.
local B, T, V = 64, 10, 200
local seed = 12345
local function random_ids(rows, cols, lo, hi) -- a fixed LCG, independent of the engine's generator
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
local src, dec_in = random_ids(B, T, 4, V - 1), random_ids(B, T, 4, V - 1)
local lens = random_ids(1, B, 2, T):reshape { B }
local net = nn.EncoderDecoder(nn.TransformerEncoder(V, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0.2),
  nn.TransformerDecoder(V, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0.2))
net:train()
local opt = attn.optim.Adam { params = net:parameters(), lr = 0.005 }
local loss = nn.MaskedSoftmaxCELoss()
for _, p in ipairs(paths) do
  linear.layer_norm = p[2]
  times[p[1]] = time_it(function()
    opt:zero_grad()
    loss(net(src, dec_in, lens), dec_in, lens):sum():backward()
    nn.clip_grad_norm_(net, 1)
    opt:step()
  end, 4)
end
linear.layer_norm = kernel
print(string.format("Transformer training step (book settings): kernel %.2f ms, composed %.2f ms (%.2fx)",
  times.kernel * 1e3, times.composed * 1e3, times.composed / times.kernel))
