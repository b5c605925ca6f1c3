-- The API fuzzer's own checks: a call busy in C, one blocked, a Lua loop and a crash,
-- planted at call 1 (ATTN_FUZZ_PLANT), must each end the run with a failure
-- that names the seed and the call, rather than run on. Nothing here depends on
-- the machine's speed: the limits count the fuzzer's CPU time, the Lua hook
-- (2 s) always fires before the watchdog for C (3 s), and no fuzzed call comes
-- before the planted one.

local helper = require "helper"

local function run_planted(kind)
  local cmd = string.format("ATTN_FUZZ_PLANT=%s %s 2>&1; echo \"exit=$?\"", kind,
    helper.lua_command("tools/fuzz.lua 60 7"))
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return out
end

describe("tools/fuzz.lua", function()
  for kind, verdict in pairs {
    c = "call 1 ran 3 s of CPU time without returning",
    blocked = "call 1 made no progress for 10 s",
    lua = "the fuzzer process ended with status 3\n",
    -- SIGSEGV, or ASan's abort when the suite runs under the sanitizers
    crash = "the fuzzer process ended with status 13[49]\n",
  } do
    it("fails on a planted " .. kind .. " fault and names the seed and call", function()
      local out = run_planted(kind)
      assert.truthy(out:find("FUZZ FAILURE: " .. verdict), out)
      assert.truthy(out:find("seed 7, call #1:\n  planted:" .. kind .. "()", 1, true), out)
      assert.truthy(out:find("replay: lua5.4 tools/fuzz.lua 60 7", 1, true), out)
      assert.truthy(out:find("exit=1\n", 1, true), out)
      -- the run stopped at the fault: the child never printed its end-of-run summary
      assert.falsy(out:find("fuzz: seed 7,", 1, true), out)
    end)
  end
end)
