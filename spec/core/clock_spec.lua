local attn = require "attn"

describe("attn.clock", function()
  it("is a monotonic wall clock: it counts a sleep that CPU time does not", function()
    local t0, cpu0 = attn.clock(), os.clock()
    assert.is_true(os.execute("sleep 0.2"))
    local wall, cpu = attn.clock() - t0, os.clock() - cpu0
    -- seconds: milliseconds would read 200 or more; the upper bound only tells the units apart,
    -- so a loaded machine's late wake-up does not fail it
    assert.is_true(wall >= 0.2 and wall < 60, "slept 0.2 s, clock advanced " .. wall)
    assert.is_true(cpu < 0.1, "CPU time " .. cpu) -- the sleeping child's time is not ours
    local prev = attn.clock()
    for _ = 1, 10000 do
      local now = attn.clock()
      assert(now >= prev, "clock went backwards")
      prev = now
    end
  end)
end)
