-- The probes make bench relies on: the allocator's peak of live bytes, the process CPU clock
-- and the FMA peak measurement.
local attn = require "attn"
local core = attn.core

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
    -- a rate (flop/s), finite and positive; how fast is the bench's "peak" row, which also
    -- reports it against the 4 GFLOP/s floor this spec once asserted
    assert.is_true(flops > 0 and flops < math.huge, "peak " .. flops)
  end)
end)
