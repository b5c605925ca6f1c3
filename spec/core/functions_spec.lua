-- Tensor functions the book calls: tile (Torch's repeat), normal, sort, topk,
-- multinomial, argmin/argmax, each against plain Lua loops.
local attn = require "attn"
local helper = require "helper"

local function raises(pattern, f)
  local ok, err = pcall(f)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.truthy(tostring(err):find(pattern, 1, true), "got: " .. tostring(err))
end

-- Element of a nested table at a 1-based multi-index.
local function at(t, idx)
  for _, i in ipairs(idx) do t = t[i] end
  return t
end

-- Calls fn(idx) for every multi-index of shape, row-major.
local function each_index(shape, fn)
  local idx = {}
  local function walk(d)
    if d > #shape then return fn(idx) end
    for i = 1, shape[d] do
      idx[d] = i
      walk(d + 1)
    end
    idx[d] = nil
  end
  walk(1)
end

-- Naive tile: out[i] = x[((i - 1) mod s) + 1] per dim, x padded with leading 1-dims.
local function naive_tile(x, reps)
  local xs = x:shape()
  while #xs < #reps do table.insert(xs, 1, 1) end
  while #reps < #xs do table.insert(reps, 1, 1) end
  local xt = x:reshape(xs):totable()
  local os = {}
  for d = 1, #xs do os[d] = xs[d] * reps[d] end
  local out = attn.zeros(os, x:dtype())
  each_index(os, function(idx)
    local src = {}
    for d = 1, #idx do src[d] = (idx[d] - 1) % xs[d] + 1 end
    out:set(at(xt, src), table.unpack(idx))
  end)
  return out
end

-- Naive stable sort of a list: insertion sort, NaN above every number.
local function naive_sort(list, descending)
  local function before(a, b)
    if a ~= a or b ~= b then return descending and (a ~= a and b == b) or (not descending and a == a and b ~= b) end
    if descending then return a > b end
    return a < b
  end
  local order = {}
  for i = 1, #list do order[i] = i end
  for i = 2, #order do
    local j = i
    while j > 1 and before(list[order[j]], list[order[j - 1]]) do
      order[j], order[j - 1] = order[j - 1], order[j]
      j = j - 1
    end
  end
  local values = {}
  for i, o in ipairs(order) do values[i] = list[o] end
  return values, order
end

-- The rows of x along dim as lists, with a function writing a row back into a table of x's shape.
local function rows_along(x, dim)
  local shape, t = x:shape(), x:totable()
  local other = {}
  for d = 1, #shape do other[d] = d == dim and 1 or shape[d] end
  local rows = {}
  each_index(other, function(idx)
    local row, pos = {}, table.move(idx, 1, #idx, 1, {})
    for j = 1, shape[dim] do
      pos[dim] = j
      row[j] = at(t, pos)
    end
    rows[#rows + 1] = { start = table.move(idx, 1, #idx, 1, {}), values = row }
  end)
  return rows
end

local function same_values(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if not (a[i] == b[i] or (a[i] ~= a[i] and b[i] ~= b[i])) then return false end
  end
  return true
end

describe("tile (Torch's repeat)", function()
  it("matches a naive loop for more, equal and fewer repeat counts than dims", function()
    attn.manual_seed(1)
    local x = attn.randn({ 2, 3 })
    for _, reps in ipairs({ { 2, 3 }, { 1, 1 }, { 3 }, { 2, 1, 2 }, { 0, 2 } }) do
      local got = x:tile(table.unpack(reps))
      assert.close(got, naive_tile(x, table.move(reps, 1, #reps, 1, {})), { atol = 0 })
    end
    assert.close(x:tile({ 2, 2 }), naive_tile(x, { 2, 2 }), { atol = 0 }) -- a table of counts
    local nc = attn.randn({ 3, 4 }):transpose(1, 2) -- a strided view
    assert.close(nc:tile(2, 1, 3), naive_tile(nc, { 2, 1, 3 }), { atol = 0 })
    local ids = attn.tensor({ 1, (1 << 53) + 1 }, "int64")
    assert.same({ { 1, (1 << 53) + 1, 1, (1 << 53) + 1 } }, ids:tile(1, 2):totable())
    assert.same({ 4 }, attn.tensor({ 7 }):tile(4):shape())
  end)

  it("always returns a new tensor and has a gradient", function()
    local x = attn.tensor({ 1, 2 })
    local y = x:tile(1)
    y:set(5, 1)
    assert.equal(1, x:get(1))
    helper.gradcheck(function(a) return a:tile(2, 1, 3) end, { helper.param({ 2, 3 }) })
    helper.gradcheck(function(a) return a:tile(2) end, { helper.param({ 3, 2 }) })
  end)

  it("refuses bad repeat counts", function()
    raises("tile: repeat count 2 is 1.5, not an integer >= 0", function() attn.ones({ 2 }):tile(1, 1.5) end)
    raises("tile: repeat count 1 is -1", function() attn.ones({ 2 }):tile(-1) end)
  end)
end)

describe("normal", function()
  it("draws N(mean, std^2) from the seeded generator", function()
    attn.manual_seed(3)
    local x = attn.normal(2, 0.5, { 40000 }, "float64")
    assert.equal("float64", x:dtype())
    local s, s2, n = 0, 0, 40000
    for _, v in ipairs(x:totable()) do
      s = s + v
      s2 = s2 + v * v
    end
    local mean = s / n
    local sd = math.sqrt(s2 / n - mean * mean)
    assert.is_true(math.abs(mean - 2) < 0.02, "mean " .. mean)
    assert.is_true(math.abs(sd - 0.5) < 0.01, "std " .. sd)
    attn.manual_seed(3)
    assert.close(attn.normal(2, 0.5, { 40000 }, "float64"), x, { atol = 0 })
    assert.same({ 2, 3 }, attn.normal(0, 1, { 2, 3 }):shape())
    assert.is_true(attn.normal(0, 1, { 2 }, { requires_grad = true }).requires_grad)
    raises("std >= 0", function() attn.normal(0, -1, { 2 }) end)
  end)
end)

describe("sort and topk", function()
  it("sort matches a naive stable sort along every dim, both orders, with ties and NaN", function()
    attn.manual_seed(4)
    local x = attn.randint(0, 4, { 3, 4, 5 }):to("float64") -- many ties
    x:set(0 / 0, 2, 3, 1)
    x:set(0 / 0, 1, 1, 5)
    for dim = 1, 3 do
      for _, desc in ipairs({ false, true }) do
        local values, indices = x:sort(dim, desc)
        assert.equal("int64", indices:dtype())
        local vt, it = values:totable(), indices:totable()
        for _, row in ipairs(rows_along(x, dim)) do
          local ev, eo = naive_sort(row.values, desc)
          local gv, go, pos = {}, {}, table.move(row.start, 1, #row.start, 1, {})
          for j = 1, #ev do
            pos[dim] = j
            gv[j], go[j] = at(vt, pos), at(it, pos)
          end
          assert.is_true(same_values(gv, ev), "values along dim " .. dim)
          assert.same(eo, go)
        end
      end
    end
  end)

  it("sort keeps int64 exact and defaults to the last dim, ascending", function()
    local big = (1 << 53) + 1
    local v, i = attn.tensor({ { big, big - 1, -big, math.maxinteger, math.mininteger } }, "int64"):sort()
    assert.same({ { math.mininteger, -big, big - 1, big, math.maxinteger } }, v:totable())
    assert.same({ { 5, 3, 2, 1, 4 } }, i:totable())
    -- -0 ties with +0 (order kept), infinities at the ends, NaN above +inf
    local f = attn.tensor({ 0.0, -0.0, math.huge, -math.huge, 0 / 0, -1e-300 }, "float64")
    local fv, fi = f:sort()
    assert.same({ 4, 6, 1, 2, 3, 5 }, fi:totable())
    assert.equal(-math.huge, fv:get(1))
    local _, di = f:sort(1, true)
    assert.same({ 5, 3, 1, 2, 6, 4 }, di:totable())
  end)

  it("topk matches the head of the naive sort, largest and smallest", function()
    attn.manual_seed(5)
    local x = attn.randint(0, 3, { 4, 6 }):to("float32")
    for _, largest in ipairs({ true, false }) do
      local v, i = x:topk(3, 2, largest)
      local rows = x:totable()
      for r = 1, 4 do
        local ev, eo = naive_sort(rows[r], largest)
        assert.same({ ev[1], ev[2], ev[3] }, v:totable()[r])
        assert.same({ eo[1], eo[2], eo[3] }, i:totable()[r])
      end
    end
    local v = x:topk(2, 1)
    assert.same({ 2, 6 }, v:shape())
    assert.same({ 4, 0 }, x:topk(0):shape())
    raises("topk: k = 7 must be an integer in 0..6", function() x:topk(7) end)
  end)

  it("topk's selection kernel gives sort's head: every dim, both orders, ties, NaN, -0, views, threads", function()
    attn.manual_seed(7)
    -- wide rows of few values (ties everywhere) with NaN and signed zeros, over 2 x 3 x 90
    local x = (attn.randint(-2, 3, { 2, 3, 90 }):to("float64") * 0.5)
    x:set(0 / 0, 1, 2, 7)
    x:set(0 / 0, 2, 1, 40)
    x:set(-0.0, 1, 1, 3)
    local cases = { x, x:to("float32"), x:transpose(1, 3), (x * 4):to("int64") }
    for _, t in ipairs(cases) do
      for dim = 1, 3 do
        local n = t:size(dim)
        for _, k in ipairs({ 0, 1, math.min(n, 4), math.min(n, attn.core.TOPK_MAX) }) do
          for _, largest in ipairs({ true, false }) do
            local v, i = t:topk(k, dim, largest)
            local sv, si = t:sort(dim, largest)
            local head = sv:narrow(dim, 1, k)
            assert.same(si:narrow(dim, 1, k):totable(), i:totable())
            assert.same(head:ne(head):totable(), v:ne(v):totable()) -- NaN in the same places
            assert.same(head:masked_fill(head:ne(head), 0):totable(), v:masked_fill(v:ne(v), 0):totable())
          end
        end
      end
    end
    -- more rows than one thread's share, and a k above the kernel's limit (sort's path)
    local big = attn.randint(0, 50, { 300, 200 })
    local _, one = big:topk(5, 2)
    attn.set_num_threads(2)
    local _, two = big:topk(5, 2)
    attn.set_num_threads(1)
    assert.same(one:totable(), two:totable())
    assert.same(big:sort(2, true):narrow(2, 1, 70):totable(), (big:topk(70, 2)):totable())
  end)

  it("pass gradients to the picked values", function()
    helper.gradcheck(function(a) return (a:sort(2, true)) end, { helper.param({ 3, 4 }) })
    helper.gradcheck(function(a) return (a:sort(1)) end, { helper.param({ 3, 4 }) })
    helper.gradcheck(function(a)
      local v = a:topk(2, 1)
      return v * v
    end, { helper.param({ 4, 3 }) })
  end)
end)

describe("multinomial", function()
  it("draws with replacement at the given frequencies, unnormalised rows included", function()
    attn.manual_seed(6)
    local probs = attn.tensor({ { 1, 0, 3 }, { 0.25, 0.25, 0.5 } })
    local n = 20000
    local s = attn.multinomial(probs, n, true)
    assert.equal("int64", s:dtype())
    assert.same({ 2, n }, s:shape())
    local rows = s:totable()
    local expected = { { 0.25, 0, 0.75 }, { 0.25, 0.25, 0.5 } }
    for r = 1, 2 do
      local counts = { 0, 0, 0 }
      for _, c in ipairs(rows[r]) do counts[c] = counts[c] + 1 end
      for c = 1, 3 do
        local p = expected[r][c]
        local tol = 4 * math.sqrt(n * p * (1 - p)) + 1e-9
        assert.is_true(math.abs(counts[c] - n * p) <= tol, string.format("row %d category %d: %d draws", r, c, counts[c]))
      end
    end
  end)

  it("draws without replacement: distinct, never a zero weight, a permutation when all are drawn", function()
    attn.manual_seed(7)
    local probs = attn.tensor({ 0.1, 0, 0.4, 0.2, 0.3 })
    for _ = 1, 50 do
      local s = attn.multinomial(probs, 4):totable()
      table.sort(s)
      assert.same({ 1, 3, 4, 5 }, s)
    end
    -- the first draw follows the weights
    local first = { 0, 0, 0, 0, 0 }
    for _ = 1, 4000 do
      local c = attn.multinomial(probs, 2):get(1)
      first[c] = first[c] + 1
    end
    assert.is_true(math.abs(first[3] / 4000 - 0.4) < 0.05, "first draws of category 3: " .. first[3])
    raises("row 1 has 4 categories with nonzero probability; cannot draw 5 samples without replacement",
      function() attn.multinomial(probs, 5) end)
  end)

  it("is seeded and independent of the thread count", function()
    local probs = attn.rand({ 3, 7 })
    attn.manual_seed(8)
    local a = attn.multinomial(probs, 5, true)
    local threads = attn.get_num_threads()
    attn.set_num_threads(threads == 1 and 2 or 1)
    attn.manual_seed(8)
    local b = attn.multinomial(probs, 5, true)
    attn.set_num_threads(threads)
    assert.same(a:totable(), b:totable())
  end)

  it("refuses invalid weights", function()
    raises("probability -0.5 at row 1, category 2 is not a finite number >= 0",
      function() attn.multinomial(attn.tensor({ 1, -0.5 }), 1) end)
    raises("row 2 has 0 categories with nonzero probability; cannot draw 1 samples",
      function() attn.multinomial(attn.tensor({ { 1, 1 }, { 0, 0 } }), 1, true) end)
    raises("needs a float tensor", function() attn.multinomial(attn.tensor({ 1, 2 }, "int64"), 1) end)
    raises("multinomial: num_samples must be an integer", function() attn.multinomial(attn.tensor({ 1 }), 1.5) end)
  end)
end)

describe("argmin and argmax", function()
  it("match naive loops over every dim (the first of tied values), as int64", function()
    attn.manual_seed(9)
    local x = attn.randint(0, 3, { 3, 4, 5 }):to("float32")
    for dim = 1, 3 do
      for _, name in ipairs({ "argmin", "argmax" }) do
        local got = x[name](x, dim):totable()
        for _, row in ipairs(rows_along(x, dim)) do
          local best = 1
          for j = 2, #row.values do
            local v, b = row.values[j], row.values[best]
            if (name == "argmin" and v < b) or (name == "argmax" and v > b) then best = j end
          end
          local pos = table.move(row.start, 1, #row.start, 1, {})
          table.remove(pos, dim)
          assert.equal(best, at(got, pos), name .. " along dim " .. dim)
        end
      end
    end
    local flat = x:reshape({ 60 }):totable()
    local lo = 1
    for j = 2, 60 do if flat[j] < flat[lo] then lo = j end end
    assert.equal(lo, x:argmin():item())
    assert.equal("integer", math.type(x:argmin():item()))
  end)

  it("max and argmax over long contiguous float32 rows (the fast path): the first max, the first NaN, -0", function()
    attn.manual_seed(10)
    local x = attn.randint(-3, 3, { 6, 300 }):to("float32") -- ties of the max in every row
    x:set(0 / 0, 2, 150)
    x:set(0 / 0, 2, 299)
    x:narrow(1, 3, 1):fill_(-1)
    x:set(-0.0, 3, 7)
    x:set(0.0, 3, 9) -- row 3's max is zero, first at 7 (a negative zero)
    x:set(5, 4, 300) -- the max in the scalar tail of the eight-wide loop
    local values, idx = x:max(2)
    local vt, it = values:totable(), idx:totable()
    for r, row in ipairs(x:totable()) do
      local best = 1
      for j = 2, #row do
        if row[best] == row[best] and (row[j] ~= row[j] or row[j] > row[best]) then best = j end
      end
      assert.equal(best, it[r], "row " .. r)
      assert.equal(best, x:argmax(2):totable()[r])
      if row[best] == row[best] then assert.equal(row[best], vt[r]) else assert.is_true(vt[r] ~= vt[r]) end
    end
    assert.equal(7, it[3])
    assert.equal(-math.huge, 1 / vt[3]) -- the value is that entry's, sign included
  end)
end)
