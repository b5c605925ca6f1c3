-- make bench: the engine's core throughput, then every bench/*_bench.lua.
-- All figures come from one run on this machine; compare ratios, not absolutes.
local attn = require "attn"
local clock = attn.core.clock

local function time_it(fn, min_seconds)
  fn() -- warm-up: first touch of fresh pages, BLAS buffers
  local reps, t0 = 0, clock()
  repeat
    fn()
    reps = reps + 1
  until clock() - t0 >= (min_seconds or 0.5)
  return (clock() - t0) / reps
end

print(string.format("attn %s bench, %d threads", attn._VERSION, attn.get_num_threads()))
print("\n-- matmul (cblas gemm inside the worker pool)")
print(string.format("%-28s %10s %10s", "shape", "ms/call", "GFLOP/s"))
for _, case in ipairs {
  { 256, 256, 256 }, { 1024, 1024, 1024 }, { 2048, 64, 2048 }, { 8, 512, 64, 512 },
} do
  local a, b, flops
  if #case == 3 then
    local m, k, n = case[1], case[2], case[3]
    a, b, flops = attn.randn({ m, k }), attn.randn({ k, n }), 2 * m * k * n
  else
    local bs, m, k, n = case[1], case[2], case[3], case[4]
    a, b, flops = attn.randn({ bs, m, k }), attn.randn({ bs, k, n }), 2 * bs * m * k * n
  end
  local s = time_it(function() return attn.core.matmul(a, b) end)
  print(string.format("%-28s %10.3f %10.1f", table.concat(case, "x"), s * 1e3, flops / s / 1e9))
end

print("\n-- elementwise and softmax on 4M float32 elements")
local x, y = attn.randn({ 2048, 2048 }), attn.randn({ 2048, 2048 })
local n = x:numel()
for _, case in ipairs {
  { "add (contiguous)", function() return attn.core.add(x, y) end, 12 },
  { "add (transposed operand)", function() return attn.core.add(x, y:t()) end, 12 },
  { "exp", function() return attn.core.exp(x) end, 8 },
  { "softmax over last dim", function() return attn.core.softmax(x, 2) end, 8 },
  { "sum over last dim", function() return attn.core.sum(x, 2) end, 4 },
} do
  local s = time_it(case[2])
  print(string.format("%-28s %10.3f ms %8.2f GB/s", case[1], s * 1e3, n * case[3] / s / 1e9))
end

-- The caching allocator's effect on an attention-sized step (4 MiB outputs):
-- with the cache off, freed blocks go back to glibc, which unmaps large ones.
print("\n-- allocation reuse: 1024x1024 scores, softmax, weighted sum; 30 steps")
local q = attn.randn({ 1024, 64 })
local function attention_step() return attn.core.matmul(attn.core.softmax(attn.core.matmul(q, q:t()), 2), q) end
local function faults() return (attn.core.rusage()) end
local function measure(limit)
  attn.set_cache_limit(limit)
  attn.empty_cache()
  for _ = 1, 3 do attention_step() end
  collectgarbage()
  local f0, t0 = faults(), clock()
  for _ = 1, 30 do
    attention_step()
    collectgarbage("step", 0)
  end
  return (clock() - t0) / 30, (faults() - f0) / 30
end
local t_off, f_off = measure(0)
local t_on, f_on = measure(4 * 2 ^ 30)
print(string.format("cache off: %.2f ms/step, %.0f minor faults/step", t_off * 1e3, f_off))
print(string.format("cache on:  %.2f ms/step, %.0f minor faults/step (%.2fx faster)", t_on * 1e3, f_on,
  t_off / t_on))

-- Component benches.
local names = {}
for f in io.popen("ls bench/*_bench.lua 2>/dev/null"):lines() do names[#names + 1] = f end
for _, f in ipairs(names) do
  print("\n== " .. f)
  dofile(f)
end
