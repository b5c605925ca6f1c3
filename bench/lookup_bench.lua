-- Cost of a tensor's __index by kind of key: a method (t.dim, what every
-- t:method() call pays), an own field (t.grad), a missing field (t.grad_fn on
-- a leaf, answered after the property table), and Torch-style t[i].
-- CPU time (os.clock), not wall time: on a shared machine it is the steadier
-- measure of a cost that involves no waiting.
-- Run: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" lua5.4 bench/lookup_bench.lua
local attn = require "attn"

local t = attn.zeros(2, 3)
t.grad = attn.zeros(2, 3)
local N = tonumber(os.getenv("N")) or 2000000
local rounds = tonumber(os.getenv("ROUNDS")) or 7

-- The best of several rounds: the machine is shared, the minimum is the cost.
local function per_lookup(f)
  local best = math.huge
  for _ = 1, rounds do
    local t0 = os.clock()
    f()
    best = math.min(best, os.clock() - t0)
  end
  return best / N * 1e9
end

local cases = {
  { "method (t.dim)", function() local x for _ = 1, N do x = t.dim end return x end },
  { "own field (t.grad)", function() local x for _ = 1, N do x = t.grad end return x end },
  { "missing field (t.grad_fn)", function() local x for _ = 1, N do x = t.grad_fn end return x end },
  { "property (t.requires_grad)", function() local x for _ = 1, N do x = t.requires_grad end return x end },
  { "slice (t[2])", function() local x for _ = 1, N // 20 do x = t[2] end return x end, 20 },
}
for _, c in ipairs(cases) do
  print(string.format("%-28s %7.1f ns", c[1], per_lookup(c[2]) * (c[3] or 1)))
end
