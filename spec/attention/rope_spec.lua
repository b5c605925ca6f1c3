-- attn.rope against its closed form in both pair conventions, the relative-position property,
-- per-sample positions, the backward (finite differences and the inverse rotation) and bad input.
local attn = require "attn"
local helper = require "helper"

-- The closed form, in double: pair (a, b) of features rotated by p * base^(-2(i-1)/d).
local function rope_naive(x, positions, base, interleaved)
  local s = x:shape()
  local N, d = s[#s - 1], s[#s]
  local rows = attn.core.totable(x:reshape({ -1, N, d }))
  for _, m in ipairs(rows) do
    for t = 1, N do
      local row, out = m[t], {}
      for i = 1, d // 2 do
        local a = positions[t] * base ^ (-2 * (i - 1) / d)
        local ia, ib = i, i + d // 2
        if interleaved then ia, ib = 2 * i - 1, 2 * i end
        out[ia] = row[ia] * math.cos(a) - row[ib] * math.sin(a)
        out[ib] = row[ib] * math.cos(a) + row[ia] * math.sin(a)
      end
      m[t] = out
    end
  end
  return attn.tensor(rows, "float64"):reshape(s)
end

describe("attn.rope", function()
  it("equals the closed form in both conventions (float64, 1e-12)", function()
    attn.manual_seed(1)
    local x = attn.randn({ 2, 3, 5, 8 }, "float64")
    helper.assert_close(attn.rope(x), rope_naive(x, { 0, 1, 2, 3, 4 }, 10000, false), { atol = 1e-12, rtol = 0 })
    helper.assert_close(attn.rope(x, { interleaved = true, base = 500, positions = { 9, 3, 0, 70, 2 } }),
      rope_naive(x, { 9, 3, 0, 70, 2 }, 500, true), { atol = 1e-12, rtol = 0 })
    helper.assert_close(attn.rope(x, { positions = attn.tensor({ 4, 5, 6, 7, 8 }, "int64") }),
      rope_naive(x, { 4, 5, 6, 7, 8 }, 10000, false), { atol = 1e-12, rtol = 0 })
  end)

  it("the two conventions differ by the permutation that interleaves the halves", function()
    local x = attn.randn({ 4, 6 }, "float64")
    local perm = { 1, 4, 2, 5, 3, 6 } -- half-split feature order -> interleaved order
    local xi = x:index_select(2, attn.tensor(perm, "int64"))
    helper.assert_close(attn.rope(x):index_select(2, attn.tensor(perm, "int64")), attn.rope(xi, { interleaved = true }),
      { atol = 1e-14, rtol = 0 })
  end)

  it("makes q_m . k_n depend only on m - n", function()
    attn.manual_seed(2)
    for _, interleaved in ipairs { false, true } do
      local q, k = attn.randn({ 1, 16 }, "float64"), attn.randn({ 1, 16 }, "float64")
      local function dot(m, n)
        local qm = attn.rope(q, { positions = { m }, interleaved = interleaved })
        local kn = attn.rope(k, { positions = { n }, interleaved = interleaved })
        return (qm * kn):sum():item()
      end
      local ref = dot(3, 1)
      for _, mn in ipairs { { 2, 0 }, { 12, 10 }, { 102, 100 } } do
        assert.is_true(math.abs(dot(mn[1], mn[2]) - ref) < 1e-11)
      end
      assert.is_true(math.abs(dot(4, 1) - ref) > 1e-6) -- and does depend on it
    end
  end)

  it("takes per-sample positions (B, N)", function()
    local x = attn.randn({ 2, 3, 2, 4 }, "float64")
    local y = attn.rope(x, { positions = { { 5, 6 }, { 0, 9 } } })
    helper.assert_close(y:select(1, 1), rope_naive(x:select(1, 1), { 5, 6 }, 10000, false), { atol = 1e-12, rtol = 0 })
    helper.assert_close(y:select(1, 2), rope_naive(x:select(1, 2), { 0, 9 }, 10000, false), { atol = 1e-12, rtol = 0 })
  end)

  it("has the inverse rotation as backward, and passes gradcheck", function()
    local x = attn.randn({ 2, 3, 6 }, "float64"):requires_grad_()
    local g = attn.randn({ 2, 3, 6 }, "float64")
    local y = attn.rope(x, { positions = { 1, 4, 8 }, interleaved = true })
    y:backward(g)
    -- the rotation is orthogonal: its transpose applied to g, rotated forward again, is g
    helper.assert_close(attn.rope(x.grad, { positions = { 1, 4, 8 }, interleaved = true }), g, { atol = 1e-13, rtol = 0 })
    helper.gradcheck(function(t) return attn.rope(t, { positions = { 2, 0, 5 } }) end, { x:detach():requires_grad_() })
  end)

  it("works in float32 and matches float64", function()
    local x = attn.randn({ 3, 7, 10 }, "float64")
    helper.assert_close(attn.rope(x:to("float32")):to("float64"), attn.rope(x), { atol = 1e-6, rtol = 1e-6 })
  end)

  it("raises on odd d, bad positions and unknown options, naming the values", function()
    assert.has_error(function() attn.rope(attn.randn({ 2, 5 })) end,
      "rope: the feature size d = 5 of x [2x5] must be even (features rotate in pairs)")
    assert.has_error(function() attn.rope(attn.randn({ 2, 4 }), { positions = { 0, -1 } }) end,
      "rope: positions[2] = -1 is not a non-negative integer (positions are 0-based)")
    assert.has_error(function() attn.rope(attn.randn({ 2, 4 }), { positions = { 0, 1.5 } }) end,
      "rope: positions[2] = 1.5 is not a non-negative integer (positions are 0-based)")
    assert.has_error(function() attn.rope(attn.randn({ 2, 4 }), { positions = { 0, 1, 2 } }) end,
      "rope: positions [3] must be (2) or (B, 2) (x has N = 2)")
    assert.has_error(function() attn.rope(attn.randn({ 2, 4 }), { offset = 1 }) end)
  end)
end)
