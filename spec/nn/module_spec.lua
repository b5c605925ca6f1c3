-- The Module base class: class helper, registration and enumeration order,
-- state dicts, modes, conversion, printing and nested error context.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn

-- A small custom module tree used throughout:
-- Block: own parameter "scale" (registered after a child, still listed first),
-- child "inner" (Sequential of two Linears), child "head", a buffer "steps".
local Block = nn.Module:extend("Block")
function Block:init(d)
  self.inner = nn.Sequential(nn.Linear(d, 3), nn.Linear(3, d))
  self:register_parameter("scale", attn.ones({ d }))
  self.head = nn.Linear(d, 1)
  self:register_buffer("steps", attn.zeros({ 1 }))
  self.d = d
end
function Block:forward(x) return self.head(self.inner(x) * self.scale) end
function Block:extra_repr() return "d=" .. self.d end

local Outer = nn.Module:extend("Outer")
function Outer:init()
  self.block = Block(2)
  self.dropout = nn.Dropout(0.5)
end
function Outer:forward(x) return self.block(self.dropout(x)) end

describe("nn.Module", function()
  before_each(function() attn.manual_seed(31) end)

  describe("classes", function()
    it("constructs by calling the class and runs forward through __call", function()
      local b = Block(2)
      assert.is_true(nn.is_module(b))
      assert.equal("Block", b:class_name())
      assert.same({ 4, 1 }, b(attn.ones({ 4, 2 })):shape())
      assert.is_true(b.training)
      assert.is_false(nn.is_module({}))
      assert.is_false(nn.is_module(attn.ones({ 1 })))
    end)

    it("lets users subclass a layer and build classes with nn.class", function()
      local NoBias = nn.Linear:extend("NoBias")
      function NoBias:init(i, o) nn.Linear.init(self, i, o, { bias = false }) end
      local m = NoBias(3, 2)
      assert.is_nil(m.bias)
      assert.same({ 2 }, m(attn.ones({ 3 })):shape())
      assert.equal("NoBias(in_features=3, out_features=2, bias=False)", tostring(m))
      local Twice = nn.class("Twice")
      function Twice.forward(_, x) return x * 2 end
      assert.close(Twice()(attn.ones({ 2 })), { 2, 2 })
      assert.error_matches(function() nn.Module()(attn.ones({ 1 })) end, "has no forward method")
    end)

    it("registers parameters assigned as leaf tensors that require grad", function()
      local M = nn.Module:extend("M")
      function M:init()
        self.w = attn.ones({ 2 }):requires_grad_() -- parameter
        self.cache = attn.ones({ 2 })                 -- plain field
        self.n = 3
      end
      local m = M()
      assert.same({ "w" }, m:parameter_names())
      assert.same({ "w" }, m:state_dict_keys())
      m.w = nil
      assert.same({}, m:parameters())
    end)
  end)

  describe("enumeration", function()
    it("lists own parameters first, then children depth first, in registration order", function()
      local b = Block(2)
      local named, names = b:named_parameters(), b:parameter_names()
      assert.same({ "scale", "inner.0.weight", "inner.0.bias", "inner.1.weight", "inner.1.bias", "head.weight",
        "head.bias" }, names)
      local params = b:parameters()
      assert.equal(7, #params)
      for i, n in ipairs(names) do
        assert.equal(n, named[i][1])
        assert.equal(named[i][2], params[i])
      end
      assert.equal(b.inner[2].weight, named[4][2])
      assert.same({ { "steps", b.steps } }, b:named_buffers())
      assert.equal(5, #b:modules()) -- Block, Sequential, 2 Linear, head
      assert.equal(2, #b:children())
    end)

    it("named_parameters, named_buffers and named_modules loop as PyTorch's (for name, x in ...) and stay lists",
      function()
      local b = Block(2)
      local function loop(list)
        local names, values = {}, {}
        for name, v in list do
          names[#names + 1], values[#values + 1] = name, v
        end
        return names, values
      end
      for _, kind in ipairs { "named_parameters", "named_buffers", "named_modules" } do
        local list = b[kind](b)
        -- the list: #, ipairs and [i][1] as before
        local by_ipairs, count = {}, 0
        for i, e in ipairs(list) do
          by_ipairs[i] = e[1]
          count = count + 1
        end
        assert.equal(count, #list)
        assert.equal(by_ipairs[1], list[1][1])
        -- the generic for over the call gives the same names and values, in order
        local names, values = loop(b[kind](b))
        assert.same(by_ipairs, names)
        for i, e in ipairs(list) do assert.equal(e[2], values[i]) end
        -- a second loop over the same list starts again at the front; a break leaves nothing behind
        for name in list do if name ~= nil then break end end
        assert.same(by_ipairs, (loop(list)))
      end
      assert.same({ "scale", "inner.0.weight", "inner.0.bias", "inner.1.weight", "inner.1.bias", "head.weight",
        "head.bias" }, (loop(b:named_parameters())))
      assert.same({ "steps" }, (loop(b:named_buffers())))
      assert.same({ "", "inner", "inner.0", "inner.1", "head" }, (loop(b:named_modules())))
      -- nested loops over one list are independent
      local list, pairs_seen = b:named_parameters(), 0
      for _ in list do
        for _ in list do pairs_seen = pairs_seen + 1 end
      end
      assert.equal(49, pairs_seen)
    end)

    it("named_modules lists self first, depth first, each module once; apply visits children first", function()
      local lin = nn.Linear(2, 2)
      assert.equal(1, #nn.Sequential(lin, lin):children()) -- tied: listed once, as PyTorch
      local o = nn.Sequential(lin, nn.Sequential(nn.ReLU(), lin))
      local names = {}
      for i, e in ipairs(o:named_modules()) do names[i] = e[1] .. "=" .. e[2]:class_name() end
      assert.same({ "=Sequential", "0=Linear", "1=Sequential", "1.0=ReLU" }, names)
      assert.equal(4, #o:modules())
      assert.same({ lin, o[2] }, o:children())
      local order = {}
      assert.equal(o, o:apply(function(m) order[#order + 1] = m:class_name() end))
      assert.same({ "Linear", "ReLU", "Linear", "Sequential", "Sequential" }, order)
      -- the book's initialisation idiom
      o:apply(function(m) if m:class_name() == "Linear" then nn.init.zeros_(m.weight) end end)
      assert.equal(0, lin.weight:abs():sum():item())
    end)

    it("lists a shared parameter once", function()
      local lin = nn.Linear(2, 2)
      local tied = nn.Sequential(lin, nn.ReLU(), lin)
      assert.equal(2, #tied:parameters())
      assert.same({ "0.weight", "0.bias" }, tied:parameter_names())
    end)
  end)

  describe("state dicts", function()
    it("holds parameters and buffers under dotted names, sharing storage", function()
      local b = Block(2)
      local sd, names = b:state_dict(), b:state_dict_keys()
      assert.same({ "scale", "steps", "inner.0.weight", "inner.0.bias", "inner.1.weight", "inner.1.bias",
        "head.weight", "head.bias" }, names)
      assert.close(sd["head.weight"], b.head.weight, { atol = 0 })
      assert.equal(b.head.weight:storage_id(), sd["head.weight"]:storage_id())
      assert.is_false(sd["head.weight"].requires_grad)
    end)

    it("round-trips: a differently seeded module loads and then computes the same", function()
      local a = Block(2)
      attn.manual_seed(99)
      local b = Block(2)
      local x = attn.randn({ 3, 2 })
      assert.is_false(helper.compare(a(x), b(x)))
      local report = b:load_state_dict(a:state_dict())
      assert.same({}, report.missing_keys)
      assert.same({}, report.unexpected_keys)
      assert.close(b(x), a(x), { atol = 0 })
      -- in place: still the same tensors, still leaves requiring grad
      local w = b.head.weight
      b:load_state_dict(a:state_dict())
      assert.equal(w, b.head.weight)
      assert.is_true(w.requires_grad and w:is_leaf())
    end)

    it("round-trips through a safetensors file", function()
      local a = Block(2)
      local path = os.tmpname()
      assert(attn.save(path, a:state_dict()))
      local loaded = assert(attn.load(path))
      os.remove(path)
      attn.manual_seed(5)
      local b = Block(2)
      b:load_state_dict(loaded)
      local x = attn.randn({ 2, 2 })
      assert.close(b(x), a(x), { atol = 0 })
    end)

    it("converts the dtype and accepts nested tables", function()
      local m = nn.Linear(2, 2)
      m:load_state_dict({ weight = attn.tensor({ { 1, 2 }, { 3, 4 } }, "float64"), bias = { 0.5, -0.5 } })
      assert.equal("float32", m.weight:dtype())
      assert.close(m.weight, { { 1, 2 }, { 3, 4 } }, { atol = 0 })
      assert.close(m.bias, { 0.5, -0.5 }, { atol = 0 })
    end)

    it("raises on a missing key, naming the key and the module", function()
      local b = Block(2)
      local sd = b:state_dict()
      sd["head.bias"] = nil
      assert.error_matches(function() b:load_state_dict(sd) end,
        "load_state_dict: Block: missing key 'head.bias'", nil, true)
      local report = b:load_state_dict(sd, false)
      assert.same({ "head.bias" }, report.missing_keys)
    end)

    it("lists every missing and unexpected key and names a prefix that would match them", function()
      local b = Block(2)
      local wrapped = {}
      for k, v in pairs(b:state_dict()) do wrapped["module." .. k] = v end
      local ok, err = pcall(b.load_state_dict, b, wrapped)
      assert.is_false(ok)
      assert.matches("missing keys 'head.bias', 'head.weight', 'inner.0.bias', ", err, 1, true)
      assert.matches("; unexpected keys 'module.head.bias', 'module.head.weight', ", err, 1, true)
      assert.matches("(the checkpoint's keys carry an extra prefix 'module.')", err, 1, true)
      local inner = {}
      for k, v in pairs(b.inner:state_dict()) do inner[k] = v end
      local o = nn.Sequential(b.inner)
      err = select(2, pcall(o.load_state_dict, o, { ["0.weight"] = inner["0.weight"] }))
      assert.matches("missing keys '0.0.bias', '0.0.weight', '0.1.bias', '0.1.weight'; unexpected key '0.weight'",
        err, 1, true)
      err = select(2, pcall(o.load_state_dict, o, inner))
      assert.matches("(the checkpoint's keys lack the prefix '0.')", err, 1, true)
    end)

    it("raises on an unexpected key", function()
      local b = Block(2)
      local sd = b:state_dict()
      sd["head.extra"] = attn.zeros({ 1 })
      assert.error_matches(function() b:load_state_dict(sd) end,
        "load_state_dict: Block: unexpected key 'head.extra'", nil, true)
      assert.same({ "head.extra" }, b:load_state_dict(sd, false).unexpected_keys)
    end)

    it("raises on a mis-shaped key (even when not strict) and copies nothing", function()
      local b = Block(2)
      local before = b.head.weight:clone()
      local sd = b:state_dict()
      sd["head.weight"] = attn.zeros({ 4, 3 })
      sd["inner.0.weight"] = attn.zeros({ 3, 2 }) -- valid, but must not be copied either
      assert.error_matches(function() b:load_state_dict(sd) end,
        "load_state_dict: Block: key 'head.weight' has shape [4x3], parameter has [1x2]", nil, true)
      assert.error_matches(function() b:load_state_dict(sd, false) end, "key 'head.weight' has shape", nil, true)
      assert.close(b.head.weight, before, { atol = 0 })
      assert.is_true(b.inner[1].weight:abs():sum():item() > 0)
    end)
  end)

  describe("modes and conversion", function()
    it("train/eval set the flag recursively and toggle dropout", function()
      local o = Outer()
      o:eval()
      for _, m in ipairs(o:modules()) do assert.is_false(m.training) end
      local x = attn.randn({ 20, 2 })
      assert.close(o(x), o(x), { atol = 0 })
      o:train()
      for _, m in ipairs(o:modules()) do assert.is_true(m.training) end
      assert.is_false(helper.compare(o(x), o(x)))
      assert.equal(o, o:train(false))
      assert.is_false(o.block.head.training)
    end)

    it("zero_grad drops every gradient", function()
      local b = Block(2)
      b(attn.ones({ 1, 2 })):sum():backward()
      for _, p in ipairs(b:parameters()) do assert.is_not_nil(p.grad) end
      b:zero_grad()
      for _, p in ipairs(b:parameters()) do assert.is_nil(p.grad) end
    end)

    it("to(dtype) converts parameters and buffers, keeping them leaves that require grad", function()
      local b = Block(2)
      local w = b.head.weight:totable()
      assert.equal(b, b:to("float64"))
      for _, p in ipairs(b:parameters()) do
        assert.equal("float64", p:dtype())
        assert.is_true(p.requires_grad and p:is_leaf())
      end
      assert.equal("float64", b.steps:dtype())
      assert.close(b.head.weight, w, { atol = 0 })
      assert.equal("float64", b(attn.ones({ 1, 2 }, "float64")):dtype())
      assert.equal("float64", b:dtype())
      -- a shared parameter stays shared
      local lin = nn.Linear(2, 2)
      local tied = nn.Sequential(lin, lin):to("float64")
      assert.equal(tied[1].weight, tied[2].weight)
    end)
  end)

  describe("printing", function()
    it("lists the structure like PyTorch's repr", function()
      assert.equal(table.concat({
        "Outer(",
        "  (block): Block(",
        "    d=2",
        "    (inner): Sequential(",
        "      (0): Linear(in_features=2, out_features=3, bias=True)",
        "      (1): Linear(in_features=3, out_features=2, bias=True)",
        "    )",
        "    (head): Linear(in_features=2, out_features=1, bias=True)",
        "  )",
        "  (dropout): Dropout(p=0.5, inplace=False)",
        ")",
      }, "\n"), tostring(Outer()))
    end)
  end)

  describe("errors", function()
    it("name the path of the nested module that raised", function()
      local o = Outer()
      local ok, err = pcall(o, attn.ones({ 2, 5 }))
      assert.is_false(ok)
      assert.equal("string", type(err))
      assert.matches("^in Outer%.block%.inner%.0 %(Linear%): Linear: input %[2x5%] has last dim 5", err)
      -- one level down
      err = select(2, pcall(o.block, attn.ones({ 2, 5 })))
      assert.matches("^in Block%.inner%.0 %(Linear%): ", err)
      -- an error raised by the outermost module itself is passed through unchanged
      err = select(2, pcall(o.block.head, attn.ones({ 2, 5 })))
      assert.matches("^Linear: input %[2x5%]", err)
      -- the depth bookkeeping recovered: a good call still works
      assert.same({ 2, 1 }, o(attn.ones({ 2, 2 })):shape())
    end)

    it("keep positions that point into user code", function()
      local Bad = nn.Module:extend("Bad")
      function Bad.forward() error("boom") end
      local Holder = nn.Module:extend("Holder")
      function Holder:init() self.bad = Bad() end
      function Holder:forward(x) return self.bad(x) end
      local _, err = pcall(Holder(), 1)
      assert.matches("^in Holder%.bad %(Bad%): .*module_spec%.lua:%d+: boom", err)
    end)

    it("keep the traceback of the error site: the user's forward frames are not lost", function()
      local Deep = nn.Module:extend("Deep")
      local function helper_fn(x)
        local y = x:matmul(attn.ones({ 5, 5 })) -- the faulty line
        return y
      end
      function Deep.forward(_, x)
        local y = helper_fn(x) -- not a tail call, so Lua keeps this frame
        return y
      end
      local Top = nn.Module:extend("Top")
      function Top:init() self.deep = Deep() end
      function Top:forward(x) return self.deep(x) end
      local _, err = pcall(Top(), attn.ones({ 2, 3 }))
      assert.matches("^in Top%.deep %(Deep%): matmul", err)
      assert.matches("\nstack traceback:\n", err, 1, true)
      assert.matches("in upvalue 'helper_fn'", err, 1, true)
      assert.matches("module_spec.lua:%d+ in function <spec/nn/module_spec.lua:%d+>", err)
      -- the depth bookkeeping recovered
      assert.same({ 2, 5 }, Top()(attn.ones({ 2, 5 })):shape())
    end)

    it("count call depth per coroutine: one abandoned mid-forward leaves later errors plain messages", function()
      local Yielding = nn.Module:extend("Yielding")
      function Yielding.forward(_, x) coroutine.yield("parked"); return x end
      local Wrap = nn.Module:extend("Wrap")
      function Wrap:init() self.inner = Yielding() end
      function Wrap:forward(x) return self.inner(x) end
      local co = coroutine.create(function() return Wrap()(1) end)
      assert.same({ true, "parked" }, { coroutine.resume(co) })
      assert.equal("suspended", coroutine.status(co)) -- abandoned inside two forwards
      local o = Outer()
      local ok, err = pcall(o, attn.ones({ 2, 5 }))
      assert.is_false(ok)
      assert.equal("string", type(err))
      assert.matches("^in Outer%.block%.inner%.0 %(Linear%): Linear: input %[2x5%] has last dim 5", err)
      err = select(2, pcall(o.block.head, attn.ones({ 2, 5 })))
      assert.equal("string", type(err))
      assert.matches("^Linear: input %[2x5%]", err)
      -- another coroutine counts from zero too, and nested errors inside it keep their path
      local ok2, err2 = coroutine.resume(coroutine.create(function() return o(attn.ones({ 2, 5 })) end))
      assert.is_false(ok2)
      assert.equal("string", type(err2))
      assert.matches("^in Outer%.block%.inner%.0 %(Linear%): Linear: input %[2x5%]", err2)
    end)
  end)
end)

describe("the cached parameters() list", function()
  -- The reference: the tensors of a fresh tree walk (named_parameters walks
  -- the tree at every call and never reads the cache).
  local function walked(m)
    local out = {}
    for i, e in ipairs(m:named_parameters()) do out[i] = e[2] end
    return out
  end
  -- parameters() equals the walk element by element (the same tensor objects).
  local function agrees(m)
    local got, want = m:parameters(), walked(m)
    assert.equal(#want, #got)
    for i = 1, #want do assert.is_true(rawequal(want[i], got[i]), "position " .. i) end
    return got
  end
  local function param(...) return attn.randn({ ... }, { requires_grad = true }) end

  it("follows every change made through the module's fields and registration functions", function()
    local root = Block(4)
    local list = agrees(root) -- cached from here on
    assert.equal(7, #list)
    root.extra = param(2) -- a new parameter field
    assert.equal(8, #agrees(root))
    local old = root.extra
    root.extra = param(2) -- replaced by another parameter
    assert.is_false(rawequal(old, agrees(root)[2]))
    root.extra = nil -- removed
    assert.equal(7, #agrees(root))
    root:register_parameter("gate", attn.ones({ 4 })) -- explicit forms
    assert.equal(8, #agrees(root))
    root:register_buffer("gate", attn.ones({ 4 })) -- the name becomes a buffer: no longer a parameter
    assert.equal(7, #agrees(root))
    root:add_module("side", nn.Linear(2, 2))
    assert.equal(9, #agrees(root))
    root.side = nn.Linear(2, 2, { bias = false }) -- a child replaced
    assert.equal(8, #agrees(root))
    root.side = nil -- and removed
    assert.equal(7, #agrees(root))
    -- a change deep in the tree reaches the root's cached list
    root.inner[1].weight = param(3, 4)
    agrees(root)
    root.inner[2].bias = nil
    assert.equal(6, #agrees(root))
    root.head.extra = param(1)
    assert.equal(7, #agrees(root))
  end)

  it("follows the containers: append, extend, insert, replace, dict entries", function()
    local list = nn.ModuleList { nn.Linear(2, 2) }
    local top = nn.Sequential(list, nn.Linear(2, 3))
    agrees(top)
    list:append(nn.Linear(2, 2))
    assert.equal(6, #agrees(top))
    list:extend { nn.Linear(2, 2, { bias = false }) }
    assert.equal(7, #agrees(top))
    list:insert(1, nn.Linear(2, 2))
    assert.equal(9, #agrees(top))
    list[2] = nn.ReLU() -- replacement through the integer __newindex
    assert.equal(7, #agrees(top))
    list[#list + 1] = nn.Linear(2, 2) -- append through it
    assert.equal(9, #agrees(top))
    local dict = nn.ModuleDict { a = nn.Linear(2, 2) }
    local holder = nn.Sequential(dict)
    assert.equal(2, #agrees(holder))
    dict.b = nn.Linear(2, 2)
    assert.equal(4, #agrees(holder))
    dict.a = nil
    assert.equal(2, #agrees(holder))
    -- a module shared by two parents (tied): listed once, and a change seen from both
    local shared = nn.Linear(2, 2)
    local x, y = nn.Sequential(shared), nn.Sequential(shared, shared)
    assert.equal(2, #agrees(x))
    assert.equal(2, #agrees(y))
    shared.weight = param(2, 2) -- re-registered: now after the bias, as a fresh walk lists it
    assert.is_true(rawequal(shared.weight, agrees(x)[2]))
    assert.is_true(rawequal(shared.weight, agrees(y)[2]))
  end)

  it("stays valid across in place changes: load_state_dict and to()", function()
    local m = Block(3)
    local before = agrees(m)
    local sd = Block(3):state_dict()
    m:load_state_dict(sd)
    local after = agrees(m)
    for i = 1, #before do assert.is_true(rawequal(before[i], after[i])) end
    helper.assert_close(m.inner[1].weight, sd["inner.0.weight"], { atol = 0, rtol = 0 })
    m:to("float64")
    for _, p in ipairs(agrees(m)) do assert.equal("float64", p:dtype()) end
    assert.equal("float64", m:dtype())
  end)

  it("returns a new table each call: a caller changing it cannot corrupt the cache", function()
    local m = Block(2)
    local list = m:parameters()
    list[1], list[#list + 1] = nil, attn.ones({ 1 })
    table.remove(list, 2)
    agrees(m)
    assert.is_false(rawequal(m:parameters(), m:parameters()))
  end)

  it("still refuses a plain table of modules filled after the list was cached", function()
    local Late = nn.Module:extend("LateFill")
    function Late:init()
      self.lin = nn.Linear(2, 2)
      self.blks = {}
    end
    local late = Late()
    assert.equal(2, #late:parameters()) -- cached, the table still empty
    late.blks[1] = nn.Linear(2, 2)
    assert.error_matches(function() late:parameters() end, "field 'blks' is a plain Lua table", nil, true)
    late.blks[1] = nil
    assert.equal(2, #late:parameters())
    late.more = {} -- a plain table assigned later is watched too
    late:parameters()
    late.more.x = nn.ReLU()
    assert.error_matches(function() late:parameters() end, "field 'more' is a plain Lua table", nil, true)
    -- a watched field given a fresh table (as a forward keeping its attention
    -- weights does at every call) keeps the cached list, and is still checked
    late.more = {}
    late:parameters()
    local cache = rawget(late, "_pcache")
    late.more = {}
    late:parameters()
    assert.is_true(rawequal(cache, rawget(late, "_pcache")))
    late.more[1] = nn.ReLU()
    assert.error_matches(function() late:parameters() end, "field 'more' is a plain Lua table", nil, true)
  end)

  it("is not rebuilt by the book's Transformer forward (attention weights kept in plain tables)", function()
    local net = nn.TransformerEncoder(20, 8, 8, 8, 8, { 8 }, 8, 16, 2, 2, 0)
    local X, lens = attn.randint(1, 20, { 2, 5 }, "int64"), attn.tensor({ 3, 5 }, "int64")
    net(X, lens) -- the first forward creates the attention_weights field
    agrees(net)
    local cache = rawget(net, "_pcache")
    net(X, lens)
    assert.is_true(rawequal(cache, rawget(net, "_pcache")))
    agrees(net)
  end)

  it("is rebuilt after an edit of the registries behind them when told (module.invalidate)", function()
    local m = nn.Sequential(nn.Linear(2, 2))
    local extra = nn.Linear(2, 2) -- built first: any registration, anywhere, drops every cached list
    agrees(m)
    rawget(m, "_attrs").side = extra
    m._module_names[#m._module_names + 1] = "side"
    assert.equal(2, #m:parameters()) -- the cache does not see a raw edit
    require("attn.nn.module").invalidate()
    assert.equal(4, #agrees(m))
  end)
end)
