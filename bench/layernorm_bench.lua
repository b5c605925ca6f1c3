-- LayerNorm cost: the C kernel node (linear.layer_norm) against the node
-- composed from core ops (linear.layer_norm_composed), forward+backward at
-- the Transformer's book size (batch 64 x 10 steps x 32 hidden), and a whole
-- Transformer training step (d2l 11.7 settings) with either path. One thread,
-- CPU time (os.clock), best of five alternating rounds: the machine is shared.
-- Run: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" lua5.4 bench/layernorm_bench.lua
local attn = require "attn"
local nn = attn.nn

attn.set_num_threads(1)
attn.manual_seed(0)

-- The paths: every LayerNorm and AddNorm of the timed modules with its own
-- `fused` field unset (the kernel nodes) or false (the composed nodes,
-- layer_norm_composed under dropout and add). attn.nn.fused's rule.
local paths = { { "kernel", nil }, { "composed", false } }

-- Best CPU time per call of fn under each path, the paths taking turns
-- round by round so a load change on the machine hits both alike.
local function compare(fn, min_seconds, root)
  local norms = {}
  for _, m in ipairs(root:modules()) do
    if getmetatable(m) == nn.LayerNorm or getmetatable(m) == nn.AddNorm then norms[#norms + 1] = m end
  end
  assert(#norms > 0, "no LayerNorm to time")
  local best = {}
  for round = 0, 5 do -- round 0 warms up (allocator cache)
    for _, p in ipairs(paths) do
      for _, m in ipairs(norms) do m.fused = p[2] end
      local reps, t0 = 0, os.clock()
      repeat
        fn()
        reps = reps + 1
      until os.clock() - t0 >= min_seconds / 10
      if round > 0 then best[p[1]] = math.min(best[p[1]] or math.huge, (os.clock() - t0) / reps) end
    end
  end
  for _, m in ipairs(norms) do m.fused = nil end
  return best
end

local ln = nn.LayerNorm(32)
local x = attn.randn({ 64, 10, 32 }, { requires_grad = true })
local g = attn.randn { 64, 10, 32 }
local times = compare(function()
  x.grad, ln.weight.grad, ln.bias.grad = nil, nil, nil
  ln(x):backward(g)
end, 2, ln)
print(string.format("LayerNorm(32) fwd+bwd (64, 10, 32) float32: kernel %.1f us, composed %.1f us (%.2fx)",
  times.kernel * 1e6, times.composed * 1e6, times.composed / times.kernel))

-- Transformer training step, batch 64 x 10, 32 hidden, 4 heads, FFN 64, 2 blocks, vocab 200.
local B, T, V = 64, 10, 200
-- ids and lengths from the engine's seeded generator (a timing needs no more)
local src, dec_in = attn.randint(4, V, { B, T }), attn.randint(4, V, { B, T })
local lens = attn.randint(2, T + 1, { B })
local net = nn.EncoderDecoder(nn.TransformerEncoder(V, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0.2),
  nn.TransformerDecoder(V, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0.2))
net:train()
local opt = attn.optim.Adam { params = net:parameters(), lr = 0.005 }
local loss = nn.MaskedSoftmaxCELoss()
times = compare(function()
  opt:zero_grad()
  loss(net(src, dec_in, lens), dec_in, lens):sum():backward()
  nn.clip_grad_norm_(net, 1)
  opt:step()
end, 6, net)
print(string.format("Transformer training step (book settings): kernel %.2f ms, composed %.2f ms (%.2fx)",
  times.kernel * 1e3, times.composed * 1e3, times.composed / times.kernel))
