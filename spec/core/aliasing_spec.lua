-- In-place writes whose input overlaps the output read the input as it was
-- before the call (through a temporary), whatever the overlap.
local attn = require "attn"
local helper = require "helper"

describe("aliasing in in-place ops", function()
  it("a:add_(a:t()) adds the original transpose", function()
    local a = attn.tensor({ { 1, 2 }, { 3, 4 } })
    a:add_(a:t())
    helper.assert_close(a, { { 2, 5 }, { 5, 8 } })
  end)

  it("binary in-place ops with a shifted view of the same storage", function()
    for _, op in ipairs({ "add_", "sub_", "mul_", "div_" }) do
      local x = attn.arange(1, 11, 1, "float64")
      local expected = x:clone()
      local ref_in = x:narrow(1, 1, 9):clone()
      expected:narrow(1, 2, 9)[op](expected:narrow(1, 2, 9), ref_in)
      x:narrow(1, 2, 9)[op](x:narrow(1, 2, 9), x:narrow(1, 1, 9))
      helper.assert_close(x, expected, { atol = 0, rtol = 0 })
    end
  end)

  it("copy_ between overlapping views moves the original values, in both directions", function()
    local b = attn.arange(1, 7)
    b:narrow(1, 2, 5):copy_(b:narrow(1, 1, 5))
    helper.assert_close(b, { 1, 1, 2, 3, 4, 5 })
    local c = attn.arange(1, 7)
    c:narrow(1, 1, 5):copy_(c:narrow(1, 2, 5))
    helper.assert_close(c, { 2, 3, 4, 5, 6, 6 })
    local m = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 }, { 7, 8, 9 } })
    m:copy_(m:t())
    helper.assert_close(m, { { 1, 4, 7 }, { 2, 5, 8 }, { 3, 6, 9 } })
  end)

  it("index_add_ with a source that overlaps the destination", function()
    local x = attn.tensor({ { 1, 1 }, { 2, 2 }, { 3, 3 } }, "float64")
    x:index_add_(1, { 2, 3 }, x:narrow(1, 1, 2))
    helper.assert_close(x, { { 1, 1 }, { 3, 3 }, { 5, 5 } })
  end)

  it("the very same view in and out needs no copy and stays exact", function()
    local x = attn.tensor({ 1, 2, 3 })
    x:mul_(x)
    helper.assert_close(x, { 1, 4, 9 })
  end)
end)
