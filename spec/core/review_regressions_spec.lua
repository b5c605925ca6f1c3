-- Regressions for bugs found in review: each case failed before its fix.
local attn = require "attn"
local helper = require "helper"
local core = attn.core

local function raises(pattern, f)
  local ok, err = pcall(f)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.truthy(tostring(err):find(pattern, 1, true), "got: " .. tostring(err))
end

describe("bounds and overflow", function()
  it("narrow refuses start + length past the end even when the sum overflows", function()
    local x = attn.tensor({ 1, 2, 3, 4 })
    raises("narrow: start 2 length", function() return x:narrow(1, 2, math.maxinteger) end)
    raises("narrow: start", function() return x:narrow(1, math.maxinteger, 2) end)
  end)

  it("view and expand refuse shapes whose element count overflows", function()
    raises("more elements than can be addressed", function() return attn.tensor({ 1, 2 }):view(3, 6148914691236517206) end)
    raises("more elements than can be addressed",
      function() return core.expand(core.full({ 1, 1 }, 1), { 3, 6148914691236517206 }) end)
  end)

  it("an index list too long to hold is refused before any write", function()
    raises("indices are more than can be held", function()
      local idx = core.expand(core.tensor({ 1 }), { (1 << 40) + 1 })
      return core.index_select(core.full({ 3 }, 7), 1, idx)
    end)
  end)

  it("empty shapes are empty whatever the other sizes", function()
    assert.are.equal(0, attn.empty({ 2 ^ 62, 4, 0 }):numel())
    assert.are.equal(0, attn.empty({ 0, 2 ^ 62, 4 }):numel())
  end)

  it("writing into an expanded view is refused", function()
    local e = attn.zeros({ 1, 3 }):expand(4, 3)
    raises("is an expanded view", function() return e:add_(1) end)
    raises("is an expanded view", function() return e:copy_(attn.ones({ 4, 3 })) end)
  end)

  it("a non-string attention name option is ignored, not kept as a dangling pointer", function()
    local ok, err = pcall(core.scores_attention_forward, attn.zeros({ 1, 2, 2 }), nil, { name = 12345.25, valid_lens = { -1 } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("valid_lens", 1, true))
  end)
end)

describe("numerics", function()
  it("gather and scatter_add reach float32 positions past 2^24", function()
    local n = 16777220
    local y = attn.zeros({ n }, "float32")
    y:scatter_add_(1, attn.tensor({ 16777218 }, "float64"), attn.ones({ 1 }, "float32"))
    assert.are.equal(1, y:get(16777218))
    assert.are.equal(0, y:get(16777217))
  end)

  it("float32 log_softmax does not depend on the memory layout", function()
    local x = attn.tensor({ { 10000, 10000.5 }, { 0, 0 } }, "float32")
    local strided = x:t():contiguous():t()
    assert.is_false(strided:is_contiguous())
    helper.assert_close(x:log_softmax(2), strided:log_softmax(2), { atol = 1e-6, rtol = 0 })
    helper.assert_close(x:log_softmax(2), x:to("float64"):log_softmax(2), { atol = 1e-5, rtol = 0 })
  end)

  it("where broadcasts the condition against scalar or smaller branches", function()
    local c = attn.tensor({ { 1, 0, 1 }, { 0, 1, 0 } })
    assert.are.same({ { 1, 0, 1 }, { 0, 1, 0 } }, attn.where(c, 1, 0):totable())
    assert.are.same({ { 1, -2, 3 }, { -1, 2, -3 } },
      attn.where(c, attn.tensor({ 1, 2, 3 }), attn.tensor({ -1, -2, -3 })):totable())
    raises("masked_fill: mask [2x4] must broadcast to the input [4]",
      function() return attn.ones({ 4 }):masked_fill(attn.ones({ 2, 4 }), 1) end)
  end)

  it("the tensor printout formats exactly the values it shows", function()
    local t = attn.zeros({ 8192 }, "float64")
    t:set(0.5, 2)
    t:set(2.75, 8192)
    local s = tostring(t)
    assert.truthy(s:find("0.5000", 1, true), s)
    assert.truthy(s:find("2.7500", 1, true), s)
  end)
end)

describe("autograd", function()
  local function leaf(v) return attn.tensor(v, { dtype = "float64", requires_grad = true }) end

  it("cat and permute keep their own copy of the caller's table", function()
    local a, b, c = leaf({ 1, 2 }), leaf({ 3, 4 }), leaf({ 5, 6 })
    local buf, h = {}, c
    for step = 1, 2 do
      buf[1] = step == 1 and a or b
      buf[2] = h
      h = attn.cat(buf, 1):narrow(1, 3, 2) * 2
    end
    h:sum():backward()
    assert.are.same({ 4, 4 }, c.grad:totable())
    local x = helper.param({ 2, 3, 4 })
    local perm = { 3, 1, 2 }
    local y = x:permute(perm)
    perm[1], perm[2] = 1, 3
    y:sum():backward()
    assert.are.same({ 2, 3, 4 }, x.grad:shape())
  end)

  it("backward checks the shape and dtype of the grad it is given", function()
    local y = leaf({ 1, 2, 3 })
    raises("backward: grad must be a float64 tensor of the output's shape [3], got float64 [2x3]",
      function() (y * 2):backward(attn.ones({ 2, 3 }, "float64")) end)
    raises("got float32 [3]", function() (y * 2):backward(attn.ones({ 3 })) end)
    raises("got number", function() (y * 2):backward(2) end)
  end)

  it("number ^ tensor and x ^ 0 have the right gradients", function()
    helper.gradcheck(function(x) return 2 ^ x + attn.pow(3, x) end, { leaf({ 0.5, 1, -2 }) })
    local z = leaf({ 0, 1 })
    ;(z ^ 0):sum():backward()
    assert.are.same({ 0, 0 }, z.grad:totable())
    local w = leaf({ 0, 2 })
    ;(w ^ attn.tensor({ 0, 0 }, "float64")):sum():backward()
    assert.are.same({ 0, 0 }, w.grad:totable())
  end)

  it("maximum and minimum split ties; clamp passes the gradient at its bounds", function()
    local a, b = leaf({ 1, 2 }), leaf({ 1, 3 })
    attn.maximum(a, b):sum():backward()
    assert.are.same({ 0.5, 0 }, a.grad:totable())
    assert.are.same({ 0.5, 1 }, b.grad:totable())
    helper.gradcheck(function(p, q) return attn.minimum(p, q) end, { leaf({ 1, 2 }), leaf({ 1, 3 }) })
    local x = leaf({ -2, -1, 0.5, 3, 4 })
    x:clamp(-1, 3):sum():backward()
    assert.are.same({ 0, 1, 1, 1, 0 }, x.grad:totable())
  end)

  it("backward refuses when a tensor it needs was modified in place after the forward pass", function()
    local w = leaf({ 1, 2 })
    local c = attn.tensor({ 2, 3 }, "float64")
    local loss = (w * c):sum()
    c:mul_(10)
    raises("backward: a tensor used by 'mul' was modified in place after the forward pass", function() loss:backward() end)
    local x = leaf({ 1, 2 })
    local e = x:exp()
    local l2 = (e * 2):sum()
    attn.no_grad(function() e:add_(1) end)
    raises("a tensor used by", function() l2:backward() end)
    local ok = leaf({ 1, 2 })
    local l3 = (ok:exp() * c):sum() -- c was modified before this forward: fine
    l3:backward()
    helper.assert_close(ok.grad, { math.exp(1) * 20, math.exp(2) * 30 }, { atol = 1e-12 })
  end)

  it("a node no gradient reaches is skipped (the condition of a where)", function()
    local y = leaf({ -1, 2, 3 })
    attn.where(y:relu(), y, 0):sum():backward()
    assert.are.same({ 0, 1, 1 }, y.grad:totable())
  end)
end)

describe("messages use the caller's shapes", function()
  it("for 1-D matmul, stack, attention options and multi-head valid_lens", function()
    raises("matmul: inner dims differ: [3] @ [4]", function() return attn.ones({ 3 }):matmul(attn.ones({ 4 })) end)
    raises("matmul: inner dims differ: [2x3] @ [4]", function() return attn.ones({ 2, 3 }):matmul(attn.ones({ 4 })) end)
    raises("stack: tensor 2 is float32 [3], tensor 1 is float32 [2]; all must match",
      function() return attn.stack({ attn.ones({ 2 }), attn.ones({ 3 }) }) end)
    local q = attn.randn({ 2, 3, 4 })
    raises("dot_product_attention: training must be a boolean, got yes",
      function() return attn.dot_product_attention(q, q, q, { training = "yes", dropout = 0.5 }) end)
    local m = attn.nn.MultiHeadAttention{ key_size = 4, query_size = 4, value_size = 4, num_hiddens = 4, num_heads = 2 }
    raises("MultiHeadAttention: valid_lens [3] does not fit queries [2x3x4] (expected [2] or [2x3])",
      function() return m(q, q, q, { 1, 2, 3 }) end)
  end)
end)

describe("attention masks", function()
  it("broadcast with extra leading size-1 dims, as NumPy", function()
    attn.manual_seed(4)
    local q = attn.randn({ 2, 3, 4 })
    local mask = attn.tensor({ { 1, 1, 0 }, { 1, 0, 0 }, { 1, 1, 1 } })
    local want = attn.dot_product_attention(q, q, q, { mask = mask })
    local got = attn.dot_product_attention(q, q, q, { mask = mask:reshape(1, 1, 3, 3) })
    helper.assert_close(got, want, { atol = 0 })
  end)
end)

describe("modules", function()
  it("to(dtype) converts parameters in place, so an optimizer built before keeps working", function()
    local m = attn.nn.Linear(2, 3)
    local opt = attn.optim.SGD{ params = m:parameters(), lr = 0.1 }
    local w = m.weight
    m:to("float64")
    assert.is_true(rawequal(w, m.weight))
    assert.are.equal("float64", w:dtype())
    local before = w:clone()
    m(attn.ones({ 1, 2 }, "float64")):sum():backward()
    opt:step()
    assert.is_true((w - before):abs():sum():item() > 0)
  end)
end)
