-- Containers (ModuleList, ModuleDict, Sequential) and the registration rules
-- they exist for: plain tables of modules refused, late module fields registered.
local attn = require "attn"
local nn = attn.nn
require "helper" -- assert.close

describe("nn.ModuleList", function()
  before_each(function() attn.manual_seed(3) end)

  it("registers its children under PyTorch's names and indexes them from 1", function()
    local Net = nn.Module:extend("Net")
    function Net:init()
      self.blks = nn.ModuleList()
      for _ = 1, 3 do self.blks:append(nn.Linear(2, 2)) end
    end
    function Net:forward(x)
      for _, blk in ipairs(self.blks) do x = blk(x) end
      return x
    end
    local net = Net()
    assert.equal(3, #net.blks)
    assert.same({ "blks.0.weight", "blks.0.bias", "blks.1.weight", "blks.1.bias", "blks.2.weight", "blks.2.bias" },
      net:state_dict_keys())
    assert.equal(6, #net:parameters())
    assert.equal(net.blks[2].weight, net:named_parameters()[3][2])
    -- forward through the loop equals the explicit chain
    local x = attn.randn({ 4, 2 })
    local want = net.blks[3](net.blks[2](net.blks[1](x)))
    assert.close(net(x), want, { atol = 0 })
    -- gradients reach every block
    net(x):sum():backward()
    for _, p in ipairs(net:parameters()) do assert.is_not_nil(p.grad) end
    -- an error in a block names its full path, although the list itself was not called
    net.blks[2] = nn.Linear(3, 2)
    assert.error_matches(function() net(x) end, "in Net.blks.1 (Linear): Linear: input [4x2]", nil, true)
  end)

  it("replaces, appends by index, inserts and extends, keeping names in order", function()
    local a, b, c, d = nn.Linear(1, 1), nn.Linear(1, 2), nn.Linear(2, 2), nn.ReLU()
    local l = nn.ModuleList({ a, b })
    l[3] = c                      -- append at #l + 1
    assert.equal(c, l[3])
    l[2] = nn.Linear(1, 3)        -- replace keeps the position
    assert.same({ "0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias" }, l:state_dict_keys())
    assert.same({ 3, 1 }, l:state_dict()["1.weight"]:shape())
    l:insert(1, d)
    assert.equal(d, l[1])
    assert.equal(a, l[2])
    assert.same({ "0", "1", "2", "3" }, (function()
      local names = {}
      for i, ch in ipairs(l:named_children()) do names[i] = ch[1] end
      return names
    end)())
    l:extend({ nn.ReLU(), nn.ReLU() })
    assert.equal(6, #l)
    assert.error_matches(function() l[9] = nn.ReLU() end, "index 9 out of range 1..7", nil, true)
    assert.error_matches(function() l[1] = 5 end, "ModuleList: element 1 must be a module, got a number", nil, true)
    assert.error_matches(function() nn.ModuleList({ nn.ReLU(), "x" }) end, "element 2 must be a module", nil, true)
    assert.error_matches(function() l(attn.ones({ 1 })) end, "has no forward method", nil, true)
    -- subclassing still works although instances have an extend method
    local MyList = nn.ModuleList:extend("MyList")
    assert.equal("MyList", MyList({ nn.ReLU() }):class_name())
  end)
end)

describe("nn.ModuleDict", function()
  it("registers named children, in the given order for a list of pairs and sorted for a map", function()
    local d = nn.ModuleDict({ { "q", nn.Linear(2, 3) }, { "k", nn.Linear(2, 3, { bias = false }) } })
    assert.same({ "q", "k" }, d:keys())
    assert.same({ "q.weight", "q.bias", "k.weight" }, d:state_dict_keys())
    assert.equal(2, #d)
    local m = nn.ModuleDict({ z = nn.ReLU(), a = nn.Linear(1, 1) })
    assert.same({ "a", "z" }, m:keys())
    m.b = nn.Linear(1, 1)
    assert.same({ "a.weight", "a.bias", "b.weight", "b.bias" }, m:state_dict_keys())
    assert.equal(m.b, m:values()[3])
    assert.error_matches(function() m.c = 3 end, "value for 'c' must be a module", nil, true)
    assert.error_matches(function() m.keys = nn.ReLU() end, "would hide the method", nil, true)
  end)
end)

describe("registration of module fields", function()
  it("refuses a plain table of modules, when assigned and when filled later", function()
    local Eager = nn.Module:extend("Eager")
    function Eager:init() self.blks = { nn.Linear(4, 4) } end
    assert.error_matches(function() Eager() end,
      "Eager: field 'blks' is a plain Lua table holding a module (Linear at key 1)", nil, true)
    assert.error_matches(function() Eager() end, "use nn.ModuleList", nil, true)
    -- the issue's example: an empty table filled after the assignment
    local Late = nn.Module:extend("Late")
    function Late:init()
      self.blks = {}
      for i = 1, 2 do self.blks[i] = nn.Linear(4, 4) end
    end
    local late = Late()
    for _, f in ipairs { "parameters", "state_dict", "named_parameters", "modules" } do
      assert.error_matches(function() late[f](late) end, "field 'blks' is a plain Lua table", nil, true)
    end
    -- plain tables of other things stay fine
    local Ok = nn.Module:extend("Ok")
    function Ok:init() self.sizes, self.weights = { 1, 2 }, { attn.ones({ 1 }) } end
    assert.same({}, Ok():parameters())
  end)

  it("registers a field that first held a plain value and later a module or a parameter", function()
    local M = nn.Module:extend("M")
    function M:init()
      self.proj = false
      self.w = 0
      self.proj = nn.Linear(2, 2)
      self.w = attn.ones({ 2 }, { requires_grad = true })
    end
    local m = M()
    assert.same({ "w", "proj.weight", "proj.bias" }, m:parameter_names())
    -- and unregisters when set to nil; a child cannot silently become a number
    assert.error_matches(function() m.proj = 3 end, "cannot assign a number to child module 'proj'", nil, true)
    assert.error_matches(function() m.w = m.w * 2 end, "cannot assign a tensor that is not a leaf", nil, true)
    m.proj = nil
    assert.same({ "w" }, m:parameter_names())
  end)

  it("refuses cycles instead of recursing forever", function()
    local a, b = nn.Sequential(nn.ReLU()), nn.Sequential(nn.ReLU())
    assert.error_matches(function() a:add_module("self", a) end, "the module would contain itself", nil, true)
    a:append(b)
    assert.error_matches(function() b:append(a) end, "the module would contain itself", nil, true)
    local M = nn.Module:extend("M")
    local m = M()
    assert.error_matches(function() m.me = m end, "cannot register 'me' (M)", nil, true)
    assert.equal(4, #a:modules()) -- a, ReLU, b, ReLU: still a tree
    -- a cycle made behind the checks: every walk (parameters' lean one too) raises with the path
    rawget(b, "_attrs").back = a
    b._module_names[#b._module_names + 1] = "back"
    for _, walk in ipairs { "parameters", "named_parameters", "modules" } do
      assert.error_matches(function() a[walk](a) end, "module tree has a cycle: 1.back (Sequential) contains itself",
        nil, true)
    end
  end)
end)

describe("nn.Sequential", function()
  it("passes extra arguments on to every block", function()
    local Masked = nn.Module:extend("Masked")
    function Masked.forward(_, x, lens) return attn.sequence_mask(x, lens) + 1 end
    local seq = nn.Sequential(Masked(), Masked())
    local y = seq(attn.ones({ 2, 3 }), attn.tensor({ 1, 2 }))
    assert.close(y, { { 3, 1, 1 }, { 3, 3, 1 } }, { atol = 0 })
  end)
end)
