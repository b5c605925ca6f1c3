--- Benchmark of the attention kernels against sgemm on the same machine.
-- Run from the repository root:
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" lua5.4 bench/attention_bench.lua
-- Reports, for B*heads = 8 and d = 64, the forward time and GFLOP/s (4*B*N*N*d flops) of
-- dot_product_attention with and without weights, next to batched sgemm (8,N,64)x(8,64,N)
-- and a square 1024 sgemm, for 1 and 2 threads, plus the per-call time of the book's tiny
-- examples. Times are wall-clock (attn.core.clock when present; otherwise os.clock with one
-- thread, and `date +%s.%N` around long batches for two threads).
local attn = require "attn"
local core = require "attn.core"

local BH, D = 8, 64
local SIZES = { 128, 256, 512, 1024, 2048, 4096 }
local BUDGET = 0.25 -- seconds per measurement (at least one call)

local function date_clock()
  local p = io.popen("date +%s.%N")
  local s = p:read("l")
  p:close()
  return tonumber(s)
end

local wall = core.clock
local clock_name = "attn.core.clock (monotonic wall clock)"
if not wall then clock_name = "os.clock (CPU time; 2-thread rows use date +%s.%N around batches)" end

-- Seconds per call of fn: warm up once, then three rounds of batches that double in size until
-- the round's share of the budget is spent (few clock reads, which matters for the popen'd date
-- clock); the fastest round counts, which filters out interference from other processes.
local function time_call(fn, threads)
  fn()
  collectgarbage()
  local clock = wall or (threads == 1 and os.clock) or date_clock
  local best = math.huge
  for _ = 1, 3 do
    local reps, t0 = 0, clock()
    local elapsed
    repeat
      local n = math.max(1, reps)
      for _ = 1, n do fn() end
      reps = reps + n
      collectgarbage()
      elapsed = clock() - t0
    until elapsed >= BUDGET / 3
    best = math.min(best, elapsed / reps)
  end
  return best
end

local function gflops(flops, seconds) return flops / seconds / 1e9 end

local rows = {}
local function line(fmt, ...) rows[#rows + 1] = string.format(fmt, ...) end

local start = wall and wall() or os.time()
attn.manual_seed(0)
attn.no_grad(function()
  for _, threads in ipairs { 1, 2 } do
    attn.set_num_threads(threads)
    line("")
    line("threads = %d   (B*heads = %d, d = %d, forward flops = 4*B*N*N*d)", threads, BH, D)
    line("%6s | %11s %8s | %11s %8s | %8s %9s | %s", "N", "sdpa+w ms", "GFLOP/s", "sdpa ms", "GFLOP/s",
      "sgemm", "sdpa/gemm", "")
    line("%s", string.rep("-", 86))
    for _, n in ipairs(SIZES) do
      local Q = attn.randn({ BH, n, D })
      local K = attn.randn({ BH, n, D })
      local V = attn.randn({ BH, n, D })
      local Kt = K:transpose(2, 3):contiguous()
      local flops = 4 * BH * n * n * D
      local t_w = time_call(function() return attn.dot_product_attention(Q, K, V) end, threads)
      local t_nw = time_call(function() return attn.dot_product_attention(Q, K, V, { need_weights = false }) end, threads)
      local t_mm = time_call(function() return core.matmul(Q, Kt) end, threads)
      local g_mm = gflops(2 * BH * n * n * D, t_mm)
      local g_nw = gflops(flops, t_nw)
      line("%6d | %11.2f %8.1f | %11.2f %8.1f | %8.1f %8.0f%% |", n, t_w * 1e3, gflops(flops, t_w), t_nw * 1e3,
        g_nw, g_mm, 100 * g_nw / g_mm)
      Q, K, V, Kt = nil, nil, nil, nil
      collectgarbage()
    end
    local A, B = attn.randn({ 1024, 1024 }), attn.randn({ 1024, 1024 })
    local t_sq = time_call(function() return core.matmul(A, B) end, threads)
    line("square sgemm 1024: %.2f ms, %.1f GFLOP/s", t_sq * 1e3, gflops(2 * 1024 ^ 3, t_sq))
  end
  attn.set_num_threads(1)

  -- The book's tiny examples (per call, forward only, eval mode).
  local queries = attn.randn({ 2, 1, 20 })
  local keys = attn.ones({ 2, 10, 2 })
  local values = attn.arange(0, 40, 1):reshape(1, 10, 4):expand(2, 10, 4):contiguous()
  local W_q, W_k, w_v = attn.randn({ 20, 8 }), attn.randn({ 2, 8 }), attn.randn({ 8 })
  local q2 = attn.randn({ 2, 1, 2 })
  local t_add = time_call(function()
    return attn.additive_attention(queries:matmul(W_q), keys:matmul(W_k), values, w_v, { valid_lens = { 2, 6 } })
  end, 1)
  local t_dot = time_call(function()
    return attn.dot_product_attention(q2, keys, values, { valid_lens = { 2, 6 } })
  end, 1)
  local X = attn.ones({ 2, 4, 100 })
  local KV = attn.ones({ 2, 6, 100 })
  local Wq, Wk, Wv, Wo = attn.randn({ 100, 100 }), attn.randn({ 100, 100 }), attn.randn({ 100, 100 }),
    attn.randn({ 100, 100 })
  local t_mha = time_call(function()
    local q = attn.split_heads(X:matmul(Wq), 5)
    local k = attn.split_heads(KV:matmul(Wk), 5)
    local v = attn.split_heads(KV:matmul(Wv), 5)
    local out = attn.dot_product_attention(q, k, v, { valid_lens = attn.repeat_interleave({ 3, 2 }, 5) })
    return attn.merge_heads(out, 5):matmul(Wo)
  end, 1)
  line("")
  line("book examples (1 thread, per call):")
  line("  additive attention toy (2x1x20 queries, 2x10x2 keys, h = 8): %8.1f us", t_add * 1e6)
  line("  dot-product attention toy (2x1x2 queries, 2x10x2 keys):      %8.1f us", t_dot * 1e6)
  line("  multi-head shape check (100 hidden, 5 heads, 2x4 / 2x6):     %8.1f us", t_mha * 1e6)
end)

print("attention benchmark; clock: " .. clock_name)
print(table.concat(rows, "\n"))
if wall then print(string.format("\ntotal %.1f s", wall() - start)) end
