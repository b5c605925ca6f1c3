-- Torch7-style indexing: t[i], t[{...}], assignment, #t, ipairs, split/chunk.
local attn = require "attn"
local helper = require "helper"

-- The reference: a nested table with x[i][j] = 10 * i + j, built by loops.
local function grid(rows, cols)
  local t = {}
  for i = 1, rows do
    t[i] = {}
    for j = 1, cols do t[i][j] = 10 * i + j end
  end
  return t
end

describe("Torch7-style indexing", function()
  local ref = grid(3, 4)
  local x
  before_each(function() x = attn.tensor(ref, "float64") end)

  it("t[i] is the i-th slice along dim 1, a view; a number for a 1-D tensor", function()
    local row = x[2]
    assert.are.same(ref[2], row:totable())
    assert.are.equal(x:storage_id(), row:storage_id()) -- a view, not a copy
    assert.are.equal(23, x[2][3])
    assert.are.equal("number", type(x[2][3]))
    assert.are.same(ref[3], x[-1]:totable()) -- negative from the end
    assert.are.equal(34, x[-1][-1])
    assert.are.equal(12, x[1.0][2.0]) -- integral floats index too
    local cube = attn.arange(24):reshape(2, 3, 4)
    assert.are.same({ 3, 4 }, cube[2]:shape())
    assert.are.equal(cube:get(2, 3, 1), cube[2][3][1])
  end)

  it("#t is the first size; ipairs and for ... in t:split(1) walk the first dim", function()
    assert.are.equal(3, #x)
    local seen = 0
    for i, row in ipairs(x) do
      seen = seen + 1
      assert.are.same(ref[i], row:totable())
    end
    assert.are.equal(3, seen)
    assert.is_nil(x[4]) -- past the end: nil, which is what ends ipairs
    local rows = {}
    for part in x:split(1) do rows[#rows + 1] = part:totable() end
    assert.are.same({ { ref[1] }, { ref[2] }, { ref[3] } }, rows)
    local total = 0
    for _, v in ipairs(attn.tensor({ 1, 2, 3 })) do total = total + v end -- 1-D: numbers
    assert.are.equal(6, total)
  end)

  it("t[{...}] selects with integers and narrows with {a, b}, {a} and {}", function()
    assert.are.same({ 21, 22, 23 }, x[{ 2, { 1, 3 } }]:totable())
    assert.are.same({ 12, 22, 32 }, x[{ {}, 2 }]:totable())
    assert.are.same({ { 23, 24 } }, x[{ { 2 }, { -2, -1 } }]:totable())
    assert.are.same({ { 21, 22, 23, 24 }, { 31, 32, 33, 34 } }, x[{ { 2, 3 } }]:totable())
    assert.are.same({ 31, 32, 33, 34 }, x[{ 3 }]:totable())
    assert.are.equal(34, x[{ 3, 4 }]) -- every dim selected: a number
    assert.are.equal(x:storage_id(), x[{ {}, { 2, 3 } }]:storage_id())
    assert.are.same({ 2, 2 }, x[{ { 1, 2 }, { 2, 3 } }]:shape())
  end)

  it("t[i] = v and t[{...}] = v assign a number or a broadcast tensor in place", function()
    local expect = grid(3, 4)
    x[1] = 0
    for j = 1, 4 do expect[1][j] = 0 end
    x[{ 2, { 1, 2 } }] = attn.tensor({ -1, -2 }, "float64")
    expect[2][1], expect[2][2] = -1, -2
    x[3][4] = 99 -- through the row view: writes the same storage
    expect[3][4] = 99
    x[{ {}, 3 }] = attn.tensor({ 7 }, "float64") -- broadcast down the column
    for i = 1, 3 do expect[i][3] = 7 end
    assert.are.same(expect, x:totable())
    local v = attn.zeros(3)
    v[2] = 5
    assert.are.same({ 0, 5, 0 }, v:totable())
    local ids = attn.tensor({ { 4, 5 }, { 6, 7 } }, "int64")
    assert.are.equal(math.tointeger(7), ids[2][2]) -- int64 elements read as Lua integers
    assert.are.equal("integer", math.type(ids[{ 1, 2 }]))
    ids[1] = 9
    assert.are.same({ { 9, 9 }, { 6, 7 } }, ids:totable())
  end)

  it("split and chunk return views, walkable by for, with torch's sizes", function()
    local t = attn.arange(10)
    local sizes = {}
    for _, p in ipairs(t:split(4)) do sizes[#sizes + 1] = p:numel() end
    assert.are.same({ 4, 4, 2 }, sizes)
    local parts = t:split({ 3, 7 })
    assert.are.same({ 0, 1, 2 }, parts[1]:totable())
    assert.are.equal(t:storage_id(), parts[2]:storage_id())
    local chunks = x:chunk(2, 2)
    assert.are.same({ { 11, 12 }, { 21, 22 }, { 31, 32 } }, chunks[1]:totable())
    assert.are.same({ { 13, 14 }, { 23, 24 }, { 33, 34 } }, chunks[2]:totable())
    assert.are.equal(3, #attn.arange(5):chunk(3)) -- sizes 2, 2, 1
    assert.are.equal(3, #attn.arange(6):chunk(4)) -- sizes 2, 2, 2: fewer parts, as torch
    local n = 0
    local list = x:split(2, 2)
    for _ in list do n = n + 1 end
    for _ in list do n = n + 1 end -- a list can be walked again
    assert.are.equal(4, n)
  end)

  it("records select and narrow, so gradients flow through indexing", function()
    helper.gradcheck(function(w) return w[2] * 3 + w[{ { 1, 2 }, 2 }]:sum() end, { helper.param({ 3, 2 }) })
    helper.gradcheck(function(w)
      local s = w[1][1] -- a 2-D slice of a 3-D tensor, then a row of it
      for part in w:split(1, 2) do s = s + part:sum() * 2 end
      return s
    end, { helper.param({ 2, 3, 2 }) })
    local w = attn.ones(3, 2, { requires_grad = true })
    ;(w[2] * attn.tensor({ 5, 7 })):sum():backward()
    assert.are.same({ { 0, 0 }, { 5, 7 }, { 0, 0 } }, w.grad:totable())
  end)

  it("methods and fields keep working next to integer keys", function()
    x.grad = attn.zeros(3, 4)
    assert.are.equal(3, x:size(1))
    assert.are.same({ 3, 4 }, x.grad:shape())
    assert.are.equal("function", type(x.transpose))
  end)

  it("names the mistake", function()
    local function raises(pattern, fn) assert.error_matches(fn, pattern, 1, true) end
    raises("tensor index: 0 out of range for dim 1 of size 3 ([3x4]; indices are 1-based)", function() return x[0] end)
    raises("tensor index: -4 out of range for dim 1 of size 3", function() return x[-4] end)
    raises("tensor index: 5 out of range for dim 2 of size 4 ([3x4]", function() return x[{ 1, 5 }] end)
    raises("tensor index: 1.5 at dim 1 is not an integer", function() return x[{ 1.5 }] end)
    raises("tensor index: 3 entries for a 2-D tensor [3x4]", function() return x[{ 1, 1, 1 }] end)
    raises("tensor index: range {3, 2} at dim 1 is empty ([3x4])", function() return x[{ { 3, 2 } }] end)
    raises("tensor index: a boolean key", function() return x[true] end)
    raises("tensor index: a 0-d tensor has no slices", function() return attn.tensor(1)[1] end)
    raises("tensor index assignment: the value is a string", function() x[1] = "a" end)
    raises("tensor index assignment: in-place update of a tensor that requires grad",
      function() attn.zeros(2, { requires_grad = true })[1] = 1 end)
    raises("split: size must be a positive integer, got 0", function() return x:split(0) end)
    raises("split: sizes add up to 2, but dim 1 of [3x4] has 3", function() return x:split({ 1, 1 }) end)
    raises("chunk: n must be a positive integer, got 0", function() return x:chunk(0) end)
  end)
end)
