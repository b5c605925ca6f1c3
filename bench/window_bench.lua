-- Window attention rows of the bench: local (sliding-window) attention with window 128 against
-- full attention at N 16384, d 64, one head, forward and forward+backward, causal and not
-- (issue 21: the window costs O(N r), at least 10x less than full attention in the forward).
-- Process CPU time, one thread, the best of two calls (a full call takes seconds).
-- bench/bench.lua includes these rows (not with ROWS=book); `lua5.4 bench/window_bench.lua` runs
-- and prints only them (QUICK=1: N 4096).
local attn = require "attn"
local core = attn.core

local M = {}

local function best(fn)
  local t = math.huge
  for _ = 1, 2 do
    local c0 = core.cpu_clock()
    fn()
    t = math.min(t, core.cpu_clock() - c0)
  end
  return t
end

--- The rows: {id, what, size, threads = 1, seconds, speedup (full / window)}.
function M.rows(opts)
  opts = opts or {}
  local N, d, r = opts.quick and 4096 or 16384, 64, 128
  local saved = core.get_num_threads()
  core.set_num_threads(1)
  attn.manual_seed(0)
  local q, k, v, dout = attn.randn { 1, N, d }, attn.randn { 1, N, d }, attn.randn { 1, N, d }, attn.randn { 1, N, d }
  local rows = {}
  for _, causal in ipairs { false, true } do
    local t = {}
    for _, window in ipairs { r, false } do
      local o = { need_weights = false, causal = causal, window = window or nil }
      local out, _, _, lse = core.sdpa_forward(q, k, v, o)
      local fwd = best(function() return core.sdpa_forward(q, k, v, o) end)
      local bwd = best(function() return core.sdpa_backward(q, k, v, o, dout, nil, nil, nil, out, lse) end)
      t[window and "window" or "full"] = { fwd = fwd, fwdbwd = fwd + bwd }
    end
    for _, pass in ipairs { "fwd", "fwdbwd" } do
      for _, kind in ipairs { "window", "full" } do
        local speedup = kind == "window" and t.full[pass] / t.window[pass] or nil
        rows[#rows + 1] = {
          id = string.format("window_%d_%s_%s%s", N, kind, pass, causal and "_causal" or ""),
          what = string.format("%s attention %s%s", kind == "window" and "window " .. r or "full",
            pass == "fwd" and "forward" or "forward+backward",
            speedup and string.format(" (%.1fx faster than full)", speedup) or ""),
          size = string.format("N %d, d %d, 1 head%s", N, d, causal and ", causal" or ""), threads = 1,
          seconds = t[kind][pass], speedup = speedup,
        }
      end
    end
  end
  core.set_num_threads(saved)
  return rows
end

if arg and arg[0] and arg[0]:match("window_bench%.lua$") then
  print("| row | size | seconds | full / window |")
  print("|---|---|---|---|")
  for _, row in ipairs(M.rows { quick = os.getenv("QUICK") == "1" }) do
    print(string.format("| %s | %s | %.4f | %s |", row.what, row.size, row.seconds,
      row.speedup and string.format("%.1fx", row.speedup) or ""))
  end
  print("one thread, process CPU time, best of two calls; machine shared")
end

return M
