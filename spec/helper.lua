--- Shared spec helpers: tensor comparison that reports the worst element,
-- a gradient-check assertion, and small naive references.
local attn = require "attn"
local say = require "say"
local luassert = require "luassert"

local helper = {}

function helper.flatten(v, out)
  out = out or {}
  if type(v) == "table" then
    for _, x in ipairs(v) do helper.flatten(x, out) end
  else
    out[#out + 1] = v
  end
  return out
end

local function shape_of_table(v)
  local s = {}
  while type(v) == "table" do
    s[#s + 1] = #v
    v = v[1]
  end
  return s
end

local shape_str = attn.core.shape_str

-- Values and shape of a tensor, nested table or number.
local function unpack_value(v)
  if attn.is_tensor(v) then return helper.flatten(v:totable()), v:shape() end
  if type(v) == "number" then return { v }, {} end
  return helper.flatten(v), shape_of_table(v)
end

--- Compares actual and expected (tensors, nested tables or numbers).
-- opts: atol (default 1e-6), rtol (default 1e-5). Returns ok, message where
-- the message names the worst element and shows both values.
function helper.compare(actual, expected, opts)
  opts = opts or {}
  local atol, rtol = opts.atol or 1e-6, opts.rtol or 1e-5
  local a, ashape = unpack_value(actual)
  local e, eshape = unpack_value(expected)
  local shapes_differ = #ashape > 0 and #eshape > 0 and shape_str(ashape) ~= shape_str(eshape)
  if #a ~= #e or (opts.check_shape ~= false and shapes_differ) then
    return false, string.format("shape mismatch: actual %s (%d values), expected %s (%d values)", shape_str(ashape),
      #a, shape_str(eshape), #e)
  end
  local worst, worst_excess = nil, -math.huge
  for i = 1, #a do
    local x, y = a[i], e[i]
    local err = math.abs(x - y)
    if x ~= x or y ~= y then err = (x ~= x and y ~= y) and 0 or math.huge end
    if x == y then err = 0 end -- equal infinities
    local excess = err - (atol + rtol * math.abs(y))
    if excess > worst_excess then worst, worst_excess = i, excess end
  end
  if worst_excess > 0 then
    local lines = { string.format(
      "tensors differ: worst element #%d: actual %.9g, expected %.9g (abs err %.3g, atol %g, rtol %g)",
      worst, a[worst], e[worst], math.abs(a[worst] - e[worst]), atol, rtol) }
    if #a <= 64 then
      local fa, fe = {}, {}
      for i = 1, #a do
        fa[i] = string.format("%.6g", a[i])
        fe[i] = string.format("%.6g", e[i])
      end
      lines[#lines + 1] = "actual:   " .. table.concat(fa, " ")
      lines[#lines + 1] = "expected: " .. table.concat(fe, " ")
    end
    return false, table.concat(lines, "\n")
  end
  return true
end

--- assert.close(actual, expected [, opts]) via luassert, and helper.assert_close.
local function close(_, arguments)
  local ok, msg = helper.compare(arguments[1], arguments[2], arguments[3])
  arguments.message = msg
  return ok
end
say:set("assertion.close.positive", "%s")
say:set("assertion.close.negative", "expected tensors to differ")
luassert:register("assertion", "close", close, "assertion.close.positive", "assertion.close.negative")

-- A failing assertion on tensors prints their values, not a userdata address.
luassert:add_formatter(function(v)
  if attn.is_tensor(v) then return tostring(v) end
end)

function helper.assert_close(actual, expected, opts)
  local ok, msg = helper.compare(actual, expected, opts)
  if not ok then error(msg, 2) end
end

--- Asserts that analytic gradients of fn match finite differences.
-- inputs: tensors (made float64, requires_grad) or plain values.
function helper.gradcheck(fn, inputs, opts)
  local ok, report = attn.gradcheck(fn, inputs, opts)
  if not ok then error(report.message or "gradcheck failed", 2) end
  return report
end

--- A float64 random tensor that requires grad, for gradient checks.
function helper.param(shape, scale)
  local t = attn.randn(shape, "float64")
  if scale then t = t * scale end
  return t:requires_grad_()
end

--- Calls run(n) on n = 1 and then 2 threads (the count restored after) and asserts that the
-- lists of tensors it returns hold the same bits; returns the 1-thread list.
function helper.assert_same_bits_on_threads(run)
  local before, res = attn.get_num_threads(), {}
  for n = 1, 2 do
    attn.set_num_threads(n)
    res[n] = run(n)
  end
  attn.set_num_threads(before)
  for i = 1, #res[1] do helper.assert_identical(res[2][i], res[1][i]) end
  return res[1]
end

--- Leaves of the given shapes (one table each) and dtype, N(0, 1), requiring grad.
function helper.leaves(dtype, ...)
  local out = {}
  for i, shape in ipairs({ ... }) do out[i] = attn.randn(shape, dtype):requires_grad_() end
  return out
end

--- Overwrites every parameter of module m with N(0, scale^2) (ones and zeros would hide
-- gradients); returns m.
function helper.randomize(m, scale)
  attn.no_grad(function()
    for _, p in ipairs(m:parameters()) do p:copy_(attn.randn(p:shape(), p:dtype()) * scale) end
  end)
  return m
end

--- Naive matrix product of nested tables (independent of BLAS).
function helper.naive_matmul(a, b)
  local out = {}
  for i = 1, #a do
    out[i] = {}
    for j = 1, #b[1] do
      local s = 0
      for k = 1, #b do s = s + a[i][k] * b[k][j] end
      out[i][j] = s
    end
  end
  return out
end

--- Minor page faults of this process so far (getrusage's ru_minflt).
function helper.minor_faults() return (attn.core.rusage()) end

--- Resident set size in bytes (/proc/self/statm).
function helper.rss_bytes()
  local f = assert(io.open("/proc/self/statm"))
  local _, resident = f:read("n", "n")
  f:close()
  return resident * 4096
end

-- ---------------------------------------------------------------- files

function helper.write_bytes(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

function helper.read_bytes(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

--- A fresh empty directory under /tmp.
function helper.make_tmpdir()
  local lfs = require "lfs"
  local name = os.tmpname()
  os.remove(name)
  assert(lfs.mkdir(name))
  return name
end

function helper.remove_tree(path)
  local lfs = require "lfs"
  if lfs.symlinkattributes(path, "mode") == "directory" then
    for entry in lfs.dir(path) do
      if entry ~= "." and entry ~= ".." then helper.remove_tree(path .. "/" .. entry) end
    end
    lfs.rmdir(path)
  else
    os.remove(path)
  end
end

function helper.list_dir(path)
  local lfs = require "lfs"
  local out = {}
  for entry in lfs.dir(path) do
    if entry ~= "." and entry ~= ".." then out[#out + 1] = entry end
  end
  table.sort(out)
  return out
end

--- Temporary files an atomic save may leave behind in dir ("*.tmp.*").
function helper.temp_files(dir)
  local out = {}
  for _, name in ipairs(helper.list_dir(dir)) do
    if name:find("%.tmp%.") then out[#out + 1] = name end
  end
  return out
end

--- Writes `bytes` to path and asserts that load(path) returns nil and the message
-- "<op>: <path>: " followed by Lua pattern `pattern`.
function helper.assert_load_fails(load, op, path, bytes, pattern)
  helper.write_bytes(path, bytes)
  local t, msg = load(path)
  luassert.is_nil(t)
  luassert.is_string(msg)
  local full = "^" .. op .. ": " .. path:gsub("%p", "%%%0") .. ": " .. pattern
  luassert.truthy(msg:find(full), "message '" .. msg .. "' does not match '" .. pattern .. "'")
end

--- Every proper prefix of the file at `good` must make load(path) return nil and
-- a message matching `pattern` (the prefixes are written to `scratch`).
function helper.assert_truncations_fail(good, scratch, load, pattern)
  local full = helper.read_bytes(good)
  for len = 0, #full - 1 do
    helper.write_bytes(scratch, full:sub(1, len))
    local t, msg = load(scratch)
    luassert.is_nil(t, "a prefix of " .. len .. " bytes loaded")
    luassert.matches(pattern, msg)
  end
end

--- 300 single-byte changes of the file at `good` (seeded) never make load raise;
-- a rejection's message matches `pattern`.
function helper.assert_byte_flips_never_raise(good, scratch, load, pattern, seed)
  local full = helper.read_bytes(good)
  math.randomseed(seed)
  for _ = 1, 300 do
    local pos = math.random(1, #full)
    local bytes = { full:byte(1, -1) }
    bytes[pos] = math.random(0, 255)
    helper.write_bytes(scratch, string.char(table.unpack(bytes)))
    local ok, t, msg = pcall(load, scratch)
    luassert.is_true(ok, "load raised for a byte changed at " .. pos .. ": " .. tostring(t))
    if t == nil then luassert.matches(pattern, msg) end
  end
end

--- Bit-exact comparison: same dtype and shape and identical serialised bytes
-- (which also tells -0 from 0 and NaN payloads). When the bytes differ, the
-- first element that differs by value is named; the walk over the elements is
-- skipped otherwise (it dominates big comparisons, under emulation most).
function helper.assert_identical(actual, expected)
  luassert.is_true(attn.is_tensor(actual))
  luassert.are.equal(expected:dtype(), actual:dtype())
  luassert.are.same(expected:shape(), actual:shape())
  if attn.core.tensor_to_bytes(actual) == attn.core.tensor_to_bytes(expected) then return end
  local a, e = helper.flatten({ actual:totable() }), helper.flatten({ expected:totable() })
  luassert.are.equal(#e, #a)
  for i = 1, #e do
    if e[i] == e[i] then luassert.are.equal(e[i], a[i], "element " .. i) end
  end
  luassert.is_true(attn.core.tensor_to_bytes(actual) == attn.core.tensor_to_bytes(expected), "bytes differ")
end

helper.sanitized = os.getenv("ATTN_SANITIZED") == "1"

--- The shell command that runs the Lua file `script` in a child interpreter
-- with the module this suite loaded (the sanitized one under `make test-asan`).
-- The interpreter is ATTN_LUA when set (the command that starts one; `make
-- check-aarch64` sets qemu-user and an arm64 lua5.4), lua5.4 otherwise, run
-- under the command `prefix` when given.
function helper.lua_command(script, prefix)
  local so = assert(package.searchpath("attn.core", package.cpath))
  local lua = (prefix and prefix .. " " or "") .. (os.getenv("ATTN_LUA") or "lua5.4")
  return string.format('LUA_PATH="lua/?.lua;lua/?/init.lua;spec/?.lua;;" LUA_CPATH="%s;;" %s %s',
    so:gsub("attn/core%.so$", "?.so"), lua, script)
end

--- Runs Lua source in a child process (see lua_command), so a crash fails a
-- spec instead of the whole run. opts: times (run it that many times, stop at
-- the first failure), shell (commands run first in the child's shell, e.g.
-- "ulimit -f 64"), prefix (a command the interpreter runs under, e.g.
-- valgrind). Returns exit_ok, exit_kind ("exit"/"signal"), code, and the
-- combined output.
function helper.run_lua(source, opts)
  opts = opts or {}
  local script = os.tmpname()
  helper.write_bytes(script, source)
  local cmd = helper.lua_command(script, opts.prefix) .. " 2>&1"
  if opts.times then
    cmd = string.format("i=0; while [ $i -lt %d ]; do %s || { echo \"run $i failed: $?\"; exit 1; }; i=$((i+1)); done",
      opts.times, cmd)
  end
  if opts.shell then cmd = opts.shell .. "; " .. cmd end
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local ok, kind, code = p:close()
  os.remove(script)
  return ok, kind, code, out
end

--- The row-math paths (attn.core.isa) this CPU and build can run, portable first.
function helper.isa_paths()
  local paths = {}
  for _, isa in ipairs { "generic", "avx2", "avx512" } do
    if attn.core.isa_supported(isa) then paths[#paths + 1] = isa end
  end
  return paths
end

--- A copy of the options table t with the entries of extra (may be nil) set over it.
function helper.with(t, extra)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

--- Whether 0-based query i keeps key j under the attention options opts (causal, window,
-- pattern with stride and summary, global): the rule of src/attention/attn_attention.h
-- ("Sparse patterns"), written out plainly for the specs' naive loops.
function helper.pattern_keeps(opts, i, j)
  if opts.causal and j > i then return false end
  local g = {}
  for _, p in ipairs(opts.global or {}) do g[p - 1] = true end
  if g[i] or g[j] then return true end
  local s, c = opts.stride, opts.summary or 1
  if opts.pattern == "strided" then return math.abs(i - j) < s or (i - j) % s == 0 end
  if opts.pattern == "fixed" then return i // s == j // s or j % s >= s - c end
  if opts.window then return math.abs(i - j) <= opts.window end
  return true
end

--- The flash attention kernel sets this machine can run ("flash_generic" always, then
-- "flash_avx2" and "flash_avx512" when the CPU and build have them).
function helper.flash_kernels()
  local names = { "flash_generic" }
  local one = attn.ones { 1, 1, 1 }
  for _, k in ipairs { "flash_avx2", "flash_avx512" } do
    if pcall(attn.core.sdpa_forward, one, one, one, { kernel = k }) then names[#names + 1] = k end
  end
  return names
end

return helper
