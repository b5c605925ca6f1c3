-- attn.rope against its closed form in both pair conventions, the relative-position property,
-- per-sample positions, the backward (finite differences and the inverse rotation) and bad input;
-- the fused kernel (src/nn/attn_rope.c) against the composed path, bit for bit.
local attn = require "attn"
local helper = require "helper"

local nn = attn.nn

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
  for _, path in ipairs { "fused", "composed" } do
    it("equals the closed form in both conventions (float64, 1e-12, " .. path .. " path)", function()
      attn.manual_seed(1)
      nn.set_fused(path == "fused")
      local x = attn.randn({ 2, 3, 5, 8 }, "float64")
      local ok, err = pcall(function()
        helper.assert_close(attn.rope(x), rope_naive(x, { 0, 1, 2, 3, 4 }, 10000, false), { atol = 1e-12, rtol = 0 })
        helper.assert_close(attn.rope(x, { interleaved = true, base = 500, positions = { 9, 3, 0, 70, 2 } }),
          rope_naive(x, { 9, 3, 0, 70, 2 }, 500, true), { atol = 1e-12, rtol = 0 })
        helper.assert_close(attn.rope(x, { positions = attn.tensor({ 4, 5, 6, 7, 8 }, "int64") }),
          rope_naive(x, { 4, 5, 6, 7, 8 }, 10000, false), { atol = 1e-12, rtol = 0 })
        -- a strided x (a transposed view) and positions far past any cached table
        local xt = attn.randn({ 2, 8, 5 }, "float64"):transpose(2, 3)
        helper.assert_close(attn.rope(xt, { positions = { 100000, 7, 65, 64, 3 } }),
          rope_naive(xt, { 100000, 7, 65, 64, 3 }, 10000, false), { atol = 1e-12, rtol = 0 })
      end)
      nn.set_fused(true)
      assert(ok, err)
    end)
  end

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

describe("attn.rope's fused kernel", function()
  local threads_before
  before_each(function() threads_before = attn.get_num_threads() end)
  after_each(function()
    attn.set_num_threads(threads_before)
    nn.set_fused(true)
  end)

  -- y and x's gradient for the probe g, by the fused or the composed path.
  local function run(path, x, g, opts)
    nn.set_fused(path == "fused")
    local xl = x:detach():requires_grad_()
    local y = attn.rope(xl, opts)
    y:backward(g)
    nn.set_fused(true)
    return y:detach(), xl.grad
  end

  it("gives the composed path's bits, forward and backward, in both dtypes and conventions", function()
    attn.manual_seed(5)
    for _, dtype in ipairs { "float32", "float64" } do
      for _, interleaved in ipairs { false, true } do
        local cases = {
          { attn.randn({ 2, 3, 5, 8 }, dtype), {} },
          { attn.randn({ 2, 5, 3, 8 }, dtype):transpose(2, 3), { positions = { 9, 3, 0, 70, 2 }, base = 500 } },
          { attn.randn({ 3, 10, 4 }, dtype):transpose(2, 3), { positions = attn.tensor({ 1, 2, 3, 4 }, "float32") } },
          { attn.randn({ 2, 3, 4, 6 }, dtype), { positions = { { 5, 6, 7, 8 }, { 0, 300, 2, 1 } } } },
          { attn.randn({ 4, 12 }, dtype):narrow(2, 3, 6), { positions = attn.tensor({ 3, 1, 4, 1 }, "int64") } },
        }
        for i, c in ipairs(cases) do
          local x, opts = c[1], c[2]
          opts.interleaved = interleaved
          local g = attn.randn(x:shape(), dtype)
          local yf, gf = run("fused", x, g, opts)
          local yc, gc = run("composed", x, g, opts)
          local what = string.format("%s, interleaved %s, case %d", dtype, tostring(interleaved), i)
          assert(pcall(helper.assert_identical, yf, yc), what .. ": forward")
          assert(pcall(helper.assert_identical, gf, gc), what .. ": backward")
        end
      end
    end
  end)

  it("has the same bits on 1 and 2 threads", function()
    local x = attn.randn({ 8, 512, 16 })
    local g = attn.randn({ 8, 512, 16 })
    attn.set_num_threads(1)
    local y1, g1 = run("fused", x, g, { positions = attn.arange(0, 512, 1, "int64") * 3 })
    attn.set_num_threads(2)
    local y2, g2 = run("fused", x, g, { positions = attn.arange(0, 512, 1, "int64") * 3 })
    helper.assert_identical(y2, y1)
    helper.assert_identical(g2, g1)
  end)

  it("passes gradcheck", function()
    local x = attn.randn({ 2, 3, 6 }, "float64"):requires_grad_()
    helper.gradcheck(function(t) return attn.rope(t, { positions = { 2, 0, 5 }, interleaved = true }) end, { x })
    helper.gradcheck(function(t) return attn.rope(t:transpose(2, 3)) end, { attn.randn({ 2, 4, 3 }, "float64"):requires_grad_() })
  end)

  it("fills the angle tables with the closed form", function()
    local c, s = attn.core.rope_tables(5, 6, 100, "float64")
    assert.are.same({ 5, 3 }, c:shape())
    for p = 0, 4 do
      for i = 1, 3 do
        local a = p * 100 ^ (-(2 * (i - 1)) / 6)
        assert.are.equal(math.cos(a), c[p + 1][i])
        assert.are.equal(math.sin(a), s[p + 1][i])
      end
    end
  end)

  it("raises in the kernel on odd d and on positions out of range, naming the values", function()
    local core = attn.core
    assert.has_error(function() core.rope(attn.randn({ 2, 5 }), nil, nil, nil, 10000, false, false) end,
      "rope: the feature size d = 5 of x [2x5] must be even (features rotate in pairs)")
    assert.has_error(function() attn.rope(attn.randn({ 2, 4 }), { positions = attn.tensor({ 0, -1 }, "int64") }) end,
      "rope: positions[2] = -1 is not a non-negative integer (positions are 0-based)")
    assert.has_error(function() attn.rope(attn.randn({ 2, 4 }), { positions = attn.tensor({ 0.5, 1 }) }) end,
      "rope: positions[1] = 0.5 is not a non-negative integer (positions are 0-based)")
    assert.has_error(function() attn.rope(attn.randn({ 2, 4 }), { positions = attn.tensor({ 0, 1, 2 }, "int64") }) end,
      "rope: positions [3] must be (2) or (B, 2) (x has N = 2)")
    assert.has_error(function() attn.rope(attn.randn({ 3, 2, 4 }), { positions = attn.zeros({ 2, 2 }, "int64") }) end,
      "rope: positions [2x2] has 2 rows, x [3x2x4] has 3 samples")
    assert.has_error(function() core.rope(attn.randn({ 2, 4 }), nil, nil, nil, -1, false, false) end,
      "rope: base must be a positive number, got -1")
    -- a table's bad values raise the composed path's messages on either path
    for _, on in ipairs { true, false } do
      nn.set_fused(on)
      assert.has_error(function() attn.rope(attn.randn({ 2, 4 }), { positions = { 0, -1 } }) end,
        "rope: positions[2] = -1 is not a non-negative integer (positions are 0-based)")
      assert.has_error(function() attn.rope(attn.randn({ 2, 2, 4 }), { positions = { { 0, 1 }, { 2 } } }) end,
        "rope: positions rows have different lengths (2 and 1)")
    end
    nn.set_fused(true)
  end)
end)
