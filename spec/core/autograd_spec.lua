local attn = require "attn"
local helper = require "helper"

local P = helper.param

describe("autograd", function()
  before_each(function() attn.manual_seed(11) end)

  describe("gradcheck of every differentiable op (float64 central differences)", function()
    local cases = {
      add = function() return function(a, b) return a + b end, { P { 2, 3 }, P { 3 } } end,
      sub = function() return function(a, b) return 1 - a - b end, { P { 2, 3 }, P { 2, 1 } } end,
      mul = function() return function(a, b) return a * b * 3 end, { P { 2, 3 }, P { 1, 3 } } end,
      div = function()
        return function(a, b) return a / (b:abs() + 1) + 2 / (b:abs() + 1) end, { P { 2, 3 }, P { 3 } }
      end,
      pow = function()
        return function(a, b) return (a:abs() + 0.5) ^ b + (a:abs() + 0.5) ^ 3 end, { P { 2, 3 }, P { 2, 3 } }
      end,
      unary = function()
        return function(x)
          return x:exp() + x:tanh() + x:sigmoid() + x:relu() + (x:abs() + 1):log() + (x:square() + 1):sqrt()
            + x:sin() + x:cos() + (x:abs() + 1):reciprocal() - (-x):abs()
        end, { P { 3, 4 } }
      end,
      maximum = function() return function(a, b) return a:maximum(b) + a:minimum(0.1) end, { P { 3, 4 }, P { 4 } } end,
      reductions = function()
        return function(x)
          return x:sum(1) * x:mean(2, true) + x:sum() + x:mean():reshape(1, 1)
        end, { P { 3, 4 } }
      end,
      max_min = function()
        return function(x)
          local v = x:max(2)
          local w = x:min(1, true)
          return v:sum() + w:sum() + x:max() * 2
        end, { P { 3, 4 } }
      end,
      softmax = function() return function(x) return x:softmax(2) * x:log_softmax(1) end, { P { 3, 4 } } end,
      views = function()
        return function(x)
          local y = x:reshape(4, 6):transpose(1, 2):narrow(1, 2, 3):select(2, 2)
          local z = x:permute(3, 1, 2):unsqueeze(1):squeeze(1):contiguous():view(4, 6)
          return y:sum() + z:clone():sum(1):sum() + x:expand(2, 2, 3, 4):sum(1):to("float64")
        end, { P { 2, 3, 4 } }
      end,
      indexing = function()
        local idx = attn.tensor({ { 2, 1 }, { 3, 3 } }, "float64")
        local mask = attn.tensor({ { 1, 0, 0 }, { 0, 0, 1 } }, "float64")
        return function(x)
          return x:index_select(2, { 3, 1, 3 }):sum(1) + x:gather(2, idx):sum()
            + x:masked_fill(mask, 5):sum(2, true):sum()
            + attn.where(mask, x, x * 2):sum()
        end, { P { 2, 3 } }
      end,
      matmul = function()
        return function(a, b, v) return a:matmul(b):matmul(v) + v:matmul(v) end, { P { 2, 3, 4 }, P { 4, 5 }, P { 5 } }
      end,
      vector_matmul = function() -- the core's 1-D rule on each side of a batch, and a dot product
        return function(u, m, w)
          return u:matmul(m):sum() * 0.5 + m:matmul(w):sum() + u:matmul(u) * w:matmul(w)
        end, { P { 4 }, P { 2, 4, 4 }, P { 4 } }
      end,
      batched_broadcast_matmul = function()
        return function(a, b) return a:matmul(b) end, { P { 2, 1, 3, 4 }, P { 3, 4, 2 } }
      end,
      cat_stack = function()
        return function(a, b)
          return attn.cat({ a, b, a }, 2):sum(1):sum() + attn.stack({ a, b }, 3):sum(1) * 2
        end, { P { 2, 3 }, P { 2, 3 } }
      end,
      stack_every_dim = function() -- one node per stack; weights make each slice's gradient differ
        local w = {}
        for _, dim in ipairs { 1, 2, 3, -1, -2, -3 } do
          local shape = { 2, 3 }
          table.insert(shape, dim > 0 and dim or #shape + 2 + dim, 3)
          w[dim] = attn.randn(shape, "float64")
        end
        return function(a, b, c)
          local total
          for dim, wd in pairs(w) do
            local term = (attn.stack({ a, b, c }, dim) * wd):sum()
            total = total and total + term or term
          end
          return total
        end, { P { 2, 3 }, P { 2, 3 }, P { 2, 3 } }
      end,
    }
    for name, make in pairs(cases) do
      it(name, function()
        local fn, inputs = make()
        local report = helper.gradcheck(fn, inputs)
        assert.is_true(report.max_abs_err < 1e-6)
      end)
    end
  end)

  it("gradcheck reports a wrong gradient", function()
    local x = P { 3 }
    local bad = function(t)
      local out = attn.core.exp(t)
      return attn.autograd.record("bad", out, { t }, function(g) return g end) -- should be g * exp(t)
    end
    local ok, report = attn.gradcheck(bad, { x })
    assert.is_false(ok)
    assert.truthy(report.message:find("analytic", 1, true))
  end)

  it("matches a hand-derived gradient", function()
    local w = attn.tensor({ 1, 2, 3 }, { dtype = "float64", requires_grad = true })
    local loss = (w * w):sum() -- d/dw = 2w
    loss:backward()
    assert.are.same({ 2, 4, 6 }, w.grad:totable())
  end)

  it("accumulates across backward calls until zero_grad", function()
    local w = attn.tensor({ 1, 2 }, { dtype = "float64", requires_grad = true })
    for _ = 1, 3 do (w * 2):sum():backward() end
    assert.are.same({ 6, 6 }, w.grad:totable())
    w:zero_grad()
    assert.is_nil(w.grad)
  end)

  it("handles a tensor used twice (diamond) and broadcast reduction", function()
    local x = attn.tensor({ { 1, 2 } }, { dtype = "float64", requires_grad = true })
    local y = x + attn.zeros({ 3, 2 }, "float64") -- broadcast to (3, 2)
    local loss = (y * y + y):sum()
    loss:backward()
    assert.are.same({ { 3 * 3, 3 * 5 } }, x.grad:totable()) -- sum over 3 rows of 2x + 1
  end)


  it("sums many contributions in place without touching a tensor another input or the caller holds", function()
    -- x + x + x: each add's backward hands the same gradient tensor to both
    -- inputs, here the caller's G; the sum for x is made anew, then added into
    local x = attn.tensor({ 1, 2 }, { dtype = "float64", requires_grad = true })
    local G = attn.tensor({ 1, 10 }, "float64")
    local y = x + x + x
    y:backward(G)
    assert.are.same({ 3, 30 }, x.grad:totable())
    assert.are.same({ 1, 10 }, G:totable())
    -- n's gradient S is a sum of two contributions; n's backward hands S to
    -- w, to z and to w again: the second w must not add into S, which z holds
    local w = attn.tensor({ 1, 2 }, { dtype = "float64", requires_grad = true })
    local z = w * 3
    local n = attn.autograd.record("w+z+w", attn.core.add(attn.core.add(w, z), w), { w, z, w },
      function(g) return g, g, g end)
    local loss = (n * 1 + n * 2):sum()
    loss:backward()
    assert.are.same({ 3 + 3 + 3 * 3, 3 + 3 + 3 * 3 }, w.grad:totable())
    -- a leaf used at ten steps (a decoder's weight) gets the sum of all ten, in order
    local v = attn.tensor({ 0.1, 0.2 }, { dtype = "float32", requires_grad = true })
    local total, expected = nil, { 0, 0 }
    for k = 1, 10 do
      local term = v * k
      total = total and total + term or term
      expected[1], expected[2] = expected[1] + k, expected[2] + k
    end
    total:sum():backward()
    assert.are.same(expected, v.grad:totable())
  end)
  it("keeps a new gradient that reached one leaf alone as its grad, and copies every other", function()
    local core = attn.core
    -- a gradient made in the pass, over all of its storage, for one leaf: kept as is
    local made
    local a = attn.tensor({ 1, 2, 3 }, { dtype = "float64", requires_grad = true })
    local y = attn.autograd.record("fresh", core.mul(a, 2), { a }, function(g)
      made = core.mul(g, 2)
      return made
    end)
    y:backward(attn.tensor({ 1, 1, 1 }, "float64"))
    assert.are.equal(made:storage_id(), a.grad:storage_id())
    assert.are.same({ 2, 2, 2 }, a.grad:totable())
    -- the caller's seed, passed straight to a leaf: copied, so the leaf's grad is not the seed
    local b = attn.tensor({ 1, 2 }, { dtype = "float64", requires_grad = true })
    local seed = attn.tensor({ 5, 6 }, "float64")
    attn.autograd.record("pass", core.mul(b, 1), { b }, function(g) return g end):backward(seed)
    assert.are_not.equal(seed:storage_id(), b.grad:storage_id())
    b.grad:add_(attn.tensor({ 1, 1 }, "float64"))
    assert.are.same({ 5, 6 }, seed:totable())
    -- one new tensor handed to two leaves: each gets its own copy
    local c1 = attn.tensor({ 1, 2 }, { dtype = "float64", requires_grad = true })
    local c2 = attn.tensor({ 3, 4 }, { dtype = "float64", requires_grad = true })
    local both = attn.autograd.record("both", core.add(c1, c2), { c1, c2 }, function(g)
      local t = core.mul(g, 3)
      return t, t
    end)
    both:backward(attn.tensor({ 1, 1 }, "float64"))
    assert.are_not.equal(c1.grad:storage_id(), c2.grad:storage_id())
    c1.grad:add_(attn.tensor({ 1, 1 }, "float64"))
    assert.are.same({ 3, 3 }, c2.grad:totable())
    -- a view of a new tensor (its first half): copied, not the larger storage kept alive
    local d = attn.tensor({ 1, 2 }, { dtype = "float64", requires_grad = true })
    local base
    local half = attn.autograd.record("half", core.mul(d, 1), { d }, function(g)
      base = core.cat({ g, g }, 1)
      return base:narrow(1, 1, 2)
    end)
    half:backward(attn.tensor({ 7, 8 }, "float64"))
    assert.are_not.equal(base:storage_id(), d.grad:storage_id())
    assert.are.same({ 7, 8 }, d.grad:totable())
    -- the kept grad is the leaf's own: a second pass adds into it
    y = attn.autograd.record("again", core.mul(a, 2), { a }, function(g) return core.mul(g, 2) end)
    y:backward(attn.tensor({ 1, 1, 1 }, "float64"))
    assert.are.same({ 4, 4, 4 }, a.grad:totable())
    assert.are.equal(made:storage_id(), a.grad:storage_id())
    -- a backward function that runs a backward of its own and returns that pass's leaf grad: the
    -- tensor is new to the outer pass but W holds it, so x gets a copy
    local W = attn.tensor({ 1, 2, 3 }, { dtype = "float64", requires_grad = true })
    local x = attn.tensor({ 4, 5, 6 }, { dtype = "float64", requires_grad = true })
    local z = attn.autograd.record("inner", core.mul(x, 1), { x }, function(g)
      attn.enable_grad(function() (W * g):sum():backward() end)
      return W.grad
    end)
    z:backward(attn.tensor({ 1, 1, 1 }, "float64"))
    assert.are_not.equal(W.grad:storage_id(), x.grad:storage_id())
    W.grad:mul_(0)
    assert.are.same({ 1, 1, 1 }, x.grad:totable())
  end)

  it("detach and no_grad stop recording", function()
    local w = attn.ones({ 2 }, { requires_grad = true })
    local d = w:detach()
    assert.is_false(d.requires_grad)
    assert.are.equal(w:storage_id(), d:storage_id())
    local y = attn.no_grad(function() return w * 2 end)
    assert.is_false(y.requires_grad)
    assert.is_nil(y.grad_fn)
    assert.is_true(attn.is_grad_enabled())
    assert.has_error(function() attn.no_grad(function() error("boom") end) end)
    assert.is_true(attn.is_grad_enabled(), "grad mode restored after an error")
  end)

  it("reads requires_grad as a boolean field and sets it with requires_grad_", function()
    local x = attn.zeros({ 2 }, "float64")
    assert.are.equal(false, x.requires_grad) -- a boolean, so `if x.requires_grad` means what it says
    assert.are.equal(x, x:requires_grad_()) -- returns the tensor (the default flag is true)
    assert.are.equal(true, x.requires_grad)
    local y = x * 2
    assert.are.equal(true, y.requires_grad) -- results of recorded ops require grad
    x:requires_grad_(false)
    assert.are.equal(false, x.requires_grad)
    x.requires_grad = true -- PyTorch's assignment form goes through the same checks
    assert.are.equal(true, x.requires_grad)
    assert.has_error(function() y:requires_grad_(false) end,
      "requires_grad_: cannot turn off grad on a non-leaf tensor (use :detach())")
    assert.has_error(function() (x * 2).requires_grad = false end,
      "requires_grad_: cannot turn off grad on a non-leaf tensor (use :detach())")
    assert.is_nil(x.no_such_field) -- unknown fields still read as nil
  end)

  it("keeps a result's node, position and flag apart from its own fields", function()
    -- grad_fn and _oi live in the tensor's user value slots, a leaf's flag and user fields in its
    -- fields table (src/bind/lbind.h): each must read back what was set, whatever the other holds
    local autograd = require "attn.autograd"
    local x = attn.tensor({ 1, 2 }, { dtype = "float64", requires_grad = true })
    local y = x * 3
    assert.are.equal("mul", y.grad_fn.name)
    assert.are.same({ x }, { y.grad_fn.inputs[1] })
    assert.is_false(y.is_leaf and y:is_leaf())
    assert.is_true(x:is_leaf())
    assert.is_nil(x.grad_fn)
    assert.is_nil(y._oi) -- a one-output node gives no position
    y.note = "kept"
    y.grad = nil
    assert.are.equal("kept", y.note)
    assert.are.equal("mul", y.grad_fn.name) -- a user field does not hide the node
    local a, b = x * 1, x * 2
    local outs = autograd.record("pair", { a + 0, b + 0 }, { a, b }, function(ga, gb) return ga, gb end)
    assert.are.equal(1, outs[1]._oi)
    assert.are.equal(2, outs[2]._oi)
    assert.are.equal(outs[1].grad_fn, outs[2].grad_fn)
    assert.is_true(outs[2].requires_grad)
    ;(outs[1] * 5 + outs[2] * 7):sum():backward()
    assert.are.same({ 5 + 14, 5 + 14 }, x.grad:totable())
    local d = y:detach()
    assert.is_nil(d.grad_fn)
    assert.is_false(d.requires_grad)
    assert.are.equal("kept", y.note) -- the view shares storage, not fields
    assert.is_nil(d.note)
  end)

  it("walks deep and shared graphs in order, and names a node an earlier backward freed", function()
    -- the walk (core.graph_order) runs in C over Lua lists: a chain far deeper than the C stack
    -- allows recursion into, and a node reached by two paths runs once, after both consumers
    local x = attn.tensor({ 0.5 }, { dtype = "float64", requires_grad = true })
    local y = x
    for _ = 1, 30000 do y = y * 1 end
    y:sum():backward()
    assert.are.same({ 1 }, x.grad:totable())
    x.grad = nil
    local shared = x:exp()
    local out = (shared * shared + shared:tanh()):sum()
    out:backward()
    local e = math.exp(0.5)
    local t = (math.exp(2 * e) - 1) / (math.exp(2 * e) + 1) -- tanh(e)
    assert.is_true(math.abs(x.grad:get(1) - (2 * e * e + (1 - t * t) * e)) < 1e-12)
    assert.has_error(function() out:backward() end, "backward: the graph through 'sum' was already freed by an "
      .. "earlier backward; pass {retain_graph = true} to the first one")
  end)

  it("links no node for an op that returns its input, through record and record_wanted", function()
    local autograd = require "attn.autograd"
    local x = attn.tensor({ 1, 2 }, { dtype = "float64", requires_grad = true })
    local y = x * 2
    local node = y.grad_fn
    assert.are.equal(y, y:contiguous()) -- contiguous of a contiguous tensor is the identity
    assert.are.equal(node, y.grad_fn)
    assert.are.equal(y, autograd.record_wanted("same", y, { y }, function(g) return g * 100 end))
    assert.are.equal(node, y.grad_fn)
    local z = autograd.record_wanted("double", y * 1, { y }, function(g) return g * 2 end)
    assert.are.equal("double", z.grad_fn.name)
    z:sum():backward()
    assert.are.same({ 4, 4 }, x.grad:totable())
    assert.has_error(function() autograd.record_wanted("bad", y, y, function() end) end,
      "record: inputs must be a table of values, got a userdata")
    assert.has_error(function() autograd.record_wanted("bad", 5, { y }, function() end) end,
      "record: out must be a tensor or a table of tensors, got a number")
  end)

  it("tells a fused layer's operand shape with core.fits_last", function()
    local core = attn.core
    local q = attn.zeros { 2, 1, 20 }
    assert.is_true(core.fits_last(q, 3, 20))
    assert.is_false(core.fits_last(q, 3, 2))
    assert.is_false(core.fits_last(q, 2, 20))
    assert.is_false(core.fits_last(attn.zeros {}, 0, 1)) -- a 0-d tensor has no last dim
    assert.is_false(core.fits_last({ 20 }, 1, 20)) -- not a tensor
    assert.has_error(function() core.fits_last(q, 3.5, 20) end,
      "fits_last: argument 2 (ndim) must be an integer, got 3.5")
    assert.has_error(function() core.fits_last(q, 3) end,
      "fits_last: argument 3 (last) must be an integer, got no value")
  end)

  it("frees the graph after backward unless retain_graph", function()
    local w = attn.ones({ 2 }, { requires_grad = true })
    local loss = (w:exp() * 3):sum()
    loss:backward({ retain_graph = nil })
    assert.has_error(function() loss:backward() end)
    local loss2 = (w:exp() * 3):sum()
    loss2:backward(nil, { retain_graph = true })
    loss2:backward()
    assert.is_true(math.abs(w.grad:get(1) - 3 * 3 * math.exp(1)) < 1e-4)
  end)

  it("explains what is wrong", function()
    local x = attn.ones({ 2 })
    assert.has_error(function() x:sum():backward() end,
      "backward: tensor does not require grad (no input of its computation had requires_grad)")
    local w = attn.ones({ 2 }, { requires_grad = true })
    assert.has_error(function() (w * 2):backward() end,
      "backward: grad can be omitted only for a one-element tensor, got [2]")
  end)

  it("keeps memory flat over many steps", function()
    local w = attn.randn({ 64, 64 }, { requires_grad = true })
    local x = attn.randn({ 32, 64 })
    local function step()
      local loss = x:matmul(w):tanh():softmax(2):sum()
      loss:backward()
      attn.no_grad(function() w:sub_(w.grad * 0.01) end)
      w:zero_grad()
    end
    for _ = 1, 50 do step() end
    collectgarbage()
    local before = attn.memory()
    for _ = 1, 500 do step() end
    collectgarbage()
    local after = attn.memory()
    assert.is_true(after - before < 64 * 1024, string.format("live bytes %d -> %d", before, after))
  end)

  it("keeps grad mode per coroutine: one suspended inside no_grad leaves the rest recording", function()
    local autograd = require "attn.autograd"
    local w = attn.ones({ 2 }, { requires_grad = true })
    local co = coroutine.create(function()
      attn.no_grad(function()
        coroutine.yield(attn.is_grad_enabled(), (w * 2).grad_fn ~= nil)
      end)
      return attn.is_grad_enabled()
    end)
    local _, inside, recorded = coroutine.resume(co)
    assert.is_false(inside)
    assert.is_false(recorded)
    -- the coroutine is parked inside no_grad, yet this code records as usual
    assert.is_true(attn.is_grad_enabled())
    local y = (w * 3):sum()
    assert.is_true(y.grad_fn ~= nil)
    y:backward()
    assert.same({ 3, 3 }, w.grad:totable())
    -- and no_grad here does not leak into the coroutine either
    local resumed = attn.no_grad(function() return select(2, coroutine.resume(co)) end)
    assert.is_true(resumed)
    assert.is_true(autograd.is_enabled())
  end)

  it("names the operation whose backward failed", function()
    local autograd = require "attn.autograd"
    local w = attn.ones({ 2 }, { requires_grad = true })
    local y = autograd.record("my_broken_op", w * 1, { w }, function() error("cannot differentiate here", 0) end)
    assert.has_error(function() y:sum():backward() end,
      "backward of 'my_broken_op' failed: cannot differentiate here")
    -- grad mode is back on after the failure
    assert.is_true(attn.is_grad_enabled())
  end)

  it("runs a backward pass from inside another's backward function, and passes after a failed one", function()
    -- the passes keep their work tables between calls: the inner pass must get
    -- its own, and a pass that raised must leave nothing behind for the next
    local autograd = require "attn.autograd"
    local u = attn.tensor({ 1, 2 }, { dtype = "float64", requires_grad = true })
    local v = attn.tensor({ 3, 4 }, { dtype = "float64", requires_grad = true })
    local y = autograd.record("calls_backward", u * 2, { u }, function(g)
      attn.enable_grad(function() (v * v):sum():backward() end)
      return g * 2
    end)
    ;(y * y):sum():backward()
    assert.are.same({ 8, 16 }, u.grad:totable()) -- 2 y * 2 with y = 2 u
    assert.are.same({ 6, 8 }, v.grad:totable())
    local broken = autograd.record("broken", u * 1, { u }, function() error("no", 0) end)
    assert.has_error(function() (broken + u):sum():backward() end, "backward of 'broken' failed: no")
    u.grad = nil
    ;(u * 3 + u):sum():backward()
    assert.are.same({ 4, 4 }, u.grad:totable())
  end)
end)
