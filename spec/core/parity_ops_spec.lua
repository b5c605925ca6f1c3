-- PyTorch-parity tensor ops (issue 19): erf and the exact GELU against a high-precision
-- reference written here, cumsum/cumprod, tril/triu, scatter_add, var/std, norm,
-- repeat_interleave and einsum against naive loops, gradients by finite differences, and
-- calls that size their output before walking a huge expanded input.
local attn = require "attn"
local helper = require "helper"

local sqrt2, sqrtpi = math.sqrt(2), math.sqrt(math.pi)

-- erf(z) for |z| < 0.5 by its series with positive terms only, 2/sqrt(pi) e^{-z^2}
-- sum_n z (2 z^2)^n / (1 3 5 ... (2n + 1)): no cancellation, so accurate to the last bits.
local function erf_series(z)
  local term, sum = z, z
  for n = 1, 60 do
    term = term * 2 * z * z / (2 * n + 1)
    sum = sum + term
  end
  return 2 / sqrtpi * math.exp(-z * z) * sum
end
-- erfc(z) for z >= 0.5 by its continued fraction e^{-z^2}/sqrt(pi) / (z + (1/2)/(z + 1/(z + ...))),
-- evaluated from the bottom with enough terms to converge at z = 0.5.
local function erfc_cf(z)
  local t = z
  for k = 20000, 1, -1 do t = z + (k / 2) / t end
  return math.exp(-z * z) / sqrtpi / t
end
-- The standard normal CDF, without the cancellation of 1 + erf for negative x.
local function phi_ref(x)
  local z = x / sqrt2
  if z >= 0.5 then return 1 - erfc_cf(z) / 2 end
  if z <= -0.5 then return erfc_cf(-z) / 2 end
  return 0.5 + erf_series(z) / 2
end

local POINTS = { -8, -5, -3, -2, -1.5, -1, -0.7, -0.3, -1e-3, 0, 1e-3, 0.3, 0.7, 1, 1.5, 2, 3, 5, 8 }

local function rel_err(a, b) return a == b and 0 or math.abs(a - b) / math.abs(b) end

describe("erf and GELU (libm, exact to double rounding)", function()
  it("erf matches known values and the series to 1e-15 relative", function()
    -- erf(0.5), erf(1), erf(2) to 20 digits (Abramowitz & Stegun table 7.1, DLMF)
    local known = { [0.5] = 0.52049987781304653768, [1] = 0.84270079294971486934, [2] = 0.99532226501895273416 }
    for x, v in pairs(known) do
      local got = attn.erf(attn.tensor({ x }, "float64")):item()
      assert.is_true(rel_err(got, v) <= 1e-15, string.format("erf(%g) = %.17g, expected %.17g", x, got, v))
    end
    for _, z in ipairs({ -0.45, -0.2, 0.01, 0.25, 0.45 }) do
      local got = attn.erf(attn.tensor({ z }, "float64")):item()
      assert.is_true(rel_err(got, erf_series(z)) <= 1e-15, string.format("erf(%g) = %.17g", z, got))
    end
  end)

  -- 1e-15 relative, times the condition number of x Phi(x) in the lower tail (about x^2: the
  -- rounding of x / sqrt 2 alone moves erfc by 2 z^2 ulps there, in any implementation)
  it("gelu(x) = x Phi(x) and its gradient match the reference to 1e-15 relative in float64", function()
    local x = attn.tensor(POINTS, { dtype = "float64", requires_grad = true })
    local y = attn.nn.GELU()(x)
    y:sum():backward()
    for i, v in ipairs(POINTS) do
      local want = v * phi_ref(v)
      local dwant = phi_ref(v) + v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi)
      local got, dgot = y:get(i), x.grad:get(i)
      local tol = 1e-15 * math.max(1, v < 0 and v * v or 1)
      assert.is_true(rel_err(got, want) <= tol,
        string.format("gelu(%g) = %.17g, expected %.17g", v, got, want))
      assert.is_true(rel_err(dgot, dwant) <= tol,
        string.format("gelu'(%g) = %.17g, expected %.17g", v, dgot, dwant))
    end
  end)

  it("float32 is the double value rounded once", function()
    local x = attn.tensor(POINTS)
    local y = attn.gelu(x)
    for i, v in ipairs(POINTS) do
      local xv = x:get(i) -- v rounded to float32
      local want = xv * phi_ref(xv)
      assert.is_true(math.abs(y:get(i) - want) <= 6e-8 * math.max(math.abs(want), 1e-30),
        string.format("float32 gelu(%g) = %.9g, expected %.9g", v, y:get(i), want))
    end
  end)

  it("gradients agree with finite differences (gelu, erf) and the tanh form stays", function()
    attn.manual_seed(3)
    helper.gradcheck(function(x) return attn.gelu(x) end, { helper.param({ 3, 4 }, 2) })
    helper.gradcheck(function(x) return attn.erf(x) end, { helper.param({ 5 }) })
    local function tanh(u) return 1 - 2 / (math.exp(2 * u) + 1) end -- (math.tanh is gone in Lua 5.4)
    local x = attn.tensor({ -1, 0.5, 2 }, "float64")
    local t = attn.nn.GELU({ approximate = "tanh" })(x)
    for i = 1, 3 do
      local v = x:get(i)
      helper.assert_close(t:get(i), 0.5 * v * (1 + tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3))),
        { atol = 1e-15, rtol = 1e-15 })
    end
  end)
end)

describe("PositionalEncoding in float64", function()
  it("the table follows the module's dtype: sin/cos(pos / 10000^(2i/d)) to 1e-14", function()
    local d, T = 6, 9
    local m = attn.nn.PositionalEncoding(d, 0, 50):to("float64")
    assert.are.equal("float64", m.P:dtype())
    local X = attn.zeros({ 1, T, d }, "float64")
    local y = m(X)
    for pos = 0, T - 1 do
      for c = 0, d - 1 do
        local a = pos / 10000 ^ ((c - c % 2) / d)
        local want = c % 2 == 0 and math.sin(a) or math.cos(a)
        assert.is_true(math.abs(y[{ 1, pos + 1, c + 1 }] - want) <= 1e-14, string.format("P[%d][%d]", pos, c))
      end
    end
    -- a float32 module fed float64 gets the float64 table too, not an upcast
    local m32 = attn.nn.PositionalEncoding(d, 0, 50)
    local y32 = m32(X)
    helper.assert_close(y32, y, { atol = 0, rtol = 0 })
  end)
end)

-- naive references on nested tables
local function scan_ref(rows, prod)
  local out = {}
  for r, row in ipairs(rows) do
    out[r] = {}
    local acc = prod and 1 or 0
    for k, v in ipairs(row) do
      acc = prod and acc * v or acc + v
      out[r][k] = acc
    end
  end
  return out
end

describe("cumsum and cumprod", function()
  for _, dtype in ipairs({ "float32", "float64" }) do
    it("match naive loops along each dim (" .. dtype .. ")", function()
      attn.manual_seed(1)
      local x = attn.randn({ 3, 5 }, dtype)
      local rows = x:totable()
      local tol = dtype == "float32" and { atol = 1e-5 } or { atol = 1e-14 }
      helper.assert_close(x:cumsum(2), scan_ref(rows), tol)
      helper.assert_close(x:cumprod(-1), scan_ref(rows, true), tol)
      helper.assert_close(x:t():cumsum(1), attn.tensor(scan_ref(rows)):t(), tol) -- strided input, dim 1
    end)
  end

  it("int64 cumsum is exact", function()
    local x = attn.tensor({ 1 << 60, 3, -2 }, "int64")
    assert.same({ 1 << 60, (1 << 60) + 3, (1 << 60) + 1 }, x:cumsum(1):totable())
  end)

  it("gradients agree with finite differences, cumprod with zeros in the input", function()
    attn.manual_seed(2)
    helper.gradcheck(function(x) return x:cumsum(2) end, { helper.param({ 3, 4 }) })
    helper.gradcheck(function(x) return x:cumprod(1) end, { helper.param({ 4, 3 }) })
    -- one zero, two zeros, a zero first and last: the products are polynomials in each entry,
    -- so finite differences are exact there and the gradient must not be NaN
    for _, row in ipairs({ { 2, 0, 3, 0.5 }, { 0, 1.5, 0, 2 }, { 1.5, -2, 0.5, 0 }, { 0, 0, 0, 0 } }) do
      local x = attn.tensor(row, { dtype = "float64", requires_grad = true })
      helper.gradcheck(function(t) return t:cumprod(1) end, { x })
      x.grad = nil
      local y = x:cumprod(1)
      y:sum():backward()
      -- d/dx_k of sum_j prod_{i<=j} x_i, by the definition
      for k = 1, #row do
        local want = 0
        for j = k, #row do
          local p = 1
          for i = 1, j do
            if i ~= k then p = p * row[i] end
          end
          want = want + p
        end
        assert.are.equal(want, x.grad:get(k))
      end
    end
  end)
end)

describe("tril and triu", function()
  it("keep j - i <= k (tril) or >= k (triu) on every matrix of a batch, with gradients", function()
    attn.manual_seed(4)
    local x = attn.randn({ 2, 3, 4 }, "float64")
    for _, k in ipairs({ -3, -1, 0, 1, 2, 5 }) do
      local lo, up = x:tril(k), x:triu(k)
      for b = 1, 2 do
        for i = 1, 3 do
          for j = 1, 4 do
            local v = x[{ b, i, j }]
            assert.are.equal((j - i <= k) and v or 0, lo[{ b, i, j }])
            assert.are.equal((j - i >= k) and v or 0, up[{ b, i, j }])
          end
        end
      end
    end
    helper.gradcheck(function(t) return t:tril(-1) end, { helper.param({ 3, 3 }) })
    helper.gradcheck(function(t) return attn.triu(t, 1) end, { helper.param({ 2, 3, 4 }) })
    assert.has_error(function() attn.tril(attn.ones(3)) end, "tril: input [3] must have at least 2 dims")
  end)
end)

describe("scatter_add (out of place)", function()
  it("adds src at index along dim, leaves x unchanged, and differentiates in x and src", function()
    local x = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, "float64")
    local index = attn.tensor({ { 3, 1 }, { 2, 2 } }, "int64")
    local src = attn.tensor({ { 10, 20 }, { 30, 40 } }, "float64")
    local out = attn.scatter_add(x, 2, index, src)
    assert.same({ { 21, 2, 13 }, { 4, 75, 6 } }, out:totable())
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, x:totable())
    attn.manual_seed(5)
    helper.gradcheck(function(a, s) return attn.scatter_add(a, 2, index, s) end,
      { helper.param({ 2, 3 }), helper.param({ 2, 2 }) })
    assert.error_matches(function() attn.scatter_add(x, 2, attn.tensor({ { 4, 1 }, { 1, 1 } }, "int64"), src) end,
      "out of range")
  end)
end)

describe("var, std and norm", function()
  local function ref_var(v, correction)
    local m = 0
    for _, a in ipairs(v) do m = m + a end
    m = m / #v
    local s = 0
    for _, a in ipairs(v) do s = s + (a - m) ^ 2 end
    return s / (#v - correction)
  end

  for _, dtype in ipairs({ "float32", "float64" }) do
    it("var/std match the definition over a dim and over all (" .. dtype .. ")", function()
      attn.manual_seed(6)
      local x = attn.randn({ 3, 4 }, dtype)
      local rows = x:totable()
      local tol = { atol = dtype == "float32" and 1e-5 or 1e-13 }
      local v1, v0, s1 = {}, {}, {}
      for r, row in ipairs(rows) do
        v1[r], v0[r], s1[r] = ref_var(row, 1), ref_var(row, 0), math.sqrt(ref_var(row, 1))
      end
      helper.assert_close(x:var(2), v1, tol)
      helper.assert_close(x:var(2, false), v0, tol)
      helper.assert_close(x:var(2, { correction = 0 }), v0, tol)
      helper.assert_close(x:std(-1), s1, tol)
      assert.same({ 3, 1 }, x:std(2, { keepdim = true }):shape())
      helper.assert_close(x:var(), ref_var(helper.flatten(rows), 1), tol)
      assert.error_matches(function() x:var(2, { bias = true }) end, "var: unknown option 'bias'")
    end)
  end

  it("norm: p = 2, 1, inf, -inf, 0, 3 and 0.5 against loops, with gradients", function()
    local x = attn.tensor({ { 3, -4, 0 }, { 1, 2, -2 } }, "float64")
    local rows = x:totable()
    local function ref(row, p)
      if p == math.huge or p == -math.huge then
        local best = math.abs(row[1])
        for _, v in ipairs(row) do
          best = (p > 0) and math.max(best, math.abs(v)) or math.min(best, math.abs(v))
        end
        return best
      end
      local s = 0
      for _, v in ipairs(row) do
        if p == 0 then s = s + (v ~= 0 and 1 or 0) else s = s + math.abs(v) ^ p end
      end
      return p == 0 and s or s ^ (1 / p)
    end
    for _, p in ipairs({ 2, 1, math.huge, -math.huge, 0, 3, 0.5 }) do
      helper.assert_close(x:norm(p, 2), { ref(rows[1], p), ref(rows[2], p) }, { atol = 1e-14 })
      helper.assert_close(attn.linalg.vector_norm(x, p, -1, true), { { ref(rows[1], p) }, { ref(rows[2], p) } },
        { atol = 1e-14 })
    end
    helper.assert_close(x:norm(), math.sqrt(9 + 16 + 1 + 4 + 4), { atol = 1e-14 })
    helper.assert_close(attn.linalg.norm(x), math.sqrt(34), { atol = 1e-14 })
    helper.assert_close(attn.linalg.norm(x, "fro"), math.sqrt(34), { atol = 1e-14 })
    assert.error_matches(function() attn.linalg.norm(x, 1) end, "matrix norms")
    attn.manual_seed(7)
    for _, p in ipairs({ 2, 1, 3, math.huge }) do
      helper.gradcheck(function(t) return t:norm(p, 2) end, { helper.param({ 3, 4 }) })
    end
    helper.gradcheck(function(t) return attn.linalg.vector_norm(t, 1.5) end, { helper.param({ 5 }) })
  end)

  it("the gradient at a zero norm is 0 (PyTorch's subgradient), ties share the inf-norm's", function()
    for _, p in ipairs({ 2, 1, 3, 0.5, math.huge }) do
      local z = attn.zeros({ 3 }, { dtype = "float64", requires_grad = true })
      z:norm(p):backward()
      assert.same({ 0, 0, 0 }, z.grad:totable())
    end
    local t = attn.tensor({ 2, -2, 1 }, { dtype = "float64", requires_grad = true })
    t:norm(math.huge):backward()
    assert.same({ 0.5, -0.5, 0 }, t.grad:totable())
  end)
end)

describe("repeat_interleave (PyTorch's)", function()
  -- naive: entry i of x along dim repeated counts[i] times
  local function naive(rows, counts, dim)
    local out = {}
    if dim == 1 then
      for i, row in ipairs(rows) do
        for _ = 1, counts[i] do out[#out + 1] = row end
      end
    else
      for r, row in ipairs(rows) do
        out[r] = {}
        for i, v in ipairs(row) do
          for _ = 1, counts[i] do out[r][#out[r] + 1] = v end
        end
      end
    end
    return out
  end

  for _, dtype in ipairs({ "float32", "float64", "int64" }) do
    it("repeats along dim 1, dim 2, -1 and flattened, by a count or per entry (" .. dtype .. ")", function()
      local rows = { { 1, 2, 3 }, { 4, 5, 6 } }
      local x = attn.tensor(rows, dtype)
      assert.same(naive(rows, { 2, 2 }, 1), attn.repeat_interleave(x, 2, 1):totable())
      assert.same(naive(rows, { 3, 3, 3 }, 2), x:repeat_interleave(3, -1):totable())
      assert.same(naive(rows, { 0, 2, 1 }, 2), attn.repeat_interleave(x, { 0, 2, 1 }, 2):totable())
      assert.same(naive(rows, { 1, 3 }, 1), attn.repeat_interleave(x, attn.tensor({ 1, 3 }, "int64"), 1):totable())
      assert.same({ 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6 }, attn.repeat_interleave(x, 2):totable())
      assert.same(dtype, attn.repeat_interleave(x, 2, 1):dtype())
    end)
  end

  -- per-entry counts build their index in C (a mark at each nonzero count's first position,
  -- summed along): zero counts first, last and in runs, all zero, and counts of a million
  it("takes zero counts anywhere and counts of millions (per-entry counts)", function()
    local rows = { { 1, 2, 3, 4, 5, 6 } }
    local x = attn.tensor(rows, "float64")
    for _, counts in ipairs { { 0, 0, 2, 0, 0, 1 }, { 3, 0, 0, 0, 1, 0 }, { 0, 0, 0, 0, 0, 0 }, { 1, 1, 1, 1, 1, 1 } } do
      local y = attn.repeat_interleave(x, counts, 2)
      local want = naive(rows, counts, 2)
      assert.same(#want[1], y:shape()[2])
      if #want[1] > 0 then assert.same(want, y:totable()) end
    end
    local big = attn.repeat_interleave(attn.tensor({ 7, 8, 9 }), attn.tensor({ 1000000, 0, 2000000 }, "int64"))
    assert.same({ 3000000 }, big:shape())
    -- closed forms: the sum, and the entries at the boundary
    assert.are.equal(7 * 1000000 + 9 * 2000000, big:to("float64"):sum():item())
    assert.same({ 7, 9 }, { big[1000000], big[1000001] })
  end)

  it("differentiates: the gradient sums the repeats back", function()
    attn.manual_seed(8)
    helper.gradcheck(function(t) return attn.repeat_interleave(t, 3, 2) end, { helper.param({ 2, 3 }) })
    helper.gradcheck(function(t) return attn.repeat_interleave(t, { 2, 0, 1 }, 1) end, { helper.param({ 3, 2 }) })
    helper.gradcheck(function(t) return attn.repeat_interleave(t, 2) end, { helper.param({ 2, 2 }) })
    local x = attn.tensor({ 1, 2 }, { requires_grad = true })
    attn.repeat_interleave(x, { 3, 1 }):sum():backward()
    assert.same({ 3, 1 }, x.grad:totable())
  end)

  it("refuses bad repeats, naming them", function()
    local x = attn.ones(2, 3)
    assert.error_matches(function() attn.repeat_interleave(x, -1, 1) end, "repeats must be an integer >= 0")
    assert.error_matches(function() attn.repeat_interleave(x, { 1, 2 }, 2) end, "2 repeat counts for dim 2 of size 3")
    assert.error_matches(function() attn.repeat_interleave(x, { 1, 1.5, 1 }, 2) end, "repeats entry 2 is 1.5")
    assert.error_matches(function() attn.repeat_interleave(x, 2, 3) end, "dim 3 out of range")
  end)
end)

describe("einsum", function()
  -- naive einsum over nested tables: loops over every label assignment
  local function naive(eq, ...)
    local ops = { ... }
    local lhs, rhs = eq:match("^(.-)%->(.*)$")
    local terms = {}
    for t in (lhs .. ","):gmatch("([^,]*),") do terms[#terms + 1] = t end
    local sizes, labels = {}, {}
    for k, t in ipairs(terms) do
      local shape = ops[k]:shape()
      for d = 1, #t do
        local l = t:sub(d, d)
        if not sizes[l] then labels[#labels + 1] = l end
        sizes[l] = math.max(sizes[l] or 1, shape[d])
      end
    end
    local out_shape = {}
    for d = 1, #rhs do out_shape[d] = sizes[rhs:sub(d, d)] end
    local out = attn.zeros(out_shape, "float64")
    local val = {}
    local function at(x, t)
      local idx = {}
      for d = 1, #t do idx[d] = math.min(val[t:sub(d, d)], x:size(d)) end -- size 1 broadcasts
      return #idx == 0 and x:item() or x[idx]
    end
    local function loop(i)
      if i > #labels then
        local p = 1
        for k, t in ipairs(terms) do p = p * at(ops[k], t) end
        local idx = {}
        for d = 1, #rhs do idx[d] = val[rhs:sub(d, d)] end
        if #idx == 0 then
          out:fill_(out:item() + p)
        else
          out[idx] = out[idx] + p
        end
        return
      end
      for v = 1, sizes[labels[i]] do
        val[labels[i]] = v
        loop(i + 1)
      end
    end
    loop(1)
    return out
  end

  local cases = {
    { "ij,jk->ik", { 2, 3 }, { 3, 4 } }, { "bij,bjk->bik", { 2, 2, 3 }, { 2, 3, 2 } },
    { "bhqd,bhkd->bhqk", { 2, 2, 3, 4 }, { 2, 2, 2, 4 } }, { "i,i->", { 4 }, { 4 } }, { "i,j->ij", { 2 }, { 3 } },
    { "ij,ij->ij", { 2, 3 }, { 2, 3 } }, { "ij,kj->ikj", { 2, 3 }, { 2, 3 } }, { "ijk,ik->j", { 2, 3, 2 }, { 2, 2 } },
    { "bij,jk->bk", { 2, 3, 2 }, { 2, 3 } }, { "bij,bjk->bik", { 1, 2, 3 }, { 3, 3, 2 } },
    { "ij,jk->ki", { 3, 2 }, { 2, 2 } }, { "ii,i->i", { 3, 3 }, { 3 } },
    { "ij->ji", { 2, 3 } }, { "ii->i", { 3, 3 } }, { "ii->", { 3, 3 } }, { "ijk->k", { 2, 3, 2 } }, { "ij->", { 2, 3 } },
  }
  for _, dtype in ipairs({ "float32", "float64" }) do
    it("matches naive loops on " .. #cases .. " equations (" .. dtype .. ")", function()
      attn.manual_seed(9)
      for _, c in ipairs(cases) do
        local ops = {}
        for k = 2, #c do ops[k - 1] = attn.randn(c[k], dtype) end
        local ref = naive(c[1], table.unpack(ops))
        local got = attn.einsum(c[1], table.unpack(ops))
        assert.are.equal(dtype, got:dtype())
        local ok, msg = helper.compare(got, ref, { atol = dtype == "float32" and 1e-5 or 1e-13 })
        assert.is_true(ok, c[1] .. ": " .. tostring(msg))
      end
    end)
  end

  it("gradients agree with finite differences", function()
    attn.manual_seed(10)
    for _, c in ipairs(cases) do
      local ops = {}
      for k = 2, #c do ops[k - 1] = helper.param(c[k]) end
      local ok, report = attn.gradcheck(function(...) return attn.einsum(c[1], ...) end, ops)
      assert.is_true(ok, c[1] .. ": " .. tostring(report.message))
    end
  end)

  it("implicit output, the table form, and errors naming the equation and shapes", function()
    local a, b = attn.randn({ 2, 3 }, "float64"), attn.randn({ 3, 4 }, "float64")
    helper.assert_close(attn.einsum("ij,jk", a, b), a:matmul(b), { atol = 1e-14 })
    helper.assert_close(attn.einsum("ij,jk->ik", { a, b }), a:matmul(b), { atol = 1e-14 })
    helper.assert_close(attn.einsum("ba", a), a:t(), { atol = 0 })
    assert.has_error(function() attn.einsum("ij,jk->ik", a, attn.ones({ 4, 4 }, "float64")) end,
      "einsum: label 'j' has sizes 3 and 4 (ij,jk->ik with [2x3] and [4x4])")
    assert.has_error(function() attn.einsum("ijk,jk->ik", a, b) end, "einsum: term 'ijk' names 3 dims, operand 1 is [2x3]")
    assert.error_matches(function() attn.einsum("ij,jk->iz", a, b) end, "output label 'z' is in no operand")
    assert.error_matches(function() attn.einsum("i,i,i->", attn.ones(2), attn.ones(2), attn.ones(2)) end,
      "one or two operands")
  end)
end)

describe("outputs are sized before the inputs are walked", function()
  local huge = attn.ones({ 1, 1 }):expand({ 3, 1 << 40 })
  it("nn.Embedding of a huge expanded id view refuses the output size", function()
    local ok, err = pcall(attn.nn.Embedding(10, 4), huge)
    assert.is_false(ok)
    assert.matches("Embedding: output float32 [3x1099511627776x4] needs", tostring(err), 1, true)
    assert.matches("more than memory can hold", tostring(err), 1, true)
  end)

  it("index_select with a huge expanded index refuses the output size", function()
    -- an index list small enough to convert, an output too large: under a 1 GiB request limit
    -- (so the case does not depend on the machine's memory)
    local core, limit = attn.core, attn.core.max_request()
    finally(function() core.set_max_request(limit) end)
    core.set_max_request(1 << 30)
    local idx = attn.ones({ 1 }):expand({ 1 << 26 })
    assert.error_matches(function() attn.ones(2, 64):index_select(1, idx) end,
      "index_select: output float32 %[67108864x64%] needs 1.72e%+10 bytes, more than memory can hold")
  end)

  it("repeat_interleave and einsum size theirs too", function()
    assert.error_matches(function() attn.repeat_interleave(attn.ones({ 1 }):expand({ 1 << 40 }), 1 << 10) end,
      "repeat_interleave: output float32 %[1125899906842624%] needs")
    assert.error_matches(function() attn.repeat_interleave(attn.ones({ 2 }), { 1 << 40, 1 << 40 }) end,
      "repeat_interleave: output float32 %[2199023255552%] needs")
  end)
end)
