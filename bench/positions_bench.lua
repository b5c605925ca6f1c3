-- Position-scheme rows of the bench: causal dot-product attention forward+backward with rotary
-- positions (attn.rope on q and k, its backward included) and with ALiBi (`alibi = true`, inside
-- the kernel), each against plain attention on the same operands, at N = 1024 and 4096
-- (d = 64, (1, H, N, d) with bench.lua's heads per N: about 8 heads' work at N = 1024), one
-- thread, process CPU time, the best of three rounds. `vs plain` is the scheme's time over
-- plain attention's (the issue asks for within 1.10). bench/bench.lua includes these rows (not
-- with ROWS=book); `lua5.4 bench/positions_bench.lua` runs and prints only them.
local attn = require "attn"
local core = attn.core

local M = {}

local function heads_for(N) return math.max(1, math.min(64, math.floor(8 * (1024 / N) ^ 2 + 0.5))) end

-- Best CPU seconds per call over three rounds of at least `budget` / 3 seconds each.
local function measure(fn, budget)
  fn()
  collectgarbage()
  local best = math.huge
  for _ = 1, 3 do
    local reps, c0, w0 = 0, core.cpu_clock(), core.clock()
    repeat
      fn()
      reps = reps + 1
    until core.clock() - w0 >= budget / 3
    best = math.min(best, (core.cpu_clock() - c0) / reps)
  end
  collectgarbage()
  return best
end

--- The rows: {id, what, size, threads = 1, seconds (forward+backward), vs_plain}.
function M.rows(opts)
  opts = opts or {}
  local budget = opts.quick and 0.3 or 1.0
  local saved = core.get_num_threads()
  core.set_num_threads(1)
  attn.manual_seed(0)
  local rows = {}
  for _, N in ipairs { 1024, 4096 } do
    local H, d = heads_for(N), 64
    local q = attn.randn({ 1, H, N, d }):requires_grad_()
    local k = attn.randn({ 1, H, N, d }):requires_grad_()
    local v = attn.randn({ 1, H, N, d }):requires_grad_()
    local g = attn.randn({ 1, H, N, d })
    local function step(scheme)
      return function()
        q.grad, k.grad, v.grad = nil, nil, nil
        local o = { causal = true, need_weights = false }
        local qq, kk = q, k
        if scheme == "rope" then
          qq, kk = attn.rope(q), attn.rope(k)
        elseif scheme == "alibi" then
          o.alibi = true
        end
        local out = attn.dot_product_attention(qq, kk, v, o)
        out:backward(g)
      end
    end
    local plain
    for _, scheme in ipairs { "plain", "rope", "alibi" } do
      local t = measure(step(scheme), budget)
      if scheme == "plain" then plain = t end
      local what = scheme == "plain" and "attention fwd+bwd, plain" or scheme == "rope" and
        "attention fwd+bwd, RoPE on q and k" or "attention fwd+bwd, ALiBi in the kernel"
      rows[#rows + 1] = { id = string.format("pos_%s_%d", scheme, N), what = what,
        size = string.format("N %d, d %d, %d heads, causal", N, d, H), threads = 1, seconds = t,
        vs_plain = scheme ~= "plain" and t / plain or nil }
      io.stderr:write(string.format("  %-40s N %5d %9.2f ms%s\n", what, N, 1e3 * t,
        scheme ~= "plain" and string.format("  %.3fx plain", t / plain) or ""))
    end
  end
  core.set_num_threads(saved)
  return rows
end

if arg and arg[0] and arg[0]:match("positions_bench%.lua$") then
  print("| row | size | ms | vs plain |")
  print("|---|---|---|---|")
  for _, r in ipairs(M.rows { quick = os.getenv("QUICK") == "1" }) do
    print(string.format("| %s | %s | %.2f | %s |", r.what, r.size, 1e3 * r.seconds,
      r.vs_plain and string.format("%.3fx", r.vs_plain) or ""))
  end
  print("one thread, process CPU time, best of three rounds; machine shared")
end

return M
