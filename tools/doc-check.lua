-- Lists every public name of attn that has no LDoc entry and fails if any.
-- Public names are found at run time: the attn table (lazy sub-modules
-- loaded), the tensor methods, and every module file lua/attn/*.lua and
-- lua/attn/d2l/*.lua that is not internal; tables in them that are namespaces (nn.init) are walked too.
-- Documented names come from LDoc itself (tools/doc_names.lua as a filter).
-- A name is documented when a doc module of its path (or below it) has an
-- item of that name; a name whose value is the same function as a
-- documented one (an alias: attn.exp is Tensor.exp, nn.clip_grad_norm is
-- nn.clip_grad_norm_) needs no second entry.
-- Usage (from the checkout): lua5.4 tools/doc-check.lua <file of ldoc filter output>
local attn = require "attn"

local INTERNAL = { core = true, cairo = true, format = true, tensor = true }

-- Documented items: docs[module][item] = true (item names without their
-- class or table prefix: "Tensor:add" and "Tensor.add" are "add").
local docs = {}
for line in io.lines(arg[1]) do
  local m, item = line:match("^([^\t]+)\t(.+)$")
  if m == "module" then
    docs[item] = docs[item] or {}
  elseif m then
    docs[m] = docs[m] or {}
    docs[m][item:match("[^.:]+$")] = true
    docs[m][item] = true
  end
end

-- Whether a doc module of `path` (or below it) has the item, or a doc module
-- of the parent path has it as a method of the class: "Optimizer:step".
local function covers(m, path) return m == path or (path ~= "attn" and m:sub(1, #path + 1) == path .. ".") end
local function documented(path, name)
  local parent, class = path:match("^(.*)%.([^.]+)$")
  for m, items in pairs(docs) do
    if covers(m, path) and (items[name] or items[name .. ":init"] or items[name .. ".init"]) then
      return true -- a class is documented by its own entry or its constructor's
    end
    if parent and covers(m, parent) and (items[class .. ":" .. name] or items[class .. "." .. name]) then
      return true
    end
  end
  return false
end

-- Every (path, name, value) of the public surface.
local entries, seen_tables = {}, {}
local function walk(path, t)
  if seen_tables[t] then return end
  seen_tables[t] = true
  local names = {}
  for k in pairs(t) do
    if type(k) == "string" and not k:match("^_") then names[#names + 1] = k end
  end
  table.sort(names)
  for _, k in ipairs(names) do
    local v = rawget(t, k)
    if INTERNAL[k] or rawequal(v, attn.core.methods) then -- luacheck: ignore 542
      -- the binding and the methods table (walked as attn.Tensor) are not names of their own
    elseif type(v) == "function" then
      entries[#entries + 1] = { path = path, name = k, value = v }
    elseif type(v) == "table" and getmetatable(v) == nil then
      -- a namespace (nn.init, attn.linalg): documented itself, and walked
      entries[#entries + 1] = { path = path, name = k, value = v }
      walk(path .. "." .. k, v)
    elseif type(v) == "table" then
      entries[#entries + 1] = { path = path, name = k, value = v } -- a class (nn.Linear)
    end
  end
end

for _, key in ipairs { "nn", "optim", "linalg", "progress", "d2l" } do local _ = attn[key] end
walk("attn.Tensor", attn.core.methods)
walk("attn.io", require "attn.io")
walk("attn.attention", require "attn.attention")
-- The book's kit first, under its own names: the deprecated aliases in
-- lua/attn/ (attn.metrics is attn.d2l.metrics) are then tables already walked, and
-- attn.data's copies of attn.d2l.data's functions are the same documented values.
for _, dir in ipairs { "d2l", "" } do
  local prefix = dir == "" and "attn." or "attn." .. dir .. "."
  for file in io.popen("ls lua/attn/" .. dir .. "/*.lua"):lines() do
    local name = file:match("([%w_]+)%.lua$")
    if not INTERNAL[name] and name ~= "init" then
      local ok, m = pcall(require, prefix .. name)
      if ok and type(m) == "table" then walk(prefix .. name, m) end
    end
  end
end
seen_tables[attn.core.methods] = true
walk("attn", attn)

local ok_values, missing = {}, {}
for _, e in ipairs(entries) do
  if documented(e.path, e.name) then ok_values[e.value] = true end
end
for _, e in ipairs(entries) do
  if not documented(e.path, e.name) and not ok_values[e.value] and
    not (type(e.value) == "table" and docs[e.path .. "." .. e.name]) then
    missing[#missing + 1] = e.path .. "." .. e.name
  end
end
table.sort(missing)
for _, name in ipairs(missing) do print("undocumented: " .. name) end
print(string.format("doc check: %d public names, %d undocumented", #entries, #missing))
os.exit(#missing == 0 and 0 or 1)
