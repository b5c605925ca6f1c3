-- nn.Conv2d and nn.conv2d: the GEMM path and the reference path against naive Lua loops
-- (float64), gradients against finite differences, both dtypes, thread counts, errors.
local attn = require "attn"
local nn = require "attn.nn"
local helper = require "helper"

-- y[n][o][i][j] by the definition, from nested tables (float64 arithmetic in Lua).
local function naive_conv(x, w, b, o)
  local X, Wt = x:totable(), w:totable()
  local B = b and b:totable()
  local sx, sw = x:shape(), w:shape()
  local N, H, W = sx[1], sx[3], sx[4]
  local O, Cg, kh, kw = sw[1], sw[2], sw[3], sw[4]
  local function pair(v, d)
    v = v or d
    return type(v) == "table" and v or { v, v }
  end
  local st, pd, dl, G = pair(o.stride, 1), pair(o.padding, 0), pair(o.dilation, 1), o.groups or 1
  local Og = O // G
  local Ho = (H + 2 * pd[1] - dl[1] * (kh - 1) - 1) // st[1] + 1
  local Wo = (W + 2 * pd[2] - dl[2] * (kw - 1) - 1) // st[2] + 1
  local Y = {}
  for n = 1, N do
    Y[n] = {}
    for oc = 1, O do
      local g = (oc - 1) // Og
      Y[n][oc] = {}
      for i = 1, Ho do
        Y[n][oc][i] = {}
        for j = 1, Wo do
          local s = B and B[oc] or 0
          for c = 1, Cg do
            for p = 1, kh do
              for q = 1, kw do
                local ih = (i - 1) * st[1] - pd[1] + (p - 1) * dl[1]
                local iw = (j - 1) * st[2] - pd[2] + (q - 1) * dl[2]
                if ih >= 0 and ih < H and iw >= 0 and iw < W then
                  s = s + Wt[oc][c][p][q] * X[n][g * Cg + c][ih + 1][iw + 1]
                end
              end
            end
          end
          Y[n][oc][i][j] = s
        end
      end
    end
  end
  return attn.tensor(Y, "float64")
end

-- The cases: every option, rectangular kernels, depthwise, batch 1, 1x1 images.
local cases = {
  { name = "plain 3x3", x = { 2, 3, 6, 5 }, w = { 4, 3, 3, 3 }, o = {} },
  { name = "stride 2, padding 1", x = { 2, 2, 7, 6 }, w = { 3, 2, 3, 3 }, o = { stride = 2, padding = 1 } },
  { name = "rectangular kernel, stride {2, 1}, padding {1, 2}", x = { 1, 2, 6, 5 }, w = { 3, 2, 2, 3 },
    o = { stride = { 2, 1 }, padding = { 1, 2 } } },
  { name = "dilation 2", x = { 2, 2, 7, 7 }, w = { 2, 2, 3, 3 }, o = { dilation = 2, padding = 1 } },
  { name = "dilation {2, 1}, stride {1, 3}", x = { 1, 3, 8, 9 }, w = { 2, 3, 2, 2 },
    o = { dilation = { 2, 1 }, stride = { 1, 3 } } },
  { name = "groups 2", x = { 2, 4, 5, 5 }, w = { 6, 2, 3, 3 }, o = { groups = 2, padding = 1 } },
  { name = "depthwise (groups = channels)", x = { 2, 3, 5, 4 }, w = { 3, 1, 3, 3 }, o = { groups = 3 } },
  { name = "depthwise multiplier 2", x = { 1, 2, 4, 4 }, w = { 4, 1, 2, 2 }, o = { groups = 2, stride = 2 } },
  { name = "1x1 kernel (direct path)", x = { 2, 3, 4, 5 }, w = { 5, 3, 1, 1 }, o = {} },
  { name = "1x1 kernel, stride 2", x = { 1, 3, 5, 5 }, w = { 2, 3, 1, 1 }, o = { stride = 2 } },
  { name = "1x1 image", x = { 3, 2, 1, 1 }, w = { 4, 2, 1, 1 }, o = {} },
  { name = "1x1 image, 3x3 kernel, padding 1", x = { 1, 2, 1, 1 }, w = { 3, 2, 3, 3 }, o = { padding = 1 } },
  { name = "kernel as large as the padded input", x = { 1, 1, 3, 2 }, w = { 2, 1, 5, 4 }, o = { padding = 1 } },
}

local function with_kernel(o, kernel) return helper.with(o, { kernel = kernel }) end

describe("nn.conv2d", function()
  for _, case in ipairs(cases) do
    it("matches naive loops on both paths, to 1e-12 in float64: " .. case.name, function()
      attn.manual_seed(1)
      local x, w, b = attn.randn(case.x, "float64"), attn.randn(case.w, "float64"), attn.randn({ case.w[1] }, "float64")
      local expected = naive_conv(x, w, b, case.o)
      assert.close(nn.conv2d(x, w, b, case.o), expected, { atol = 1e-12, rtol = 0 })
      assert.close(nn.conv2d(x, w, b, with_kernel(case.o, "reference")), expected, { atol = 1e-12, rtol = 0 })
      assert.close(nn.conv2d(x, w, nil, case.o), naive_conv(x, w, nil, case.o), { atol = 1e-12, rtol = 0 })
    end)

    it("has gradients of input, weight and bias that pass gradcheck, both paths: " .. case.name, function()
      attn.manual_seed(2)
      local x, w, b = helper.param(case.x), helper.param(case.w), helper.param({ case.w[1] })
      for _, kernel in ipairs { "auto", "reference" } do
        helper.gradcheck(function(a, c, d) return nn.conv2d(a, c, d, with_kernel(case.o, kernel)) end, { x, w, b })
      end
    end)
  end

  it("has the same gradients on the GEMM and the reference path (float64, 1e-12)", function()
    attn.manual_seed(3)
    for _, case in ipairs(cases) do
      local grads = {}
      for _, kernel in ipairs { "auto", "reference" } do
        attn.manual_seed(4)
        local x, w, b = helper.param(case.x), helper.param(case.w), helper.param({ case.w[1] })
        local y = nn.conv2d(x, w, b, with_kernel(case.o, kernel))
        y:backward(attn.ones(y:shape(), "float64"))
        grads[kernel] = { x.grad, w.grad, b.grad }
      end
      for i = 1, 3 do assert.close(grads.auto[i], grads.reference[i], { atol = 1e-12, rtol = 0 }) end
    end
  end)

  it("has float32's one-image products (the engine's kernel) match the reference path, every case and a wide row",
    function()
      attn.manual_seed(7)
      local all = helper.with(cases, {}) -- plus rows of 19 and 20 outputs (copies of 32 bytes with a tail)
      all[#all + 1] = { x = { 3, 3, 5, 21 }, w = { 5, 3, 3, 3 }, o = { padding = 1 } }
      all[#all + 1] = { x = { 2, 4, 4, 22 }, w = { 6, 2, 3, 3 }, o = { groups = 2 } }
      for _, case in ipairs(all) do
        local res = {}
        for _, kernel in ipairs { "auto", "reference" } do
          attn.manual_seed(8)
          local x, w, b = attn.randn(case.x):requires_grad_(), attn.randn(case.w):requires_grad_(),
            attn.randn({ case.w[1] }):requires_grad_()
          local y = nn.conv2d(x, w, b, with_kernel(case.o, kernel))
          y:backward(attn.randn(y:shape()))
          res[kernel] = { y, x.grad, w.grad, b.grad }
        end
        for i = 1, 4 do assert.close(res.auto[i], res.reference[i], { atol = 2e-5, rtol = 1e-5 }) end
      end
    end)

  it("runs float32 to float32 rounding of the float64 result, forward and backward", function()
    attn.manual_seed(5)
    local x, w, b = attn.randn({ 3, 4, 9, 8 }), attn.randn({ 6, 2, 3, 3 }), attn.randn({ 6 })
    local o = { padding = 1, stride = { 1, 2 }, groups = 2 }
    x:requires_grad_(); w:requires_grad_(); b:requires_grad_()
    local y = nn.conv2d(x, w, b, o)
    assert.are.equal("float32", y:dtype())
    local g = attn.randn(y:shape())
    y:backward(g)
    local x64, w64, b64 = x:detach():to("float64"):requires_grad_(), w:detach():to("float64"):requires_grad_(),
      b:detach():to("float64"):requires_grad_()
    local y64 = nn.conv2d(x64, w64, b64, o)
    y64:backward(g:to("float64"))
    assert.close(y, y64, { atol = 1e-5, rtol = 1e-5 })
    assert.close(x.grad, x64.grad, { atol = 1e-5, rtol = 1e-5 })
    assert.close(w.grad, w64.grad, { atol = 1e-4, rtol = 1e-5 })
    assert.close(b.grad, b64.grad, { atol = 1e-4, rtol = 1e-5 })
  end)

  it("gives the same bits on 1 and 2 threads, both dtypes (batch 13: uneven dW chunks)", function()
    for _, dt in ipairs { "float32", "float64" } do
      local out = helper.assert_same_bits_on_threads(function()
        attn.manual_seed(6)
        local x = attn.randn({ 13, 4, 10, 9 }, dt):requires_grad_()
        local w = attn.randn({ 8, 4, 3, 3 }, dt):requires_grad_()
        local b = attn.randn({ 8 }, dt):requires_grad_()
        local y = nn.conv2d(x, w, b, { padding = 1 })
        y:backward(attn.randn(y:shape(), dt))
        return { y, x.grad, w.grad, b.grad }
      end)
      if dt == "float64" then -- blocks of 5, 5 and 3 images against the plain loops
        attn.manual_seed(6)
        local x, w, b = attn.randn({ 13, 4, 10, 9 }, dt), attn.randn({ 8, 4, 3, 3 }, dt), attn.randn({ 8 }, dt)
        assert.close(out[1], nn.conv2d(x, w, b, { padding = 1, kernel = "reference" }), { atol = 1e-12, rtol = 0 })
      end
    end
  end)

  -- The bias gradient sums dy in float32 partials of at most 8 entries each, flushed into doubles
  -- (attn_conv's own sum in 32 lanes every 256 positions; the Winograd paths as their gradient
  -- transforms read dy, or by that sum when dx and dW are not asked for): on a 512x512 plane it is
  -- the float64 sum rounded (within one ulp); lanes over a whole row of the plane (8192 terms
  -- each) were 4x past that. Every path and ISA set, alone and beside the other gradients.
  it("has a float32 bias gradient within one ulp of the float64 sum on a 512x512 plane, every path", function()
    attn.manual_seed(21)
    local saved = attn.core.isa()
    finally(function() attn.core.isa(saved) end)
    local x, w = attn.randn({ 1, 1, 512, 512 }), attn.randn({ 2, 1, 3, 3 })
    local g = attn.rand({ 1, 2, 512, 512 })
    local exact = g:to("float64"):sum(4):sum(3):sum(1):view({ 2 })
    for _, isa in ipairs(helper.isa_paths()) do
      attn.core.isa(isa)
      for _, kernel in ipairs { "im2col", "winograd", "winograd4", "reference" } do
        for _, alone in ipairs { false, true } do
          local b = attn.zeros({ 2 }):requires_grad_()
          local xl = alone and x or x:detach():requires_grad_()
          nn.conv2d(xl, w, b, { padding = 1, kernel = kernel }):backward(g)
          for o = 1, 2 do
            local s = exact[o]
            local ulp = 2 ^ (math.floor(math.log(s, 2)) - 23)
            assert.is_true(math.abs(b.grad[o] - s) <= ulp,
              isa .. " " .. kernel .. (alone and " alone" or "") .. ": " .. b.grad[o] .. " vs " .. s)
          end
        end
      end
    end
  end)

  it("takes a 3-D input as one image", function()
    attn.manual_seed(7)
    local x, w = attn.randn({ 2, 5, 5 }, "float64"), attn.randn({ 3, 2, 3, 3 }, "float64")
    local y = nn.conv2d(x, w, nil, { padding = 1 })
    assert.are.same({ 3, 5, 5 }, y:shape())
    assert.close(y, naive_conv(x:reshape({ 1, 2, 5, 5 }), w, nil, { padding = { 1, 1 } }):reshape({ 3, 5, 5 }),
      { atol = 1e-12, rtol = 0 })
  end)

  it("handles an empty batch", function()
    local x, w = attn.zeros({ 0, 2, 4, 4 }, "float64"):requires_grad_(), attn.ones({ 3, 2, 3, 3 }, "float64")
    w:requires_grad_()
    local y = nn.conv2d(x, w)
    assert.are.same({ 0, 3, 2, 2 }, y:shape())
    y:sum():backward()
    assert.close(w.grad, attn.zeros({ 3, 2, 3, 3 }, "float64"), { atol = 0, rtol = 0 })
  end)

  it("raises naming the shapes and values", function()
    local x, w = attn.randn({ 1, 4, 5, 5 }), attn.randn({ 6, 2, 3, 3 })
    assert.has_error(function() nn.conv2d(attn.randn({ 4, 5, 5, 1, 1 }), w) end,
      "conv2d: input [4x5x5x1x1] must be (N, C, H, W) or (C, H, W)")
    assert.has_error(function() nn.conv2d(x, attn.randn({ 6, 2, 3 })) end,
      "conv2d: weight [6x2x3] must be 4-D (out_channels, in_channels / groups, kh, kw)")
    assert.has_error(function() nn.conv2d(x, w) end,
      "conv2d: input [1x4x5x5] has 4 channels, weight [6x2x3x3] with groups 1 expects 2")
    assert.has_error(function() nn.conv2d(x, w, nil, { groups = 3 }) end,
      "conv2d: groups 3 must divide in_channels 4 and out_channels 6")
    assert.has_error(function() nn.conv2d(x, w, nil, { groups = 2, stride = 0 }) end,
      "conv2d: stride must be an integer >= 1 or a table {h, w} of them, got 0")
    assert.has_error(function() nn.conv2d(x, w, nil, { groups = 2, stride = { 1, 0 } }) end,
      "conv2d: stride must be an integer >= 1 or a table {h, w} of them, got {1, 0}")
    assert.has_error(function() nn.conv2d(x, attn.randn({ 6, 2, 7, 3 }), nil, { groups = 2, padding = { 0, 1 } }) end,
      "conv2d: kernel 7x3 (dilation 1x1: 7x3) is larger than the padded input 5x7 (input [1x4x5x5], padding 0x1)")
    assert.has_error(function() nn.conv2d(x, w, nil, { groups = 2, dilation = 3 }) end,
      "conv2d: kernel 3x3 (dilation 3x3: 7x7) is larger than the padded input 5x5 (input [1x4x5x5], padding 0x0)")
    assert.has_error(function() nn.conv2d(x, w, attn.randn({ 5 }), { groups = 2 }) end,
      "conv2d: bias [5] must be [6]")
    assert.has_error(function() nn.conv2d(x, w:to("float64"), nil, { groups = 2 }) end,
      "conv2d: weight [6x2x3x3] is float64, expected float32")
    assert.has_error(function() nn.conv2d(x, w, nil, { groups = 2, kernel = "fast" }) end,
      "conv2d: kernel must be 'auto', 'im2col', 'winograd', 'winograd4' or 'reference', got fast")
    assert.has_error(function() nn.conv2d(x, w, nil, { groups = 2, kernel = "winograd" }) end,
      "conv2d: kernel 'winograd' takes 3x3 kernels at stride 1, dilation 1 and groups 1, got input "
        .. "[1x4x5x5], weight [6x2x3x3], stride 1x1, dilation 1x1, groups 2")
    assert.has_error(function() nn.conv2d(attn.randn({ 1, 2, 5, 5 }), attn.randn({ 3, 2, 3, 3 }), nil,
      { kernel = "winograd4", stride = 2 }) end, "conv2d: kernel 'winograd4' takes 3x3 kernels at stride 1, dilation 1 "
        .. "and groups 1, got input [1x2x5x5], weight [3x2x3x3], stride 2x2, dilation 1x1, groups 1")
  end)
end)

-- Winograd F(2x2, 3x3) (kernel = "winograd") and F(4x4, 3x3) ("winograd4"): odd sizes (a last tile
-- row and column of one output), padding 0, 1, 2, batch 1 and many, channel counts that are no
-- multiple of anything, an image smaller than a tile, several images per block, and images larger
-- than a block (bands of tile rows, the last one short: 23 tile rows, 21 per band in float32 and 10
-- in float64 for F(2x2); 5 groups of 4x4 tiles, 2 per band, for F(4x4)).
local wino_cases = {
  { name = "odd 7x5, padding 1", x = { 2, 3, 7, 5 }, w = { 5, 3, 3, 3 }, o = { padding = 1 } },
  { name = "padding 0, batch 1", x = { 1, 5, 8, 9 }, w = { 3, 5, 3, 3 }, o = {} },
  { name = "padding 2, {2, 0}", x = { 3, 2, 5, 6 }, w = { 7, 2, 3, 3 }, o = { padding = { 2, 0 } } },
  { name = "1x1 image, padding 1", x = { 2, 9, 1, 1 }, w = { 4, 9, 3, 3 }, o = { padding = 1 } },
  { name = "3x3 image, padding 0 (one output)", x = { 1, 2, 3, 3 }, w = { 2, 2, 3, 3 }, o = {} },
  { name = "many tiles: several images per block", x = { 2, 2, 41, 37 }, w = { 3, 2, 3, 3 }, o = { padding = 1 } },
  { name = "an image larger than a block: bands", x = { 1, 6, 45, 45 }, w = { 6, 6, 3, 3 }, o = { padding = 1 } },
  { name = "an image larger than an F(4x4) block: bands", x = { 1, 8, 70, 70 }, w = { 5, 8, 3, 3 },
    o = { padding = 1 } },
  -- outputs a multiple of 16 wide: F(4x4)'s last group spills its patches' last two columns into
  -- the plane (the input gradient's extra group)
  { name = "16 wide, padding 1", x = { 2, 3, 16, 16 }, w = { 4, 3, 3, 3 }, o = { padding = 1 } },
  { name = "18 wide, padding 0", x = { 1, 2, 10, 18 }, w = { 3, 2, 3, 3 }, o = {} },
  { name = "the same in bands (64 wide, padding 1)", x = { 1, 8, 64, 64 }, w = { 5, 8, 3, 3 }, o = { padding = 1 } },
  { name = "padding {3, 4}", x = { 2, 3, 6, 5 }, w = { 4, 3, 3, 3 }, o = { padding = { 3, 4 } } },
}

-- Per kernel: outputs per tile side, the float32 bound's magnitude factor and extra roundings
-- (below), the float64 tolerance against naive loops. F(2x2)'s transforms have coefficients 0,
-- +-1/2, +-1: a tile's sums weigh a weight times an input by at most 8 along each side, 64 in all;
-- F(4x4)'s (up to 5 in B^T, 1/4 and 1/6 in G, 8 in A^T) by at most 54 along a side for any of the
-- three passes (48 forward, 38.5 for the input gradient, 53.3 for the weight gradient).
local WINO = {
  winograd = { m = 2, factor = 64, depth = 10, f64 = 1e-12 },
  winograd4 = { m = 4, factor = 54 ^ 2, depth = 16, f64 = 1e-10 },
}
local WINO_KERNELS = { "winograd", "winograd4" }

-- The float32 Winograd error bound of attn_conv_internal.h for a convolution over C channels of
-- weights w and inputs x: every output is a signed sum of at most factor C products of a weight and
-- an input, each reaching it through at most C + depth roundings: |err| <= (C + depth) u factor C
-- max|w| max|x|, u = 2^-24. For the weight gradient, a sum over every tile of the batch, the worst
-- case (tiles + depth roundings) is vacuous; it takes the random-walk form of the same bound,
-- sqrt(tiles) + depth roundings (rounds: the count of roundings).
local function wino_bound(kernel, C, w, x, rounds)
  local k = WINO[kernel]
  return (rounds or C + k.depth) * 2 ^ -24 * k.factor * C * w:abs():max():item() * x:abs():max():item()
end

describe("nn.conv2d with kernel = 'winograd' and 'winograd4'", function()
  for _, kernel in ipairs(WINO_KERNELS) do
    for _, case in ipairs(wino_cases) do
      it(kernel .. " matches naive loops and the reference path in float64, values and gradients: " .. case.name,
        function()
          attn.manual_seed(11)
          local x, w = attn.randn(case.x, "float64"), attn.randn(case.w, "float64")
          local b = attn.randn({ case.w[1] }, "float64")
          local tol = { atol = WINO[kernel].f64, rtol = 0 }
          assert.close(nn.conv2d(x, w, b, with_kernel(case.o, kernel)), naive_conv(x, w, b, case.o), tol)
          local grads = {}
          for _, k in ipairs { kernel, "reference", "im2col" } do
            local xl, wl, bl = x:detach():requires_grad_(), w:detach():requires_grad_(), b:detach():requires_grad_()
            local y = nn.conv2d(xl, wl, bl, with_kernel(case.o, k))
            attn.manual_seed(12)
            y:backward(attn.randn(y:shape(), "float64"))
            grads[k] = { y, xl.grad, wl.grad, bl.grad }
          end
          for i = 1, 4 do
            assert.close(grads[kernel][i], grads.reference[i], tol)
            assert.close(grads.im2col[i], grads.reference[i], { atol = 1e-12, rtol = 0 })
          end
        end)
    end
  end

  -- Padding deeper than a band reaches: the first bands of tile rows read only padding (F(2x2) in
  -- bands of one tile row, 2 output rows, under padding 6; F(4x4) in bands of one group row, 16
  -- output rows, under padding 20). Their prefetch of rows past the end once looped for ever.
  it("runs bands that lie wholly in the padding (values and gradients against im2col)", function()
    local deep = {
      { kernel = "winograd", dtype = "float64", x = { 1, 8, 2, 380 }, w = { 8, 8, 3, 3 }, padding = 6 },
      { kernel = "winograd4", dtype = "float64", x = { 1, 8, 4, 4 }, w = { 8, 8, 3, 3 }, padding = 20 },
      { kernel = "auto", dtype = "float32", x = { 1, 8, 4, 4 }, w = { 8, 8, 3, 3 }, padding = 20 },
    }
    for _, d in ipairs(deep) do
      attn.manual_seed(21)
      local x, w, b = attn.randn(d.x, d.dtype), attn.randn(d.w, d.dtype), attn.randn({ d.w[1] }, d.dtype)
      local got = {}
      for _, k in ipairs { d.kernel, "im2col" } do
        local xl, wl, bl = x:detach():requires_grad_(), w:detach():requires_grad_(), b:detach():requires_grad_()
        local y = nn.conv2d(xl, wl, bl, { padding = d.padding, kernel = k })
        attn.manual_seed(22)
        y:backward(attn.randn(y:shape(), d.dtype))
        got[k] = { y, xl.grad, wl.grad, bl.grad }
      end
      local tol = d.dtype == "float64" and 1e-10 or 1e-3
      for i = 1, 4 do assert.close(got[d.kernel][i], got.im2col[i], { atol = tol, rtol = tol }) end
    end
  end)

  it("has gradients that pass gradcheck (float64)", function()
    attn.manual_seed(13)
    for _, kernel in ipairs(WINO_KERNELS) do
      for _, case in ipairs { wino_cases[1], wino_cases[3], wino_cases[5] } do
        local x, w, b = helper.param(case.x), helper.param(case.w), helper.param({ case.w[1] })
        helper.gradcheck(function(a, c, d) return nn.conv2d(a, c, d, with_kernel(case.o, kernel)) end, { x, w, b })
      end
    end
  end)

  -- every ISA set: AVX-512 has its own float32 transforms for both (F(2x2): two short tile rows per
  -- vector up to 8 tiles a row, 16 tiles of one row above; F(4x4): one group of 4x4 tiles per
  -- vector; the cases cover 1 to 24 tiles a row, odd tile rows, bands)
  it("stays within its error bound in float32 on every ISA set (values, input and weight gradients against float64)",
    function()
      attn.manual_seed(14)
      local saved = attn.core.isa()
      finally(function() attn.core.isa(saved) end)
      local f32_cases = helper.with(wino_cases, {
        { x = { 4, 16, 14, 14 }, w = { 32, 16, 3, 3 }, o = { padding = 1 } },
        { x = { 3, 3, 29, 31 }, w = { 4, 3, 3, 3 }, o = { padding = { 0, 2 } } },
      })
      for _, isa in ipairs(helper.isa_paths()) do
        attn.core.isa(isa)
        for _, kernel in ipairs(WINO_KERNELS) do
          for _, case in ipairs(f32_cases) do
            local x, w = attn.randn(case.x), attn.randn(case.w)
            local xl, wl = x:detach():requires_grad_(), w:detach():requires_grad_()
            local y = nn.conv2d(xl, wl, nil, with_kernel(case.o, kernel))
            local g = attn.randn(y:shape())
            y:backward(g)
            local x64, w64 = x:to("float64"):requires_grad_(), w:to("float64"):requires_grad_()
            local y64 = nn.conv2d(x64, w64, nil, with_kernel(case.o, "reference"))
            y64:backward(g:to("float64"))
            local C, O, m = case.x[2], case.w[1], WINO[kernel].m
            -- dx: sums over the O channels of dy with the same magnitudes; dW: sums over every tile
            -- of the batch, the same bound with the tiles as the channels
            local tiles = case.x[1] * math.ceil(y:shape()[3] / m) * math.ceil(y:shape()[4] / m)
            local depth = WINO[kernel].depth
            assert.close(y, y64, { atol = wino_bound(kernel, C, w, x), rtol = 0 })
            assert.close(xl.grad, x64.grad, { atol = wino_bound(kernel, O, w, g), rtol = 0 })
            assert.close(wl.grad, w64.grad,
              { atol = wino_bound(kernel, tiles, g, x, math.sqrt(tiles) + depth), rtol = 0 })
            -- and the bound is not vacuous: it is below the outputs' own scale
            -- (F(4x4)'s is up to a tenth of it, on a 1x1 image; F(2x2)'s a thousandth)
            assert.is_true(wino_bound(kernel, C, w, x) < 0.25 * y64:abs():max():item())
          end
        end
      end
    end)

  -- whole images per block, and images cut into bands (neighbouring bands share two rows of the
  -- input gradient: the even bands write them, then the odd ones add into them, each phase's bands
  -- in parallel)
  it("gives the same bits on 1 and 2 threads (float32, forward and backward, whole images and bands)", function()
    attn.manual_seed(15)
    for _, kernel in ipairs(WINO_KERNELS) do
      for _, shapes in ipairs {
        { { 5, 6, 23, 19 }, { 7, 6, 3, 3 } }, { { 3, 6, 45, 45 }, { 6, 6, 3, 3 } }, { { 2, 8, 70, 70 }, { 5, 8, 3, 3 } },
        { { 1, 4, 130, 130 }, { 4, 4, 3, 3 } }, -- one image in 5 or 6 bands: its bands in parallel
      } do
        local x, w, b = attn.randn(shapes[1]), attn.randn(shapes[2]), attn.randn({ shapes[2][1] })
        helper.assert_same_bits_on_threads(function()
          local xl, wl, bl = x:detach():requires_grad_(), w:detach():requires_grad_(), b:detach():requires_grad_()
          local y = nn.conv2d(xl, wl, bl, { padding = 1, kernel = kernel })
          y:backward(y:detach())
          return { y, xl.grad, wl.grad, bl.grad }
        end)
      end
    end
  end)

  it("has every ISA set's transforms match the reference path (float64)", function()
    local saved = attn.core.isa()
    finally(function() attn.core.isa(saved) end)
    for _, isa in ipairs(helper.isa_paths()) do
      attn.core.isa(isa)
      for _, kernel in ipairs(WINO_KERNELS) do
        for _, case in ipairs { wino_cases[1], wino_cases[3], wino_cases[7], wino_cases[8] } do
          attn.manual_seed(17)
          local x, w = attn.randn(case.x, "float64"), attn.randn(case.w, "float64")
          local b = attn.randn({ case.w[1] }, "float64")
          local res = {}
          for _, k in ipairs { kernel, "reference" } do
            local xl, wl, bl = x:detach():requires_grad_(), w:detach():requires_grad_(), b:detach():requires_grad_()
            local y = nn.conv2d(xl, wl, bl, with_kernel(case.o, k))
            y:backward(y:detach())
            res[k] = { y, xl.grad, wl.grad, bl.grad }
          end
          for i = 1, 4 do assert.close(res[kernel][i], res.reference[i], { atol = 100 * WINO[kernel].f64, rtol = 1e-12 }) end
        end
      end
    end
  end)

  -- AUTO's tile: F(4x4) in float32 where the active set has its own F(4x4) transforms (AVX-512),
  -- F(2x2) otherwise and in float64
  it("is what 'auto' runs from 8 input and output channels and 12x12 outputs up, im2col below", function()
    local saved = attn.core.isa()
    finally(function() attn.core.isa(saved) end)
    local function run(xs, ws, kernel, dtype)
      attn.manual_seed(19)
      local x, w = attn.randn(xs, dtype):requires_grad_(), attn.randn(ws, dtype):requires_grad_()
      local y = nn.conv2d(x, w, nil, { padding = 1, kernel = kernel })
      y:backward(y:detach())
      return { y, x.grad, w.grad }
    end
    local function same(a, b)
      for i = 1, 3 do
        if attn.core.tensor_to_bytes(a[i]) ~= attn.core.tensor_to_bytes(b[i]) then return false end
      end
      return true
    end
    for _, isa in ipairs(helper.isa_paths()) do
      attn.core.isa(isa)
      for _, dtype in ipairs { "float32", "float64" } do
        local tile = (isa == "avx512" and dtype == "float32") and "winograd4" or "winograd"
        for _, case in ipairs {
          { x = { 2, 8, 12, 12 }, w = { 8, 8, 3, 3 }, want = tile },
          { x = { 2, 7, 12, 12 }, w = { 8, 7, 3, 3 }, want = "im2col" },
          { x = { 2, 8, 12, 12 }, w = { 7, 8, 3, 3 }, want = "im2col" },
          { x = { 2, 8, 11, 14 }, w = { 8, 8, 3, 3 }, want = "im2col" },
        } do
          local res = {}
          for _, k in ipairs { "auto", "winograd", "winograd4", "im2col" } do res[k] = run(case.x, case.w, k, dtype) end
          -- the paths round differently: the test can tell them apart
          assert.is_false(same(res.winograd, res.im2col) or same(res.winograd4, res.im2col)
            or same(res.winograd, res.winograd4))
          assert.is_true(same(res.auto, res[case.want]), isa .. " " .. dtype .. " wants " .. case.want)
        end
      end
    end
  end)

  it("is picked by a Conv2d's field kernel", function()
    attn.manual_seed(16)
    local m = nn.Conv2d(3, 4, 3, { padding = 1, dtype = "float64" })
    local x = attn.randn({ 2, 3, 5, 6 }, "float64")
    local expected = naive_conv(x, m.weight, m.bias, { padding = 1 })
    for _, kernel in ipairs { "winograd", "winograd4", "im2col" } do
      m.kernel = kernel
      assert.close(m(x), expected, { atol = 1e-12, rtol = 0 })
    end
  end)
end)

describe("nn.Conv2d", function()
  it("has PyTorch's parameter shapes, initial ranges and repr", function()
    attn.manual_seed(8)
    local m = nn.Conv2d(4, 6, { 3, 2 }, { groups = 2, padding = 1, stride = { 2, 1 } })
    assert.are.same({ 6, 2, 3, 2 }, m.weight:shape())
    assert.are.same({ 6 }, m.bias:shape())
    local bound = 1 / math.sqrt(2 * 3 * 2) -- kaiming_uniform(a = sqrt 5) over fan_in = 12
    assert.is_true(m.weight:abs():max():item() <= bound)
    assert.is_true(m.bias:abs():max():item() <= bound)
    assert.is_true(m.weight:abs():max():item() > bound / 2)
    assert.are.equal("Conv2d(4, 6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), groups=2)", tostring(m))
    local keys = {}
    for k in pairs(m:state_dict()) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.are.same({ "bias", "weight" }, keys)
    assert.is_nil(nn.Conv2d(2, 2, 1, { bias = false }).bias)
  end)

  it("computes conv2d with its parameters, on the reference path with kernel = 'reference'", function()
    attn.manual_seed(9)
    local m = nn.Conv2d(2, 3, 3, { padding = 1, dilation = 2, dtype = "float64" })
    local x = attn.randn({ 2, 2, 6, 6 }, "float64")
    local expected = naive_conv(x, m.weight, m.bias, { padding = { 1, 1 }, dilation = { 2, 2 } })
    assert.close(m(x), expected, { atol = 1e-12, rtol = 0 })
    m.kernel = "reference"
    assert.close(m(x), expected, { atol = 1e-12, rtol = 0 })
  end)

  it("raises on bad constructor arguments", function()
    assert.has_error(function() nn.Conv2d(4, 6, 3, { groups = 4 }) end,
      "Conv2d: groups 4 must divide in_channels 4 and out_channels 6")
    assert.has_error(function() nn.Conv2d(4, 6, 0) end,
      "Conv2d: kernel_size must be an integer >= 1 or a table {h, w} of them, got 0")
    assert.has_error(function() nn.Conv2d(4, 6, 3, { padding_mode = "reflect" }) end,
      "Conv2d: padding_mode 'reflect' is not supported (only 'zeros')")
    assert.has_error(function() nn.Conv2d(4, 6, 3, { paddings = 1 }) end)
  end)
end)

describe("a PyTorch CNN (Conv2d, BatchNorm2d, ReLU, MaxPool2d, grouped dilated Conv2d, AdaptiveAvgPool2d, "
  .. "Flatten, Linear)", function()
  local F = require "nn.torch_fixtures"
  local ALL_DIFFS = { "output", "grad_input", "grad_state", "after" }
  for _, name in ipairs(F.cnn_cases) do
    it("matches PyTorch 1.13 to 1e-10 (outputs, input and parameter gradients, running stats): " .. name, function()
      for _, threads in ipairs { 1, 2 } do
        local before = attn.get_num_threads()
        attn.set_num_threads(threads)
        local ok, err = pcall(F.check, name, { min_n = 10, whats = ALL_DIFFS,
          where = string.format(" (%d threads)", threads) })
        attn.set_num_threads(before)
        assert(ok, err)
      end
      F.check(name, { dtype = "float32", tol = 1e-4, whats = ALL_DIFFS, where = " in float32" })
    end)
  end

  it("loads PyTorch's state dict unchanged (keys and weight shapes)", function()
    local t = assert(attn.load("spec/fixtures/torch/cnn_eval.safetensors"))
    local m = F.cnn()
    local sd = m:state_dict()
    local n = 0
    for k, v in pairs(t) do
      local key = k:match("^state%.(.+)$")
      if key then
        assert.are.same(v:shape(), sd[key]:shape(), key)
        n = n + 1
      end
    end
    local mine = 0
    for _ in pairs(sd) do mine = mine + 1 end
    assert.are.equal(mine, n)
  end)
end)
