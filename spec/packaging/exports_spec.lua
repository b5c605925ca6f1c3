-- The C modules are built with -fvisibility=hidden: their dynamic symbol table defines the
-- luaopen_* entry points Lua's loader looks up and nothing else, so no core or binding function
-- can clash with another library's symbol or be called around the binding's checks.
require "attn"
require "attn.cairo"

local function has_nm()
  local p = io.popen("nm --version 2>/dev/null")
  local out = p and p:read("a") or ""
  if p then p:close() end
  return out ~= ""
end

-- The symbols the shared object at path defines in its dynamic table.
local function exported(path)
  local p = assert(io.popen("nm -D --defined-only '" .. path .. "' 2>&1; echo \"exit $?\""))
  local out = p:read("a")
  p:close()
  assert.matches("exit 0%s*$", out, 1, false, out)
  local names = {}
  for name in out:gmatch("%x+ %a ([%w_.@]+)\n") do names[#names + 1] = name end
  return names
end

describe("the C modules' exported symbols", function()
  if not has_nm() then
    pending("nm (binutils) is not installed: the dynamic symbol tables are not checked")
    return
  end

  for module, entry in pairs({ ["attn.core"] = "luaopen_attn_core", ["attn.cairo"] = "luaopen_attn_cairo" }) do
    it(module .. " defines only its luaopen_* entry point", function()
      local path = assert(package.searchpath(module, package.cpath))
      local names = exported(path)
      local others = {}
      for _, name in ipairs(names) do
        if not name:match("^luaopen_") then others[#others + 1] = name end
      end
      assert.are.same({}, others, path .. " exports more than luaopen_*")
      assert.are.same({ entry }, names)
    end)
  end
end)
