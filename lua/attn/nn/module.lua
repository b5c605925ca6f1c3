--- The Module base class of `attn.nn` and the tiny class helper behind every layer.
--
-- A module owns parameters (leaf tensors that require grad), buffers (state that
-- is saved but not trained) and child modules. Parameter names and layouts follow
-- the book's PyTorch modules, so the dotted names of `m:state_dict()` are those of
-- `torch.nn.Module.state_dict()` ("W_q.weight", "rnn.weight_ih_l0", "0.weight").
--
-- **Registration.** Assigning a Module to a field (`self.W_q = nn.Linear(3, 4)`)
-- registers it as a child; assigning a leaf tensor that requires grad registers it
-- as a parameter (`self.weight = attn.randn({4, 3}):requires_grad_()`). The
-- explicit forms are `self:register_parameter(name, t)`, `self:register_buffer(name,
-- t)` and `self:add_module(name, m)`. Registration order is the order of
-- `parameters()`: own parameters first, then each child's, depth first. Assigning
-- a plain tensor (no grad) keeps it an ordinary field, outside the state dict.
-- Assigning `nil` to a registered name removes the entry from the enumeration.
-- Registration happens when a field is first set (Lua calls __newindex only for
-- absent keys): a field that first held a plain value and later receives a
-- module or parameter is not registered; use add_module / register_parameter.
--
-- **Sequential children** are named "0", "1", ... as in PyTorch, so the state dict
-- of `nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 8))` has keys
-- "0.weight", "0.bias", "2.weight", "2.bias"; in Lua the layers are `seq[1]`,
-- `seq[2]`, `seq[3]` (1-based, like every index of this library).
--
-- **Errors.** Calling `m(...)` runs `m:forward(...)`. An error raised inside a
-- child module is re-raised by the outermost module with the path of the failing
-- module: "in MultiHeadAttention.W_q (Linear): Linear: input [2x4x3] has ...".
-- Each level adds its own name once. An error raised by the outermost module's own
-- forward is passed through as it is (only a "…/attn/….lua:123: " position inside
-- this library is removed; positions in user code are kept).
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

local M = {}

-- ---------------------------------------------------------------- class helper

local Module = {}

-- Metamethods every class table carries for its instances (metamethods are not
-- inherited through __index, so `extend` copies them).
local INSTANCE_META = { "__index", "__newindex", "__call", "__tostring", "__len" }

local class_mt = {}

-- Calling a class constructs an instance: registries first, then cls.init.
function class_mt.__call(cls, ...)
  local obj = {}
  rawset(obj, "_param_names", {})
  rawset(obj, "_buffer_names", {})
  rawset(obj, "_module_names", {})
  rawset(obj, "_keys", {})
  rawset(obj, "training", true)
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
  for _, k in ipairs(INSTANCE_META) do
    if k ~= "__index" then cls[k] = rawget(parent, k) end
  end
  cls.__index = cls
  setmetatable(cls, { __index = parent, __call = class_mt.__call, __tostring = class_mt.__tostring })
  return cls
end

--- `nn.class(name [, parent])`: the same as `parent:extend(name)` (parent defaults to Module).
function M.class(name, parent) return Module.extend(parent or Module, name) end

Module.__name = "Module"
Module.__index = Module
setmetatable(Module, { __call = class_mt.__call, __tostring = class_mt.__tostring })

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

local function remove_name(list, name)
  for i = #list, 1, -1 do
    if list[i] == name then table.remove(list, i) end
  end
end

local function add_name(list, name)
  for _, n in ipairs(list) do
    if n == name then return end
  end
  list[#list + 1] = name
end

-- Forget `name` in every registry (a field being re-assigned with another kind).
local function unregister(self, name)
  remove_name(self._param_names, name)
  remove_name(self._buffer_names, name)
  remove_name(self._module_names, name)
end

local function is_param_tensor(v) return is_tensor(v) and v._rg == true and v.grad_fn == nil end

-- Field assignment: modules and leaf tensors requiring grad are registered.
function Module.__newindex(self, k, v)
  if type(k) == "string" and not k:find("^_") then
    if is_module(v) then
      unregister(self, k)
      add_name(self._module_names, k)
      rawset(v, "_name", k)
    elseif is_param_tensor(v) then
      unregister(self, k)
      add_name(self._param_names, k)
    end
  end
  rawset(self, k, v)
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
  rawset(self, self._keys[name] or name, t)
  return t
end

--- Registers `t` as a buffer: in the state dict and converted by `to`, not trained.
function Module:register_buffer(name, t)
  if t ~= nil and not is_tensor(t) then
    error(string.format("register_buffer: '%s' must be a tensor, got a %s", name, type(t)), 2)
  end
  unregister(self, name)
  add_name(self._buffer_names, name)
  rawset(self, self._keys[name] or name, t)
  return t
end

--- Registers child module `m` under `name`; `key` (optional) is the Lua field
-- holding it when it differs from the name (Sequential stores "0" at field 1).
function Module:add_module(name, m, key)
  if not is_module(m) then
    error(string.format("add_module: '%s' must be a module, got a %s", tostring(name), type(m)), 2)
  end
  unregister(self, name)
  add_name(self._module_names, name)
  if key ~= nil then self._keys[name] = key end
  rawset(m, "_name", name)
  rawset(self, key or name, m)
  return m
end

local function get(self, name) return rawget(self, self._keys[name] or name) end

-- ---------------------------------------------------------------- enumeration

--- The children as an ordered list of {name, module}.
function Module:named_children()
  local out = {}
  for _, name in ipairs(self._module_names) do
    local m = get(self, name)
    if m ~= nil then out[#out + 1] = { name, m } end
  end
  return out
end

--- The children as a list of modules, in registration order.
function Module:children()
  local out = {}
  for _, c in ipairs(self:named_children()) do out[#out + 1] = c[2] end
  return out
end

-- Visits (prefix, module) depth first: the module itself, then its children.
local function walk(self, prefix, visit)
  visit(prefix, self)
  for _, c in ipairs(self:named_children()) do
    walk(c[2], prefix .. c[1] .. ".", visit)
  end
end

--- Every module of the tree (self first), depth first, as a list.
function Module:modules()
  local out = {}
  walk(self, "", function(_, m) out[#out + 1] = m end)
  return out
end

-- Ordered (name, tensor) pairs of one kind ("_param_names" or "_buffer_names").
local function named_entries(self, registry, dedupe)
  local names, values, seen = {}, {}, {}
  walk(self, "", function(prefix, m)
    for _, n in ipairs(m[registry]) do
      local t = get(m, n)
      if t ~= nil and not (dedupe and seen[t]) then
        seen[t] = true
        names[#names + 1] = prefix .. n
        values[#values + 1] = t
      end
    end
  end)
  return names, values
end

--- The parameters as a list: registration order, own before children's, depth
-- first; a parameter shared by two modules appears once.
function Module:parameters()
  local _, values = named_entries(self, "_param_names", true)
  return values
end

--- A table from dotted names ("W_q.weight", "0.bias") to parameter tensors.
-- (A single result, so it can be passed on directly; `parameter_names()` gives
-- the order.)
function Module:named_parameters()
  local names, values = named_entries(self, "_param_names", true)
  local map = {}
  for i, n in ipairs(names) do map[n] = values[i] end
  return map
end

--- The dotted parameter names, in `parameters()` order.
function Module:parameter_names()
  return (named_entries(self, "_param_names", true))
end

--- A table from dotted names to buffers.
function Module:named_buffers()
  local names, values = named_entries(self, "_buffer_names", true)
  local map = {}
  for i, n in ipairs(names) do map[n] = values[i] end
  return map
end

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

local shape_str = require("attn.core").shape_str -- "[2x3]" from a tensor or a table of sizes

--- Copies the values of `sd` (name -> tensor or nested table) into the existing
-- parameters and buffers, in place, outside autograd, converting the dtype.
-- With strict (the default) a missing or unexpected key raises; a mis-shaped key
-- always raises. Nothing is copied unless every check passes. Returns
-- {missing_keys = {...}, unexpected_keys = {...}} (sorted).
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
  table.sort(unexpected)
  if strict and #missing > 0 then error(string.format("%smissing key '%s'", who, missing[1]), 2) end
  if strict and #unexpected > 0 then error(string.format("%sunexpected key '%s'", who, unexpected[1]), 2) end
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
    walk(self, "", function(_, m)
      for _, registry in ipairs { "_param_names", "_buffer_names" } do
        for _, n in ipairs(m[registry]) do
          local t = get(m, n)
          if t ~= nil and t:dtype() ~= dtype then -- a shared tensor converts once
            t:set_(attn.core.to(t, dtype))
            t.grad = nil
          end
        end
      end
    end)
  end)
  return self
end

--- The dtype of the first parameter (nil for a module without parameters).
function Module:dtype()
  local p = self:parameters()[1]
  return p and p:dtype() or nil
end

-- ---------------------------------------------------------------- calling

-- Call depth of modules on the stack: the outermost call turns a nested error
-- into its message.
local depth = 0

local ModuleError = {}
ModuleError.__index = ModuleError
function ModuleError.__tostring(e) return e:message() end
function ModuleError:message(root)
  local path = table.concat(self.path, ".")
  if root then path = root .. "." .. path end
  return string.format("in %s (%s): %s", path, self.leaf, self.msg)
end

-- Removes a leading "…/attn/….lua:123: " position (one inside this library)
-- from an error message; positions in user code are kept.
local function strip_position(msg)
  if type(msg) ~= "string" then return tostring(msg) end
  return (msg:gsub("^[^\n:]-attn/[^\n:]-%.lua:%d+: ", "", 1))
end

local function finish_call(self, ok, ...)
  depth = depth - 1
  if ok then return ... end
  local err = ...
  local name = rawget(self, "_name") or self:class_name()
  if getmetatable(err) == ModuleError then
    if depth > 0 then
      table.insert(err.path, 1, name)
      error(err, 0)
    end
    error(err:message(self:class_name()), 0)
  end
  if depth > 0 then
    error(setmetatable({ path = { name }, leaf = self:class_name(), msg = strip_position(err) }, ModuleError), 0)
  end
  error(type(err) == "string" and strip_position(err) or err, 0)
end

--- `m(...)` runs `m:forward(...)`, adding the module path to nested errors.
function Module.__call(self, ...)
  depth = depth + 1
  return finish_call(self, pcall(self.forward, self, ...))
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
