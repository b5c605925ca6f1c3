-- Progress display: plain lines on a file, in-place redraws on a terminal,
-- rates and times from an injected clock.
local attn = require "attn"
local progress = attn.progress

-- An output object that collects everything written.
local function fake_out()
  local out = { chunks = {}, flushes = 0 }
  function out:write(...)
    for i = 1, select("#", ...) do self.chunks[#self.chunks + 1] = tostring((select(i, ...))) end
    return self
  end
  function out:flush() self.flushes = self.flushes + 1 end
  function out:text() return table.concat(self.chunks) end
  function out:lines()
    local lines = {}
    for line in self:text():gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
    return lines
  end
  return out
end

-- A clock the spec moves by hand.
local function fake_clock(start)
  local c = { now = start or 100 }
  c.fn = function() return c.now end
  return c
end

local function count(s, plain)
  local n, i = 0, 1
  while true do
    local j = s:find(plain, i, true)
    if not j then return n end
    n, i = n + 1, j + #plain
  end
end

describe("progress.format_time", function()
  it("formats h:mm:ss", function()
    assert.are.equal("1:02:05", progress.format_time(3725))
    assert.are.equal("0:00:00", progress.format_time(0))
    assert.are.equal("0:00:59", progress.format_time(59.9))
    assert.are.equal("0:01:00", progress.format_time(60))
    assert.are.equal("10:00:00", progress.format_time(36000))
    assert.are.equal("100:00:01", progress.format_time(360001))
  end)

  it("shows an unknown time for negative, nan and infinite seconds", function()
    assert.are.equal("-:--:--", progress.format_time(-1))
    assert.are.equal("-:--:--", progress.format_time(0 / 0))
    assert.are.equal("-:--:--", progress.format_time(math.huge))
    assert.are.equal("-:--:--", progress.format_time(nil))
  end)
end)

describe("progress on a file (tty = false)", function()
  it("prints one line per update with every = 1", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { total = 10, label = "train", every = 1, out = out, tty = false, clock = clock.fn }
    for epoch = 1, 10 do
      clock.now = clock.now + 1
      p:update(epoch, { loss = 0.123, tokens = 2541 })
    end
    local summary = p:finish()
    local lines = out:lines()
    assert.are.equal(10, #lines)
    assert.are.equal(0, count(out:text(), "\r"))
    local third = lines[3]
    assert.truthy(third:find("^train epoch 3/10"))
    assert.truthy(third:find("loss 0.1230", 1, true))
    assert.truthy(third:find("2541 tok/s", 1, true))
    assert.truthy(third:find("elapsed 0:00:03", 1, true))
    assert.truthy(third:find("eta 0:00:07", 1, true))
    assert.truthy(lines[10]:find("eta 0:00:00", 1, true))
    assert.are.equal(10, summary.elapsed)
    assert.are.equal(25410, summary.tokens)
    assert.are.equal(2541, summary.tokens_per_sec)
    assert.are.equal(10, summary.updates)
    assert.is_true(out.flushes >= 10)
  end)

  it("defaults to about 20 lines over the run", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { total = 100, out = out, tty = false, clock = clock.fn }
    for epoch = 1, 100 do
      clock.now = clock.now + 0.5
      p:update(epoch, { loss = 1 / epoch })
    end
    p:finish()
    local lines = out:lines()
    assert.are.equal(20, #lines)
    assert.truthy(lines[1]:find("^epoch 5/100"))
    assert.truthy(lines[20]:find("^epoch 100/100"))
  end)

  it("prints every n-th update plus the last, with tokens/sec over the interval", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { total = 10, every = 3, out = out, tty = false, clock = clock.fn }
    for epoch = 1, 10 do
      clock.now = clock.now + 2
      p:update(epoch, { loss = 0.5, tokens = 100 })
    end
    p:finish()
    local lines = out:lines()
    assert.are.equal(4, #lines) -- 3, 6, 9 and the last, 10
    assert.truthy(lines[1]:find("epoch 3/10", 1, true))
    assert.truthy(lines[1]:find("50.00 tok/s", 1, true)) -- 300 tokens in 6 s
    assert.truthy(lines[3]:find("epoch 9/10", 1, true))
    assert.truthy(lines[4]:find("epoch 10/10", 1, true))
    assert.truthy(lines[4]:find("50.00 tok/s", 1, true)) -- 100 tokens in 2 s
  end)

  it("finish prints the last update when the run stops early", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { total = 10, every = 3, out = out, tty = false, clock = clock.fn }
    for epoch = 1, 4 do
      clock.now = clock.now + 1
      p:update(epoch, { loss = 0.25 })
    end
    local summary = p:finish()
    local lines = out:lines()
    assert.are.equal(2, #lines)
    assert.truthy(lines[2]:find("epoch 4/10", 1, true))
    assert.truthy(lines[2]:find("eta 0:00:06", 1, true))
    assert.is_nil(summary.tokens_per_sec)
    assert.are.equal(4, summary.elapsed)
    -- finishing twice prints nothing more and returns the same summary
    assert.are.equal(summary, p:finish())
    assert.are.equal(2, #out:lines())
  end)

  it("shows other metrics after the loss, in key order, and no rate without tokens", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { total = 2, out = out, tty = false, clock = clock.fn }
    clock.now = clock.now + 1
    p:update(1, { loss = 2, lr = 3e-4, acc = 0.875, batch = 12, note = "warmup" })
    p:finish()
    local line = out:lines()[1]
    assert.are.equal("epoch 1/2 | loss 2.0000 | acc 0.8750 | batch 12 | lr 3.000e-04 | note warmup"
      .. " | elapsed 0:00:01 | eta 0:00:01", line)
  end)

  it("estimates the remaining time from the updates seen (resumed runs)", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { total = 10, out = out, tty = false, every = 1, clock = clock.fn }
    clock.now = clock.now + 60
    p:update(6, { loss = 1 })
    assert.truthy(out:lines()[1]:find("eta 0:04:00", 1, true)) -- 60 s per epoch, 4 to go
  end)

  it("works without a total and without an epoch number", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { out = out, tty = false, unit = "step", clock = clock.fn }
    clock.now = clock.now + 3725
    p:update()
    p:update { loss = 0.5 }
    p:finish()
    local lines = out:lines()
    assert.are.equal(2, #lines)
    assert.are.equal("step 1 | elapsed 1:02:05", lines[1])
    assert.are.equal("step 2 | loss 0.5000 | elapsed 1:02:05", lines[2])
  end)

  it("carries tokens over a zero-length interval instead of dividing by zero", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { total = 3, out = out, tty = false, every = 1, clock = clock.fn }
    p:update(1, { tokens = 10 })
    clock.now = clock.now + 1
    p:update(2, { tokens = 10 })
    local lines = out:lines()
    assert.is_nil(lines[1]:find("tok/s", 1, true))
    assert.truthy(lines[2]:find("20.00 tok/s", 1, true))
  end)
end)

describe("progress on a terminal (tty = true)", function()
  it("redraws one line with \\r and ends it with \\n on finish", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { total = 10, label = "train", out = out, tty = true, every = 5, clock = clock.fn }
    for epoch = 1, 10 do
      clock.now = clock.now + 1
      p:update(epoch, { loss = epoch == 1 and 123.456 or 0.123, tokens = 2541 })
      assert.are.equal(0, count(out:text(), "\n"))
    end
    assert.are.equal(10, count(out:text(), "\r")) -- every update redraws on a terminal
    local summary = p:finish()
    local text = out:text()
    assert.are.equal("\n", text:sub(-1))
    assert.are.equal(1, count(text, "\n"))
    assert.truthy(text:find("\rtrain epoch 3/10 | loss 0.1230 | 2541 tok/s", 1, true))
    assert.are.equal(10, summary.elapsed)
  end)

  it("blanks the tail of a longer previous line", function()
    local out, clock = fake_out(), fake_clock()
    local p = progress.new { total = 2, out = out, tty = true, clock = clock.fn }
    p:update(1, { loss = 1, note = "a long note that will disappear" })
    local first = out:text()
    p:update(2, { loss = 1 })
    local second = out:text():sub(#first + 1)
    assert.are.equal(#first, #second) -- the shorter line is padded to the old width
    assert.truthy(second:find("^\repoch 2/2 | loss 1.0000 | elapsed 0:00:00 | eta 0:00:00 +$"))
  end)

  it("finish without any update writes nothing", function()
    local out = fake_out()
    local p = progress.new { total = 2, out = out, tty = true }
    local summary = p:finish()
    assert.are.equal("", out:text())
    assert.are.equal(0, summary.updates)
  end)
end)

describe("progress.new", function()
  it("detects no terminal for an object that is not io.stdout or io.stderr", function()
    local p = progress.new { total = 1, out = fake_out() }
    assert.is_false(p.tty)
  end)

  it("uses a wall clock that does not run backwards", function()
    local a = progress.clock()
    local b = progress.clock()
    assert.is_number(a)
    assert.is_true(b >= a)
  end)

  it("rejects invalid options", function()
    assert.error_matches(function() progress.new { total = 0 } end, "progress.new: total must be a positive integer")
    assert.error_matches(function() progress.new { every = 1.5 } end, "progress.new: every must be a positive integer")
    assert.error_matches(function() progress.new { out = 42 } end, "progress.new: out must be a file")
    assert.error_matches(function() progress.new { tty = "yes" } end, "progress.new: tty must be a boolean")
    assert.error_matches(function() progress.new { totl = 3 } end, "progress.new: unknown option 'totl'")
  end)

  it("rejects updates after finish and bad arguments", function()
    local p = progress.new { total = 3, out = fake_out(), tty = false }
    assert.error_matches(function() p:update("one") end, "progress:update: k must be a number")
    assert.error_matches(function() p:update(1, { tokens = "many" }) end, "metrics.tokens must be a number")
    p:finish()
    assert.error_matches(function() p:update(1) end, "progress:update: called after finish")
  end)

  it("finishes a <close> variable", function()
    local out = fake_out()
    do
      local p <close> = progress.new { total = 2, out = out, tty = true }
      p:update(1)
    end
    assert.are.equal("\n", out:text():sub(-1))
  end)
end)
