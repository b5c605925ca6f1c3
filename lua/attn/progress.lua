--- Progress display for training loops.
-- Shows the epoch (k/total), the metrics given, tokens per second, elapsed
-- time and an estimate of the remaining time. On a terminal it redraws one
-- line in place ("\r" and blanks over the rest of the previous line); on a
-- file or pipe it prints plain lines every `every` updates plus the last one,
-- so logs stay short.
--
-- Wall clock: `attn.core.clock` (a monotonic clock in the C module) when it
-- exists. Without it the module reads `/proc/uptime` (Linux, 10 ms
-- resolution); where that is missing too it falls back to `os.clock`, which
-- measures CPU time, not wall time, kept within a second of the wall time
-- measured by `os.time`. That last fallback is coarse: it overstates time
-- spent in multithreaded BLAS and understates time spent waiting on I/O.
-- @module attn.progress
-- @usage
-- local p = attn.progress.new{total = epochs, label = "train"}
-- for epoch = 1, epochs do
--   local loss, ntokens = train_one_epoch()
--   p:update(epoch, {loss = loss, tokens = ntokens})
-- end
-- local summary = p:finish()   -- {elapsed = s, tokens = n, tokens_per_sec = r, updates = k}
local check = require "attn.check"

local progress = {}

-- ---------------------------------------------------------------- clock

local function uptime_clock()
  local f = io.open("/proc/uptime", "r")
  if not f then return nil end
  local v = f:read("n")
  f:close()
  return v
end

-- CPU time clamped to the one-second window that os.time allows, never
-- running backwards.
local function fallback_clock()
  local wall0, cpu0, last = os.time(), os.clock(), 0
  return function()
    local wall = os.difftime(os.time(), wall0)
    local t = math.min(math.max(os.clock() - cpu0, wall - 1), wall + 1)
    if t < last then t = last end
    last = t
    return t
  end
end

local function default_clock()
  local ok, core = pcall(require, "attn.core")
  if ok and type(core) == "table" and type(core.clock) == "function" then return core.clock end
  if uptime_clock() then return uptime_clock end
  return fallback_clock()
end

progress.clock = default_clock()

-- ---------------------------------------------------------------- formatting

--- Formats seconds as h:mm:ss (hours unbounded): 3725 -> "1:02:05".
-- @tparam number seconds (rounded down; negative or not finite gives "-:--:--")
-- @treturn string
function progress.format_time(seconds)
  if type(seconds) ~= "number" or seconds ~= seconds or seconds < 0 or seconds == math.huge then
    return "-:--:--"
  end
  local s = math.floor(seconds)
  return string.format("%d:%02d:%02d", s // 3600, s % 3600 // 60, s % 60)
end

local function format_value(key, v)
  if type(v) ~= "number" then return tostring(v) end
  if key == "loss" then return string.format("%.4f", v) end
  if math.type(v) == "integer" then return string.format("%d", v) end
  if v == 0 or v ~= v or math.abs(v) == math.huge then return string.format("%.4f", v) end
  if math.abs(v) < 1e-3 or math.abs(v) >= 1e6 then return string.format("%.3e", v) end
  return string.format("%.4f", v)
end

local function format_rate(r)
  if r >= 100 then return string.format("%.0f", r) end
  return string.format("%.2f", r)
end

-- ---------------------------------------------------------------- terminal check

local function is_terminal(out)
  local fd = (out == io.stderr and 2) or (out == io.stdout and 1) or nil
  if not fd then return false end
  local term = os.getenv("TERM")
  if term == nil or term == "" or term == "dumb" then return false end
  -- os.execute lets the child inherit our stdout and stderr, so `test -t` sees them.
  return os.execute("test -t " .. fd) == true
end

-- ---------------------------------------------------------------- Progress

--- A progress display made by `progress.new`: `p:update(fields)` after each
-- step or epoch, `p:finish()` at the end.
-- @type Progress
local Progress = {}
Progress.__index = Progress

--- Creates a progress display.
-- @tparam table opts
--   `total` (number of updates expected, e.g. epochs; optional: no estimate without it),
--   `label` (text before the line, optional), `unit` ("epoch"),
--   `out` (a file or any object with :write and optionally :flush; io.stderr),
--   `tty` (redraw in place; default: detected once here for io.stderr/io.stdout, false otherwise),
--   `every` (plain-line mode: print every n-th update; default about 20 lines over the run),
--   `clock` (a function returning seconds; default attn.progress.clock)
-- @treturn Progress
-- @raise on an invalid option
function progress.new(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("progress.new: expected a table of options, got a " .. type(opts), 2) end
  check.options("progress.new", opts,
    { total = true, label = true, unit = true, out = true, tty = true, every = true, clock = true })
  local total = opts.total
  if total ~= nil and (math.type(total) ~= "integer" or total < 1) then
    error("progress.new: total must be a positive integer, got " .. tostring(total), 2)
  end
  local every = opts.every
  if every ~= nil and (math.type(every) ~= "integer" or every < 1) then
    error("progress.new: every must be a positive integer, got " .. tostring(every), 2)
  end
  local out = opts.out or io.stderr
  if (type(out) ~= "table" and type(out) ~= "userdata") or out.write == nil then
    error("progress.new: out must be a file or an object with a write method", 2)
  end
  if opts.tty ~= nil and type(opts.tty) ~= "boolean" then
    error("progress.new: tty must be a boolean, got a " .. type(opts.tty), 2)
  end
  if opts.clock ~= nil and type(opts.clock) ~= "function" then
    error("progress.new: clock must be a function returning seconds, got a " .. type(opts.clock), 2)
  end
  local tty = opts.tty
  if tty == nil then tty = is_terminal(out) end
  local clock = opts.clock or progress.clock
  local now = clock()
  return setmetatable({
    total = total,
    label = opts.label,
    unit = opts.unit or "epoch",
    out = out,
    tty = tty,
    every = every or (total and math.max(1, math.ceil(total / 20))) or 1,
    clock = clock,
    start = now,
    count = 0, -- updates so far
    first_k = nil, -- k of the first update (runs may resume mid-way)
    tokens = 0, -- all tokens seen
    saw_tokens = false,
    pending_tokens = 0, -- tokens since the last shown line
    shown_at = now, -- clock when the last line was shown
    shown_count = 0, -- count at the last shown line
    width = 0, -- length of the line on screen (tty mode)
  }, Progress)
end

-- The text of one line for update k.
function Progress:_render(k, metrics, now)
  local parts = {}
  local head = string.format("%s %d", self.unit, k)
  if self.total then head = head .. "/" .. self.total end
  parts[1] = self.label and (self.label .. " " .. head) or head
  if metrics then
    local keys = {}
    for key in pairs(metrics) do
      if key ~= "tokens" and key ~= "loss" then keys[#keys + 1] = key end
    end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    if metrics.loss ~= nil then table.insert(keys, 1, "loss") end
    for _, key in ipairs(keys) do
      parts[#parts + 1] = tostring(key) .. " " .. format_value(key, metrics[key])
    end
  end
  local dt = now - self.shown_at
  if self.pending_tokens > 0 and dt > 0 then
    parts[#parts + 1] = format_rate(self.pending_tokens / dt) .. " tok/s"
  end
  local elapsed = now - self.start
  parts[#parts + 1] = "elapsed " .. progress.format_time(elapsed)
  if self.total then
    local done = k - (self.first_k - 1)
    local eta = done > 0 and elapsed / done * math.max(self.total - k, 0) or nil
    parts[#parts + 1] = "eta " .. progress.format_time(eta)
  end
  return table.concat(parts, " | ")
end

function Progress:_show(line, now)
  if self.tty then
    local pad = self.width > #line and string.rep(" ", self.width - #line) or ""
    self.out:write("\r", line, pad)
    self.width = #line
  else
    self.out:write(line, "\n")
  end
  if self.out.flush then self.out:flush() end
  -- Tokens seen within a zero-length interval carry over to the next line.
  if self.pending_tokens == 0 or now > self.shown_at then
    self.pending_tokens = 0
    self.shown_at = now
  end
  self.shown_count = self.count
end

--- Records update k (default: one more than the last) and shows it when due.
-- @tparam[opt] integer k the epoch (or step) just finished
-- @tparam[opt] table metrics values to show (`loss` first, as %.4f; the rest in key order);
--   `tokens` (processed since the last update) gives tokens/sec instead of being shown
-- @treturn string|nil the line shown, or nil when this update was not shown
-- @raise on a finished display or invalid arguments
function Progress:update(k, metrics)
  if self.finished then error("progress:update: called after finish()", 2) end
  if type(k) == "table" and metrics == nil then k, metrics = nil, k end
  if k == nil then k = (self.last_k or 0) + 1 end
  if type(k) ~= "number" then error("progress:update: k must be a number, got a " .. type(k), 2) end
  if metrics ~= nil and type(metrics) ~= "table" then
    error("progress:update: metrics must be a table, got a " .. type(metrics), 2)
  end
  local tokens = metrics and metrics.tokens
  if tokens ~= nil and type(tokens) ~= "number" then
    error("progress:update: metrics.tokens must be a number, got a " .. type(tokens), 2)
  end
  local now = self.clock()
  self.first_k = self.first_k or k
  self.count = self.count + 1
  self.last_k, self.last_metrics, self.last_time = k, metrics, now
  if tokens then
    self.tokens = self.tokens + tokens
    self.pending_tokens = self.pending_tokens + tokens
    self.saw_tokens = true
  end
  local last = self.total ~= nil and k >= self.total
  if self.tty or last or self.count % self.every == 0 then
    local line = self:_render(k, metrics, now)
    self:_show(line, now)
    return line
  end
  return nil
end

--- Ends the display: prints the last update if it was not shown yet, ends
-- the redrawn line on a terminal. Calling it again returns the same summary.
-- @treturn table `{elapsed = seconds, updates = n, tokens = n, tokens_per_sec = rate}`
--   (tokens fields only when tokens were given)
function Progress:finish()
  if self.summary then return self.summary end
  local now = self.clock()
  if self.count > self.shown_count then
    self:_show(self:_render(self.last_k, self.last_metrics, self.last_time), self.last_time)
  end
  if self.tty and self.shown_count > 0 then
    self.out:write("\n")
    if self.out.flush then self.out:flush() end
  end
  local elapsed = now - self.start
  local summary = { elapsed = elapsed, updates = self.count }
  if self.saw_tokens then
    summary.tokens = self.tokens
    summary.tokens_per_sec = elapsed > 0 and self.tokens / elapsed or nil
  end
  self.finished, self.summary = true, summary
  return summary
end

Progress.__close = Progress.finish

progress.Progress = Progress

return progress
