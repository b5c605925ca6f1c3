-- A seeded fuzzer of the whole Lua API (`make fuzz`).
--
-- Driver: lua5.4 tools/fuzz.lua [seconds] [seed]
--   runs a child fuzzer under a watchdog and reports. A failure is a child
--   that dies (a crash, a sanitizer report), a call that runs longer than 2 s,
--   or one blocked for 10 s; the report names the seed and the call that was
--   running. A call's time is the CPU time of the fuzzing process (all its
--   threads), so a machine busy with other work does not fail a call: Lua
--   code is stopped by a debug hook in the child after 2 s, a call stuck in C
--   is killed by the watchdog after 3 s (the driver reads the child's CPU time
--   from /proc; the second more lets the hook always stop a Lua loop first,
--   whatever the time the child then takes to exit), and a call that waits
--   (uses under a tenth of the wall time in CPU) is killed after 10 s of wall
--   time.
-- Child: lua5.4 tools/fuzz.lua --child seed seconds heartbeat_file, started with
--   the driver's own interpreter, or the command in ATTN_LUA (make check-aarch64).
--
-- Functions are found by walking the module tables (every module file under
-- lua/attn is required, lazily loaded ones included), tensor methods from the
-- tensor metatable, and the methods of every table a call returns (modules,
-- optimizers, ...), so functions added later are fuzzed without listing them.
-- Arguments are hostile: nil, NaN, +-inf, huge and negative integers, 2^62,
-- strings, ragged and cyclic tables, empty, 0-d, expanded, transposed and
-- freed tensors, mixed dtypes, tables whose __index frees tensors, and
-- finalizers that free tensors while calls run.

local CALL_LIMIT = 2.0 -- CPU seconds a call may take (the hook in the child)
local C_LIMIT = CALL_LIMIT + 1 -- CPU seconds of a call stuck in C (the watchdog)
local BLOCKED_LIMIT = 10 -- wall seconds a call may wait without progress (a deadlock, a sleep)
local WAITING = 0.1 -- a call using less CPU than this share of the wall time is waiting
local POLL = 0.1 -- seconds between the watchdog's looks at the heartbeat

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- ---------------------------------------------------------------- driver

local function driver(seconds, seed)
  local hb = os.tmpname()
  local status = hb .. ".status"
  local pidfile = hb .. ".pid"
  local script = arg[0]
  os.execute(string.format("(%s %s --child %d %d %s; echo $? > %s) & echo $! > %s",
    os.getenv("ATTN_LUA") or shell_quote(arg[-1] or "lua5.4"), shell_quote(script), seed, seconds, hb, status, pidfile))
  local function read(path)
    local f = io.open(path)
    if not f then return nil end
    local s = f:read("a")
    f:close()
    return s
  end
  -- The child's CPU time (user + system, all threads) from /proc/<pid>/stat.
  local ticks = 100
  do
    local p = io.popen("getconf CLK_TCK")
    if p then
      ticks = tonumber(p:read("l")) or ticks
      p:close()
    end
  end
  local child_pid
  local function child_cpu()
    child_pid = child_pid or tonumber((read(hb .. ".child") or ""):match("%d+"))
    local stat = child_pid and read("/proc/" .. child_pid .. "/stat")
    if not stat then return nil end
    local fields = {}
    for field in stat:match("%) (.*)"):gmatch("%S+") do fields[#fields + 1] = field end
    return (tonumber(fields[12]) + tonumber(fields[13])) / ticks -- utime, stime
  end
  -- Wall time without progress is counted in polls: each poll sleeps POLL
  -- seconds and then some (the shell), so the count never overstates it.
  local last, still, cpu_at_progress = nil, 0, nil
  local verdict
  while true do
    os.execute("sleep " .. POLL)
    local st = read(status)
    if st and st ~= "" then
      local code = tonumber(st)
      if code ~= 0 then verdict = "the fuzzer process ended with status " .. tostring(code) end
      break
    end
    local beat = read(hb) or ""
    local n = beat:match("^(%d+)\t")
    local cpu = child_cpu()
    if n ~= last then
      last, still, cpu_at_progress = n, 0, cpu
    elseif n then
      still = still + 1
    end
    local used = n and cpu and cpu_at_progress and cpu - cpu_at_progress
    if used and used >= C_LIMIT then
      verdict = string.format("call %s ran %g s of CPU time without returning", n, C_LIMIT)
    elseif still * POLL >= BLOCKED_LIMIT and (used or 0) < WAITING * still * POLL then
      verdict = string.format("call %s made no progress for %d s", n, BLOCKED_LIMIT)
    end
    if verdict then
      if child_pid then os.execute("kill -9 " .. child_pid) end
      break
    end
  end
  local beat = read(hb) or ""
  os.remove(hb)
  os.remove(status)
  os.remove(pidfile)
  os.remove(hb .. ".child")
  if verdict then
    local n, call = beat:match("^(%d+)\t([^\n]*)")
    print(string.format("FUZZ FAILURE: %s\n  seed %d, call #%s:\n  %s\n  replay: lua5.4 tools/fuzz.lua %d %d",
      verdict, seed, tostring(n), tostring(call), seconds, seed))
    os.exit(1)
  end
end

-- ---------------------------------------------------------------- child

local function child(seed, seconds, hb_path)
  local pid
  do -- our pid, for the watchdog's kill (Lua has no getpid)
    local stat = assert(io.open("/proc/self/stat"))
    pid = stat:read("n")
    stat:close()
    local f = assert(io.open(hb_path .. ".child", "w"))
    f:write(pid, "\n")
    f:close()
  end
  local attn = require "attn"
  local core = attn.core
  core.set_max_request(8 << 20) -- a hostile size fails cleanly instead of filling memory
  math.randomseed(seed)
  local R = math.random

  -- Every module under lua/attn, required so its tables can be walked.
  local lfs = require "lfs"
  local root = package.searchpath("attn", package.path):gsub("/init%.lua$", "")
  local function require_all(dir, prefix)
    for entry in lfs.dir(dir) do
      local path = dir .. "/" .. entry
      if entry:match("%.lua$") then
        local name = prefix .. entry:gsub("%.lua$", ""):gsub("%.init$", "")
        name = name:gsub("%.init$", "")
        pcall(require, name)
      elseif entry ~= "." and entry ~= ".." and lfs.attributes(path, "mode") == "directory" then
        require_all(path, prefix .. entry .. ".")
      end
    end
  end
  require_all(root, "attn.")
  for _, k in ipairs({ "linalg", "nn", "optim", "io", "attention" }) do local _ = attn[k] end

  -- Functions that only print or draw to the terminal, or that change the
  -- process (not the engine), are left out, and so is the bound on single
  -- allocations this fuzzer sets for itself.
  local skip = { progress = true, report = true, cli = true, print = true, exit = true, set_max_request = true,
    abort = true, mpi = true, distributed = true } -- MPI: abort ends the process by design; collectives need mpirun

  local functions, fn_names, seen = {}, {}, {}
  local visited_modules = {}
  local function add(name, f) -- the smallest name, so the order (and a seed's calls) is reproducible
    if not seen[f] then
      seen[f] = true
      functions[#functions + 1] = f
    end
    if not fn_names[f] or name < fn_names[f] then fn_names[f] = name end
  end
  local function callable(v)
    if type(v) == "function" then return true end
    local mt = getmetatable(v)
    return type(mt) == "table" and rawget(mt, "__call") ~= nil
  end
  local visited = {}
  local function walk(t, prefix, depth)
    if visited[t] or depth > 3 then return end
    visited[t] = true
    for k, v in pairs(t) do
      if type(k) == "string" and not skip[k] and not k:match("^_") then
        local name = prefix .. "." .. k
        if callable(v) then add(name, v) end
        if type(v) == "table" then walk(v, name, depth + 1) end
      end
    end
  end
  for name in pairs(package.loaded) do visited_modules[#visited_modules + 1] = name end
  table.sort(visited_modules)
  for _, name in ipairs(visited_modules) do
    local m = package.loaded[name]
    local top = name:match("^attn[%.%w_]*$")
    if top and type(m) == "table" and not skip[name:match("[^%.]+$")] then walk(m, name, 0) end
  end
  local methods = {}
  for k, v in pairs(core.methods) do
    if type(v) == "function" and not k:match("^__") then methods[#methods + 1] = { k, v } end
  end
  table.sort(methods, function(a, b) return a[1] < b[1] end)
  table.sort(functions, function(a, b) return fn_names[a] < fn_names[b] end)

  -- ------------------------------------------------------------ values
  local pool = {} -- tensors and objects (results of calls join it)
  local POOL = 48
  local function put(v)
    pool[R(POOL)] = v
  end
  local dtypes = { "float32", "float64", "int64" }
  local function small_shape()
    local s = {}
    for i = 1, R(0, 3) do s[i] = R(0, 4) end
    return s
  end
  local function fresh_tensor()
    local ok, t = pcall(function()
      local dt = dtypes[R(#dtypes)]
      local x = attn.randn(small_shape(), dt == "int64" and "float64" or dt)
      if dt == "int64" then x = (x * 3):to("int64") end
      local k = R(8)
      if k == 1 and x:dim() >= 2 then x = x:transpose(1, 2) end
      if k == 2 then x = x:unsqueeze(1):expand({ 3, table.unpack(x:shape()) }) end
      if k == 3 then x = attn.randn({}) end
      if k == 4 and dt ~= "int64" then x = attn.randn(small_shape(), { dtype = dt, requires_grad = true }) end
      if k == 5 then x:free() end
      return x
    end)
    return ok and t or nil
  end
  for i = 1, POOL do pool[i] = fresh_tensor() end
  local function any_tensor()
    for _ = 1, 4 do
      local v = pool[R(POOL)]
      if attn.is_tensor(v) then return v end
    end
    return fresh_tensor()
  end
  local function hostile_table()
    return setmetatable({}, { __index = function()
      local t = any_tensor()
      if t then pcall(t.free, t) end
    end })
  end
  local cyclic = {}
  cyclic[1] = cyclic
  cyclic.x = cyclic
  local scalars = { 0 / 0, math.huge, -math.huge, 0, -0.0, 1, 2, 3, -1, -2, 0.5, 1e308, -1e308, 2 ^ 62, 1 << 62,
    math.maxinteger, math.mininteger, 1 << 31, -(1 << 31), 1 << 40, 7, 64, "float32", "float64", "int64", "abc",
    "", "1", "x.safetensors", "m.npy", true, false }
  local tables = {
    function() return {} end,
    function() return small_shape() end,
    function() return { 1 << 62, 1 << 62 } end,
    function() return { -1, 2 } end,
    function() return { { 1, 2 }, { 3 } } end,
    function() return cyclic end,
    function() return { dtype = dtypes[R(3)] } end,
    function() return { requires_grad = true } end,
    function() return { causal = true, valid_lens = { 1, 2 }, dropout = 0.5, training = true } end,
    function() return { padding = R(0, 2), kernel = ({ "winograd", "winograd4", "im2col", "reference" })[R(4)] } end,
    function() return { lr = 0 / 0, params = { any_tensor() } } end,
    function() return { any_tensor(), any_tensor() } end,
    function() return { w = any_tensor(), [1] = any_tensor() } end,
    hostile_table,
  }
  local function any_value()
    local k = R(10)
    if k <= 4 then return any_tensor() end
    if k <= 6 then return scalars[R(#scalars)] end
    if k <= 8 then return tables[R(#tables)]() end
    if k == 9 then return pool[R(POOL)] end
    return nil
  end

  local function describe(v, depth)
    depth = depth or 0
    if attn.is_tensor(v) then
      local ok, s = pcall(function() return string.format("tensor<%s %s>", v:dtype(), core.shape_str(v:shape())) end)
      return ok and s or "freed tensor"
    end
    if type(v) == "string" then return string.format("%q", v) end
    if type(v) == "table" then
      if depth > 1 then return "{...}" end
      if getmetatable(v) and not rawget(v, 1) then return "table with metatable" end
      local parts = {}
      for k, x in pairs(v) do
        if #parts >= 4 then parts[#parts + 1] = "..." break end
        parts[#parts + 1] = (type(k) == "string" and k .. "=" or "") .. (x == v and "<cycle>" or describe(x, depth + 1))
      end
      return "{" .. table.concat(parts, ", ") .. "}"
    end
    return tostring(v)
  end

  -- ------------------------------------------------------------ calls
  local hb = assert(io.open(hb_path, "w"))
  local deadline = 0
  local clock = os.clock -- the process's CPU time, as the watchdog counts it
  debug.sethook(function()
    if clock() > deadline then error("fuzz: call ran longer than the limit") end
  end, "", 10000)

  -- ATTN_FUZZ_PLANT=c|blocked|lua|crash makes call 1 one the fuzzer must
  -- catch (a call busy in C, one blocked, a Lua loop, a crash): how
  -- spec/tools/fuzz_spec.lua checks the checker. The first call, so no fuzzed
  -- call before it can use up a limit on a slow (emulated, sanitized) machine.
  local planted = ({
    c = function() return ("a"):rep(5000):find(".-.-.-b") end, -- backtracking: minutes inside one C call
    blocked = function() os.execute("sleep 30") end,
    lua = function() while true do end end,
    crash = function() os.execute("kill -SEGV " .. pid) os.execute("sleep 6") end,
  })[os.getenv("ATTN_FUZZ_PLANT") or ""]

  local reached, reached_methods, n_calls, n_ok = {}, {}, 0, 0
  local lua_errors = {}
  local start = os.time()
  local args = {}
  while os.time() - start < seconds do
    n_calls = n_calls + 1
    local f, name, nargs
    local k = R(10)
    if planted and n_calls == 1 then
      f, name, nargs = planted, "planted:" .. os.getenv("ATTN_FUZZ_PLANT"), 0
    elseif k <= 5 then
      local m = methods[R(#methods)]
      f, name = m[2], "Tensor:" .. m[1]
      nargs = R(1, 4)
      args[1] = R(6) > 1 and any_tensor() or any_value()
      for i = 2, nargs do args[i] = any_value() end
      reached_methods[m[1]] = true
    elseif k <= 8 or #pool == 0 then
      f = functions[R(#functions)]
      name = fn_names[f]
      nargs = R(0, 4)
      for i = 1, nargs do args[i] = any_value() end
      reached[name] = true
    else -- a method of an object a call returned (module, optimizer, ...)
      local obj = pool[R(POOL)]
      if type(obj) == "table" then
        local keys, have = {}, {}
        local t = obj
        for _ = 1, 5 do -- the object, then its class chain through __index tables
          for key, v in pairs(t) do
            if type(v) == "function" and type(key) == "string" and not have[key] then
              have[key] = true
              keys[#keys + 1] = key
            end
          end
          local mt = getmetatable(t)
          t = type(mt) == "table" and rawget(mt, "__index")
          if type(t) ~= "table" then break end
        end
        table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
        if #keys > 0 then
          local key = keys[R(#keys)]
          f, name = obj[key], "object:" .. tostring(key)
        elseif callable(obj) then
          f, name = obj, "object()"
        end
        nargs = R(1, 3)
        args[1] = obj
        for i = 2, nargs do args[i] = any_value() end
        if f then reached[name] = true end
      end
    end
    if f then
      local parts = {}
      for i = 1, nargs do parts[i] = describe(args[i]) end
      hb:seek("set")
      hb:write(n_calls, "\t", name, "(", table.concat(parts, ", "), ")\n")
      hb:flush()
      if R(50) == 1 then -- a finalizer that frees a tensor, pending during the next calls
        local victim = any_tensor()
        setmetatable({}, { __gc = function() if victim then pcall(victim.free, victim) end end })
      end
      deadline = clock() + CALL_LIMIT
      local res = table.pack(pcall(f, table.unpack(args, 1, nargs)))
      deadline = math.huge
      if res[1] then
        n_ok = n_ok + 1
        for i = 2, res.n do
          local v = res[i]
          if attn.is_tensor(v) or type(v) == "table" then put(v) end
        end
      else
        local msg = tostring(res[2])
        if msg:find("longer than the limit") then
          hb:seek("set")
          hb:write(n_calls, "\t", name, "(", table.concat(parts, ", "), ") [timed out]\n")
          hb:close()
          io.stderr:write("call ran longer than " .. CALL_LIMIT .. " s of CPU time\n")
          os.exit(3)
        end
        -- Lua runtime errors raised inside the library's own code
        local where = msg:match("^[^:]-(lua/attn/[%w_/]+%.lua:%d+): attempt to")
          or msg:match("^[^:]-(lua/attn/[%w_/]+%.lua:%d+): bad argument")
        if where and not lua_errors[where] then lua_errors[where] = name .. ": " .. msg end
      end
      for i = 1, nargs do args[i] = nil end
      if n_calls % 2000 == 0 then
        for i = 1, POOL do
          if R(4) == 1 then pool[i] = fresh_tensor() end
        end
      end
    end
  end
  debug.sethook()
  hb:close()

  local n_fn, n_obj, n_meth = 0, 0, 0
  for key in pairs(reached) do
    if key:match("^object") then n_obj = n_obj + 1 else n_fn = n_fn + 1 end
  end
  for _ in pairs(reached_methods) do n_meth = n_meth + 1 end
  print(string.format("fuzz: seed %d, %d calls (%d returned, the rest raised), %d s", seed, n_calls, n_ok,
    os.time() - start))
  print(string.format("fuzz: reached %d of %d module functions, %d of %d tensor methods, %d methods of returned objects",
    n_fn, #functions, n_meth, #methods, n_obj))
  local where = {}
  for w in pairs(lua_errors) do where[#where + 1] = w end
  table.sort(where)
  if #where > 0 then
    print(string.format("fuzz: %d places in lua/attn raised a Lua runtime error instead of a checked one:", #where))
    for i = 1, math.min(#where, 15) do print("  " .. lua_errors[where[i]]:sub(1, 200)) end
  end
  os.exit(0)
end

if arg[1] == "--child" then
  child(tonumber(arg[2]), tonumber(arg[3]), arg[4])
else
  driver(tonumber(arg[1]) or 60, tonumber(arg[2]) or os.time())
end
