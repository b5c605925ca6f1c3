-- tools/doc-check.lua (run by `make doc` and CI over LDoc's list of entries)
-- must name what is missing and fail; `make doc-check` runs it for real.
local helper = require "helper"

local function run_check(lines)
  local dir = helper.make_tmpdir()
  local names = dir .. "/names.txt"
  helper.write_bytes(names, table.concat(lines, "\n") .. "\n")
  local p = assert(io.popen(helper.lua_command("tools/doc-check.lua " .. names) .. " 2>&1; echo \"exit $?\""))
  local out = p:read("a")
  p:close()
  helper.remove_tree(dir)
  return out, tonumber(out:match("exit (%d+)%s*$"))
end

describe("the documentation check", function()
  it("lists public names without an entry and fails", function()
    local out, code = run_check({ "module\tattn", "attn\tzeros" })
    assert.are_not.equal(0, code)
    assert.truthy(out:find("undocumented: attn.ones\n", 1, true)) -- a creation function
    assert.truthy(out:find("undocumented: attn.Tensor.transpose\n", 1, true)) -- a C method
    assert.truthy(out:find("undocumented: attn.nn.Linear\n", 1, true)) -- a class
    assert.truthy(out:find("undocumented: attn.optim.Adam\n", 1, true))
    assert.is_nil(out:find("undocumented: attn.zeros\n", 1, true)) -- documented
  end)

  it("takes an alias as documented through its original and a class through its constructor", function()
    local out = run_check({ "module\tattn.Tensor", "attn.Tensor\tTensor.exp", "module\tattn.nn.clip",
      "attn.nn.clip\tclip_grad_norm_", "module\tattn.nn.gru", "attn.nn.gru\tGRU:init" })
    assert.is_nil(out:find("undocumented: attn.exp\n", 1, true)) -- attn.exp is Tensor.exp
    assert.is_nil(out:find("undocumented: attn.nn.clip_grad_norm\n", 1, true)) -- the alias of clip_grad_norm_
    assert.is_nil(out:find("undocumented: attn.nn.GRU\n", 1, true))
    assert.truthy(out:find("undocumented: attn.log\n", 1, true))
  end)
end)
