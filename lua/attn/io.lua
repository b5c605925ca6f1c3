--- Checkpoints: safetensors state dicts and NumPy `.npy` arrays.
--
-- The facade exposes these as `attn.save`, `attn.load`, `attn.save_npy` and
-- `attn.load_npy`.
--
-- **Writing.** Files are written atomically: the bytes go to a temporary file
-- in the target's directory, which is fsync'ed and renamed over the target, so
-- an interrupted or failed save never damages the previous file and leaves no
-- temporary file behind. Data are little-endian, row-major and contiguous
-- (strided views are written as their contiguous copy). safetensors headers
-- list the keys in byte order with `__metadata__` first, tensors are laid out
-- back to back in the same order, and the header is padded with spaces to a
-- multiple of 8 bytes, so equal inputs give byte-identical files.
--
-- **Reading.** Every field of the header is validated; a bad or truncated file
-- returns `nil, msg` naming the function, the file and the entry. The readers
-- are strict about the data region: in safetensors the tensors' byte ranges,
-- sorted, must tile the data buffer exactly (no overlaps, no gaps, no trailing
-- bytes: the rule of the reference implementation), and a `.npy` file must end
-- where its data end. Trailing bytes usually mean a damaged or concatenated
-- file, so they are reported rather than ignored.
--
-- **dtypes.** safetensors: F32, F64 and I64 load bit-exactly; F16 and BF16
-- load into float32 (exactly: every half value is a float), I32 into int64.
-- float32, float64 and int64 tensors are saved as F32, F64 and I64. `.npy`:
-- `<f4`, `<f8` and `<i8` bit-exactly (both ways), `<f2` into float32, `<i4`
-- into int64, and the big-endian `>` forms of all of them.
-- `fortran_order: True` arrays are transposed into row-major order. `.npy`
-- versions 1.0, 2.0 and 3.0 are read; 1.0 is written.
--
-- **Errors.** Programmer errors (a non-string path, a non-tensor in the state
-- dict, a non-string metadata value) raise. I/O and format failures return
-- `nil, msg`.
-- @module attn.io
local core = require "attn.core"
local cjson = require "cjson"

local M = {}

local json = cjson.new()
json.decode_invalid_numbers(false)
json.decode_max_depth(16)

--- Largest safetensors header accepted by `load`, in bytes.
M.MAX_HEADER_BYTES = 100000000

local MAX_DIMS = 8

local tensor_mt = core.metatable

local function is_tensor(v) return getmetatable(v) == tensor_mt end

-- The integer value of a JSON number (3, 3.0 and 3e0 alike), else nil.
local function as_int(v) return type(v) == "number" and math.tointeger(v) or nil end

-- Shapes read from a file may be anything, so this formatter never raises.
local shape_str = core.shape_str -- "[2x3]"; any list of integers, as read from a file

-- Byte-order comparison (independent of the C locale that `<` consults).
local function byte_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = a:byte(i), b:byte(i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, byte_less)
  return keys
end

local function read_file(path, fn)
  local f, err = io.open(path, "rb")
  if not f then return nil, fn .. ": " .. err end
  local data, rerr = f:read("a")
  f:close()
  if not data then return nil, string.format("%s: %s: cannot read: %s", fn, path, tostring(rerr)) end
  return data
end

local function check_path(path, fn)
  if type(path) ~= "string" then error(string.format("%s: path must be a string, got a %s", fn, type(path)), 3) end
  if path:find("\0", 1, true) then error(string.format("%s: path %q contains a NUL byte", fn, path), 3) end
end

-- ---------------------------------------------------------------- JSON output

local json_escapes = {
  ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
}

local function json_string(s)
  local body = s:gsub('[%c"\\]', function(c) return json_escapes[c] or string.format("\\u%04x", c:byte()) end)
  return '"' .. body .. '"'
end

-- ---------------------------------------------------------------- safetensors

local save_dtypes = { float32 = "F32", float64 = "F64", int64 = "I64" }
local load_dtypes = { F32 = 4, F64 = 8, F16 = 2, BF16 = 2, I64 = 8, I32 = 4 }
local itemsizes = { float32 = 4, float64 = 8, int64 = 8 }

--- Saves a state dict as a safetensors file (atomically).
-- @tparam string path
-- @tparam {[string]=Tensor,...} tensors names (any valid UTF-8, e.g. "W_q.weight") to tensors
-- @tparam[opt] {[string]=string,...} metadata stored under `__metadata__`
-- @treturn[1] boolean true
-- @treturn[2] nil
-- @treturn[2] string message naming the file and the failing step
-- @raise when an argument has the wrong type, a name is not valid UTF-8 or
-- is "__metadata__", or a tensor was freed
-- @usage assert(attn.save("model.safetensors", model:state_dict(), { epoch = "3" }))
function M.save(path, tensors, metadata)
  check_path(path, "save")
  if type(tensors) ~= "table" then
    error(string.format("save: tensors must be a table of names to tensors, got a %s", type(tensors)), 2)
  end
  if metadata ~= nil and type(metadata) ~= "table" then
    error(string.format("save: metadata must be a table of strings to strings, got a %s", type(metadata)), 2)
  end
  for name, t in pairs(tensors) do
    if type(name) ~= "string" then
      error(string.format("save: tensor names must be strings, got a %s key", type(name)), 2)
    elseif name == "__metadata__" then
      error("save: '__metadata__' is reserved and cannot name a tensor", 2)
    elseif not utf8.len(name) then
      error(string.format("save: tensor name %q is not valid UTF-8", name), 2)
    elseif not is_tensor(t) then
      error(string.format("save: '%s' is a %s, not a tensor", name, type(t)), 2)
    end
  end
  for k, v in pairs(metadata or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then
      error(string.format("save: metadata must map strings to strings, got %s -> %s", type(k), type(v)), 2)
    elseif not utf8.len(k) or not utf8.len(v) then
      error(string.format("save: metadata entry %q is not valid UTF-8", k), 2)
    end
  end

  local entries, parts, offset = {}, { false }, 0
  if metadata and next(metadata) then
    local kv = {}
    for _, k in ipairs(sorted_keys(metadata)) do kv[#kv + 1] = json_string(k) .. ":" .. json_string(metadata[k]) end
    entries[1] = '"__metadata__":{' .. table.concat(kv, ",") .. "}"
  end
  for _, name in ipairs(sorted_keys(tensors)) do
    local t = tensors[name]
    local dtype = core.dtype(t)
    local nbytes = core.numel(t) * itemsizes[dtype]
    entries[#entries + 1] = string.format('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}', json_string(name),
      save_dtypes[dtype], table.concat(core.shape(t), ","), offset, offset + nbytes)
    parts[#parts + 1] = t
    offset = offset + nbytes
  end
  local header = "{" .. table.concat(entries, ",") .. "}"
  header = header .. string.rep(" ", -#header % 8)
  parts[1] = string.pack("<I8", #header) .. header
  local ok, err = core.write_file_atomic(path, parts)
  if not ok then return nil, "save: " .. err end
  return true
end

-- Does a decoded JSON value look like an array? (cjson decodes [] and {}
-- alike, so an empty table counts as both an array and an object.)
local function is_array(v)
  if type(v) ~= "table" then return false end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  return n == #v
end

-- "a number", "null", "an array of length 2"... for messages about decoded JSON values.
local function json_type(v)
  if v == cjson.null then return "null" end
  if type(v) == "table" then
    if next(v) == nil then return "empty" end
    return is_array(v) and string.format("an array of length %d", #v) or "an object"
  end
  return "a " .. type(v)
end

local function json_array_str(v)
  local s = {}
  for i, x in ipairs(v) do s[i] = type(x) == "string" and string.format("%q", x) or tostring(as_int(x) or x) end
  return "[" .. table.concat(s, ", ") .. "]"
end

-- Validates one header entry; returns {name, dtype, shape, first, last} or
-- nil, message (without the "load: file: " prefix).
local function check_entry(name, e, buffer_len)
  local where = string.format("tensor '%s'", name)
  if type(e) ~= "table" or (next(e) ~= nil and is_array(e)) then
    return nil, string.format("%s: entry is %s, not an object", where, json_type(e))
  end
  for _, field in ipairs({ "dtype", "shape", "data_offsets" }) do
    if e[field] == nil then return nil, string.format("%s: missing %s", where, field) end
  end
  local dtype = e.dtype
  if type(dtype) ~= "string" then
    return nil, string.format("%s: dtype is %s, not a string", where, json_type(dtype))
  end
  local itemsize = load_dtypes[dtype]
  if not itemsize then
    return nil, string.format("%s: unsupported dtype '%s' (supported: F32, F64, F16, BF16, I64, I32)", where, dtype)
  end
  if not is_array(e.shape) then
    return nil, string.format("%s: shape is %s, not an array of sizes", where, json_type(e.shape))
  end
  local shape = {}
  for i, v in ipairs(e.shape) do
    local d = as_int(v)
    if not d or d < 0 then
      return nil, string.format("%s: shape entry %d is %s, not a non-negative integer", where, i,
        type(v) == "number" and string.format("%.17g", v) or json_type(v))
    end
    shape[i] = d
  end
  if #shape > MAX_DIMS then
    return nil, string.format("%s: shape %s has %d dims, at most %d are supported", where, shape_str(shape), #shape,
      MAX_DIMS)
  end
  local offs = e.data_offsets
  if not is_array(offs) or #offs ~= 2 then
    return nil, string.format("%s: data_offsets is %s, not [begin, end]", where, json_type(offs))
  end
  local first, last = as_int(offs[1]), as_int(offs[2])
  if not first or not last or first < 0 or last < 0 then
    return nil, string.format("%s: data_offsets %s are not non-negative integers", where, json_array_str(offs))
  end
  if last < first then
    return nil, string.format("%s: data_offsets [%d, %d] end before they begin", where, first, last)
  end
  local needed = itemsize
  for _, d in ipairs(shape) do
    if d == 0 then
      needed = 0
      break
    end
  end
  if needed > 0 then
    for _, d in ipairs(shape) do
      if needed > math.maxinteger // d then
        return nil, string.format("%s: shape %s is too large", where, shape_str(shape))
      end
      needed = needed * d
    end
  end
  if needed ~= last - first then
    return nil, string.format("%s: shape %s needs %d bytes, data_offsets span %d", where, shape_str(shape), needed,
      last - first)
  end
  if last > buffer_len then
    return nil, string.format("%s: data_offsets [%d, %d] lie outside the data buffer of %d bytes (truncated file?)",
      where, first, last, buffer_len)
  end
  return { name = name, dtype = dtype, shape = shape, first = first, last = last }
end

--- Loads a safetensors file.
-- @tparam string path
-- @treturn[1] {[string]=Tensor,...} tensors (F32 and F16/BF16 as float32, F64 as float64)
-- @treturn[1] {[string]=string,...} metadata (empty table when the file has none)
-- @treturn[2] nil
-- @treturn[2] string message, e.g. "load: m.safetensors: tensor 'w': shape [3x4] needs 48 bytes, data_offsets span 40"
-- @usage local sd, meta = assert(attn.load("model.safetensors"))
function M.load(path)
  check_path(path, "load")
  local data, rerr = read_file(path, "load")
  if not data then return nil, rerr end
  local function fail(fmt, ...) return nil, string.format("load: %s: " .. fmt, path, ...) end

  if #data < 8 then return fail("file is %d bytes, too short for the 8-byte header length", #data) end
  local n = string.unpack("<I8", data)
  if n < 0 or n > M.MAX_HEADER_BYTES then
    return fail("header length %.0f is absurd (limit %d bytes)", n < 0 and n + 2.0 ^ 64 or n, M.MAX_HEADER_BYTES)
  end
  if n > #data - 8 then
    return fail("header length %d exceeds the %d bytes after it (truncated file?)", n, #data - 8)
  end
  local text = data:sub(9, 8 + n)
  if not text:find("^%s*{") then return fail("header is not a JSON object") end
  local ok, header = pcall(json.decode, text)
  if not ok then return fail("header is not valid JSON: %s", tostring(header)) end
  if type(header) ~= "table" then return fail("header is not a JSON object") end

  local metadata = {}
  local meta = header.__metadata__
  if meta ~= nil then
    if type(meta) ~= "table" or (next(meta) ~= nil and is_array(meta)) then
      return fail("__metadata__ is %s, not an object", json_type(meta))
    end
    for _, k in ipairs(sorted_keys(meta)) do
      if type(meta[k]) ~= "string" then
        return fail("__metadata__ entry '%s' is %s, not a string", k, json_type(meta[k]))
      end
      metadata[k] = meta[k]
    end
  end

  local buffer_len = #data - 8 - n
  local entries = {}
  for _, name in ipairs(sorted_keys(header)) do
    if name ~= "__metadata__" then
      local e, err = check_entry(name, header[name], buffer_len)
      if not e then return fail("%s", err) end
      entries[#entries + 1] = e
    end
  end
  table.sort(entries, function(a, b)
    if a.first ~= b.first then return a.first < b.first end
    if a.last ~= b.last then return a.last < b.last end
    return byte_less(a.name, b.name)
  end)
  local pos, prev = 0, nil
  for _, e in ipairs(entries) do
    if e.first < pos then
      return fail("tensor '%s': data_offsets [%d, %d] overlap tensor '%s' [%d, %d]", e.name, e.first, e.last,
        prev.name, prev.first, prev.last)
    elseif e.first > pos then
      return fail("tensor '%s': data_offsets [%d, %d] leave a gap of %d bytes before them", e.name, e.first, e.last,
        e.first - pos)
    end
    pos, prev = e.last, e
  end
  if pos ~= buffer_len then
    return fail("%d trailing bytes after the last tensor (the data buffer has %d bytes, tensors cover %d)",
      buffer_len - pos, buffer_len, pos)
  end

  local tensors = {}
  for _, e in ipairs(entries) do
    tensors[e.name] = core.tensor_from_bytes(data, 8 + n + e.first, e.dtype, e.shape)
  end
  return tensors, metadata
end

-- ---------------------------------------------------------------- .npy

local NPY_MAGIC = "\x93NUMPY"

--- Saves one tensor as a NumPy `.npy` file, format version 1.0 (atomically).
-- @tparam string path
-- @tparam Tensor t float32 (`<f4`), float64 (`<f8`) or int64 (`<i8`); strided views are written row-major
-- @treturn[1] boolean true
-- @treturn[2] nil
-- @treturn[2] string message
-- @raise when t is not a tensor
function M.save_npy(path, t)
  check_path(path, "save_npy")
  if not is_tensor(t) then error(string.format("save_npy: expected a tensor, got a %s", type(t)), 2) end
  local shape = core.shape(t)
  local dims = #shape == 1 and shape[1] .. "," or table.concat(shape, ", ")
  local header = string.format("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
    ({ float32 = "<f4", float64 = "<f8", int64 = "<i8" })[core.dtype(t)], dims)
  local preamble
  if #header + 11 <= 65535 then
    header = header .. string.rep(" ", -(10 + #header + 1) % 64) .. "\n"
    preamble = NPY_MAGIC .. "\1\0" .. string.pack("<I2", #header)
  else -- cannot happen with at most 8 dims, kept for completeness
    header = header .. string.rep(" ", -(12 + #header + 1) % 64) .. "\n"
    preamble = NPY_MAGIC .. "\2\0" .. string.pack("<I4", #header)
  end
  local ok, err = core.write_file_atomic(path, { preamble .. header, t })
  if not ok then return nil, "save_npy: " .. err end
  return true
end

-- A parser for the Python literals of .npy headers: dicts, tuples, lists,
-- strings, integers, True, False and None. Returns the value or nil, message.
local NONE = setmetatable({}, { __tostring = function() return "None" end })

local function parse_python_literal(s)
  local pos = 1
  local function skip() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local function err(what)
    return nil, string.format("%s at character %d of the header", what, pos)
  end
  local value
  local function sequence(close, kind, depth)
    local out = { kind = kind }
    local had_comma = false
    while true do
      skip()
      if s:sub(pos, pos) == close then
        pos = pos + 1
        break
      end
      local v, e = value(depth + 1)
      if v == nil then return nil, e end
      out[#out + 1] = v
      skip()
      local c = s:sub(pos, pos)
      if c == "," then
        pos, had_comma = pos + 1, true
      elseif c == close then
        pos = pos + 1
        break
      else
        return err("expected ',' or '" .. close .. "'")
      end
    end
    if kind == "tuple" and #out == 1 and not had_comma then return out[1] end -- (x) is just x
    return out
  end
  function value(depth)
    if depth > 32 then return err("nesting too deep") end
    skip()
    local c = s:sub(pos, pos)
    if c == "'" or c == '"' then
      local buf, i = {}, pos + 1
      while true do
        local ch = s:sub(i, i)
        if ch == "" then return err("unterminated string") end
        if ch == c then break end
        if ch == "\\" then
          i = i + 1
          ch = s:sub(i, i)
        end
        buf[#buf + 1] = ch
        i = i + 1
      end
      pos = i + 1
      return { kind = "str", value = table.concat(buf) }
    elseif c == "(" or c == "[" then
      pos = pos + 1
      return sequence(c == "(" and ")" or "]", c == "(" and "tuple" or "list", depth)
    elseif c == "{" then
      pos = pos + 1
      local out = { kind = "dict", keys = {}, values = {} }
      while true do
        skip()
        if s:sub(pos, pos) == "}" then
          pos = pos + 1
          return out
        end
        local k, e = value(depth + 1)
        if k == nil then return nil, e end
        if type(k) ~= "table" or k.kind ~= "str" then return err("dict key is not a string") end
        skip()
        if s:sub(pos, pos) ~= ":" then return err("expected ':'") end
        pos = pos + 1
        local v, e2 = value(depth + 1)
        if v == nil then return nil, e2 end
        if out.values[k.value] ~= nil then return err("duplicate key '" .. k.value .. "'") end
        out.keys[#out.keys + 1], out.values[k.value] = k.value, v
        skip()
        local d = s:sub(pos, pos)
        if d == "," then
          pos = pos + 1
        elseif d ~= "}" then
          return err("expected ',' or '}'")
        end
      end
    end
    local num = s:match("^[-+]?%d+", pos)
    if num then
      pos = pos + #num
      if s:sub(pos, pos) == "L" or s:sub(pos, pos) == "l" then pos = pos + 1 end -- Python 2 longs
      local v = math.tointeger(tonumber(num)) -- nil when it overflowed into a float
      if not v then return err("integer " .. num .. " out of range") end
      return v
    end
    local word = s:match("^%a+", pos)
    if word == "True" or word == "False" or word == "None" then
      pos = pos + #word
      if word == "None" then return NONE end
      return word == "True"
    end
    return err(c == "" and "unexpected end" or "unexpected '" .. c .. "'")
  end
  local v, e = value(0)
  if v == nil then return nil, e end
  skip()
  if pos <= #s then return err("unexpected '" .. s:sub(pos, pos) .. "' after the dict") end
  return v
end

local function python_repr(v)
  if type(v) == "table" and v.kind == "str" then return "'" .. v.value .. "'" end
  if type(v) == "table" and v.kind then return "a " .. v.kind end
  if type(v) == "boolean" then return v and "True" or "False" end
  return tostring(v)
end

-- descr type code -> encoding for core.tensor_from_bytes, item size
local npy_types = { f4 = { "float32", 4 }, f8 = { "float64", 8 }, f2 = { "float16", 2 }, i4 = { "int32", 4 },
  i8 = { "int64", 8 } }

--- Loads a NumPy `.npy` file (versions 1.0, 2.0 and 3.0).
-- @tparam string path
-- @treturn[1] Tensor float32 for `f4`/`f2`, float64 for `f8`, int64 for `i4`/`i8` (exact); always row-major
-- @treturn[2] nil
-- @treturn[2] string message naming the file and the problem
function M.load_npy(path)
  check_path(path, "load_npy")
  local data, rerr = read_file(path, "load_npy")
  if not data then return nil, rerr end
  local function fail(fmt, ...) return nil, string.format("load_npy: %s: " .. fmt, path, ...) end

  if #data < 10 or data:sub(1, 6) ~= NPY_MAGIC then return fail("not a .npy file (bad magic)") end
  local major, minor = data:byte(7, 8)
  local hlen, start
  if major == 1 and minor == 0 then
    hlen, start = string.unpack("<I2", data, 9), 11
  elseif (major == 2 or major == 3) and minor == 0 then
    if #data < 12 then return fail("file is %d bytes, too short for a version %d.0 preamble", #data, major) end
    hlen, start = string.unpack("<I4", data, 9), 13
  else
    return fail("unsupported .npy version %d.%d (supported: 1.0, 2.0, 3.0)", major, minor)
  end
  if hlen > #data - start + 1 then
    return fail("header length %d exceeds the %d bytes after the preamble (truncated file?)", hlen, #data - start + 1)
  end
  local text = data:sub(start, start + hlen - 1)
  local header, perr = parse_python_literal(text)
  if header == nil then return fail("header is not a Python literal: %s", perr) end
  if type(header) ~= "table" or header.kind ~= "dict" then
    return fail("header is %s, not a dict", python_repr(header))
  end
  for _, k in ipairs({ "descr", "fortran_order", "shape" }) do
    if header.values[k] == nil then return fail("header has no '%s' key", k) end
  end
  for _, k in ipairs(header.keys) do
    if k ~= "descr" and k ~= "fortran_order" and k ~= "shape" then
      return fail("header has an unexpected key '%s'", k)
    end
  end

  local descr = header.values.descr
  if type(descr) ~= "table" or descr.kind ~= "str" then
    return fail("descr is %s; structured dtypes are not supported", python_repr(descr))
  end
  local order, code = descr.value:match("^([<>|=])(%a%d+)$")
  local enc = npy_types[code or ""]
  if not enc or order == "|" or order == "=" then
    return fail("unsupported descr '%s' (supported: <f4, <f8, <f2, <i4, <i8 and their big-endian '>' forms)",
      descr.value)
  end
  local fortran = header.values.fortran_order
  if type(fortran) ~= "boolean" then return fail("fortran_order is %s, not True or False", python_repr(fortran)) end
  local tuple = header.values.shape
  if type(tuple) ~= "table" or tuple.kind ~= "tuple" then
    return fail("shape is %s, not a tuple", python_repr(tuple))
  end
  local shape = {}
  for i, d in ipairs(tuple) do
    if math.type(d) ~= "integer" or d < 0 then
      return fail("shape entry %d is %s, not a non-negative integer", i, python_repr(d))
    end
    shape[i] = d
  end
  local shape_py = "(" .. table.concat(shape, ", ") .. (#shape == 1 and ",)" or ")")
  if #shape > MAX_DIMS then
    return fail("shape %s has %d dims, at most %d are supported", shape_py, #shape, MAX_DIMS)
  end
  local needed = enc[2]
  for _, d in ipairs(shape) do
    if d == 0 then
      needed = 0
    elseif needed > 0 and needed > math.maxinteger // d then
      return fail("shape %s is too large", shape_py)
    elseif needed > 0 then
      needed = needed * d
    end
  end
  local offset = start - 1 + hlen
  local available = #data - offset
  if available < needed then
    return fail("data are %d bytes, shape %s of '%s' needs %d (truncated file?)", available, shape_py, descr.value,
      needed)
  elseif available > needed then
    return fail("%d trailing bytes after the data of shape %s of '%s'", available - needed, shape_py, descr.value)
  end

  local big = order == ">"
  if not fortran then return core.tensor_from_bytes(data, offset, enc[1], shape, big) end
  -- Column-major: the bytes are the row-major layout of the reversed shape.
  local reversed, perm = {}, {}
  for i = #shape, 1, -1 do
    reversed[#reversed + 1] = shape[i]
    perm[#perm + 1] = i
  end
  local t = core.tensor_from_bytes(data, offset, enc[1], reversed, big)
  if #shape < 2 then return t end
  return core.contiguous(core.permute(t, perm))
end

return M
