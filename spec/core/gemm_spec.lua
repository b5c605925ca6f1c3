-- The small-product kernel (core.gemm_ with path "small", src/cpu/gemm_body.h) against naive loops
-- and against OpenBLAS (path "blas") on every instruction set this CPU runs: odd sizes and sizes
-- past the panel widths, all four transpose combinations, alpha and beta, strided operands and
-- output; and the size rule that sends matmul (and Linear, bmm, the GRU) to one or the other.
local attn = require "attn"
local core = attn.core
local helper = require "helper"

local paths = {}
for _, isa in ipairs { "generic", "avx2", "avx512" } do
  if core.isa_supported(isa) then paths[#paths + 1] = isa end
end

-- A (rows x cols) float32 operand as a view with a leading dim past its width (pad extra
-- columns), or transposed (stored cols x rows, read through :t()).
local function operand(rows, cols, trans, pad)
  if trans then return attn.randn(cols, rows + pad):narrow(2, 1, rows):t() end
  return attn.randn(rows, cols + pad):narrow(2, 1, cols)
end

-- alpha a b + beta c0 in double from nested tables.
local function naive(a, b, c0, alpha, beta)
  local ab, c = helper.naive_matmul(a:totable(), b:totable()), c0:totable()
  for i = 1, #ab do
    for j = 1, #ab[i] do ab[i][j] = alpha * ab[i][j] + (beta ~= 0 and beta * c[i][j] or 0) end
  end
  return ab
end

-- 1e-5 relative to the largest entry (a sum of K products cancels: entrywise relative error is
-- no measure of a product's accuracy).
local function assert_rel(actual, expected, what)
  local scale = 1e-30
  for _, v in ipairs(helper.flatten(attn.is_tensor(expected) and expected:totable() or expected)) do
    scale = math.max(scale, math.abs(v))
  end
  local ok, msg = helper.compare(actual, expected, { atol = 1e-5 * scale, rtol = 1e-5 })
  assert(ok, what .. ": " .. tostring(msg))
end

-- the edges of the kernel: panels cut inside a vector (N 5, 8, 10, 24, 33, 70, 200: masked loads
-- of B and masked stores of C), K past and inside a transposed block (K 8, 17, 40, 65), one row,
-- and the book's tiny heads (10 x 10 x 8, 10 x 8 x 10)
local shapes = { -- M, N, K
  { 1, 1, 1 }, { 3, 5, 7 }, { 8, 32, 32 }, { 9, 33, 17 }, { 13, 70, 65 }, { 64, 96, 32 }, { 17, 16, 100 },
  { 6, 200, 3 }, { 10, 10, 8 }, { 10, 8, 10 }, { 1, 9, 32 }, { 5, 24, 40 },
}

describe("small float32 products", function()
  local saved
  before_each(function()
    attn.manual_seed(5)
    saved = core.isa()
  end)
  after_each(function() core.isa(saved) end)

  for _, isa in ipairs(paths) do
    it("equal naive loops and OpenBLAS: shapes, transposes, alpha, beta, strides (" .. isa .. ")", function()
      core.isa(isa)
      for _, s in ipairs(shapes) do
        local M, N, K = s[1], s[2], s[3]
        for _, ta in ipairs { false, true } do
          for _, tb in ipairs { false, true } do
            for _, ab in ipairs { { 1, 0 }, { 1, 1 }, { -0.75, 0.5 } } do
              local alpha, beta = ab[1], ab[2]
              local a, b = operand(M, K, ta, 3), operand(K, N, tb, 5)
              local wide = attn.randn(M, N + 4) -- c is its first N columns: ldc = N + 4
              local c0 = wide:narrow(2, 1, N):clone()
              local small, blas = wide:clone(), wide:clone()
              local cs, cb = small:narrow(2, 1, N), blas:narrow(2, 1, N)
              core.gemm_(cs, a, b, alpha, beta, "small")
              core.gemm_(cb, a, b, alpha, beta, "blas")
              local what = string.format("%s %dx%dx%d ta %s tb %s alpha %g beta %g", isa, M, N, K, ta, tb, alpha,
                beta)
              assert_rel(cs, naive(a, b, c0, alpha, beta), what .. " vs naive")
              assert_rel(cs, cb, what .. " vs OpenBLAS")
              -- the columns past N (between the rows of c) are not written
              assert.are.same(wide:narrow(2, N + 1, 4):totable(), small:narrow(2, N + 1, 4):totable())
            end
          end
        end
      end
    end)

    it("reads no C when beta is 0, and lets NaN and inf through as BLAS does (" .. isa .. ")", function()
      core.isa(isa)
      local a, b = attn.randn(5, 40), attn.randn(40, 37)
      local c = core.gemm_(attn.full(5, 37, 0 / 0), a, b, 1, 0, "small")
      helper.assert_close(c, helper.naive_matmul(a:totable(), b:totable()), { atol = 1e-4 })
      a[{ 2, 3 }] = math.huge
      b[{ 4, 5 }] = 0 / 0
      local small = core.gemm_(attn.zeros(5, 37), a, b, 1, 0, "small")
      local blas = core.gemm_(attn.zeros(5, 37), a, b, 1, 0, "blas")
      local s, r = small:totable(), blas:totable()
      for i = 1, 5 do
        for j = 1, 37 do
          local x, y = s[i][j], r[i][j]
          assert(x ~= x and y ~= y or math.abs(x) == math.huge and x == y or math.abs(x - y) <= 1e-4,
            string.format("entry (%d, %d): small %g, blas %g", i, j, x, y))
        end
      end
      assert.is_true(s[2][1] == math.huge or s[2][1] == -math.huge) -- row 2 meets the inf
      assert.is_true(s[1][5] ~= s[1][5]) -- column 5 meets the NaN
    end)

    it("gives a row the same bits whatever the height of the call (" .. isa .. ")", function()
      core.isa(isa)
      -- N 45 ends in a masked vector; N 8 with beta 1 takes the narrow tile's read-then-write path
      for _, nb in ipairs { { 45, 0 }, { 8, 1 } } do
        local N, beta = nb[1], nb[2]
        for _, tb in ipairs { false, true } do
          local a, b, c0 = attn.randn(37, 29), operand(29, N, tb, 0), attn.randn(37, N)
          local whole = core.gemm_(c0:clone(), a, b, 1, beta, "small")
          for _, cut in ipairs { { 1, 1 }, { 5, 3 }, { 10, 27 } } do
            local c = c0:narrow(1, cut[1], cut[2]):clone()
            local part = core.gemm_(c, a:narrow(1, cut[1], cut[2]), b, 1, beta, "small")
            assert.are.same(whole:narrow(1, cut[1], cut[2]):totable(), part:totable())
          end
        end
      end
    end)
  end

  it("leaves the FPU to OpenBLAS's x87 code: a float64 QR after every path's edge packing", function()
    -- a staging array in the generic path's masked-load stand-in once compiled to MMX moves,
    -- whose state (never reset) turned the next dnrm2 inside LAPACK's QR into NaN
    for _, isa in ipairs(paths) do
      core.isa(isa)
      core.gemm_(attn.zeros(1, 45), attn.randn(1, 29), attn.randn(45, 29):t(), 1, 0, "small")
      core.isa(saved)
      local q = attn.linalg.qr(attn.randn({ 5, 3 }, "float64"))
      for _, v in ipairs(helper.flatten(q:totable())) do assert(v == v, isa .. ": NaN in Q") end
    end
  end)

  it("packs K past its stack workspace from the allocator when forced", function()
    local a, b = attn.randn(3, 700), attn.randn(20, 700):t()
    local small = core.gemm_(attn.zeros(3, 20), a, b, 1, 0, "small")
    assert_rel(small, helper.naive_matmul(a:totable(), b:totable()), "K 700, B transposed")
  end)

  it("sends small float32 products to the kernel and large ones to OpenBLAS", function()
    -- 8 x 1024 x 1024: past every limit, and too low for matmul to cut into row blocks
    local wide, big = attn.randn(8, 1024), attn.randn(1024, 1024)
    local blas = core.gemm_(attn.zeros(8, 1024), wide, big, 1, 0, "blas")
    for _, isa in ipairs(paths) do
      core.isa(isa)
      -- the GRU's step product (64 x 96 x 32, W_hh read transposed) and a Linear's weight gradient
      local h, w = attn.randn(64, 32), attn.randn(96, 32)
      local g, x = attn.randn(640, 96), attn.randn(640, 32)
      local step = core.gemm_(attn.zeros(64, 96), h, w:t(), 1, 0, "small")
      local dw = core.gemm_(attn.zeros(96, 32), g:t(), x, 1, 0, "small")
      local by_size = isa ~= "generic" -- the generic kernel is never chosen by size (attn_gemm.h)
      assert.are.equal(by_size, attn.eq(core.matmul(h, w:t()), step):min():item() == 1)
      assert.are.equal(by_size, attn.eq(core.matmul(g:t(), x), dw):min():item() == 1)
      assert.are.same(blas:totable(), core.matmul(wide, big):totable())
    end
  end)

  it("gemm_'s default path cuts a large product into matmul's row blocks: matmul's bits on any thread count", function()
    -- 1280 x 256 x 256 (a projection's input gradient added into another's, beta 1): four blocks
    -- of 320 rows over the worker pool, each a BLAS call of its own height
    local a, w, c0 = attn.randn(1280, 256), attn.randn(256, 256), attn.randn(1280, 256)
    local want = core.matmul(a, w:t())
    local threads = attn.get_num_threads()
    for _, n in ipairs { 1, 2, 3 } do
      attn.set_num_threads(n)
      helper.assert_identical(core.gemm_(attn.zeros(1280, 256), a, w:t()), want)
      local acc = core.gemm_(c0:clone(), a, w:t(), 1, 1)
      assert_rel(acc, c0 + want, "1280 x 256 x 256 + C on " .. n .. " threads")
      helper.assert_identical(acc, core.gemm_(c0:clone(), a, w:t(), 1, 1))
    end
    attn.set_num_threads(threads)
    assert_rel(want, core.gemm_(attn.zeros(1280, 256), a, w:t(), 1, 0, "blas"), "against one BLAS call")
  end)

  it("cuts a product of few rows and many columns into column blocks: one call's bits on any thread count", function()
    -- the output layer of one decoded sentence, (1, 32) x (32, 17851) with the weight read
    -- transposed, and of a few beams or sentences: on the small path, the row blocks too few, so
    -- matmul cuts columns (64-aligned, by the shape alone); every entry must keep one call's bits
    local threads = attn.get_num_threads() -- the ISA is restored by after_each
    for _, isa in ipairs(paths) do
      core.isa(isa)
      for _, s in ipairs { { 1, 17851, 32, true }, { 3, 4001, 45, false }, { 2, 1000, 300, true } } do
        local M, N, K, tb = s[1], s[2], s[3], s[4]
        local a, w, c0 = attn.randn(M, K), operand(K, N, tb, 0), attn.randn(M, N)
        local path = isa == "generic" and "blas" or "small" -- as attn_gemm's size rule (see above)
        local one = core.gemm_(attn.zeros(M, N), a, w, 1, 0, path)
        local acc = core.gemm_(c0:clone(), a, w, 0.5, 1, path)
        assert_rel(one, helper.naive_matmul(a:totable(), w:totable()), ("%d x %d x %d (%s)"):format(M, N, K, isa))
        for _, n in ipairs { 1, 2, 3 } do
          attn.set_num_threads(n)
          helper.assert_identical(core.matmul(a, w), one)
          helper.assert_identical(core.gemm_(c0:clone(), a, w, 0.5, 1), acc)
        end
        attn.set_num_threads(threads)
      end
    end
  end)

  it("addmm is matmul then a broadcast add of the bias, in one pass", function()
    for _, s in ipairs { { 640, 32, 32, "float32" }, { 7, 45, 13, "float32" }, { 9, 20, 6, "float64" } } do
      local M, N, K, dtype = s[1], s[2], s[3], s[4]
      local x, w, b = attn.randn({ M, K }, dtype), attn.randn({ N, K }, dtype), attn.randn({ N }, dtype)
      local want = core.matmul(x, w:t())
      core.add_(want, b)
      -- the kernel's accumulator plus the bias is rounded once, as the add after the product
      if dtype == "float32" then assert.are.same(want:totable(), core.addmm(b, x, w:t()):totable()) end
      helper.assert_close(core.addmm(b, x, w:t()), want, { atol = 1e-12, rtol = 1e-12 })
    end
    local b, x, w = attn.randn(1024), attn.randn(8, 1024), attn.randn(1024, 1024) -- OpenBLAS with beta 1
    assert_rel(core.addmm(b, x, w), core.matmul(x, w) + b, "addmm 8 x 1024 x 1024")
    assert.has_error(function() core.addmm(attn.ones(3), attn.randn(2, 4), attn.randn(4, 5)) end,
      "addmm: expected bias (N), a (M, K), b (K, N), got [3], [2x4], [4x5]")
    assert.has_error(function() core.addmm(attn.ones(5, "float64"), attn.randn(2, 4), attn.randn(4, 5)) end,
      "addmm: dtypes differ: bias float64 [5], a float32 [2x4]")
  end)

  it("leaves float64 to OpenBLAS and checks its arguments", function()
    local a, b = attn.randn(4, 6, "float64"), attn.randn(6, 3, "float64")
    local c = core.gemm_(attn.ones(4, 3, "float64"), a, b, 2, 1)
    local want = naive(a, b, attn.ones(4, 3, "float64"), 2, 1)
    helper.assert_close(c, want, { atol = 1e-12, rtol = 1e-12 })
    assert.has_error(function() core.gemm_(attn.zeros(4, 3, "float64"), a, b, 1, 0, "small") end,
      "gemm: the small path is float32 only, got float64")
    assert.has_error(function() core.gemm_(attn.zeros(4, 4), attn.randn(4, 6), attn.randn(5, 4)) end,
      "gemm: expected c (M, N) = a (M, K) b (K, N), got [4x4] = [4x6] [5x4]")
    assert.has_error(function() core.gemm_(attn.zeros(4, 3), attn.randn(4, 6), b) end,
      "gemm: dtypes differ: float32 [4x3] = float32 [4x6] float64 [6x3]")
    local x = attn.randn(4, 4)
    assert.has_error(function() core.gemm_(x, x, attn.randn(4, 4)) end, "gemm: c [4x4] shares storage with a or b")
    assert.has_error(function() core.gemm_(attn.zeros(4, 4), attn.randn(4, 1):expand(4, 4), attn.randn(4, 4)) end,
      "gemm: a [4x4] and b [4x4] need a unit stride in one dim, c [4x4] in its columns")
    assert.has_error(function() core.gemm_(attn.zeros(2, 2), attn.randn(2, 2), attn.randn(2, 2), 1, 0, "fast") end,
      "gemm_: argument 6 (path) must be 'auto', 'small' or 'blas', got a string")
    -- reps (the benchmark's loop in C): beta 1 accumulates the product once per repetition
    local p, q = attn.randn(3, 5), attn.randn(5, 4)
    local acc = core.gemm_(attn.ones(3, 4), p, q, 0.5, 1, "small", 4)
    helper.assert_close(acc, naive(p, q, attn.ones(3, 4), 2, 1), { atol = 1e-5 })
    assert.has_error(function() core.gemm_(attn.zeros(3, 4), p, q, 1, 0, "small", 0) end,
      "gemm_: argument 7 (reps) must be a positive integer with reps M N K at most 2^30, got 0")
    local big = attn.randn(64, 64) -- 2^18 multiply-adds: 2^12 repetitions are the most
    assert.has_error(function() core.gemm_(attn.zeros(64, 64), big, big, 1, 0, "small", (1 << 12) + 1) end,
      "gemm_: argument 7 (reps) must be a positive integer with reps M N K at most 2^30, got 4097")
    assert.has_error(function() core.gemm_(attn.zeros(3, 4), p, q, 1, 0, "small", math.maxinteger) end)
  end)
end)
