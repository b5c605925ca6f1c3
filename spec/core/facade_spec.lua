-- The facade's lazy loader: only its listed keys load anything.
local attn = require "attn"
local helper = require "helper"

-- Runs `body` in a fresh interpreter (nothing loaded yet but what it requires)
-- and returns its printed output; fails the spec on an error.
local function fresh(body)
  local ok, _, _, out = helper.run_lua(body)
  assert(ok, out)
  return out
end

describe("the attn facade", function()
  it("gives nil for an unknown name and loads no module for it", function()
    local out = fresh([[
      local attn = require "attn"
      local before = {}
      for name in pairs(package.loaded) do before[#before + 1] = name end
      assert(attn.no_such_thing == nil and attn.save_npz == nil and attn._additive_attention == nil)
      local d2l = attn.d2l
      assert(d2l.no_such_module == nil)
      local added = {}
      for name in pairs(package.loaded) do
        local known = false
        for _, b in ipairs(before) do known = known or b == name end
        if not known then added[#added + 1] = name end
      end
      table.sort(added)
      print("added: " .. table.concat(added, " "))
    ]])
    -- attn.d2l itself is the one module loaded, none of its parts
    assert.equal("added: attn.d2l\n", out)
  end)

  it("loads a listed function's module on first use", function()
    local out = fresh([[
      local attn = require "attn"
      print(package.loaded["attn.attention"] == nil, package.loaded["attn.io"] == nil)
      local f = attn.masked_softmax
      print(f == require("attn.attention").masked_softmax, package.loaded["attn.io"] == nil)
    ]])
    assert.equal("true\ttrue\ntrue\ttrue\n", out)
  end)

  it("lists every public function of attn.io and attn.attention, as the same function", function()
    for _, modname in ipairs { "attn.io", "attn.attention" } do
      local names = {}
      for name, f in pairs(require(modname)) do
        if type(f) == "function" and not name:match("^_") then names[#names + 1] = name end
      end
      table.sort(names)
      assert.is_true(#names >= 4, modname)
      for _, name in ipairs(names) do
        assert.equal(require(modname)[name], attn[name], modname .. "." .. name .. " is not attn." .. name)
      end
    end
  end)

  it("loads its sub-modules on first use as the modules themselves", function()
    for key, modname in pairs { linalg = "attn.linalg", nn = "attn.nn", optim = "attn.optim",
      progress = "attn.progress", d2l = "attn.d2l" } do
      assert.equal(require(modname), attn[key], key)
    end
  end)
end)
