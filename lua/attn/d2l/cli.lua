--- Command-line options for experiment scripts.
--
-- Every script in `examples/` takes `--help`, `--seed N`, `--out DIR` (default
-- `out/<name>`) and `--data PATH`, plus options of its own. Options are declared
-- once, with a type, a default and a line of help; `--name value` and
-- `--name=value` both work, a flag (type "boolean") takes no value, and an
-- unknown option or a value of the wrong type stops the script with a message
-- and the usage. `ATTN_SMOKE=1` in the environment sets `opts.smoke`, which the
-- scripts use to shrink their work (CI's `make examples`).
-- @module attn.d2l.cli
-- @usage
-- local cli = require "attn.d2l.cli"
-- local opts = cli.parse(arg, {
--   name = "bahdanau", description = "Bahdanau attention on English-French",
--   options = {
--     { "epochs", "integer", 250, "training epochs" },
--     { "beam", "integer", 1, "beam width (1 = greedy)" },
--   },
-- })
-- print(opts.epochs, opts.seed, opts.out, opts.data)
local cli = {}

-- Options every experiment script has, after its own.
local COMMON = {
  { "seed", "integer", 0, "random seed (weights, dropout, batch order)" },
  { "out", "string", nil, "output folder (default out/<name>)" },
  { "data", "string", nil, "path of fra.txt (default: the shipped sample)" },
  { "help", "boolean", false, "print this help and exit" },
}

local function convert(kind, text)
  if kind == "integer" then return math.tointeger(tonumber(text)) end
  if kind == "number" then return tonumber(text) end
  if kind == "string" then return text end
  if kind == "count" then -- a positive integer, or "all" (math.huge)
    if text == "all" then return math.huge end
    local n = text and math.tointeger(tonumber(text))
    return n and n >= 1 and n or nil
  end
  if kind == "boolean" then
    if text == nil or text == "true" or text == "1" then return true end
    if text == "false" or text == "0" then return false end
    return nil
  end
  error("cli: unknown option type '" .. tostring(kind) .. "'", 3)
end

--- The usage text of a script.
-- @tparam table spec as for `cli.parse`
-- @treturn string
function cli.usage(spec)
  local lines = { string.format("usage: lua5.4 examples/%s.lua [options]", spec.name) }
  if spec.description then lines[#lines + 1] = spec.description end
  lines[#lines + 1] = "options:"
  local all = {}
  for _, o in ipairs(spec.options or {}) do all[#all + 1] = o end
  for _, o in ipairs(COMMON) do all[#all + 1] = o end
  for _, o in ipairs(all) do
    local name, kind, default, help = o[1], o[2], o[3], o[4]
    local arg_text = kind == "boolean" and "" or " " .. kind:upper()
    local default_text = (default ~= nil and kind ~= "boolean") and string.format(" (default %s)",
      default == math.huge and "all" or tostring(default)) or ""
    lines[#lines + 1] = string.format("  --%-22s %s%s", name .. arg_text, help or "", default_text)
  end
  return table.concat(lines, "\n")
end

--- Parses a script's arguments.
-- @tparam table argv the script's `arg` table (or any list of strings)
-- @tparam table spec `{name = string, description = string, options = {{name, type, default, help}, ...}}`;
--   type is "integer", "number", "string", "boolean" or "count" (a positive integer or `all`, read as math.huge)
-- @tparam[opt] table hooks `{exit = fn(code), print = fn(text)}` (for tests; default os.exit and print)
-- @treturn table the options by name, plus `smoke` (ATTN_SMOKE=1) and `out` defaulting to `out/<name>`
-- @raise on a spec without a name, with an unknown option type, or with an option declared twice
--   (runners assemble their lists from several tables; a second declaration would silently win)
function cli.parse(argv, spec, hooks)
  assert(type(spec) == "table" and type(spec.name) == "string", "cli.parse: spec.name must be a string")
  hooks = hooks or {}
  local exit, say = hooks.exit or os.exit, hooks.print or print
  local kinds, opts = {}, {}
  for _, list in ipairs { spec.options or {}, COMMON } do
    for _, o in ipairs(list) do
      if kinds[o[1]] then error("cli.parse: option --" .. o[1] .. " is declared twice", 2) end
      kinds[o[1]] = o[2]
      convert(o[2], nil) -- validates the declared type
      opts[o[1]] = o[3]
    end
  end
  local function fail(msg)
    say(string.format("%s: %s\n%s", spec.name, msg, cli.usage(spec)))
    return exit(2)
  end
  local i = 1
  while argv and argv[i] ~= nil do
    local a = argv[i]
    local name, value = a:match("^%-%-([%w_%-]+)=(.*)$")
    if not name then name = a:match("^%-%-([%w_%-]+)$") end
    if not name then return fail("unexpected argument '" .. a .. "'") end
    name = name:gsub("%-", "_")
    local kind = kinds[name]
    if not kind then return fail("unknown option --" .. name) end
    if value == nil and kind ~= "boolean" then
      i = i + 1
      value = argv[i]
      if value == nil then return fail("--" .. name .. " needs a value") end
    end
    local v = convert(kind, value)
    if v == nil then return fail(string.format("--%s expects %s, got '%s'", name, kind, tostring(value))) end
    opts[name] = v
    i = i + 1
  end
  if opts.help then
    say(cli.usage(spec))
    return exit(0)
  end
  opts.out = opts.out or ("out/" .. spec.name)
  opts.smoke = os.getenv("ATTN_SMOKE") == "1"
  return opts
end

--- What every experiment script does first: parse the options, create the
-- output folder and seed attn's generator with `--seed`.
-- @tparam table argv the script's `arg`
-- @tparam table spec as for `cli.parse`
-- @tparam[opt] table hooks as for `cli.parse`
-- @treturn table the options
-- @raise a `cli.fail` failure when the output folder cannot be made
function cli.start(argv, spec, hooks)
  local opts = cli.parse(argv, spec, hooks)
  local ok, err = cli.mkdir(opts.out)
  if not ok then cli.fail(spec.name .. ": " .. err) end
  require("attn").manual_seed(opts.seed)
  return opts
end

-- A user's mistake (a missing file, a checkpoint that does not fit): shown as
-- one line by cli.main, never as a traceback.
local Failure = { __tostring = function(f) return f.message end }

--- Raises a failure meant for the user of a script (see `cli.main`).
-- @tparam string message
-- @raise always
function cli.fail(message) error(setmetatable({ message = tostring(message) }, Failure), 2) end

--- Whether an error value was raised by `cli.fail`.
-- @param err
-- @treturn boolean
function cli.is_failure(err) return getmetatable(err) == Failure end

--- Runs a script's body: a `cli.fail` ends the script with its message on
-- stderr and exit status 1; any other error keeps its traceback.
-- @tparam function fn the body
-- @param ... its arguments
-- @return what fn returns
function cli.main(fn, ...)
  local res = table.pack(xpcall(fn, function(err)
    if cli.is_failure(err) then return err end
    return debug.traceback(tostring(err), 2)
  end, ...))
  if res[1] then return table.unpack(res, 2, res.n) end
  if cli.is_failure(res[2]) then
    io.stderr:write(res[2].message, "\n")
    os.exit(1)
  end
  error(res[2], 0)
end

--- Creates a folder and its parents (like `mkdir -p`).
-- @tparam string path
-- @treturn[1] string the path
-- @treturn[2] nil
-- @treturn[2] string message
function cli.mkdir(path)
  local ok, lfs = pcall(require, "lfs")
  if ok then
    local sofar = path:sub(1, 1) == "/" and "/" or ""
    for part in path:gmatch("[^/]+") do
      sofar = sofar .. part
      if not lfs.attributes(sofar, "mode") then
        local made, err = lfs.mkdir(sofar)
        if not made and not lfs.attributes(sofar, "mode") then return nil, "mkdir " .. sofar .. ": " .. tostring(err) end
      end
      sofar = sofar .. "/"
    end
    return path
  end
  local quoted = "'" .. path:gsub("'", "'\\''") .. "'"
  if os.execute("mkdir -p " .. quoted) then return path end
  return nil, "mkdir " .. path .. " failed"
end

return cli
