-- Small float32 products: the engine's register-blocked kernel against OpenBLAS on the same
-- operands (core.gemm_ with path "small" and "blas"), one thread, CPU time (os.clock) per call,
-- best of five alternating rounds (the machine is shared: compare the ratios). The first table
-- is the book's training shapes (the products of Linear layers, the GRU and its gradients, the
-- attention's tiny heads, as they reach the kernel), with their calls per training step and the
-- total per step they weigh in each model; the second a sweep of cubes and tall products that places the size
-- threshold (ATTN_GEMM_SMALL_MAX in src/core/attn_gemm.h). "path" is the one matmul takes.
-- Run: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" lua5.4 bench/gemm_bench.lua [isa]
local attn = require "attn"
local core = attn.core

attn.set_num_threads(1)
attn.manual_seed(0)
if arg[1] then core.isa(arg[1]) end

-- { M, N, K, ta, tb, beta, calls per Bahdanau step, per Transformer step, what }: ta/tb 1 =
-- operand read transposed (as the callers pass them). The shapes and call counts are those
-- attn_gemm saw in one training step at the book's settings (batch 64 x 10 steps), logged on
-- 2026-11-22 with the fused decoder and the short-row attention kernels in; the tiny heads'
-- products (the attention reference path's, no longer in either step) close the table.
local book = {
  { 96, 32, 640, 1, 0, 0, 9, 0, "GRU dW over all steps" },
  { 64, 96, 32, 0, 0, 1, 40, 0, "decoder GRU step h W_hh^T (W^T kept)" },
  { 64, 32, 96, 0, 0, 1, 40, 0, "GRU step backward dgh W_hh" },
  { 64, 96, 32, 0, 1, 1, 20, 0, "encoder GRU step h W_hh^T" },
  { 640, 96, 32, 0, 1, 1, 2, 0, "GRU input projections" },
  { 640, 32, 96, 0, 0, 0, 2, 0, "GRU dx" },
  { 64, 32, 96, 0, 0, 0, 20, 0, "decoder GRU dx" },
  { 1, 9, 32, 0, 1, 0, 600, 0, "decoder attention scores, one query" },
  { 9, 32, 1, 1, 0, 1, 600, 0, "decoder attention dV += p^T dO, one query" },
  { 160, 200, 32, 0, 1, 1, 4, 4, "output Linear(32, 200), a row block" },
  { 160, 32, 200, 0, 0, 0, 4, 4, "output Linear dx, a row block" },
  { 64, 32, 640, 1, 0, 0, 3, 3, "output Linear dW, a row block" },
  { 640, 32, 32, 0, 1, 0, 1, 24, "Linear(32, 32) forward" },
  { 640, 32, 32, 0, 0, 0, 0, 24, "Linear(32, 32) dx" },
  { 32, 32, 640, 1, 0, 0, 2, 24, "Linear(32, 32) dW" },
  { 160, 64, 32, 0, 1, 1, 0, 16, "FFN Linear(32, 64), a row block" },
  { 160, 32, 64, 0, 1, 1, 0, 16, "FFN Linear(64, 32), a row block" },
  { 160, 64, 32, 0, 0, 0, 0, 16, "FFN dx, a row block" },
  { 32, 64, 640, 1, 0, 0, 0, 4, "FFN dW" },
  { 10, 10, 8, 0, 1, 0, 0, 0, "a tiny head's scores Q K^T (d_head 8)" },
  { 10, 8, 10, 0, 0, 0, 0, 0, "a tiny head's weights x V" },
  { 10, 8, 10, 1, 0, 1, 0, 0, "a tiny head's dV += P^T dO" },
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

-- a build without gemm_'s reps (another checkout's, for an A/B) takes no 7th argument
local has_reps = not pcall(core.gemm_, attn.zeros(1, 1), attn.zeros(1, 1), attn.zeros(1, 1), 1, 0, "small", 0)

-- best seconds per call of each path, the paths taking turns; a tiny product runs reps times per
-- binding call (core.gemm_'s last argument), so the binding's own cost is spread over them
local function compare(M, N, K, ta, tb, beta)
  local a, b, c = operands(M, N, K, ta, tb)
  local best = {}
  local reps = has_reps and math.max(1, math.floor(2 ^ 21 / (M * N * K))) or 1
  for round = 0, 5 do
    for _, path in ipairs { "small", "blas" } do
      local t = time(function() core.gemm_(c, a, b, 1, beta, path, reps) end, 0.02) / reps
      if round > 0 then best[path] = math.min(best[path] or math.huge, t) end
    end
  end
  local ref = attn.zeros(M, N)
  local small = core.gemm_(attn.zeros(M, N), a, b, 1, 0, "small")
  local taken = core.gemm_(ref, a, b, 1, 0, "auto")
  return best, attn.eq(taken, small):min():item() == 1 and "small" or "blas"
end

local peak = core.fma_peak()

-- one table row; returns the seconds per call of each path
local function row(what, M, N, K, ta, tb, beta, calls)
  local best, path = compare(M, N, K, ta, tb, beta)
  local flops = 2 * M * N * K
  print(string.format("| %s | %d x %d x %d%s%s%s | %s | %.3f us | %.1f | %.0f%% | %.3f us | %.1f | %.2fx | %s |", what,
    M, N, K, ta == 1 and " A^T" or "", tb == 1 and " B^T" or "", beta ~= 0 and " +C" or "", calls or "",
    best.small * 1e6, flops / best.small * 1e-9, flops / best.small / peak * 100, best.blas * 1e6,
    flops / best.blas * 1e-9, best.blas / best.small, path))
  return best
end

print(string.format("isa %s, one thread, best of 5 rounds (CPU time per call), FMA peak %.1f GFLOP/s%s\n",
  core.isa(), peak * 1e-9, has_reps and "" or " (no reps: tiny rows include the binding's cost)"))
local head = "| %s | M x N x K | calls/step B, T | small | GFLOP/s | %% peak | OpenBLAS | GFLOP/s | OpenBLAS / small | path |\n"
  .. "|---|---|---|---|---|---|---|---|---|---|"
print(string.format(head, "book product"))
local per_step = { { small = 0, blas = 0 }, { small = 0, blas = 0 } }
for _, s in ipairs(book) do
  local best = row(s[9], s[1], s[2], s[3], s[4], s[5], s[6], s[7] .. ", " .. s[8])
  for m = 1, 2 do
    for p, t in pairs(best) do per_step[m][p] = per_step[m][p] + t * s[6 + m] end
  end
end
print()
for m, model in ipairs { "Bahdanau", "Transformer" } do
  local t = per_step[m]
  print(string.format("the %s step's products weighted by their calls: small %.1f us, OpenBLAS %.1f us (%.2fx)", model,
    t.small * 1e6, t.blas * 1e6, t.blas / t.small))
end
print()
print(string.format(head, "sweep"))
for _, n in ipairs { 16, 32, 48, 64, 96, 128, 160, 192, 256, 384 } do row("cube", n, n, n, 0, 1, 0) end
for _, n in ipairs { 64, 128, 256, 512 } do row("cube, B direct", n, n, n, 0, 0, 0) end
for _, m in ipairs { 1024, 2048, 4096 } do row("tall", m, 32, 32, 0, 1, 0) end
for _, m in ipairs { 1024, 2048 } do row("tall, wide", m, 256, 64, 0, 1, 0) end
for _, k in ipairs { 1024, 4096 } do row("long K", 64, 64, k, 1, 0, 0) end
