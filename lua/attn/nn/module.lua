--- The Module base class of `attn.nn` and the tiny class helper behind every layer.
--
-- A module owns parameters (leaf tensors that require grad), buffers (state that
-- is saved but not trained) and child modules. Parameter names and layouts follow
-- the book's PyTorch modules, so the dotted names of `m:state_dict()` are those of
-- `torch.nn.Module.state_dict()` ("W_q.weight", "rnn.weight_ih_l0", "0.weight").
--
-- **Registration.** Assigning a Module to a field (`self.W_q = nn.Linear(3, 4)`)
-- registers it as a child; assigning a leaf tensor that requires grad registers it
-- as a parameter (`self.weight = attn.randn({4, 3}, {requires_grad = true})`). The
-- explicit forms are `self:register_parameter(name, t)`, `self:register_buffer(name,
-- t)` and `self:add_module(name, m)`. Registration order is the order of
-- `parameters()`: own parameters first, then each child's, depth first. Assigning
-- a plain tensor (no grad) keeps it an ordinary field, outside the state dict.
-- Assigning `nil` to a registered name removes the entry from the enumeration.
-- Fields live in a side table (`_attrs`), so every assignment passes through the
-- registration check: a field that first held a plain value and later receives
-- a module or a parameter registers then. A plain Lua table holding modules is
-- refused (`self.blks = {nn.Linear(4, 4)}` raises and names `nn.ModuleList`),
-- when assigned and again when the tree is enumerated (a table filled after the
-- assignment), since its modules would silently never train. A module may not
-- contain itself: a registration that would make a cycle raises.
-- Lua evaluates multiple assignment right to left: `self.a, self.b = A, B`
-- registers b first. Write one assignment per line where the order matters
-- (it is the order of `parameters()` and of any initialisation loop over them).
--
-- **Containers.** `nn.ModuleList`, `nn.ModuleDict` and `nn.Sequential` (in
-- attn.nn.containers) hold children under PyTorch's names. List children (and
-- Sequential's) are named "0", "1", ... as in PyTorch, so the state dict
-- of `nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 8))` has keys
-- "0.weight", "0.bias", "2.weight", "2.bias"; in Lua the layers are `seq[1]`,
-- `seq[2]`, `seq[3]` (1-based, like every index of this library).
--
-- **Errors.** Calling `m(...)` runs `m:forward(...)`. An error raised inside a
-- child module is re-raised by the outermost module with the path of the failing
-- module: "in MultiHeadAttention.W_q (Linear): Linear: input [2x4x3] has ...".
-- The path is the registered one (a block of a ModuleList that is iterated, not
-- called, shows as "Net.blks.1"). An error raised by the outermost module's own
-- forward keeps its message (only a "…/attn/….lua:123: " position inside this
-- library is removed; positions in user code are kept). Either way the message
-- ends with the stack traceback taken where the error was raised (the module
-- system catches errors with xpcall, so the user's frames are not lost).
--
-- @module attn.nn.Module
-- @usage
-- -- Writing a custom module:
-- local attn = require "attn"
-- local nn = attn.nn
-- local Scale = nn.Module:extend("Scale")      -- a new class, subclass of Module
-- function Scale:init(d)                        -- constructor body; registries exist already
--   self.lin = nn.Linear(d, d)                  -- child "lin" (names "lin.weight", "lin.bias")
--   self:register_parameter("gain", attn.ones({d}))
-- end
-- function Scale:forward(x) return self.lin(x) * self.gain end
-- function Scale:extra_repr() return "gain" end  -- optional, shown by tostring
-- local m = Scale(4)                            -- construct by calling the class
-- local y = m(attn.randn({2, 4}))               -- forward via __call
-- -- Subclassing an existing layer: call the parent's init yourself.
-- local MyLinear = nn.Linear:extend("MyLinear")
-- function MyLinear:init(i, o) nn.Linear.init(self, i, o, {bias = false}) end
local attn = require "attn"
local autograd = require "attn.autograd"

local is_tensor = autograd.is_tensor
local shape_str = require("attn.core").shape_str -- "[2x3]" from a tensor or a table of sizes

local M = {}

-- ---------------------------------------------------------------- class helper

local Module = {}

-- Metamethods every class table carries for its instances (metamethods are not
-- inherited through __index, so `extend` copies them).
local INSTANCE_META = { "__index", "__newindex", "__call", "__tostring", "__len" }

local class_mt = {}

-- Calling a class constructs an instance: registries first, then cls.init.
-- Internal state (names starting with "_", and `training`) is stored in the
-- instance itself; every other field lives in `_attrs`, so that each assignment
-- reaches __newindex.
function class_mt.__call(cls, ...)
  local obj = {
    _param_names = {},
    _buffer_names = {},
    _module_names = {},
    _keys = {},
    _attrs = {},
    training = true,
  }
  setmetatable(obj, cls)
  cls.init(obj, ...)
  return obj
end

function class_mt.__tostring(cls) return "class " .. cls.__name end

--- Creates a subclass: `local MyLayer = nn.Module:extend("MyLayer")`.
-- The name is used by tostring and error messages.
-- @tparam string name CamelCase class name
-- @treturn table the class (call it to construct)
function Module.extend(parent, name)
  if type(name) ~= "string" then error("extend: expected a class name string", 2) end
  local cls = { __name = name, super = parent }
  for _, k in ipairs(INSTANCE_META) do cls[k] = rawget(parent, k) end
  setmetatable(cls, { __index = parent, __call = class_mt.__call, __tostring = class_mt.__tostring })
  return cls
end

--- `nn.class(name [, parent])`: the same as `parent:extend(name)` (parent defaults to Module).
function M.class(name, parent) return Module.extend(parent or Module, name) end

Module.__name = "Module"
setmetatable(Module, { __call = class_mt.__call, __tostring = class_mt.__tostring })

-- Field lookup: the instance's attributes, then its class (methods).
function Module.__index(self, k)
  local v = rawget(self, "_attrs")[k]
  if v ~= nil then return v end
  return getmetatable(self)[k]
end

--- Base constructor: does nothing (the registries are set up before init runs).
function Module.init() end

--- The class name of an instance, e.g. "Linear".
function Module:class_name() return getmetatable(self).__name end

--- True when `v` is a module instance.
function M.is_module(v)
  local mt = getmetatable(v)
  while type(mt) == "table" do
    if mt == Module then return true end
    mt = rawget(mt, "super")
  end
  return false
end
local is_module = M.is_module

-- ---------------------------------------------------------------- registration

-- The structure generation: bumped by every change of any module's registries
-- (a parameter, buffer or child registered, replaced or removed; a field
-- receiving its first plain table). A cached parameter list is valid while the generation
-- it was built at is current; one counter for every module, since a module
-- does not know its parents (a change deep in a tree must reach the root's
-- cache) and the tree only changes while it is being built.
local generation = 0

--- Marks the module structure as changed: every cached `parameters()` list is
-- rebuilt at its next call. The registration functions call it; a container
-- that rewrites its registries calls it too. Code that edits the internal
-- registries (`_param_names`, `_attrs`, ...) behind them must call it.
function M.invalidate() generation = generation + 1 end
local invalidate = M.invalidate

local function remove_name(list, name)
  local found = false
  for i = #list, 1, -1 do
    if list[i] == name then
      table.remove(list, i)
      found = true
    end
  end
  return found
end

local function add_name(list, name)
  for _, n in ipairs(list) do
    if n == name then return end
  end
  list[#list + 1] = name
end

local function has_name(list, name)
  for _, n in ipairs(list) do
    if n == name then return true end
  end
  return false
end

-- Forget `name` in every registry (a field being re-assigned with another kind).
local function unregister(self, name)
  local p = remove_name(self._param_names, name)
  local b = remove_name(self._buffer_names, name)
  local m = remove_name(self._module_names, name)
  if p or b or m then invalidate() end
  self._keys[name] = nil
end

local function is_param_tensor(v) return is_tensor(v) and v._rg == true and v.grad_fn == nil end

local function get(self, name) return rawget(self, "_attrs")[self._keys[name] or name] end

-- A plain Lua table: not a module, not a tensor, no metatable (a field that
-- could be filled with modules after its assignment).
local function is_plain_table(v)
  return type(v) == "table" and getmetatable(v) == nil and not is_tensor(v)
end

-- The first module found in a plain Lua table (not a module, not a tensor), or nil.
local function module_in_table(v)
  if not is_plain_table(v) then return nil end
  for k, x in pairs(v) do
    if is_module(x) then return k, x end
  end
  return nil
end

local function plain_table_error(self, field, key, m, level)
  error(string.format("%s: field '%s' is a plain Lua table holding a module (%s at key %s), which would never be " ..
    "registered (not in parameters() or state_dict()); use nn.ModuleList (or nn.ModuleDict for named entries)",
    self:class_name(), tostring(field), m:class_name(), tostring(key)), level)
end

-- True when `target` is `m` or one of its descendants (a cycle would follow).
local function reaches(m, target, seen)
  if m == target then return true end
  seen = seen or {}
  if seen[m] then return false end
  seen[m] = true
  for _, name in ipairs(m._module_names) do
    local c = get(m, name)
    if c ~= nil and reaches(c, target, seen) then return true end
  end
  return false
end

-- Registers `m` as child `name` (field `key`), refusing cycles.
local function register_module(self, name, m, key, level)
  if reaches(m, self) then
    error(string.format("%s: cannot register '%s' (%s): the module would contain itself", self:class_name(),
      tostring(name), m:class_name()), level + 1)
  end
  unregister(self, name)
  add_name(self._module_names, name)
  if key ~= nil and key ~= name then self._keys[name] = key end
  rawset(m, "_name", name)
  invalidate()
end

-- Field assignment: modules and leaf tensors requiring grad are registered; a
-- registered child or parameter cannot silently become something else.
function Module.__newindex(self, k, v)
  if type(k) == "string" and k:sub(1, 1) == "_" then
    rawset(self, k, v)
    return
  end
  if type(k) == "string" then
    if is_module(v) then
      register_module(self, k, v, nil, 2)
    elseif is_param_tensor(v) then
      unregister(self, k)
      add_name(self._param_names, k)
      invalidate()
    elseif v == nil then
      unregister(self, k)
    elseif has_name(self._module_names, k) then
      error(string.format("%s: cannot assign a %s to child module '%s' (a module or nil expected)",
        self:class_name(), type(v), k), 2)
    elseif has_name(self._param_names, k) then
      error(string.format("%s: cannot assign %s to parameter '%s' (a leaf tensor that requires grad, or nil, " ..
        "expected; change its values in place or use another name)", self:class_name(),
        is_tensor(v) and "a tensor that is not a leaf requiring grad" or "a " .. type(v), k), 2)
    elseif has_name(self._buffer_names, k) and not is_tensor(v) then
      error(string.format("%s: cannot assign a %s to buffer '%s' (a tensor or nil expected)", self:class_name(),
        type(v), k), 2)
    else
      local key, m = module_in_table(v)
      if key ~= nil then plain_table_error(self, k, key, m, 3) end
      -- a field holding a plain table is watched by the cached parameter
      -- lists from now on (whatever it holds later): only its first plain
      -- table changes the structure (forwards assign fresh ones every call)
      if is_plain_table(v) then
        local plain = rawget(self, "_plain")
        if plain == nil then
          plain = {}
          rawset(self, "_plain", plain)
        end
        if not plain[k] then
          plain[k] = true
          invalidate()
        end
      end
    end
  end
  rawget(self, "_attrs")[k] = v
end

--- Registers `t` as a parameter under `name` (sets requires_grad). Returns t.
-- Passing nil records the name with no tensor (like PyTorch's bias=None): it is
-- skipped by every enumeration.
function Module:register_parameter(name, t)
  if t ~= nil and not is_tensor(t) then
    error(string.format("register_parameter: '%s' must be a tensor, got a %s", name, type(t)), 2)
  end
  if t ~= nil and not t.requires_grad then t:requires_grad_() end
  unregister(self, name)
  add_name(self._param_names, name)
  rawget(self, "_attrs")[name] = t
  invalidate()
  return t
end

--- Registers `t` as a buffer: in the state dict and converted by `to`, not trained.
function Module:register_buffer(name, t)
  if t ~= nil and not is_tensor(t) then
    error(string.format("register_buffer: '%s' must be a tensor, got a %s", name, type(t)), 2)
  end
  unregister(self, name)
  add_name(self._buffer_names, name)
  rawget(self, "_attrs")[name] = t
  invalidate()
  return t
end

--- Registers child module `m` under `name`; `key` (optional) is the Lua field
-- holding it when it differs from the name (a ModuleList stores child "0" at 1).
-- @raise when m is not a module, or when m contains self (a cycle)
function Module:add_module(name, m, key)
  if not is_module(m) then
    error(string.format("add_module: '%s' must be a module, got a %s", tostring(name), type(m)), 2)
  end
  register_module(self, name, m, key, 2)
  rawget(self, "_attrs")[key or name] = m
  return m
end

-- ---------------------------------------------------------------- enumeration

-- Raises when a plain field of `m` holds modules (filled after it was
-- assigned). `plain` (optional) collects {m, field} of every field that has
-- held a plain table (the fields a cached list checks again).
local function check_plain_tables(m, plain)
  for k, v in pairs(rawget(m, "_attrs")) do
    local key, child = module_in_table(v)
    if key ~= nil then plain_table_error(m, k, key, child, 0) end
  end
  if plain then
    for k in pairs(rawget(m, "_plain") or {}) do plain[#plain + 1] = { m, k } end
  end
end

--- The children as an ordered list of {name, module}.
function Module:named_children()
  local out = {}
  for _, name in ipairs(self._module_names) do
    local m = get(self, name)
    if m ~= nil then out[#out + 1] = { name, m } end
  end
  return out
end

--- The children as a list of modules, in registration order; a module
-- registered twice (tied layers) is listed once, as PyTorch's children().
function Module:children()
  local out, seen = {}, {}
  for _, c in ipairs(self:named_children()) do
    if not seen[c[2]] then
      seen[c[2]] = true
      out[#out + 1] = c[2]
    end
  end
  return out
end

-- Visits (prefix, module) depth first: the module itself, then its children.
-- A module reached again on its own path (a cycle made behind the registration
-- checks) raises instead of recursing forever.
local function walk(self, prefix, visit, path)
  path = path or {}
  if path[self] then
    error(string.format("module tree has a cycle: %s (%s) contains itself", prefix:sub(1, -2), self:class_name()), 0)
  end
  check_plain_tables(self)
  path[self] = true
  visit(prefix, self)
  for _, c in ipairs(self:named_children()) do
    walk(c[2], prefix .. c[1] .. ".", visit, path)
  end
  path[self] = nil
end

-- The lists of {name, value} pairs that named_parameters, named_buffers and
-- named_modules return are also their own iterators: Lua's generic for calls
-- a callable explist value as f(nil, control) with control the previous name,
-- so `for name, p in m:named_parameters() do` reads as PyTorch's loop while
-- `ipairs(list)`, `#list` and `list[i][1]` keep working. The name -> position
-- map is built when a loop starts (control nil), so it follows edits made to
-- the list before the loop; names in one list are unique (dotted paths).
local named_list_mt = {}
local named_positions = setmetatable({}, { __mode = "k" })

function named_list_mt.__call(list, _, name)
  local i = 1
  if name == nil then
    local pos = {}
    for k, e in ipairs(list) do pos[e[1]] = k end
    named_positions[list] = pos
  else
    i = (named_positions[list] or {})[name]
    if i == nil then error("named list: the loop's name '" .. tostring(name) .. "' is not in the list", 2) end
    i = i + 1
  end
  local e = list[i]
  if e == nil then return nil end
  return e[1], e[2]
end

local function named_list(out) return setmetatable(out, named_list_mt) end

--- Every module of the tree with its dotted name (self first, named ""), depth
-- first, each module once (PyTorch's named_modules). The list is its own
-- iterator: `for name, m in net:named_modules() do ... end`.
-- @treturn table list of {name, module}
-- @usage for name, m in net:named_modules() do print(name, m:class_name()) end
function Module:named_modules()
  local out, seen = named_list({}), {}
  walk(self, "", function(prefix, m)
    if not seen[m] then
      seen[m] = true
      out[#out + 1] = { prefix:sub(1, -2), m }
    end
  end)
  return out
end

--- Every module of the tree (self first), depth first, each once, as a list.
function Module:modules()
  local out = {}
  for _, e in ipairs(self:named_modules()) do out[#out + 1] = e[2] end
  return out
end

--- Calls fn(m) on every child module (recursively, children before their
-- parent) and then on self, as PyTorch's apply; used for initialisation:
-- `net:apply(function(m) if m:class_name() == "Linear" then ... end end)`.
-- @treturn Module self
function Module:apply(fn)
  if type(fn) ~= "function" then error("apply: expected a function, got a " .. type(fn), 2) end
  for _, c in ipairs(self:children()) do c:apply(fn) end
  fn(self)
  return self
end

-- Ordered {name, tensor} pairs of one kind ("_param_names" or "_buffer_names"),
-- a list that is its own iterator (named_list).
local function named_entries(self, registry, dedupe)
  local out, seen = named_list({}), {}
  walk(self, "", function(prefix, m)
    for _, n in ipairs(m[registry]) do
      local t = get(m, n)
      if t ~= nil and not (dedupe and seen[t]) then
        seen[t] = true
        out[#out + 1] = { prefix .. n, t }
      end
    end
  end)
  return out
end

-- The order and checks of walk without the dotted names, which parameters()
-- (called by clip_grad_norm_ at every step) does not need; a cycle is
-- reported by walk itself, which names the path.
local function each_module(self, visit, path, root, plain)
  if path[self] then walk(root, "", function() end) end
  check_plain_tables(self, plain)
  path[self] = true
  visit(self)
  for _, name in ipairs(self._module_names) do
    local c = get(self, name)
    if c ~= nil then each_module(c, visit, path, root, plain) end
  end
  path[self] = nil
end

-- The parameter list of a fresh walk, with the plain-table fields met on the
-- way: {list = ..., plain = {{m, field}, ...}, generation = ...}.
local function collect_parameters(self)
  local values, seen, plain = {}, {}, {}
  each_module(self, function(m)
    for _, n in ipairs(m._param_names) do
      local t = get(m, n)
      if t ~= nil and not seen[t] then
        seen[t] = true
        values[#values + 1] = t
      end
    end
  end, {}, self, plain)
  return { list = values, plain = plain, generation = generation }
end

--- The parameters as a list: registration order, own before children's, depth
-- first; a parameter shared by two modules appears once.
--
-- The list is cached on the module (clip_grad_norm_ asks for it at every
-- step, and a walk of the Transformer's tree costs ~90 us) and rebuilt after
-- any registration change anywhere (see `invalidate`); in place changes
-- (`load_state_dict`, `to`) keep the tensors, so the list stays valid. Each
-- call returns a new table, which the caller may change freely. The
-- plain-table fields met by the walk are checked again at every call, so a
-- table filled with modules after the list was cached still raises.
function Module:parameters()
  local c = rawget(self, "_pcache")
  if c == nil or c.generation ~= generation then
    c = collect_parameters(self)
    rawset(self, "_pcache", c)
  end
  for _, e in ipairs(c.plain) do
    local v = rawget(e[1], "_attrs")[e[2]]
    local key, child = module_in_table(v)
    if key ~= nil then plain_table_error(e[1], e[2], key, child, 0) end
  end
  local list = c.list
  return table.move(list, 1, #list, 1, {})
end

--- The parameters with their dotted names ("W_q.weight", "0.bias"), in
-- `parameters()` order. The list is its own iterator, so both loops work:
-- `for name, p in net:named_parameters() do` (PyTorch's) and
-- `for _, e in ipairs(net:named_parameters()) do` (e = {name, tensor}).
-- @treturn table list of {name, tensor}
-- @usage for name, p in net:named_parameters() do print(name, p:shape()) end
function Module:named_parameters() return named_entries(self, "_param_names", true) end

--- The dotted parameter names, in `parameters()` order.
function Module:parameter_names()
  local names = {}
  for i, e in ipairs(named_entries(self, "_param_names", true)) do names[i] = e[1] end
  return names
end

--- The buffers with their dotted names, in registration order; the list is
-- its own iterator: `for name, b in net:named_buffers() do ... end`.
-- @treturn table list of {name, tensor}
function Module:named_buffers() return named_entries(self, "_buffer_names", true) end

-- (name, owner module, field name) of every parameter and buffer, state-dict order.
local function state_entries(self)
  local out = {}
  walk(self, "", function(prefix, m)
    for _, registry in ipairs { "_param_names", "_buffer_names" } do
      for _, n in ipairs(m[registry]) do
        if get(m, n) ~= nil then out[#out + 1] = { prefix .. n, m, n } end
      end
    end
  end)
  return out
end

--- name -> tensor for every parameter and buffer. The tensors are detached views
-- sharing storage with the module's (as PyTorch's state_dict), so
-- `attn.save(path, m:state_dict())` writes a checkpoint.
function Module:state_dict()
  local map = {}
  for _, e in ipairs(state_entries(self)) do map[e[1]] = get(e[2], e[3]):detach() end
  return map
end

--- The state dict's keys in order: per module, parameters then buffers, depth first.
function Module:state_dict_keys()
  local names = {}
  for _, e in ipairs(state_entries(self)) do names[#names + 1] = e[1] end
  return names
end

-- "'a', 'b', 'c'" (at most `max` names, then "and N more").
local function quote_list(list, max)
  local parts = {}
  for i = 1, math.min(#list, max) do parts[i] = "'" .. list[i] .. "'" end
  if #list > max then parts[#parts + 1] = string.format("and %d more", #list - max) end
  return table.concat(parts, ", ")
end

-- A hint when the unexpected keys are the missing ones with a prefix added or
-- removed (a checkpoint of a wrapped or of an inner module).
local function prefix_hint(missing, unexpected)
  if #missing == 0 or #missing ~= #unexpected then return "" end
  local function common(from, to)
    local p = from[1]:sub(1, #from[1] - #to[1])
    if p == "" or from[1]:sub(#p + 1) ~= to[1] then return nil end
    for i = 2, #from do
      if from[i]:sub(1, #p) ~= p or from[i]:sub(#p + 1) ~= to[i] then return nil end
    end
    return p
  end
  local sm, su = { table.unpack(missing) }, { table.unpack(unexpected) }
  table.sort(sm)
  table.sort(su)
  local p = common(su, sm)
  if p then return string.format(" (the checkpoint's keys carry an extra prefix '%s')", p) end
  p = common(sm, su)
  if p then return string.format(" (the checkpoint's keys lack the prefix '%s')", p) end
  return ""
end

--- Copies the values of `sd` (name -> tensor or nested table) into the existing
-- parameters and buffers, in place, outside autograd, converting the dtype.
-- With strict (the default) missing or unexpected keys raise, and the message
-- lists both kinds (and names a prefix that would make them match); a
-- mis-shaped key always raises. Nothing is copied unless every check passes.
-- Returns {missing_keys = {...}, unexpected_keys = {...}} (sorted).
-- @raise "load_state_dict: MultiHeadAttention: missing key 'W_o.weight'"
function Module:load_state_dict(sd, strict)
  if strict == nil then strict = true end
  local who = "load_state_dict: " .. self:class_name() .. ": "
  if type(sd) ~= "table" or is_tensor(sd) then error(who .. "expected a table of name -> tensor", 2) end
  local entries = state_entries(self)
  local known, missing, unexpected = {}, {}, {}
  for _, e in ipairs(entries) do
    known[e[1]] = true
    if sd[e[1]] == nil then missing[#missing + 1] = e[1] end
  end
  for k in pairs(sd) do
    if not known[k] then unexpected[#unexpected + 1] = tostring(k) end
  end
  table.sort(missing)
  table.sort(unexpected)
  if strict and (#missing > 0 or #unexpected > 0) then
    local parts = {}
    if #missing > 0 then parts[1] = (#missing == 1 and "missing key " or "missing keys ") .. quote_list(missing, 8) end
    if #unexpected > 0 then
      parts[#parts + 1] = (#unexpected == 1 and "unexpected key " or "unexpected keys ") .. quote_list(unexpected, 8)
    end
    error(who .. table.concat(parts, "; ") .. prefix_hint(missing, unexpected), 2)
  end
  local sources = {}
  for i, e in ipairs(entries) do
    local src = sd[e[1]]
    if src ~= nil then
      if not is_tensor(src) then
        local ok, t = pcall(attn.tensor, src)
        if not ok then error(string.format("%skey '%s' is not a tensor (%s)", who, e[1], tostring(t)), 2) end
        src = t
      end
      local ps, ss = get(e[2], e[3]):shape(), src:shape()
      if shape_str(ps) ~= shape_str(ss) then
        error(string.format("%skey '%s' has shape %s, parameter has %s", who, e[1], shape_str(ss), shape_str(ps)), 2)
      end
      sources[i] = src
    end
  end
  attn.no_grad(function()
    for i, e in ipairs(entries) do
      if sources[i] then attn.core.copy_(get(e[2], e[3]), sources[i]) end
    end
  end)
  return { missing_keys = missing, unexpected_keys = unexpected }
end

-- ---------------------------------------------------------------- modes and conversion

--- Sets the training flag on this module and every descendant. Returns self.
function Module:train(mode)
  if mode == nil then mode = true end
  for _, m in ipairs(self:modules()) do rawset(m, "training", mode and true or false) end
  return self
end

--- `train(false)`.
function Module:eval() return self:train(false) end

--- Drops the gradient of every parameter (sets `.grad` to nil).
function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
end

--- Converts every parameter and buffer to `dtype` ("float32" or "float64") in
-- place: the tensors keep their identity (an optimizer built before still
-- updates them), their gradients are dropped. Returns self.
function Module:to(dtype)
  attn.no_grad(function()
    for _, m in ipairs(self:modules()) do
      for _, registry in ipairs { "_param_names", "_buffer_names" } do
        for _, n in ipairs(m[registry]) do
          local t = get(m, n)
          if t ~= nil and t:dtype() ~= dtype then -- a shared tensor converts once
            t:set_(attn.core.to(t, dtype))
            t.grad = nil
          end
        end
      end
    end
  end)
  return self
end

--- The dtype of the first parameter (nil for a module without parameters).
function Module:dtype()
  local p = self:parameters()[1]
  return p and p:dtype() or nil
end

-- ---------------------------------------------------------------- calling

-- Call depth of modules on the stack of each coroutine (weak keys, as grad
-- mode in attn.autograd): the outermost call of a coroutine turns a nested
-- error into its message. One shared counter would stay raised by a forward
-- that yields in a coroutine never resumed, and every later top-level error
-- would then escape as an error table.
local depths = setmetatable({}, { __mode = "k" })
local running = coroutine.running
-- The main coroutine's depth in an upvalue instead (it never yields, so it cannot be left
-- raised): the book's calls run there, and two weak-table lookups cost more than the rest of
-- a call's bookkeeping.
local main_depth = 0

local ModuleError = {}
ModuleError.__index = ModuleError

-- Removes a leading "…/attn/….lua:123: " position (one inside this library)
-- from an error message; positions in user code are kept.
local function strip_position(msg)
  if type(msg) ~= "string" then return tostring(msg) end
  return (msg:gsub("^[^\n:]-attn/[^\n:]-%.lua:%d+: ", "", 1))
end

-- The dotted name of `child` inside `parent` ("blks.0" for a block of a
-- ModuleList that was not called itself), or its own name when not found.
local function qualified_name(parent, child)
  local ok, list = pcall(parent.named_modules, parent)
  if ok then
    for _, e in ipairs(list) do
      if e[2] == child then return e[1] end
    end
  end
  return rawget(child, "_name") or child:class_name()
end

-- chain: the modules whose calls the error went through, outermost first.
function ModuleError:message()
  local text = strip_position(self.msg)
  local chain = self.chain
  if #chain > 1 then
    local names = { chain[1]:class_name() }
    for i = 2, #chain do names[i] = qualified_name(chain[i - 1], chain[i]) end
    text = string.format("in %s (%s): %s", table.concat(names, "."), chain[#chain]:class_name(), text)
  end
  return text .. "\n" .. self.traceback
end
function ModuleError.__tostring(e) return e:message() end

-- xpcall's handler: runs where the error was raised, so the stack is intact.
local function capture(err)
  if getmetatable(err) == ModuleError then return err end
  -- "file:12: in ..." becomes "file:12 in ...": tools that strip a leading
  -- "position: " from a message (luassert, many loggers) must not eat the message.
  local tb = debug.traceback(nil, 2):gsub(":(%d+): ", ":%1 ")
  return setmetatable({ chain = {}, msg = err, traceback = tb }, ModuleError)
end

-- err: the captured ModuleError; depth: the calls still on this coroutine's stack.
local function fail(self, depth, err)
  table.insert(err.chain, 1, self)
  if depth > 0 then error(err, 0) end
  if #err.chain == 1 and type(err.msg) ~= "string" then error(err.msg, 0) end -- a user's error object
  error(err:message(), 0)
end

local function finish_call(self, co, ok, ...)
  local depth = depths[co] - 1
  depths[co] = depth -- (0 stays, a weak key: no new entry per top-level call)
  if ok then return ... end
  return fail(self, depth, ...)
end

local function finish_main(self, ok, ...)
  local depth = main_depth - 1
  main_depth = depth
  if ok then return ... end
  return fail(self, depth, ...)
end

--- `m(...)` runs `m:forward(...)`, adding the module path and the traceback of
-- the error site to errors.
function Module.__call(self, ...)
  local co, main = running()
  if main then
    main_depth = main_depth + 1
    return finish_main(self, xpcall(self.forward, capture, self, ...))
  end
  depths[co] = (depths[co] or 0) + 1
  return finish_call(self, co, xpcall(self.forward, capture, self, ...))
end

--- Subclasses implement forward.
function Module:forward()
  error(self:class_name() .. ": has no forward method (define " .. self:class_name() .. ":forward)", 2)
end

-- ---------------------------------------------------------------- printing

--- One-line description of the module's own settings (override in subclasses).
function Module.extra_repr() return "" end

local function repr(m, indent)
  local head = m:class_name() .. "("
  local extra = m:extra_repr()
  local children = m:named_children()
  if #children == 0 then return head .. extra .. ")" end
  local lines = { head }
  local pad = indent .. "  "
  if extra ~= "" then lines[#lines + 1] = pad .. extra end
  for _, c in ipairs(children) do
    lines[#lines + 1] = string.format("%s(%s): %s", pad, c[1], repr(c[2], pad))
  end
  lines[#lines + 1] = indent .. ")"
  return table.concat(lines, "\n")
end

--- The structure like PyTorch's repr: nested, with sizes.
function Module.__tostring(m) return repr(m, "") end

M.Module = Module
return M
