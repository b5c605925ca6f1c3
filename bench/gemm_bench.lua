-- Small float32 products: the engine's register-blocked kernel against OpenBLAS on the same
-- operands (core.gemm_ with path "small" and "blas"), one thread, CPU time (os.clock) per call,
-- best of five alternating rounds (the machine is shared: compare the ratios). The first table
-- is the book's training shapes (the products of Linear layers, the GRU and its gradients, as
-- they reach attn_gemm), the second a sweep of cubes and tall products that places the size
-- threshold (ATTN_GEMM_SMALL_MAX in src/attn_gemm.h). "path" is the one matmul takes.
-- Run: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" lua5.4 bench/gemm_bench.lua [isa]
local attn = require "attn"
local core = attn.core

attn.set_num_threads(1)
attn.manual_seed(0)
if arg[1] then core.isa(arg[1]) end

-- { M, N, K, ta, tb, beta, what }: ta/tb 1 = operand read transposed (as the callers pass them)
local book = {
  { 64, 96, 32, 0, 1, 1, "GRU step h W_hh^T (+ bias rows)" },
  { 64, 32, 96, 0, 0, 1, "GRU step backward dgh W_hh" },
  { 96, 32, 64, 1, 0, 0, "GRU cell dW_hh (decoder step)" },
  { 96, 32, 640, 1, 0, 0, "GRU dW_hh over all steps" },
  { 640, 96, 32, 0, 1, 1, "GRU input projections" },
  { 640, 32, 96, 0, 0, 0, "GRU dx" },
  { 640, 32, 32, 0, 1, 0, "Linear(32, 32) forward" },
  { 640, 32, 32, 0, 0, 0, "Linear(32, 32) dx" },
  { 32, 32, 640, 1, 0, 0, "Linear(32, 32) dW" },
  { 160, 200, 32, 0, 1, 0, "output Linear(32, 200), a row block" },
  { 160, 32, 200, 0, 0, 0, "output Linear dx, a row block" },
  { 200, 32, 640, 1, 0, 0, "output Linear dW" },
  { 160, 64, 32, 0, 1, 0, "FFN Linear(32, 64), a row block" },
  { 64, 32, 640, 1, 0, 0, "Linear dW, 64 out" },
}

local function operands(M, N, K, ta, tb)
  local a = ta == 1 and attn.randn(K, M):t() or attn.randn(M, K)
  local b = tb == 1 and attn.randn(N, K):t() or attn.randn(K, N)
  return a, b, attn.randn(M, N)
end

local function time(fn, budget)
  local reps, t0 = 0, os.clock()
  repeat
    fn()
    reps = reps + 1
  until os.clock() - t0 >= budget
  return (os.clock() - t0) / reps
end

-- best seconds per call of each path, the paths taking turns
local function compare(M, N, K, ta, tb, beta)
  local a, b, c = operands(M, N, K, ta, tb)
  local best = {}
  for round = 0, 5 do
    for _, path in ipairs { "small", "blas" } do
      local t = time(function() core.gemm_(c, a, b, 1, beta, path) end, 0.02)
      if round > 0 then best[path] = math.min(best[path] or math.huge, t) end
    end
  end
  local ref = attn.zeros(M, N)
  local small = core.gemm_(attn.zeros(M, N), a, b, 1, 0, "small")
  local taken = core.gemm_(ref, a, b, 1, 0, "auto")
  return best, attn.eq(taken, small):min():item() == 1 and "small" or "blas"
end

local function row(what, M, N, K, ta, tb, beta)
  local best, path = compare(M, N, K, ta, tb, beta)
  local flops = 2 * M * N * K
  print(string.format("| %s | %d x %d x %d%s%s | %.2f us | %.1f | %.2f us | %.1f | %.2fx | %s |", what, M, N, K,
    ta == 1 and " A^T" or "", tb == 1 and " B^T" or "", best.small * 1e6, flops / best.small * 1e-9,
    best.blas * 1e6, flops / best.blas * 1e-9, best.blas / best.small, path))
end

print(string.format("isa %s, one thread, best of 5 rounds (CPU time per call)\n", core.isa()))
local head = "| %s | M x N x K | small | GFLOP/s | OpenBLAS | GFLOP/s | OpenBLAS / small | path |\n"
  .. "|---|---|---|---|---|---|---|---|"
print(string.format(head, "book product"))
for _, s in ipairs(book) do row(s[7], s[1], s[2], s[3], s[4], s[5], s[6]) end
print()
print(string.format(head, "sweep"))
for _, n in ipairs { 16, 32, 48, 64, 96, 128, 160, 192, 256, 384 } do row("cube", n, n, n, 0, 1, 0) end
for _, n in ipairs { 64, 128, 256, 512 } do row("cube, B direct", n, n, n, 0, 0, 0) end
for _, m in ipairs { 1024, 2048, 4096 } do row("tall", m, 32, 32, 0, 1, 0) end
for _, m in ipairs { 1024, 2048 } do row("tall, wide", m, 256, 64, 0, 1, 0) end
for _, k in ipairs { 1024, 4096 } do row("long K", 64, 64, k, 1, 0, 0) end
