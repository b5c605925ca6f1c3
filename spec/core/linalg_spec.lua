-- attn.linalg: every result is checked against an independent computation in
-- plain Lua (double precision, on :totable() values): reconstructions,
-- orthogonality, closed forms and normal equations, never LAPACK itself.
local attn = require "attn"
local helper = require "helper"

local linalg = attn.linalg

-- ---------------------------------------------------------------- plain Lua matrices

local function transpose(a)
  local t = {}
  for j = 1, #a[1] do
    t[j] = {}
    for i = 1, #a do t[j][i] = a[i][j] end
  end
  return t
end

local mat_mul = helper.naive_matmul

local function mat_sub(a, b)
  local out = {}
  for i = 1, #a do
    out[i] = {}
    for j = 1, #a[1] do out[i][j] = a[i][j] - b[i][j] end
  end
  return out
end

local function eye(n)
  local out = {}
  for i = 1, n do
    out[i] = {}
    for j = 1, n do out[i][j] = i == j and 1 or 0 end
  end
  return out
end

local function zeros(m, n)
  local out = {}
  for i = 1, m do
    out[i] = {}
    for j = 1, n do out[i][j] = 0 end
  end
  return out
end

-- A column vector {{x1}, {x2}, ...} from a list, and back.
local function column(v)
  local out = {}
  for i = 1, #v do out[i] = { v[i] } end
  return out
end

-- a * diag(d): scales column j by d[j].
local function scale_columns(a, d)
  local out = {}
  for i = 1, #a do
    out[i] = {}
    for j = 1, #a[1] do out[i][j] = a[i][j] * d[j] end
  end
  return out
end

-- Determinant by cofactor expansion along the first row (small n only).
local function cofactor_det(a)
  local n = #a
  if n == 0 then return 1 end
  if n == 1 then return a[1][1] end
  local det = 0
  for j = 1, n do
    local minor = {}
    for i = 2, n do
      local row = {}
      for k = 1, n do
        if k ~= j then row[#row + 1] = a[i][k] end
      end
      minor[#minor + 1] = row
    end
    det = det + (j % 2 == 1 and 1 or -1) * a[1][j] * cofactor_det(minor)
  end
  return det
end

-- Deterministic values in [-1, 1) from a private linear congruential generator.
local lcg_state = 12345
local function rnd()
  lcg_state = (lcg_state * 1103515245 + 12345) % 2147483648
  return lcg_state / 1073741824 - 1
end

local function random_matrix(m, n)
  local out = {}
  for i = 1, m do
    out[i] = {}
    for j = 1, n do out[i][j] = rnd() end
  end
  return out
end

-- A well-conditioned square matrix: random plus n on the diagonal.
local function well_conditioned(n)
  local a = random_matrix(n, n)
  for i = 1, n do a[i][i] = a[i][i] + n end
  return a
end

-- ---------------------------------------------------------------- layouts

local SENTINEL = 1000 -- fills the unused part of bigger storages: a wrong read shows

-- tbl placed at rows 3.., columns 2.. of a bigger matrix, and narrowed out.
local function narrowed(tbl, dtype)
  local m, n = #tbl, #tbl[1]
  local big = {}
  for i = 1, m + 3 do
    big[i] = {}
    for j = 1, n + 2 do big[i][j] = SENTINEL end
  end
  for i = 1, m do
    for j = 1, n do big[i + 2][j + 1] = tbl[i][j] end
  end
  return attn.tensor(big, dtype):narrow(1, 3, m):narrow(2, 2, n)
end

-- Each builder returns a tensor whose logical values are tbl.
local layouts = {
  { "contiguous", function(tbl, dtype) return attn.tensor(tbl, dtype) end },
  { "transposed", function(tbl, dtype) return attn.tensor(transpose(tbl), dtype):transpose(1, 2) end },
  { "narrowed", narrowed },
  { "narrowed+transposed", function(tbl, dtype) return narrowed(transpose(tbl), dtype):transpose(1, 2) end },
}

local tolerances = {
  float64 = { atol = 1e-9, rtol = 1e-9 },
  float32 = { atol = 2e-4, rtol = 2e-4 },
}

local function assert_upper(r)
  for i = 1, #r do
    for j = 1, math.min(i - 1, #r[1]) do
      assert.are.equal(0, r[i][j], string.format("R[%d][%d] below the diagonal", i, j))
    end
  end
end

local function assert_descending(v)
  for i = 2, #v do assert.is_true(v[i - 1] >= v[i], "not descending at " .. i) end
end

local function assert_ascending(v)
  for i = 2, #v do assert.is_true(v[i - 1] <= v[i], "not ascending at " .. i) end
end

local function assert_shape(t, shape)
  assert.are.same(shape, t:shape())
end

-- Runs fn and checks that it raises a message containing every string given.
local function assert_error_has(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  err = tostring(err)
  for _, s in ipairs { ... } do
    assert.is_truthy(err:find(s, 1, true), string.format("error %q does not contain %q", err, s))
  end
  return err
end

-- ---------------------------------------------------------------- specs

describe("attn.linalg", function()
  for _, dtype in ipairs { "float64", "float32" } do
    local tol = tolerances[dtype]
    for _, layout in ipairs(layouts) do
      local lname, make = layout[1], layout[2]

      describe(string.format("(%s, %s input)", dtype, lname), function()
        it("builds the input it claims", function()
          local tbl = random_matrix(3, 4)
          local a = make(tbl, dtype)
          assert.are.equal(lname == "contiguous", a:is_contiguous())
          helper.assert_close(a, tbl, tol)
        end)

        it("solve: A X == B for a matrix B, X keeps B's shape and dtype", function()
          local a, b = well_conditioned(4), random_matrix(4, 3)
          local x = linalg.solve(make(a, dtype), make(b, dtype))
          assert_shape(x, { 4, 3 })
          assert.are.equal(dtype, x:dtype())
          helper.assert_close(mat_mul(a, x:totable()), b, tol)
        end)

        it("solve: a 1-D B gives a 1-D X", function()
          local a = well_conditioned(5)
          local b = { 1, -2, 0.5, 3, 0 }
          local x = linalg.solve(make(a, dtype), attn.tensor(b, dtype))
          assert_shape(x, { 5 })
          helper.assert_close(mat_mul(a, column(x:totable())), column(b), tol)
        end)

        for _, dims in ipairs { { 5, 3 }, { 3, 5 }, { 4, 4 } } do
          local m, n = dims[1], dims[2]
          local k = math.min(m, n)
          it(string.format("qr [%dx%d]: Q R == A, Q^T Q == I, R upper triangular", m, n), function()
            local a = random_matrix(m, n)
            local q, r = linalg.qr(make(a, dtype))
            assert_shape(q, { m, k })
            assert_shape(r, { k, n })
            assert.are.equal(dtype, q:dtype())
            local qt, rt = q:totable(), r:totable()
            assert_upper(rt)
            helper.assert_close(mat_mul(qt, rt), a, tol)
            helper.assert_close(mat_mul(transpose(qt), qt), eye(k), tol)
          end)

          it(string.format("svd [%dx%d]: U diag(S) Vt == A, S descending, orthonormal U and Vt", m, n), function()
            local a = random_matrix(m, n)
            local u, s, vt = linalg.svd(make(a, dtype))
            assert_shape(u, { m, k })
            assert_shape(s, { k })
            assert_shape(vt, { k, n })
            local ut, st, vtt = u:totable(), s:totable(), vt:totable()
            assert_descending(st)
            assert.is_true(st[k] >= 0)
            helper.assert_close(mat_mul(scale_columns(ut, st), vtt), a, tol)
            helper.assert_close(mat_mul(transpose(ut), ut), eye(k), tol)
            helper.assert_close(mat_mul(vtt, transpose(vtt)), eye(k), tol)
            -- sum of squared singular values == squared Frobenius norm
            local fro, ss = 0, 0
            for i = 1, m do
              for j = 1, n do fro = fro + a[i][j] ^ 2 end
            end
            for i = 1, k do ss = ss + st[i] ^ 2 end
            helper.assert_close(ss, fro, tol)
          end)
        end

        it("eigh: A V == V diag(w), w ascending, V orthogonal; reads only the lower triangle", function()
          local n = 5
          local sym, a = random_matrix(n, n), {}
          for i = 1, n do
            a[i] = {}
            for j = 1, n do
              if j > i then sym[i][j] = sym[j][i] end
              a[i][j] = j > i and 77 or sym[i][j] -- junk above the diagonal
            end
          end
          local w, v = linalg.eigh(make(a, dtype))
          assert_shape(w, { n })
          assert_shape(v, { n, n })
          local wt, vt = w:totable(), v:totable()
          assert_ascending(wt)
          helper.assert_close(mat_mul(sym, vt), scale_columns(vt, wt), tol)
          helper.assert_close(mat_mul(transpose(vt), vt), eye(n), tol)
          local trace, sum = 0, 0
          for i = 1, n do trace, sum = trace + sym[i][i], sum + wt[i] end
          helper.assert_close(sum, trace, tol)
        end)

        it("inv: A inv(A) == I == inv(A) A", function()
          local a = well_conditioned(4)
          local ai = linalg.inv(make(a, dtype))
          assert_shape(ai, { 4, 4 })
          assert.are.equal(dtype, ai:dtype())
          helper.assert_close(mat_mul(a, ai:totable()), eye(4), tol)
          helper.assert_close(mat_mul(ai:totable(), a), eye(4), tol)
        end)

        it("det: 0-d result equal to cofactor expansion (2x2, 3x3, 4x4)", function()
          for n = 2, 4 do
            local a = random_matrix(n, n)
            local d = linalg.det(make(a, dtype))
            assert.are.equal(0, d:dim())
            assert.are.equal(dtype, d:dtype())
            helper.assert_close(d:item(), cofactor_det(a), tol)
          end
        end)

        it("lstsq: overdetermined solution satisfies the normal equations A^T (A X - B) == 0", function()
          local a, b = random_matrix(6, 3), random_matrix(6, 2)
          local x, rank = linalg.lstsq(make(a, dtype), make(b, dtype))
          assert_shape(x, { 3, 2 })
          assert.are.equal(3, rank)
          local residual = mat_sub(mat_mul(a, x:totable()), b)
          helper.assert_close(mat_mul(transpose(a), residual), zeros(3, 2),
            dtype == "float32" and { atol = 1e-3 } or tol)
        end)

        it("lstsq: an exactly consistent system is solved exactly", function()
          local a = random_matrix(5, 3)
          local x0 = { 1, -2, 0.5 }
          local b = mat_mul(a, column(x0))
          local x = linalg.lstsq(make(a, dtype), make(b, dtype))
          helper.assert_close(x, column(x0), dtype == "float32" and { atol = 1e-3 } or tol)
        end)

        it("leaves the input unchanged", function()
          local tbl = well_conditioned(3)
          local a = make(tbl, dtype)
          local before = a:totable() -- tbl rounded to the dtype
          linalg.solve(a, attn.tensor({ 1, 2, 3 }, dtype))
          linalg.qr(a)
          linalg.svd(a)
          linalg.eigh(a)
          linalg.inv(a)
          linalg.det(a)
          linalg.lstsq(a, attn.tensor({ 1, 2, 3 }, dtype))
          helper.assert_close(a, before, { atol = 0, rtol = 0 })
        end)
      end)
    end
  end

  describe("closed forms", function()
    it("lstsq matches the 2x2 normal equations solved by hand", function()
      -- fit y = c0 + c1 t through (0, 1), (1, 3), (2, 4), (3, 8)
      local a = { { 1, 0 }, { 1, 1 }, { 1, 2 }, { 1, 3 } }
      local y = { 1, 3, 4, 8 }
      local s00, s01, s11, r0, r1 = 0, 0, 0, 0, 0
      for i = 1, 4 do
        s00, s01, s11 = s00 + a[i][1] ^ 2, s01 + a[i][1] * a[i][2], s11 + a[i][2] ^ 2
        r0, r1 = r0 + a[i][1] * y[i], r1 + a[i][2] * y[i]
      end
      local den = s00 * s11 - s01 * s01
      local expected = { (s11 * r0 - s01 * r1) / den, (s00 * r1 - s01 * r0) / den }
      assert.are.same({ 0.7, 2.2 }, { tonumber(string.format("%.10g", expected[1])),
        tonumber(string.format("%.10g", expected[2])) })
      local x = linalg.lstsq(attn.tensor(a, "float64"), attn.tensor(y, "float64"))
      assert_shape(x, { 2 })
      helper.assert_close(x, expected, { atol = 1e-12 })
    end)

    it("lstsq gives the minimum-norm solution when underdetermined or rank-deficient", function()
      local x, rank = linalg.lstsq(attn.tensor({ { 1, 1 } }, "float64"), attn.tensor({ 2 }, "float64"))
      helper.assert_close(x, { 1, 1 }, { atol = 1e-12 })
      assert.are.equal(1, rank)
      x = linalg.lstsq(attn.tensor({ { 1, 0, 0 }, { 0, 1, 0 } }, "float64"), attn.tensor({ 1, 2 }, "float64"))
      helper.assert_close(x, { 1, 2, 0 }, { atol = 1e-12 })
      x, rank = linalg.lstsq(attn.tensor({ { 1, 1 }, { 1, 1 }, { 1, 1 } }, "float64"),
        attn.tensor({ 2, 2, 2 }, "float64"))
      helper.assert_close(x, { 1, 1 }, { atol = 1e-12 })
      assert.are.equal(1, rank)
    end)

    it("eigh of [[2, 1], [1, 2]] is 1, 3 with eigenvectors (1, -1)/sqrt 2 and (1, 1)/sqrt 2", function()
      local w, v = linalg.eigh(attn.tensor({ { 2, 1 }, { 1, 2 } }, "float64"))
      helper.assert_close(w, { 1, 3 }, { atol = 1e-12 })
      local vt = v:totable()
      local h = 1 / math.sqrt(2)
      helper.assert_close(math.abs(vt[1][1]), h, { atol = 1e-12 })
      helper.assert_close(vt[1][1] * vt[2][1], -0.5, { atol = 1e-12 }) -- opposite signs
      helper.assert_close(vt[1][2] * vt[2][2], 0.5, { atol = 1e-12 })  -- same signs
    end)

    it("svd of a diagonal matrix sorts its absolute values", function()
      local _, s = linalg.svd(attn.tensor({ { 1, 0, 0 }, { 0, -5, 0 }, { 0, 0, 3 } }, "float64"))
      helper.assert_close(s, { 5, 3, 1 }, { atol = 1e-12 })
    end)

    it("svd of a rank-1 matrix has one nonzero singular value", function()
      local _, s = linalg.svd(attn.tensor({ { 1, 2 }, { 2, 4 }, { 3, 6 } }, "float64"))
      helper.assert_close(s, { math.sqrt(70), 0 }, { atol = 1e-12 })
    end)

    it("det of a triangular matrix is the product of its diagonal", function()
      local a = { { 2, 7, -1, 3 }, { 0, -3, 4, 1 }, { 0, 0, 0.5, 9 }, { 0, 0, 0, 4 } }
      helper.assert_close(linalg.det(attn.tensor(a, "float64")):item(), -12, { atol = 1e-12 })
      helper.assert_close(linalg.det(attn.tensor(transpose(a), "float32")):item(), -12, { atol = 1e-5 })
    end)

    it("det of a permutation is its sign, of a singular matrix 0, of a 0x0 matrix 1", function()
      local p = { { 0, 1, 0 }, { 0, 0, 1 }, { 1, 0, 0 } } -- a 3-cycle: even
      assert.are.equal(1, linalg.det(attn.tensor(p, "float64")):item())
      local swap = { { 0, 1, 0 }, { 1, 0, 0 }, { 0, 0, 1 } }
      assert.are.equal(-1, linalg.det(attn.tensor(swap, "float64")):item())
      assert.are.equal(0, linalg.det(attn.tensor({ { 1, 2 }, { 2, 4 } }, "float64")):item())
      assert.are.equal(1, linalg.det(attn.zeros({ 0, 0 }, "float64")):item())
    end)

    it("det does not overflow in intermediate products", function()
      local a = { { 1e200, 0, 0, 0 }, { 0, 1e200, 0, 0 }, { 0, 0, 1e-200, 0 }, { 0, 0, 0, 1e-200 } }
      helper.assert_close(linalg.det(attn.tensor(a, "float64")):item(), 1, { rtol = 1e-12 })
    end)

    it("qr of a matrix with orthonormal columns gives |diag R| == 1", function()
      local h = 1 / math.sqrt(2)
      local _, r = linalg.qr(attn.tensor({ { h, h }, { h, -h }, { 0, 0 } }, "float64"))
      local rt = r:totable()
      helper.assert_close({ math.abs(rt[1][1]), math.abs(rt[2][2]), rt[1][2] }, { 1, 1, 0 }, { atol = 1e-12 })
    end)

    it("handles empty matrices", function()
      local q, r = linalg.qr(attn.zeros({ 3, 0 }, "float64"))
      assert_shape(q, { 3, 0 })
      assert_shape(r, { 0, 0 })
      local u, s, vt = linalg.svd(attn.zeros({ 0, 2 }, "float64"))
      assert_shape(u, { 0, 0 })
      assert_shape(s, { 0 })
      assert_shape(vt, { 0, 2 })
      assert_shape(linalg.solve(attn.zeros({ 0, 0 }), attn.zeros({ 0 })), { 0 })
      assert_shape(linalg.inv(attn.zeros({ 0, 0 })), { 0, 0 })
      local x = linalg.lstsq(attn.zeros({ 0, 2 }, "float64"), attn.zeros({ 0 }, "float64"))
      helper.assert_close(x, { 0, 0 })
    end)
  end)

  describe("batches (leading dims)", function()
    local mats = { well_conditioned(3), well_conditioned(3) }
    local rhs = { random_matrix(3, 2), random_matrix(3, 2) }

    it("solve, inv and det work per matrix, also on a transposed batch", function()
      local batch = attn.tensor(mats, "float64")
      local tbatch = attn.tensor({ transpose(mats[1]), transpose(mats[2]) }, "float64"):transpose(2, 3)
      for _, a in ipairs { batch, tbatch } do
        local x = linalg.solve(a, attn.tensor(rhs, "float64"))
        assert_shape(x, { 2, 3, 2 })
        local xv = linalg.solve(a, attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, "float64"))
        assert_shape(xv, { 2, 3 })
        local inv, det = linalg.inv(a), linalg.det(a)
        assert_shape(det, { 2 })
        for i = 1, 2 do
          helper.assert_close(mat_mul(mats[i], x:totable()[i]), rhs[i], { atol = 1e-10 })
          helper.assert_close(mat_mul(mats[i], column(xv:totable()[i])), column(i == 1 and { 1, 2, 3 } or { 4, 5, 6 }),
            { atol = 1e-10 })
          helper.assert_close(mat_mul(mats[i], inv:totable()[i]), eye(3), { atol = 1e-10 })
          helper.assert_close(det:totable()[i], cofactor_det(mats[i]), { atol = 1e-10 })
        end
      end
    end)

    it("qr, svd, eigh and lstsq match the per-matrix results", function()
      local a = attn.tensor(mats, "float64")
      local q, r = linalg.qr(a)
      local u, s, vt = linalg.svd(a)
      local w, v = linalg.eigh(a)
      local x = linalg.lstsq(a, attn.tensor(rhs, "float64"))
      for i = 1, 2 do
        local ai = attn.tensor(mats[i], "float64")
        local qi, ri = linalg.qr(ai)
        helper.assert_close(q:select(1, i), qi, { atol = 1e-12 })
        helper.assert_close(r:select(1, i), ri, { atol = 1e-12 })
        local ui, si, vti = linalg.svd(ai)
        helper.assert_close(u:select(1, i), ui, { atol = 1e-12 })
        helper.assert_close(s:select(1, i), si, { atol = 1e-12 })
        helper.assert_close(vt:select(1, i), vti, { atol = 1e-12 })
        local wi, vi = linalg.eigh(ai)
        helper.assert_close(w:select(1, i), wi, { atol = 1e-12 })
        helper.assert_close(v:select(1, i), vi, { atol = 1e-12 })
        helper.assert_close(x:select(1, i), linalg.solve(ai, attn.tensor(rhs[i], "float64")), { atol = 1e-10 })
      end
    end)

    it("names the failing matrix of a batch", function()
      local a = attn.tensor({ eye(2), { { 1, 2 }, { 2, 4 } } }, "float64")
      assert_error_has(function() linalg.inv(a) end, "linalg.inv", "matrix 2 of batch [2x2x2]", "singular")
      helper.assert_close(linalg.det(a), { 1, 0 })
    end)
  end)

  describe("errors", function()
    local sq3 = attn.tensor(well_conditioned(3), "float64")

    it("non-square A names the function and the shape", function()
      local a = attn.zeros({ 2, 3 }, "float64")
      assert_error_has(function() linalg.solve(a, attn.zeros({ 2 }, "float64")) end,
        "linalg.solve", "must be square", "[2x3]")
      assert_error_has(function() linalg.inv(a) end, "linalg.inv", "[2x3]")
      assert_error_has(function() linalg.det(a) end, "linalg.det", "[2x3]")
      assert_error_has(function() linalg.eigh(a) end, "linalg.eigh", "[2x3]")
    end)

    it("B with other rows than A names both shapes", function()
      assert_error_has(function() linalg.solve(sq3, attn.zeros({ 4, 2 }, "float64")) end,
        "linalg.solve", "[3x3]", "[4x2]", "differ in rows")
      assert_error_has(function() linalg.lstsq(attn.zeros({ 5, 2 }, "float64"), attn.zeros({ 4 }, "float64")) end,
        "linalg.lstsq", "[5x2]", "[4]")
    end)

    it("B with the wrong number of dims or another dtype", function()
      assert_error_has(function() linalg.solve(sq3, attn.zeros({ 2, 3, 3 }, "float64")) end,
        "linalg.solve", "[3x3]", "[2x3x3]")
      assert_error_has(function() linalg.solve(sq3, attn.zeros({ 3 }, "float32")) end,
        "linalg.solve", "float64", "float32")
    end)

    it("a singular matrix raises in solve and inv, naming the zero pivot", function()
      local s = attn.tensor({ { 1, 2, 3 }, { 2, 4, 6 }, { 1, 0, 1 } }, "float64")
      assert_error_has(function() linalg.solve(s, attn.zeros({ 3 }, "float64")) end,
        "linalg.solve", "matrix [3x3] is singular", "U(3,3) = 0")
      assert_error_has(function() linalg.inv(attn.tensor({ { 1, 2 }, { 2, 4 } })) end,
        "linalg.inv", "matrix [2x2] is singular (U(2,2) = 0)")
    end)

    it("inputs that are not matrices", function()
      local v = attn.zeros({ 4 }, "float64")
      for _, name in ipairs { "qr", "svd", "eigh", "inv", "det" } do
        assert_error_has(function() linalg[name](v) end, "linalg." .. name, "[4]")
      end
      assert_error_has(function() linalg.solve(v, v) end, "linalg.solve", "[4]")
      assert_error_has(function() linalg.lstsq(attn.tensor(2.0), v) end, "linalg.lstsq", "[]")
      assert.has_error(function() linalg.det({ { 1 } }) end)
      assert.has_error(function() linalg.solve(sq3) end)
    end)

    it("NaN or infinite entries are refused by the iterative factorizations", function()
      local bad = attn.tensor({ { 1, 0 / 0 }, { 0, 1 } }, "float64")
      assert_error_has(function() linalg.svd(bad) end, "linalg.svd", "[2x2]", "NaN")
      assert_error_has(function() linalg.eigh(attn.tensor({ { 1, 0 }, { math.huge, 1 } })) end,
        "linalg.eigh", "[2x2]", "NaN or infinite")
      assert_error_has(function() linalg.lstsq(bad, attn.zeros({ 2 }, "float64")) end, "linalg.lstsq", "[2x2]")
      -- eigh reads only the lower triangle: junk above it is fine
      local w = linalg.eigh(attn.tensor({ { 1, 0 / 0 }, { 0, 2 } }, "float64"))
      helper.assert_close(w, { 1, 2 })
    end)
  end)
end)
