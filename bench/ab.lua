-- A/B of the book-sized rows between this checkout and another built one, in one run:
--
--   lua5.4 bench/ab.lua OTHER_CHECKOUT [ROUNDS]
--
-- runs bench/bench.lua (ROWS=book, TORCH=0, from this checkout for both sides, so both time
-- the same workloads) ROUNDS times (default 3) against OTHER_CHECKOUT/lua and ./lua in turn,
-- and prints each row's best time per side and the ratio. Alternating the sides spreads the
-- load of a shared machine over both; compare the ratios, not the absolute times.
local cjson = require "cjson"

local other, rounds = arg[1], tonumber(arg[2] or "3")
if not other or not rounds or rounds < 1 then
  io.stderr:write("usage: lua5.4 bench/ab.lua OTHER_CHECKOUT [ROUNDS]\n")
  os.exit(2)
end
local function built(dir)
  local f = io.open(dir .. "/lua/attn/core.so", "r")
  if f then f:close() end
  return f ~= nil
end
for _, dir in ipairs { other, "." } do
  if not built(dir) then
    io.stderr:write(dir .. "/lua/attn/core.so is missing: run make there first\n")
    os.exit(2)
  end
end

local sides = { { name = "other", dir = other }, { name = "this", dir = "." } }
local best, order = {}, {}
local out = os.tmpname()
os.remove(out)
for round = 1, rounds do
  for _, side in ipairs(sides) do
    local d = side.dir
    local cmd = string.format("ROWS=book TORCH=0 BENCH_OUT='%s' LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;' " ..
      "LUA_CPATH='%s/lua/?.so;;' lua5.4 bench/bench.lua > /dev/null 2>&1", out, d, d, d)
    assert(os.execute(cmd), "bench/bench.lua failed for " .. d)
    local f = assert(io.open(out .. "/bench.json", "r"))
    local rows = cjson.decode(f:read("a")).rows
    f:close()
    for _, r in ipairs(rows) do
      if r.seconds then
        if not best[r.id] then
          best[r.id] = { what = r.what }
          order[#order + 1] = r.id
        end
        local b = best[r.id]
        b[side.name] = math.min(b[side.name] or math.huge, r.seconds)
      end
    end
    io.stderr:write(string.format("  round %d/%d: %s done\n", round, rounds, d))
  end
end
os.execute("rm -rf '" .. out .. "'")

local function fmt(s)
  if s < 1e-3 then return string.format("%.2f us", s * 1e6) end
  return string.format("%.2f ms", s * 1e3)
end
print(string.format("| row | %s | this checkout | other / this |", other))
print("|---|---|---|---|")
for _, id in ipairs(order) do
  local b = best[id]
  if b.other and b.this then
    print(string.format("| %s | %s | %s | %.2fx |", b.what, fmt(b.other), fmt(b.this), b.other / b.this))
  end
end
print(string.format("best of %d alternating rounds, one thread, process CPU time", rounds))
