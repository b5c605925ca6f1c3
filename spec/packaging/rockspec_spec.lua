-- The package's metadata agrees with the code; tools/check-install (CI, and
-- `make check-install`) does the real luarocks build, install and removal.
local attn = require "attn"

local function load_config(path)
  local env = {}
  local chunk = assert(loadfile(path, "t", env))
  local ret = chunk()
  return ret or env
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

describe("packaging", function()
  it("the rockspec's version, licence, Lua and build type match the module", function()
    local rockspec_name = "attn-" .. attn._VERSION .. "-1.rockspec"
    local r = load_config(rockspec_name)
    assert.are.equal("attn", r.package)
    assert.are.equal(attn._VERSION .. "-1", r.version)
    assert.are.equal("MIT", r.description.license)
    assert.are.equal("make", r.build.type)
    assert.are.same({ "lua >= 5.4, < 5.5", "lua-cjson >= 2.1" }, r.dependencies)
    -- the Makefile reads these names (a directory for LUA_INCDIR, install dirs for LuaRocks' tree)
    assert.are.equal("$(LUA_INCDIR)", r.build.build_variables.LUA_INCDIR)
    assert.are.equal("$(LIBDIR)", r.build.install_variables.LIBDIR)
    assert.are.equal("$(LUADIR)", r.build.install_variables.LUADIR)
  end)

  it("ships the MIT licence text", function()
    local text = read("LICENSE")
    assert.truthy(text:find("^MIT License"))
    assert.truthy(text:find("Permission is hereby granted, free of charge", 1, true))
  end)

  it(".busted runs the specs under Lua 5.4 whatever `lua` is", function()
    assert.are.equal("lua5.4", load_config(".busted")._all.lua)
  end)

  it("make help lists every documented target, one line each", function()
    local p = assert(io.popen("make --no-print-directory help"))
    local out = p:read("a")
    p:close()
    local targets = { "all", "deps", "test", "lint", "doc", "doc-check", "install", "uninstall", "check-install",
      "check-aarch64", "clean" }
    for _, target in ipairs(targets) do
      local pattern = "\n  " .. target:gsub("%-", "%%-") .. " +%S" -- the name, spaces, its description
      assert.truthy(("\n" .. out):find(pattern), target .. " missing in:\n" .. out)
    end
  end)
end)
