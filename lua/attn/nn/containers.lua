--- Containers of `attn.nn`: ModuleList, ModuleDict and Sequential, with
-- PyTorch's child names, so state dicts of the book's modules load unchanged.
--
-- A list's children are named "0", "1", ... (state dict keys "blks.0.weight");
-- in Lua they are indexed from 1 (`blks[1]` is child "0") and `#blks`,
-- `ipairs(blks)` work as on a Lua list. A plain Lua table of modules assigned to
-- a module field is refused (it would never be registered): use these instead.
-- @module attn.nn.containers
-- @usage
-- self.blks = nn.ModuleList()
-- for i = 1, num_layers do self.blks:append(nn.Linear(4, 4)) end
-- for _, blk in ipairs(self.blks) do x = blk(x) end
local module = require "attn.nn.module"

local Module, is_module = module.Module, module.is_module

local M = {}

-- ---------------------------------------------------------------- ModuleList

--- `nn.ModuleList([modules])`: an indexable list of child modules (a Lua list
-- of modules, optional). Children are named by their 0-based position.
-- @type ModuleList
local ModuleList = Module:extend("ModuleList")
M.ModuleList = ModuleList

function ModuleList:init(modules)
  self._n = 0
  if modules == nil then return end
  if type(modules) ~= "table" or is_module(modules) then
    error(string.format("%s: expected a list of modules, got a %s", self:class_name(),
      is_module(modules) and "module" or type(modules)), 3)
  end
  for _, m in ipairs(modules) do self:append(m) end
end

local function check_module(self, m, i, level)
  if not is_module(m) then
    error(string.format("%s: element %d must be a module, got a %s", self:class_name(), i, type(m)), level + 1)
  end
end

--- Appends a module (named by its 0-based position). Returns self.
function ModuleList:append(m)
  check_module(self, m, self._n + 1, 2)
  self:add_module(tostring(self._n), m)
  return self
end

--- On an instance, appends every module of a list (or of another ModuleList)
-- and returns self, as PyTorch's ModuleList.extend; on the class,
-- `nn.ModuleList:extend("Name")` makes a subclass as for every module class.
function ModuleList:extend(modules)
  if rawget(self, "_attrs") == nil then return Module.extend(self, modules) end
  for _, m in ipairs(modules) do self:append(m) end
  return self
end

--- Registers `m` under `name` at the next position (PyTorch's
-- Sequential.add_module: the book names its blocks "block0", "block1", ...);
-- `list[#list]` is then `m`. Returns m.
function ModuleList:add_module(name, m, key)
  if key ~= nil then return Module.add_module(self, name, m, key) end
  local i = self._n + 1
  check_module(self, m, i, 2)
  Module.add_module(self, name, m, i)
  self._n = i
  return m
end

-- The children as {name, module} in position order.
local function as_list(self)
  local entries = {}
  for i, c in ipairs(self:named_children()) do entries[i] = c end
  return entries
end

-- Rebuilds the registry from {name, module} entries (after an insert or a
-- replacement): positional names ("0", "1", ...) are renumbered, others kept.
local function relist(self, entries)
  for i = 1, self._n do rawget(self, "_attrs")[i] = nil end
  self._module_names, self._keys = {}, {}
  self._n = 0
  module.invalidate() -- the registries were rewritten behind the registration functions
  for i, e in ipairs(entries) do
    local name = (e[1] == nil or e[1]:match("^%d+$")) and tostring(i - 1) or e[1]
    self:add_module(name, e[2])
  end
end

--- Inserts a module before position `index` (1-based; #list + 1 appends).
function ModuleList:insert(index, m)
  if math.type(index) ~= "integer" or index < 1 or index > self._n + 1 then
    error(string.format("%s: insert position %s out of range 1..%d", self:class_name(), tostring(index),
      self._n + 1), 2)
  end
  check_module(self, m, index, 2)
  local entries = as_list(self)
  table.insert(entries, index, { nil, m })
  relist(self, entries)
  return self
end

-- `list[i] = m` replaces child i (1-based) or appends at #list + 1.
function ModuleList.__newindex(self, k, v)
  if math.type(k) ~= "integer" then return Module.__newindex(self, k, v) end
  if k < 1 or k > self._n + 1 then
    error(string.format("%s: index %d out of range 1..%d (assign at #list + 1 to append)", self:class_name(), k,
      self._n + 1), 2)
  end
  check_module(self, v, k, 2)
  if k == self._n + 1 then return self:append(v) end
  local entries = as_list(self)
  entries[k] = { entries[k][1], v }
  relist(self, entries)
end

function ModuleList.__len(self) return self._n end

function ModuleList.forward()
  error("ModuleList: has no forward method (iterate over it: for _, m in ipairs(list) do x = m(x) end)", 2)
end

-- ---------------------------------------------------------------- ModuleDict

--- `nn.ModuleDict([modules])`: named child modules, accessed as `d.name` or
-- `d["name"]`. `modules` is a list of {name, module} pairs (kept in that
-- order) or a table name -> module (registered in sorted name order, since a
-- Lua table has none).
-- @type ModuleDict
local ModuleDict = Module:extend("ModuleDict")
M.ModuleDict = ModuleDict

function ModuleDict:init(modules)
  if modules == nil then return end
  if type(modules) ~= "table" or is_module(modules) then
    error("ModuleDict: expected a table of modules, got a " .. (is_module(modules) and "module" or type(modules)), 3)
  end
  if #modules > 0 then
    for _, p in ipairs(modules) do self[p[1]] = p[2] end
  else
    local names = {}
    for k in pairs(modules) do names[#names + 1] = k end
    table.sort(names)
    for _, k in ipairs(names) do self[k] = modules[k] end
  end
end

function ModuleDict.__newindex(self, k, v)
  if type(k) ~= "string" or k:sub(1, 1) == "_" then
    error(string.format("ModuleDict: keys must be strings not starting with '_', got %s", tostring(k)), 2)
  end
  if getmetatable(self)[k] ~= nil then
    error(string.format("ModuleDict: key '%s' would hide the method of the same name", k), 2)
  end
  if v ~= nil and not is_module(v) then
    error(string.format("ModuleDict: value for '%s' must be a module, got a %s", k, type(v)), 2)
  end
  Module.__newindex(self, k, v)
end

--- The names, in registration order.
function ModuleDict:keys()
  local out = {}
  for i, c in ipairs(self:named_children()) do out[i] = c[1] end
  return out
end

--- The modules, in registration order.
function ModuleDict:values() return self:children() end

--- {name, module} pairs, in registration order.
function ModuleDict:items() return self:named_children() end

function ModuleDict.__len(self) return #self._module_names end

function ModuleDict.forward()
  error("ModuleDict: has no forward method (call its entries)", 2)
end

-- ---------------------------------------------------------------- Sequential

--- `nn.Sequential(m1, m2, ...)`: applies the modules in turn, a ModuleList
-- whose children are named "0", "1", ... as in PyTorch (state dict keys
-- "0.weight"), while `seq[1]` is child "0". `seq(x, ...)` passes the extra
-- arguments on to every block (`blk(x, valid_lens)`), as the book's loops over
-- its blocks do.
-- @type Sequential
local Sequential = ModuleList:extend("Sequential")
M.Sequential = Sequential

function Sequential:init(...)
  self._n = 0
  for i = 1, select("#", ...) do self:append((select(i, ...))) end
end

function Sequential:forward(x, ...)
  for i = 1, self._n do x = self[i](x, ...) end
  return x
end

return M
