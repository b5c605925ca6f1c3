-- The probes make bench relies on: the allocator's peak of live bytes, the process CPU clock
-- and the FMA peak measurement.
local attn = require "attn"
local core = attn.core
local helper = require "helper"

describe("bench probes", function()
  it("peak_memory counts the most bytes live at once since the last reset", function()
    collectgarbage()
    local live = core.memory()
    core.peak_memory(true)
    assert.are.equal(live, core.peak_memory())
    do
      local t = attn.zeros { 256, 1024 } -- 1 MiB of float32
      assert.is_true(core.peak_memory() >= live + t:numel() * 4)
    end
    collectgarbage()
    collectgarbage()
    local peak = core.peak_memory(true) -- reading with reset returns the old peak
    assert.is_true(peak >= live + 2 ^ 20)
    assert.is_true(core.peak_memory() < peak, "the reset starts from the bytes live now")
  end)

  it("cpu_clock advances with work and not while sleeping", function()
    local c0 = core.cpu_clock()
    local x = 0
    for i = 1, 2e6 do x = x + i % 7 end
    local spent = core.cpu_clock() - c0
    assert.is_true(spent > 0 and x > 0)
    local c1, w1 = core.cpu_clock(), core.clock()
    os.execute("sleep 0.2")
    assert.is_true(core.clock() - w1 >= 0.15)
    assert.is_true(core.cpu_clock() - c1 < 0.1, "sleeping uses no CPU time")
  end)

  it("fma_peak measures the active instruction-set path", function()
    local flops, isa = core.fma_peak()
    assert.are.equal(core.isa(), isa)
    -- at least one FMA per cycle of a 4-wide vector at 0.5 GHz: any machine this runs on (that
    -- much slower when emulated), except under the sanitizers' instrumented, unoptimised build
    assert.is_true(flops > (helper.sanitized and 0 or 4e9 / helper.slowdown), "peak " .. flops)
  end)
end)
