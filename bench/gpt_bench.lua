-- Decode rows of the bench: tokens per second of nn.DecoderOnlyTransformer's greedy generation
-- with and without the key/value cache, at 256 and 1024 new tokens (examples/gpt.lua's default
-- model: d_model 64, 4 query heads, 2 key/value heads, 2 layers), beside PyTorch running the
-- same model with a hand-written cache (bench/torch_gpt_bench.py). One generation per row,
-- process CPU time, one thread. bench/bench.lua includes these rows (not with ROWS=book);
-- `lua5.4 bench/gpt_bench.lua` runs and prints only them (QUICK=1: 256 tokens only).
local attn = require "attn"
local core = attn.core

local M = {}

local CONFIG = { vocab_size = 77, d_model = 64, num_heads = 4, num_kv_heads = 2, num_layers = 2, ffn_hidden = 170,
  max_len = 1040 }
local PROMPT = 16

--- The rows: {id, what, size, threads = 1, seconds (per token), torch_seconds, vs_torch}.
function M.rows(opts)
  opts = opts or {}
  local lengths = opts.quick and { 256 } or { 256, 1024 }
  local saved = core.get_num_threads()
  core.set_num_threads(1)
  attn.manual_seed(0)
  local m = attn.nn.DecoderOnlyTransformer(CONFIG)
  local prompt = {}
  for t = 1, PROMPT do prompt[t] = (t * 7) % CONFIG.vocab_size + 1 end
  m:generate({ prompt }, { max_new_tokens = 8, temperature = 0 }) -- warm-up
  local rows, cases = {}, {}
  for _, n in ipairs(lengths) do
    for _, cache in ipairs { true, false } do
      local id = string.format("gpt_decode_%d_%s", n, cache and "cache" or "nocache")
      collectgarbage()
      local c0 = core.cpu_clock()
      m:generate({ prompt }, { max_new_tokens = n, temperature = 0, cache = cache })
      local t = core.cpu_clock() - c0
      rows[#rows + 1] = { id = id, what = string.format("decode, %s", cache and "KV cache" or "recompute (no cache)"),
        size = string.format("%d new tokens, %d-token prompt", n, PROMPT), threads = 1, seconds = t / n, total = t,
        n = n }
      cases[#cases + 1] = { id = id, new_tokens = n, cache = cache }
      io.stderr:write(string.format("  %-34s %6d tokens %9.1f tokens/s\n", rows[#rows].what, n, n / t))
    end
  end
  core.set_num_threads(saved)
  if opts.torch ~= false then
    local ok, cjson = pcall(require, "cjson")
    local input = os.tmpname()
    local fh = assert(io.open(input, "w"))
    fh:write(cjson.encode { config = CONFIG, prompt = PROMPT, cases = cases })
    fh:close()
    local p = io.popen("OMP_NUM_THREADS=1 /usr/bin/python3 bench/torch_gpt_bench.py < " .. input)
    local text = p:read("a")
    p:close()
    os.remove(input)
    local res
    if ok then ok, res = pcall(cjson.decode, text) end
    if ok and type(res) == "table" then
      for _, r in ipairs(rows) do
        local t = res.rows[r.id]
        if t then
          r.torch_seconds = t / r.n
          r.vs_torch = r.torch_seconds / r.seconds
        end
      end
      M.torch_version = res.version
    end
  end
  return rows
end

if arg and arg[0] and arg[0]:match("gpt_bench%.lua$") then
  print("| row | size | attn tokens/s | PyTorch tokens/s | vs PyTorch |")
  print("|---|---|---|---|---|")
  for _, r in ipairs(M.rows { quick = os.getenv("QUICK") == "1" }) do
    print(string.format("| %s | %s | %.1f | %s | %s |", r.what, r.size, 1 / r.seconds,
      r.torch_seconds and string.format("%.1f", 1 / r.torch_seconds) or "", r.vs_torch and
      string.format("%.2fx", r.vs_torch) or ""))
  end
  if M.torch_version then print("PyTorch " .. M.torch_version .. ", one thread; machine shared") end
end

return M
