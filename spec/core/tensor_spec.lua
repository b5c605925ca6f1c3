local attn = require "attn"
local helper = require "helper"

describe("tensor creation", function()
  it("builds from nested tables with float32 by default", function()
    local x = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.are.same({ 2, 3 }, x:shape())
    assert.are.equal(2, x:dim())
    assert.are.equal(6, x:numel())
    assert.are.equal("float32", x:dtype())
    assert.are.equal(3, x:size(2))
    assert.are.equal(3, x:size(-1))
    assert.are.same({ { 1, 2, 3 }, { 4, 5, 6 } }, x:totable())
  end)

  it("accepts a dtype string or an options table", function()
    assert.are.equal("float64", attn.tensor({ { 1, 2 } }, "float64"):dtype())
    assert.are.equal("float64", attn.zeros({ 2, 3 }, { dtype = "float64" }):dtype())
    local p = attn.ones({ 2 }, { requires_grad = true })
    assert.is_true(p.requires_grad)
    assert.has_error(function() attn.zeros({ 2 }, { dtyp = "float64" }) end,
      "zeros: unknown option 'dtyp' (expected dtype, requires_grad)")
  end)

  it("takes sizes as varargs or as a table, with the dtype or options last", function()
    for _, name in ipairs { "empty", "zeros", "ones", "rand", "randn" } do
      local a, b = attn[name](2, 3), attn[name]({ 2, 3 })
      assert.are.same({ 2, 3 }, a:shape())
      assert.are.same(b:shape(), a:shape())
      assert.are.equal("float64", attn[name](2, 3, "float64"):dtype())
      local p = attn[name](4, { dtype = "float64", requires_grad = true })
      assert.are.same({ 4 }, p:shape())
      assert.is_true(p.requires_grad)
      assert.are.same({}, attn[name]():shape()) -- no sizes: a 0-d tensor
    end
    assert.are.same({ { 0, 0, 0 }, { 0, 0, 0 } }, attn.zeros(2, 3):totable())
    assert.are.same({ { 7, 7 } }, attn.full(1, 2, 7):totable()) -- the last number is the value
    assert.are.same({ { 7, 7 } }, attn.full({ 1, 2 }, 7, "float64"):totable())
    assert.are.same({ { 1, 1, 1 } }, attn.bernoulli(1, 3, 1.0):totable())
    assert.has_error(function() attn.zeros(2, -1) end, "zeros: negative size -1 in shape [2x-1]")
    assert.has_error(function() attn.ones(2, 2.5) end, "ones: size 2 is 2.5, not an integer")
    assert.has_error(function() attn.rand(true) end, "rand: expected sizes like (2, 3) or {2, 3}, got a boolean")
  end)

  it("keeps float64 precision and rounds float32", function()
    local v = 0.1
    assert.are.equal(v, attn.tensor({ v }, "float64"):item())
    assert.are_not.equal(v, attn.tensor({ v }):item())
    assert.is_true(math.abs(attn.tensor({ v }):item() - v) < 1e-8)
  end)

  it("makes 0-d and empty tensors", function()
    local s = attn.tensor(3.5)
    assert.are.equal(0, s:dim())
    assert.are.equal(1, s:numel())
    assert.are.equal(3.5, s:item())
    local e = attn.zeros({ 0, 3 })
    assert.are.equal(0, e:numel())
    assert.are.same({ 0, 3 }, e:shape())
    assert.are.same({}, attn.tensor({}):totable())
  end)

  it("fills zeros, ones, full, eye, arange, linspace", function()
    assert.are.same({ { 0, 0 }, { 0, 0 } }, attn.zeros({ 2, 2 }):totable())
    assert.are.same({ 1, 1, 1 }, attn.ones({ 3 }):totable())
    assert.are.same({ 7, 7 }, attn.full({ 2 }, 7):totable())
    assert.are.same({ { 1, 0, 0 }, { 0, 1, 0 } }, attn.eye(2, 3):totable())
    assert.are.same({ 0, 1, 2, 3, 4 }, attn.arange(5):totable())
    assert.are.same({ 2, 4, 6 }, attn.arange(2, 8, 2):totable())
    assert.are.same({ 5, 4, 3 }, attn.arange(5, 2, -1):totable())
    assert.are.same({}, attn.arange(3, 3):totable())
    helper.assert_close(attn.linspace(0, 1, 5, "float64"), { 0, 0.25, 0.5, 0.75, 1 })
    assert.are.equal(1, attn.linspace(0, 1, 7):get(7))
    assert.are.same({ { 0, 0, 0 } }, attn.zeros_like(attn.ones({ 1, 3 })):totable())
    assert.are.equal("float64", attn.ones_like(attn.ones({ 2 }, "float64")):dtype())
  end)

  it("draws seeded random numbers with the right moments", function()
    attn.manual_seed(7)
    local a = attn.randn({ 1000 }, "float64")
    attn.manual_seed(7)
    local b = attn.randn({ 1000 }, "float64")
    assert.are.same(a:totable(), b:totable())
    local n = 200000
    local x = attn.randn({ n }, "float64")
    local mean = x:mean():item()
    local var = ((x - mean):square()):mean():item()
    assert.is_true(math.abs(mean) < 0.01, "mean " .. mean)
    assert.is_true(math.abs(var - 1) < 0.02, "var " .. var)
    local u = attn.rand({ n }, "float64")
    assert.is_true(u:min():item() >= 0 and u:max():item() < 1)
    assert.is_true(math.abs(u:mean():item() - 0.5) < 0.01)
    local m = attn.bernoulli({ n }, 0.3, "float64")
    assert.is_true(math.abs(m:mean():item() - 0.3) < 0.01)
    assert.are.equal(n, (m:eq(0) + m:eq(1)):sum():item())
  end)

  it("fills contiguous tensors with the same draws as strided views (fast and reference paths)", function()
    -- a transposed view takes the per-element path; a contiguous tensor the inlined loops
    for _, fill in ipairs { { "uniform_", -2, 3 }, { "normal_", 1, 2 } } do
      for _, dtype in ipairs { "float32", "float64" } do
        attn.manual_seed(3)
        local contiguous = attn.core[fill[1]](attn.zeros({ 7, 5 }, dtype), fill[2], fill[3])
        attn.manual_seed(3)
        local base = attn.zeros({ 5, 7 }, dtype)
        attn.core[fill[1]](base:t(), fill[2], fill[3])
        assert.are.same(contiguous:totable(), base:t():totable())
      end
    end
    -- bernoulli(p) is the uniform draw compared with p, for p on and off the 2^-53 grid
    for _, p in ipairs { 0, 0.2, 0.5, 1 / 3, 0.8, 1 } do
      attn.manual_seed(5)
      local u = attn.rand({ 999 }, "float64")
      attn.manual_seed(5)
      assert.are.same(u:lt(p):to("float32"):totable(), attn.bernoulli({ 999 }, p):totable())
    end
  end)

  it("converts dtypes with to()", function()
    local x = attn.tensor({ 1.5, 2.5 })
    local y = x:to("float64")
    assert.are.equal("float64", y:dtype())
    assert.are.same({ 1.5, 2.5 }, y:totable())
    assert.are.equal(x, x:to("float32"))
  end)

  it("prints shape, dtype and values, eliding large tensors", function()
    local s = tostring(attn.tensor({ { 1, 2 }, { 3, 4 } }))
    assert.truthy(s:find("attn.Tensor float32 [2x2]", 1, true))
    assert.truthy(s:find("1 2", 1, true))
    local big = tostring(attn.zeros({ 100, 100 }))
    assert.truthy(big:find("...", 1, true))
    assert.is_true(#big < 2000)
    assert.truthy(tostring(attn.zeros({ 2, 2, 2 })):find("(2,.,.) =", 1, true))
  end)

  it("can be required twice in one state", function()
    package.loaded["attn"] = nil
    package.loaded["attn.core"] = nil
    local again = require "attn"
    local x = again.tensor({ 1, 2 }) + attn.tensor({ 3, 4 })
    assert.are.same({ 4, 6 }, x:totable())
  end)
end)

describe("views", function()
  local x
  before_each(function() x = attn.arange(24, "float64"):reshape(2, 3, 4) end)

  it("share storage with their base", function()
    local v = x:view(6, 4)
    assert.are.equal(x:storage_id(), v:storage_id())
    v:set(100, 1, 1)
    assert.are.equal(100, x:get(1, 1, 1))
  end)

  it("transpose, permute, narrow, select read the right elements", function()
    local t = x:transpose(1, 3) -- (4, 3, 2)
    assert.are.same({ 4, 3, 2 }, t:shape())
    assert.is_false(t:is_contiguous())
    for i = 1, 2 do
      for j = 1, 3 do
        for k = 1, 4 do assert.are.equal(x:get(i, j, k), t:get(k, j, i)) end
      end
    end
    local p = x:permute(2, 3, 1)
    assert.are.equal(x:get(2, 3, 4), p:get(3, 4, 2))
    local n = x:narrow(3, 2, 2)
    assert.are.same({ { { 1, 2 }, { 5, 6 }, { 9, 10 } }, { { 13, 14 }, { 17, 18 }, { 21, 22 } } }, n:totable())
    assert.are.same({ 4, 5, 6, 7 }, x:select(2, 2):select(1, 1):totable())
    assert.are.same({ 20, 21, 22, 23 }, x:select(1, -1):select(1, -1):totable())
  end)

  it("unsqueeze, squeeze and expand", function()
    local v = attn.tensor({ 1, 2, 3 })
    assert.are.same({ 1, 3 }, v:unsqueeze(1):shape())
    assert.are.same({ 3, 1 }, v:unsqueeze(-1):shape())
    assert.are.same({ 3 }, v:unsqueeze(1):unsqueeze(3):squeeze():shape())
    assert.are.same({ 1, 3 }, v:unsqueeze(1):unsqueeze(3):squeeze(3):shape())
    local e = v:unsqueeze(1):expand(2, 3)
    assert.are.same({ { 1, 2, 3 }, { 1, 2, 3 } }, e:totable())
    assert.are.same({ 0, 1 }, e:stride())
    assert.are.same({ { 1, 2, 3 }, { 1, 2, 3 } }, v:expand(2, -1):totable())
  end)

  it("reshape copies non-viewable layouts, view refuses them", function()
    local t = x:transpose(2, 3) -- (2, 4, 3)
    assert.has_error(function() t:view(24) end)
    local r = t:reshape(24)
    assert.are_not.equal(t:storage_id(), r:storage_id())
    local expected = {}
    for i = 1, 2 do
      for k = 1, 4 do
        for j = 1, 3 do expected[#expected + 1] = x:get(i, j, k) end
      end
    end
    assert.are.same(expected, r:totable())
    -- a narrow along the outer dim stays viewable
    local n = x:narrow(1, 2, 1):view(12)
    assert.are.equal(x:storage_id(), n:storage_id())
    assert.are.equal(12, n:get(1))
    assert.are.same({ 3, 8 }, x:reshape(3, -1):shape())
  end)

  it("contiguous, clone and copy", function()
    local t = x:transpose(1, 2)
    local c = t:contiguous()
    assert.is_true(c:is_contiguous())
    assert.are.same(t:totable(), c:totable())
    local k = x:clone()
    k:set(-1, 1, 1, 1)
    assert.are.equal(0, x:get(1, 1, 1))
    local dst = attn.zeros({ 3, 2 }, "float64")
    dst:copy_(attn.tensor({ 1, 2 }))
    assert.are.same({ { 1, 2 }, { 1, 2 }, { 1, 2 } }, dst:totable())
  end)

  it("contiguous copies of short-row views (the head layout) hold every element in place", function()
    for _, dtype in ipairs { "float32", "float64", "int64" } do
      local base = attn.arange(0, 2 * 3 * 4 * 8):reshape(2, 3, 4, 8):to(dtype)
      local views = { base:permute(1, 3, 2, 4), base:transpose(2, 4), base:narrow(4, 2, 5):permute(3, 1, 2, 4),
        attn.arange(0, 8):to(dtype):reshape(1, 8):expand(5, 8) }
      for _, v in ipairs(views) do
        local c = v:contiguous()
        assert.is_true(c:is_contiguous())
        local shape, n = v:shape(), v:numel()
        for flat = 0, n - 1 do -- every element read with get, independent of the copy kernels
          local idx, rest = {}, flat
          for d = #shape, 1, -1 do
            idx[d] = rest % shape[d] + 1
            rest = rest // shape[d]
          end
          assert.are.equal(v:get(table.unpack(idx)), c:get(table.unpack(idx)))
        end
      end
    end
  end)

  it("full and fill_ write the value's exact bits (0, -0, NaN, inf, 1/3) in one run or through a view", function()
    for _, dtype in ipairs { "float32", "float64" } do
      for _, v in ipairs { 0.0, -0.0, 0 / 0, -math.huge, 1 / 3 } do
        local want = attn.empty({ 3, 5 }, dtype)
        for i = 1, 3 do
          for j = 1, 5 do want:set(v, i, j) end
        end
        helper.assert_identical(attn.full({ 3, 5 }, v, dtype), want)
        local t = attn.ones({ 5, 3 }, dtype)
        t:t():fill_(v) -- a transposed view: the iterator's path
        helper.assert_identical(t:t():contiguous(), want)
        t:fill_(v) -- contiguous: one run
        helper.assert_identical(t, want:t():contiguous())
      end
    end
  end)

  it("get/set with 1-based and negative indices", function()
    local m = attn.zeros({ 2, 3 })
    m:set(5, 2, -1)
    assert.are.equal(5, m:get(2, 3))
    assert.has_error(function() m:get(3, 1) end, "get: index 3 out of range for dim 1 of size 2 ([2x3])")
    assert.has_error(function() m:get(1) end, "get: 1 indices given for 2-D tensor [2x3]")
  end)

  it("cat and stack", function()
    local a, b = attn.tensor({ { 1, 2 } }), attn.tensor({ { 3, 4 }, { 5, 6 } })
    assert.are.same({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, attn.cat({ a, b }, 1):totable())
    assert.are.same({ { 1, 2, 1, 2 } }, attn.cat({ a, a }, 2):totable())
    local s = attn.stack({ attn.tensor({ 1, 2 }), attn.tensor({ 3, 4 }) }, 2)
    assert.are.same({ { 1, 3 }, { 2, 4 } }, s:totable())
    assert.has_error(function() attn.cat({ a, attn.ones({ 1, 3 }) }, 1) end)
  end)

  it("index_select, gather, masked_fill and where", function()
    local m = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.are.same({ { 3, 1 }, { 6, 4 } }, m:index_select(2, { 3, 1 }):totable())
    assert.are.same({ { 4, 5, 6 }, { 4, 5, 6 } }, m:index_select(1, attn.tensor({ 2, 2 })):totable())
    assert.are.same({ { 3, 1 }, { 5, 5 } }, m:gather(2, attn.tensor({ { 3, 1 }, { 2, 2 } })):totable())
    local mask = attn.tensor({ { 1, 0, 1 } })
    assert.are.same({ { -1, 2, -1 }, { -1, 5, -1 } }, m:masked_fill(mask, -1):totable())
    assert.are.same({ { 1, 0, 3 }, { 4, 0, 6 } }, attn.where(mask, m, 0):totable())
    assert.has_error(function() m:index_select(1, { 3 }) end)
  end)

  it("index_select and index_add_ over whole rows agree with the strided path", function()
    -- contiguous operands take the row path; transposed views of the same values the general one
    local function strided(t) return t:t():contiguous():t() end
    local idx = { 3, 1, 3, 5, 2, 3 }
    for _, dtype in ipairs { "float32", "float64", "int64" } do
      local a = (attn.randn({ 5, 7 }) * 100):to(dtype)
      assert.is_false(strided(a):is_contiguous())
      assert.are.same(strided(a):index_select(1, idx):totable(), a:index_select(1, idx):totable())
      local src = (attn.randn({ 6, 7 }) * 100):to(dtype)
      local rows, general = attn.ones({ 5, 7 }, dtype), strided(attn.ones({ 5, 7 }, dtype))
      rows:index_add_(1, idx, src) -- index 3 three times: accumulated in order
      general:index_add_(1, idx, strided(src))
      assert.are.same(general:totable(), rows:totable())
    end
  end)
end)
