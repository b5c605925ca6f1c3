local attn = require "attn"
local helper = require "helper"

-- Naive references over flattened row-major values with explicit broadcasting.
local function broadcast_shape(a, b)
  local n = math.max(#a, #b)
  local out = {}
  for d = 1, n do
    local x, y = a[d - n + #a] or 1, b[d - n + #b] or 1
    out[d] = x == 1 and y or x
  end
  return out
end

local function naive_binary(a, b, f)
  local sa, sb = a:shape(), b:shape()
  local so = broadcast_shape(sa, sb)
  local out = attn.zeros(so, "float64")
  local n = out:numel()
  local idx = {}
  for d = 1, #so do idx[d] = 1 end
  local function pick(t, s)
    local sub = {}
    for d = 1, #s do
      local od = d + #so - #s
      sub[d] = s[d] == 1 and 1 or idx[od]
    end
    return t:get(table.unpack(sub))
  end
  local flat = out:view(n)
  for k = 1, n do
    flat:set(f(pick(a, sa), pick(b, sb)), k)
    for d = #so, 1, -1 do
      idx[d] = idx[d] + 1
      if idx[d] <= so[d] then break end
      idx[d] = 1
    end
  end
  return out
end

local binary_refs = {
  add = function(x, y) return x + y end,
  sub = function(x, y) return x - y end,
  mul = function(x, y) return x * y end,
  div = function(x, y) return x / y end,
  pow = function(x, y) return x ^ y end,
  maximum = function(x, y) return math.max(x, y) end,
  minimum = function(x, y) return math.min(x, y) end,
  lt = function(x, y) return x < y and 1 or 0 end,
  ge = function(x, y) return x >= y and 1 or 0 end,
  eq = function(x, y) return x == y and 1 or 0 end,
}

describe("elementwise math", function()
  before_each(function() attn.manual_seed(1) end)

  for name, ref in pairs(binary_refs) do
    it(name .. " broadcasts like NumPy on strided views, float32 and float64", function()
      for _, dtype in ipairs { "float32", "float64" } do
        local a = attn.rand({ 3, 1, 4 }, dtype) + 0.5
        local b = attn.rand({ 4, 5 }, dtype):transpose(1, 2) + 0.5 -- (5, 4), non-contiguous
        if name == "eq" then b = attn.where(attn.rand({ 5, 4 }, dtype):lt(0.5), b, a:select(1, 1):select(1, 1)) end
        local got = attn[name](a, b)
        assert.are.same({ 3, 5, 4 }, got:shape())
        local tol = dtype == "float32" and 1e-5 or 1e-12
        helper.assert_close(got, naive_binary(a:to("float64"), b:to("float64"), ref), { atol = tol, rtol = tol })
      end
    end)
  end

  it("takes numbers on either side", function()
    local x = attn.tensor({ 1, 2, 4 })
    assert.are.same({ 3, 4, 6 }, (x + 2):totable())
    assert.are.same({ 1, 0, -2 }, (2 - x):totable())
    assert.are.same({ 2, 1, 0.5 }, (2 / x):totable())
    assert.are.same({ 2, 4, 16 }, (2 ^ x):totable())
    assert.are.same({ 1, 4, 16 }, (x ^ 2):totable())
    assert.are.same({ -1, -2, -4 }, (-x):totable())
    assert.are.same({ 0, 1, 1 }, x:gt(1):totable())
  end)

  it("unary functions match math.* on a transposed view", function()
    local x = (attn.rand({ 6, 7 }, "float64") * 4 - 2):transpose(1, 2)
    local refs = {
      exp = math.exp, tanh = function(v) return (math.exp(v) - math.exp(-v)) / (math.exp(v) + math.exp(-v)) end,
      sigmoid = function(v) return 1 / (1 + math.exp(-v)) end, relu = function(v) return math.max(v, 0) end,
      abs = math.abs, neg = function(v) return -v end, square = function(v) return v * v end,
      sin = math.sin, cos = math.cos,
    }
    for name, f in pairs(refs) do
      local got = x[name](x)
      for i = 1, 7 do
        for j = 1, 6 do
          assert.is_true(math.abs(got:get(i, j) - f(x:get(i, j))) < 1e-12, name)
        end
      end
    end
    local p = x:abs() + 0.1
    helper.assert_close(p:log():exp(), p, { atol = 1e-12 })
    helper.assert_close(p:sqrt():square(), p, { atol = 1e-12 })
  end)

  it("sigmoid and softmax stay finite for huge inputs", function()
    local s = attn.tensor({ -1000, 1000 }):sigmoid()
    assert.are.same({ 0, 1 }, s:totable())
    local z = attn.tensor({ { 1e4, 0, -1e4 }, { 3, 3, 3 } }):softmax(2)
    helper.assert_close(z, { { 1, 0, 0 }, { 1 / 3, 1 / 3, 1 / 3 } })
  end)

  it("gives the same bits on 1 and 2 threads for large inputs", function()
    local a = attn.randn({ 512, 300 }, "float32")
    local b = attn.randn({ 300 }, "float32")
    attn.set_num_threads(1)
    local one = { (a * b):sum(2):totable(), a:softmax(1):sum():item(), a:matmul(a:t()):sum():item() }
    attn.set_num_threads(2)
    local two = { (a * b):sum(2):totable(), a:softmax(1):sum():item(), a:matmul(a:t()):sum():item() }
    assert.are.same(one, two)
  end)
end)

describe("reductions", function()
  local x
  before_each(function() x = attn.tensor({ { { 1, 5, 2 }, { 7, 3, 3 } }, { { 0, -1, 4 }, { 2, 2, 9 } } }, "float64") end)

  it("sum, mean, max, min, argmax over dims with keepdim", function()
    assert.are.same({ { 8, 13 }, { 3, 13 } }, x:sum(3):totable())
    assert.are.same({ { { 8 }, { 13 } }, { { 3 }, { 13 } } }, x:sum(-1, true):totable())
    assert.are.same({ { 1, 4, 6 }, { 9, 5, 12 } }, x:sum(1):totable())
    assert.are.equal(37, x:sum():item())
    assert.are.equal(37 / 12, x:mean():item())
    assert.are.same({ { 4, 4, 2.5 }, { 1, 0.5, 6.5 } }, x:mean(2):totable())
    local v, i = x:max(3)
    assert.are.same({ { 5, 7 }, { 4, 9 } }, v:totable())
    assert.are.same({ { 2, 1 }, { 3, 3 } }, i:totable())
    assert.are.same({ { 2, 1 }, { 3, 3 } }, x:argmax(3):totable())
    local mn, mi = x:min(2, true)
    assert.are.same({ 2, 1, 3 }, mn:shape())
    assert.are.same({ { { 1, 2, 1 } }, { { 1, 1, 1 } } }, mi:totable())
    assert.are.equal(9, x:max():item())
    assert.are.equal(-1, x:min():item())
  end)

  it("sums and means over any dim equal an in-order double loop, bit for bit (blocked outputs)", function()
    -- 130 outputs cross the kernel's blocks of 64; the loop adds k = 1..len in
    -- order in double and rounds once, as the kernel promises
    attn.manual_seed(7)
    for _, dtype in ipairs { "float32", "float64" } do
      local t = attn.randn({ 37, 130 }, dtype) * 1000
      for _, case in ipairs { { t, 1 }, { t, 2 }, { t:t(), 1 }, { t:t(), 2 }, { t:narrow(2, 3, 100), 1 } } do
        local v, dim = case[1], case[2]
        local rows, cols = v:size(1), v:size(2)
        local other = dim == 1 and cols or rows
        local len = dim == 1 and rows or cols
        local sums, means = {}, {}
        for i = 1, other do
          local acc = 0.0
          for k = 1, len do acc = acc + (dim == 1 and v:get(k, i) or v:get(i, k)) end
          sums[i], means[i] = acc, acc / len
        end
        helper.assert_identical(v:sum(dim), attn.tensor(sums, "float64"):to(dtype))
        helper.assert_identical(v:mean(dim), attn.tensor(means, "float64"):to(dtype))
      end
    end
  end)

  it("reduces non-contiguous views correctly", function()
    local t = x:permute(3, 1, 2) -- (3, 2, 2)
    helper.assert_close(t:sum(1), x:sum(3))
    helper.assert_close(t:sum(), 37)
  end)

  it("float32 softmax rows (vectorised path) agree with the strided path and float64", function()
    attn.manual_seed(5)
    local z = attn.randn({ 37, 301 }) * 6 -- contiguous rows, odd length
    local ref = z:to("float64"):softmax(2)
    helper.assert_close(z:softmax(2), ref, { atol = 1e-7, rtol = 1e-5 })
    helper.assert_close(z:t():contiguous():softmax(1), ref:t(), { atol = 1e-7, rtol = 1e-5 }) -- strided rows
    helper.assert_close(z:log_softmax(2), z:to("float64"):log_softmax(2), { atol = 1e-5, rtol = 1e-5 })
    local edge = attn.tensor({ { -math.huge, 0, 1 }, { -math.huge, -math.huge, -math.huge }, { 0 / 0, 1, 2 } })
    local s = edge:softmax(2):totable()
    assert.is_true(s[1][1] == 0 and math.abs(s[1][2] + s[1][3] - 1) < 1e-6)
    assert.is_true(s[2][1] ~= s[2][1], "a row of -inf gives NaN, as the formula does")
    assert.is_true(s[3][2] ~= s[3][2], "NaN propagates")
  end)

  it("contiguous softmax rows find the max in every lane and the tail, and NaN anywhere", function()
    -- rows of 19 (two blocks of 8 and a tail of 3): the max, a NaN or +inf in each position
    for _, dtype in ipairs { "float32", "float64" } do
      for pos = 1, 19 do
        local rows = {}
        for r, special in ipairs { 30, 0 / 0, math.huge } do
          rows[r] = {}
          for j = 1, 19 do rows[r][j] = j == pos and special or -j * 0.5 end
        end
        local z = attn.tensor(rows, dtype)
        local strided = z:t():contiguous() -- the per-element reference path runs on columns
        for _, fn in ipairs { "softmax", "log_softmax" } do
          local fast, ref = z[fn](z, 2):totable(), strided[fn](strided, 1):t():totable()
          for r = 1, 3 do
            for j = 1, 19 do
              local a, b = fast[r][j], ref[r][j]
              if b ~= b then
                assert.is_true(a ~= a, string.format("%s %s row %d col %d: NaN expected", dtype, fn, r, j))
              else
                assert.is_true(math.abs(a - b) <= 1e-5 * math.max(1, math.abs(b)),
                  string.format("%s %s pos %d row %d col %d: %g vs %g", dtype, fn, pos, r, j, a, b))
              end
            end
          end
        end
      end
    end
  end)

  it("softmax and log_softmax over any dim match the formula", function()
    local s = x:softmax(2)
    for a = 1, 2 do
      for c = 1, 3 do
        local e1, e2 = math.exp(x:get(a, 1, c)), math.exp(x:get(a, 2, c))
        assert.is_true(math.abs(s:get(a, 1, c) - e1 / (e1 + e2)) < 1e-14)
      end
    end
    helper.assert_close(x:log_softmax(3), x:softmax(3):log(), { atol = 1e-12 })
  end)
end)

describe("matmul", function()
  before_each(function() attn.manual_seed(3) end)

  it("matches a naive triple loop for 2-D, transposed and narrowed operands", function()
    for _, dtype in ipairs { "float32", "float64" } do
      local a = attn.randn({ 7, 5 }, dtype)
      local b = attn.randn({ 6, 9 }, dtype):t():narrow(1, 2, 5) -- (5, 6) strided
      local got = a:matmul(b)
      local tol = dtype == "float32" and 1e-5 or 1e-12
      helper.assert_close(got, helper.naive_matmul(a:totable(), b:totable()), { atol = tol, rtol = tol })
    end
  end)

  it("batches with broadcasting batch dims and 1-D operands", function()
    local a = attn.randn({ 2, 1, 3, 4 }, "float64")
    local b = attn.randn({ 5, 4, 2 }, "float64")
    local c = a:matmul(b)
    assert.are.same({ 2, 5, 3, 2 }, c:shape())
    for i = 1, 2 do
      for j = 1, 5 do
        helper.assert_close(c:select(1, i):select(1, j),
          helper.naive_matmul(a:select(1, i):select(1, 1):totable(), b:select(1, j):totable()), { atol = 1e-12 })
      end
    end
    local v = attn.tensor({ 1, 2, 3, 4 }, "float64")
    assert.are.same({ 2, 1, 3 }, a:matmul(v):shape())
    assert.are.same({ 5, 2 }, v:matmul(b):shape())
    assert.are.equal(30, v:matmul(v):item())
  end)

  it("splits a large product over threads without changing it", function()
    local a = attn.randn({ 300, 200 }, "float64")
    local b = attn.randn({ 200, 100 }, "float64")
    local c = a:matmul(b)
    local i, j = 123, 45
    local s = 0
    for k = 1, 200 do s = s + a:get(i, k) * b:get(k, j) end
    assert.is_true(math.abs(c:get(i, j) - s) < 1e-10)
  end)

  it("bmm checks its shapes", function()
    assert.has_error(function() attn.bmm(attn.ones({ 2, 3, 4 }), attn.ones({ 3, 4, 5 })) end,
      "bmm: expected (B, n, m) @ (B, m, p), got [2x3x4] @ [3x4x5]")
  end)

  it("tanh_backward and sigmoid_backward are g (1 - y^2) and g y (1 - y), broadcasting like mul", function()
    for _, dtype in ipairs { "float32", "float64" } do
      local g, y = attn.randn({ 3, 4 }, dtype), attn.rand({ 4 }, dtype)
      local gt, yt = g:totable(), y:totable()
      local t, s = attn.core.tanh_backward(g, y):totable(), attn.core.sigmoid_backward(g, y):totable()
      for i = 1, 3 do
        for j = 1, 4 do
          assert.near(gt[i][j] * (1 - yt[j] * yt[j]), t[i][j], 1e-6)
          assert.near(gt[i][j] * yt[j] * (1 - yt[j]), s[i][j], 1e-6)
        end
      end
    end
  end)
end)

describe("reductions over an expanded dim", function()
  it("take one read whatever the size, and equal the iterated results", function()
    local x = attn.tensor({ { 1.5, -2 } }):expand(7, 2) -- dim 1 has stride 0
    assert.close(x:sum(1), x:contiguous():sum(1))
    assert.close(x:mean(1), x:contiguous():mean(1))
    assert.close(x:max(1), x:contiguous():max(1))
    local _, idx = x:max(1)
    assert.are.same({ 1, 1 }, idx:totable())
    -- 2^62 copies of 3 in int64: a loop would never end; the sum wraps like integer addition
    local big = attn.tensor(3, "int64"):expand(2 ^ 62)
    assert.are.equal(3 * (1 << 62), attn.core.sum(big, 1):item())
    assert.are.equal(3, attn.core.max(big, 1):item())
  end)
end)
