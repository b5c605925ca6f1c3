local attn = require "attn"

-- Every programmer error raises a message naming the function and the shapes or values.
describe("errors", function()
  local function raises(pattern, f, ...)
    local ok, err = pcall(f, ...)
    assert.is_false(ok, "expected an error matching " .. pattern)
    assert.truthy(tostring(err):find(pattern, 1, true), "got: " .. tostring(err))
  end

  it("C errors carry no library source position (the message is exactly the core's)", function()
    assert.has_error(function() return attn.ones({ 2, 3 }):matmul(attn.ones({ 4, 5 })) end,
      "matmul: inner dims differ: [2x3] @ [4x5]")
  end)

  it("argument errors name the function called and the argument, never the wrapper's local", function()
    local x = attn.ones(2, 3)
    raises("transpose: argument 3 (dim) must be an integer, got no value", function() return x:transpose(1) end)
    raises("matmul: argument 2 must be a tensor, got a table", function() return x:matmul({ 1, 2 }) end)
    raises("matmul: argument 1 must be a tensor, got a number", function() return attn.matmul(3, x) end)
    raises("narrow: argument 3 (start) must be an integer, got a string", function() return x:narrow(1, "a", 2) end)
    raises("select: argument 3 (index) must be an integer, got no value", function() return x:select(1) end)
    raises("sum: argument 2 (dim) must be an integer, got 1.5", function() return x:sum(1.5) end)
    raises("full: argument 2 (value) must be a number, got a string", function() return attn.full({ 2 }, "x") end)
    raises("add_: argument 2 (other) must be a tensor or a number, got a string", function() return x:add_("y") end)
    raises("masked_fill: argument 3 (value) must be a number, got nil", function() return x:masked_fill(x, nil) end)
    raises("where: argument 2 must be a tensor or a number, got a string", function() return attn.where(x, "a", 1) end)
    raises("eye: argument 1 (n) must be an integer, got a string", function() return attn.eye("3") end)
    raises("to: argument 2 (dtype) must be a string, got 5", function() return x:to(5) end)
    raises("cat: argument 1 (tensors) must be a table, got a tensor", function() return attn.cat(x) end)
    raises("fill_: argument 2 (value) must be a number, got no value", function() return x:fill_() end)
    raises("index_select: argument 3 (index) must be a 1-D tensor or a table of indices, got a string",
      function() return x:index_select(1, "a") end)
    raises("gather: argument 3 (index) must be a tensor of 1-based indices, got a table",
      function() return attn.core.gather(x, 1, {}) end)
  end)

  it("64-bit values are printed whole, not through int", function()
    raises("set_num_threads: n = 4294967296 must be in 1..64", function() attn.set_num_threads(2 ^ 32) end)
    raises("set_num_threads: argument 1 (n) must be an integer, got 1.5", function() attn.set_num_threads(1.5) end)
    raises("transpose: dim 4294967297 out of range", function() return attn.ones(2, 2):transpose(1, 2 ^ 32 + 1) end)
    raises("get: index 4294967297 out of range for dim 1 of size 2", function() return attn.ones(2):get(2 ^ 32 + 1) end)
    raises("set_cache_limit: bytes = -1 must be >= 0", function() attn.set_cache_limit(-1) end)
  end)

  it("matmul names both shapes", function()
    raises("matmul: inner dims differ: [2x3] @ [4x5]", function() return attn.ones({ 2, 3 }):matmul(attn.ones({ 4, 5 })) end)
    raises("matmul: dtypes differ", function() return attn.ones({ 2, 2 }):matmul(attn.ones({ 2, 2 }, "float64")) end)
  end)

  it("broadcasting mismatches name the shapes and the dim", function()
    raises("add: shapes [2x3] and [4] do not broadcast (dim 2: 3 vs 4)",
      function() return attn.ones({ 2, 3 }) + attn.ones({ 4 }) end)
    raises("mul: dtypes differ: float32 [2] vs float64 [2]",
      function() return attn.ones({ 2 }) * attn.ones({ 2 }, "float64") end)
  end)

  it("wrong argument types", function()
    raises("add: expected tensors or numbers, got string and attn.Tensor",
      function() return attn.core.add("x", attn.ones({ 1 })) end)
    raises("add: expected tensors or numbers, got table and number", function() return attn.core.add({}, 1) end)
    raises("zeros: expected sizes like (2, 3) or {2, 3}, got a function", function() return attn.zeros(print) end)
    raises("unknown dtype 'int8'", function() return attn.zeros({ 2 }, "int8") end)
  end)

  it("dims out of range", function()
    raises("transpose: dim 3 out of range (expected 1..2 or -2..-1)", function() return attn.ones({ 2, 2 }):transpose(1, 3) end)
    raises("sum: dim 0 out of range", function() return attn.ones({ 2 }):sum(0) end)
    raises("narrow: start 2 length 3 outside dim 1 of size 3 ([3])", function() return attn.ones({ 3 }):narrow(1, 2, 3) end)
    raises("permute: not a permutation of the 2 dims of [2x3]", function() return attn.ones({ 2, 3 }):permute(1, 1) end)
  end)

  it("bad sizes: negative, non-integer, NaN, too many dims", function()
    raises("zeros: negative size -2 in shape [3x-2]", function() return attn.zeros({ 3, -2 }) end)
    raises("empty: negative size -2 in shape [3x-2]", function() return attn.core.empty({ 3, -2 }) end)
    raises("empty: size 2 is 1.5, not an integer", function() return attn.empty({ 2, 1.5 }) end)
    raises("nan, not an integer", function() return attn.zeros({ 0 / 0 }) end)
    raises("at most 8 supported", function() return attn.zeros({ 1, 1, 1, 1, 1, 1, 1, 1, 1 }) end)
    raises("reshape: shape [4x4] has 16 elements, tensor has 6", function() return attn.ones({ 2, 3 }):reshape(4, 4) end)
    raises("view: only one dim may be -1", function() return attn.ones({ 2, 3 }):view(-1, -1) end)
  end)

  it("non-integer indices and impossible ranges name the value", function()
    raises("index_select: index 1.5 at position 1 is not an integer",
      function() return attn.ones({ 5, 3 }):index_select(1, { 1.5 }) end)
    raises("arange: need finite start, stop and a nonzero step, got 0.0, 1.0, 0.0", function() return attn.arange(0, 1, 0) end)
    raises("arange: would produce inf elements", function() return attn.arange(0, 1e300, 1e-300) end)
  end)

  it("tables that are not rectangular or not numbers", function()
    raises("tensor: table is not rectangular: entry [2] has 1 entries where a table of 2 was expected",
      function() return attn.tensor({ { 1, 2 }, { 3 } }) end)
    raises("tensor: element at [1][2] is a string, not a number", function() return attn.tensor({ { 1, "x" } }) end)
  end)

  it("refuses more memory than can be had, without crashing", function()
    raises("cannot allocate", function() return attn.zeros({ 1e6, 1e6, 1e3 }) end)
    raises("overflows the address space", function() return attn.empty({ 2 ^ 40, 2 ^ 40 }) end)
    -- the engine still works afterwards
    assert.are.equal(6, attn.ones({ 2, 3 }):sum():item())
  end)

  it("use of a freed tensor raises instead of reading freed memory", function()
    local x = attn.ones({ 2 })
    local v = x:view(2)
    x:free()
    raises("use of freed tensor", function() return x:sum() end)
    assert.are.equal(2, v:sum():item()) -- the view keeps its own reference
    do
      local scoped <close> = attn.ones({ 3 })
      assert.are.equal(3, scoped:numel())
    end
  end)

  it("in-place updates of tensors that require grad are refused while recording", function()
    local p = attn.ones({ 2 }, { requires_grad = true })
    raises("add_: in-place update of a tensor that requires grad", function() return p:add_(1) end)
    attn.no_grad(function() p:add_(1) end)
    assert.are.same({ 2, 2 }, p:totable())
  end)

  it("an index below 1 says where indices start, one above the size names the size", function()
    local x = attn.tensor({ 1, 2, 3 })
    raises("index_select: index 0 at position 1 is out of range: indices start at 1 (indices [1])",
      function() return x:index_select(1, attn.tensor({ 0 })) end)
    raises("index_select: index 5 at position 1 out of range 1..3 for dim 1 of [3]",
      function() return x:index_select(1, attn.tensor({ 5 })) end)
  end)

  it("prints NaN as nan, and names a missing tile count and a value outside int64", function()
    assert.truthy(tostring(attn.tensor({ 1, 0 / 0, 2 })):find(" nan ", 1, true))
    assert.falsy(tostring(attn.tensor({ 1, 0 / 0, 2 })):find("-nan", 1, true))
    raises("tile: expected repeat counts (integers or one table), got none", function() return attn.ones({ 2 }):tile() end)
    raises("tensor: element at [1] is 9.2233720368548e+18, outside the int64 range",
      function() return attn.tensor({ 2 ^ 63 }, "int64") end)
  end)

  -- a tensor test compares the metatable with the one the binding keeps; another library's userdata
  -- (a file handle) must fail it in a call, in the tensor metamethods and in a saved-table read
  it("another library's userdata is not a tensor", function()
    raises("exp: argument 1 must be a tensor, got a userdata", attn.exp, io.stdout)
    raises("matmul: argument 2 must be a tensor, got a userdata", attn.matmul, attn.ones(2, 2), io.stdout)
    local mt = getmetatable(attn.ones(1))
    raises("attn.Tensor expected, got FILE*", mt.__gc, io.stdout)
    raises("attn.Tensor expected, got FILE*", mt.__close, io.stdout)
    raises("attn.Tensor expected, got FILE*", require("attn.core").free, io.stdout)
    assert.are.equal(io.type(io.stdout), "file") -- untouched
  end)
end)
