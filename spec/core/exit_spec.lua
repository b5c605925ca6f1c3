-- Closing a Lua state stops and joins the worker pool before Lua unloads the
-- library: a worker still starting (or woken by the last job) must never run
-- code that is no longer mapped. ATTN_EXIT_RUNS sets the number of processes
-- (`make test-exit` runs 300; before the fix about 1 run in 8 crashed).
local helper = require "helper"

describe("process exit", function()
  it("never crashes right after set_num_threads(64) and a job", function()
    local runs = tonumber(os.getenv("ATTN_EXIT_RUNS")) or 40
    local ok, kind, code, out = helper.run_lua([[
      local attn = require "attn"
      attn.set_num_threads(64)
      local y = attn.ones({4}) + 1
      assert(y:sum():item() == 8)
      os.exit(0, true)
    ]], { times = runs })
    assert.is_true(ok, string.format("%s %s after %d runs:\n%s", tostring(kind), tostring(code), runs, out))
  end)
end)
