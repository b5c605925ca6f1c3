--- Argument checks shared by the Lua modules: the checks that only Lua has
-- (option-table keys, Lua value types). Shapes, ranges and dtypes are checked
-- by the C core, so C users get them too.
--
-- Every raising check takes a `level` (as `error` does) counted from the
-- function that calls the check: the default 3 blames the caller of that
-- function, which is the user's line when a public function checks its own
-- arguments.
-- @module attn.check

-- (attn.core is required where a check needs it: attn.progress uses this
-- module and loads without the C module.)

local check = {}
local core -- attn.core, loaded by the first tensor check (a require per check cost more than the check)

-- The allowed names, for the message: a list keeps its order (a constructor's
-- positional order says more than the alphabet), a set is sorted.
local function names_of(allowed)
  if allowed[1] ~= nil then return table.concat(allowed, ", ") end
  local names = {}
  for name in pairs(allowed) do names[#names + 1] = name end
  table.sort(names)
  return table.concat(names, ", ")
end

local function is_allowed(allowed, key)
  if allowed[key] == true then return true end
  if allowed[1] == nil then return false end
  for _, name in ipairs(allowed) do
    if name == key then return true end
  end
  return false
end

--- The message for the first key of `opts` that `allowed` does not hold, or nil.
-- @tparam string fn the name in the message
-- @tparam table opts an options table
-- @tparam table allowed a list of names ({"dtype", "bias"}) or a set ({dtype = true})
-- @treturn ?string "fn: unknown option 'k' (expected a, b)", or nil when every key is allowed
-- @usage local msg = check.unknown_option("SGD", opts, { params = true, lr = true })
function check.unknown_option(fn, opts, allowed)
  -- a tensor here would be walked by ipairs over its first size (2^40 views)
  if type(allowed) ~= "table" then error("unknown_option: allowed must be a table of names, got a " .. type(allowed), 3) end
  if type(opts) ~= "table" then error("unknown_option: opts must be a table, got a " .. type(opts), 3) end
  for k in pairs(opts) do
    if not is_allowed(allowed, k) then
      return string.format("%s: unknown option '%s' (expected %s)", fn, tostring(k), names_of(allowed))
    end
  end
end

--- Checks an options table: nil gives an empty table, a table with only
-- allowed keys is returned as it is.
-- @tparam string fn the name in the messages
-- @tparam ?table opts the caller's options
-- @tparam table allowed a list or a set of names (see unknown_option)
-- @tparam[opt=3] integer level the error level, counted from the caller of check.options
-- @treturn table opts (or {} for nil)
-- @raise "fn: options must be a table, got a number", or "fn: unknown option 'k' (expected ...)"
-- @usage opts = check.options("Linear", opts, { bias = true, dtype = true })
function check.options(fn, opts, allowed, level)
  level = level or 3
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(string.format("%s: options must be a table, got a %s", fn, type(opts)), level)
  end
  local msg = check.unknown_option(fn, opts, allowed)
  if msg then error(msg, level) end
  return opts
end

--- Checks that v is a positive Lua integer.
-- @tparam string fn the function named in the message
-- @tparam string name the argument named in the message
-- @param v the value
-- @tparam[opt=3] integer level the error level, counted from the caller of the check
-- @treturn integer v
-- @raise "fn: name must be a positive integer, got 0"
-- @usage check.positive_int("Linear", "in_features", n)
function check.positive_int(fn, name, v, level)
  if math.type(v) ~= "integer" or v < 1 then
    error(string.format("%s: %s must be a positive integer, got %s", fn, name, tostring(v)), level or 3)
  end
  return v
end

--- Checks that v has the Lua type `expected` ("string", "table", "function", ...).
-- @tparam string fn the function named in the message
-- @tparam string name the argument named in the message
-- @param v the value
-- @tparam string expected a Lua type name
-- @tparam[opt=3] integer level the error level, counted from the caller of the check
-- @return v
-- @raise "fn: name must be a string, got a nil"
-- @usage check.lua_type("preprocess", "text", text, "string")
function check.lua_type(fn, name, v, expected, level)
  if type(v) ~= expected then
    error(string.format("%s: %s must be a %s, got a %s", fn, name, expected, type(v)), level or 3)
  end
  return v
end

--- Checks that v is a tensor, and when `ndim` is given that it has that many dims.
-- @tparam string fn the function named in the message
-- @tparam string name the argument named in the message
-- @param v the value
-- @tparam[opt] integer ndim the number of dims v must have
-- @tparam[opt] string what the expected shape in words, e.g. "(batch, queries, d)"
-- @tparam[opt=3] integer level the error level, counted from the caller of the check
-- @treturn Tensor v
-- @raise "fn: name must be a tensor, got a table", "fn: name must be a tensor (B, n), got a table",
-- or "fn: name must be (B, n), got [2x3x4]"
-- @usage check.tensor("bmm", "a", a, 3, "(batch, n, m)")
function check.tensor(fn, name, v, ndim, what, level)
  level = level or 3
  core = core or require "attn.core"
  if getmetatable(v) ~= core.metatable then
    error(string.format("%s: %s must be a tensor%s, got a %s", fn, name, what and " " .. what or "", type(v)), level)
  end
  if ndim and core.dim(v) ~= ndim then
    error(string.format("%s: %s must be %s, got %s", fn, name, what or ndim .. "-D", core.shape_str(v)), level)
  end
  return v
end

return check
