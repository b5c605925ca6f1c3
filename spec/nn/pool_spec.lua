-- MaxPool2d, AvgPool2d, AdaptiveAvgPool2d and Flatten against naive Lua loops (float64),
-- gradients against finite differences, both dtypes, thread counts, errors.
local attn = require "attn"
local nn = require "attn.nn"
local helper = require "helper"

local function pair(v) return type(v) == "table" and v or { v, v } end

-- Pools every plane of x by the definition: window(i, j) gives the entries' rows, columns and
-- the divisor (nil for max); returns the pooled tensor and (max) the 0-based plane indices.
local function naive_pool(x, Ho, Wo, window)
  local X, s = x:totable(), x:shape()
  local Y, I = {}, {}
  for n = 1, s[1] do
    Y[n], I[n] = {}, {}
    for c = 1, s[2] do
      Y[n][c], I[n][c] = {}, {}
      for i = 1, Ho do
        Y[n][c][i], I[n][c][i] = {}, {}
        for j = 1, Wo do
          local h0, h1, w0, w1, div = window(i - 1, j - 1)
          local best, at, sum = -math.huge, nil, 0
          for h = math.max(h0, 0), math.min(h1, s[3]) - 1 do
            for w = math.max(w0, 0), math.min(w1, s[4]) - 1 do
              local v = X[n][c][h + 1][w + 1]
              sum = sum + v
              if v > best or at == nil then best, at = v, h * s[4] + w end
            end
          end
          Y[n][c][i][j] = div and sum / div or best
          I[n][c][i][j] = at
        end
      end
    end
  end
  return attn.tensor(Y, "float64"), attn.tensor(I, "int64")
end

local function naive_window_pool(x, k, o, average)
  k = pair(k)
  local st, pd = pair(o.stride or k), pair(o.padding or 0)
  local s = x:shape()
  local Ho = (s[3] + 2 * pd[1] - k[1]) // st[1] + 1
  local Wo = (s[4] + 2 * pd[2] - k[2]) // st[2] + 1
  return naive_pool(x, Ho, Wo, function(i, j)
    local h0, w0 = i * st[1] - pd[1], j * st[2] - pd[2]
    local h1, w1 = h0 + k[1], w0 + k[2]
    local div
    if average then
      if o.count_include_pad == false then
        div = (math.min(h1, s[3]) - math.max(h0, 0)) * (math.min(w1, s[4]) - math.max(w0, 0))
      else
        div = k[1] * k[2]
      end
    end
    return h0, h1, w0, w1, div
  end)
end

local function naive_adaptive(x, out)
  out = pair(out)
  local s = x:shape()
  return (naive_pool(x, out[1], out[2], function(i, j)
    local h0, h1 = i * s[3] // out[1], -((-(i + 1) * s[3]) // out[1])
    local w0, w1 = j * s[4] // out[2], -((-(j + 1) * s[4]) // out[2])
    return h0, h1, w0, w1, (h1 - h0) * (w1 - w0)
  end))
end

local window_cases = {
  { name = "2x2", x = { 2, 3, 6, 6 }, k = 2, o = {} },
  { name = "3x3 stride 2 padding 1", x = { 2, 2, 7, 6 }, k = 3, o = { stride = 2, padding = 1 } },
  { name = "rectangular {3, 2}, stride {1, 2}, padding {1, 0}", x = { 1, 2, 5, 7 }, k = { 3, 2 },
    o = { stride = { 1, 2 }, padding = { 1, 0 } } },
  { name = "odd size, overlap", x = { 2, 1, 5, 5 }, k = 3, o = { stride = 1 } },
  { name = "1x1 image", x = { 3, 2, 1, 1 }, k = 1, o = {} },
  { name = "1x1 image, kernel 2 padding 1", x = { 1, 2, 1, 1 }, k = 2, o = { padding = 1 } },
}

describe("nn.MaxPool2d", function()
  for _, case in ipairs(window_cases) do
    it("matches naive loops, values and indices, and passes gradcheck: " .. case.name, function()
      attn.manual_seed(1)
      local x = attn.randn(case.x, "float64")
      local y, idx = nn.max_pool2d(x, case.k, case.o)
      local ey, eidx = naive_window_pool(x, case.k, case.o, false)
      assert.close(y, ey, { atol = 0, rtol = 0 })
      helper.assert_identical(idx, eidx)
      assert.close(nn.MaxPool2d(case.k, case.o)(x), ey, { atol = 0, rtol = 0 })
      helper.gradcheck(function(a) return (nn.max_pool2d(a, case.k, case.o)) end, { x:requires_grad_() })
    end)
  end

  it("2x2 stride 2 (a path of its own): ties, widths past a vector with a tail, odd sizes, NaN", function()
    attn.manual_seed(3)
    for _, dtype in ipairs { "float32", "float64" } do
      for _, shape in ipairs { { 2, 3, 9, 21 }, { 1, 2, 4, 2 }, { 1, 1, 2, 17 } } do
        -- small integers: many ties, so the first maximum in scan order must win, as in the loops
        local x = attn.randint(0, 3, shape):to(dtype)
        local y, idx = nn.max_pool2d(x, 2)
        local ey, eidx = naive_window_pool(x:to("float64"), 2, {}, false)
        assert.close(y:to("float64"), ey, { atol = 0, rtol = 0 })
        helper.assert_identical(idx, eidx)
      end
      -- NaN wins its window wherever it sits, the later of two NaNs taking the index
      local x = attn.zeros({ 1, 1, 2, 10 }, dtype)
      x[{ 1, 1, 2, 3 }], x[{ 1, 1, 1, 8 }], x[{ 1, 1, 2, 8 }], x[{ 1, 1, 1, 10 }] = 0 / 0, 0 / 0, 0 / 0, -1
      local y, idx = nn.max_pool2d(x, 2)
      local v, at = y:totable()[1][1][1], idx:totable()[1][1][1]
      assert.is_true(v[2] ~= v[2] and v[4] ~= v[4])
      assert.same({ 0, 12, 4, 17, 8 }, at)
    end
  end)

  it("routes the gradient to each window's maximum, adding where windows share it", function()
    local x = attn.tensor({ { { { 1, 5, 2 }, { 0, 3, 1 }, { 4, 2, 0 } } } }, "float64"):requires_grad_()
    local y = nn.max_pool2d(x, 2, { stride = 1 })
    assert.close(y, { { { { 5, 5 }, { 4, 3 } } } }, { atol = 0, rtol = 0 })
    y:sum():backward()
    assert.close(x.grad, { { { { 0, 2, 0 }, { 0, 1, 0 }, { 1, 0, 0 } } } }, { atol = 0, rtol = 0 })
  end)

  it("never picks the -inf padding and propagates NaN as PyTorch", function()
    local x = attn.full({ 1, 1, 2, 2 }, -1e30, "float64")
    assert.close(nn.max_pool2d(x, 2, { padding = 1 }), attn.full({ 1, 1, 2, 2 }, -1e30, "float64"), { atol = 0 })
    local y = nn.max_pool2d(attn.tensor({ { { { 1, 0 / 0 }, { 3, 2 } } } }), 2)
    assert.is_true(y:item() ~= y:item())
  end)

  it("defaults stride to kernel_size, takes 3-D input, shows PyTorch's repr", function()
    local m = nn.MaxPool2d(2)
    assert.are.same({ 3, 2, 3 }, m(attn.randn({ 3, 4, 7 })):shape())
    assert.are.equal("MaxPool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0))", tostring(m))
  end)
end)

describe("nn.AvgPool2d", function()
  for _, case in ipairs(window_cases) do
    for _, include in ipairs { true, false } do
      local o = helper.with(case.o, { count_include_pad = include })
      it(string.format("matches naive loops and passes gradcheck (count_include_pad %s): %s", include, case.name),
        function()
          attn.manual_seed(2)
          local x = attn.randn(case.x, "float64")
          local e = naive_window_pool(x, case.k, o, true)
          assert.close(nn.avg_pool2d(x, case.k, o), e, { atol = 1e-12, rtol = 0 })
          assert.close(nn.AvgPool2d(case.k, o)(x), e, { atol = 1e-12, rtol = 0 })
          helper.gradcheck(function(a) return nn.avg_pool2d(a, case.k, o) end, { x:requires_grad_() })
        end)
    end
  end
end)

describe("nn.AdaptiveAvgPool2d", function()
  for _, case in ipairs {
    { x = { 2, 3, 7, 5 }, out = { 3, 2 } }, { x = { 1, 2, 6, 6 }, out = 3 }, { x = { 2, 2, 5, 4 }, out = 1 },
    { x = { 1, 2, 3, 2 }, out = { 5, 4 } }, { x = { 1, 1, 1, 1 }, out = 2 } } do
    local name = string.format("%s -> %s", attn.core.shape_str(case.x), attn.core.shape_str(pair(case.out)))
    it("matches PyTorch's windows by naive loops and passes gradcheck: " .. name, function()
      attn.manual_seed(3)
      local x = attn.randn(case.x, "float64")
      local e = naive_adaptive(x, case.out)
      assert.close(nn.adaptive_avg_pool2d(x, case.out), e, { atol = 1e-12, rtol = 0 })
      assert.close(nn.AdaptiveAvgPool2d(case.out)(x), e, { atol = 1e-12, rtol = 0 })
      helper.gradcheck(function(a) return nn.adaptive_avg_pool2d(a, case.out) end, { x:requires_grad_() })
    end)
  end
end)

describe("pooling", function()
  it("runs float32 as float64 rounded, and gives the same bits on 1 and 2 threads", function()
    local fns = {
      function(x) return (nn.max_pool2d(x, 3, { stride = 2, padding = 1 })) end,
      function(x) return nn.avg_pool2d(x, 3, { stride = 2, padding = 1, count_include_pad = false }) end,
      function(x) return nn.adaptive_avg_pool2d(x, { 4, 3 }) end,
    }
    for _, f in ipairs(fns) do
      for _, dt in ipairs { "float32", "float64" } do
        helper.assert_same_bits_on_threads(function()
          attn.manual_seed(4)
          local x = attn.randn({ 9, 16, 13, 11 }, dt):requires_grad_()
          local y = f(x)
          y:backward(attn.randn(y:shape(), dt))
          if dt == "float32" then
            local y64 = f(x:detach():to("float64"))
            assert.close(y, y64, { atol = 1e-6, rtol = 1e-6 })
          end
          return { y, x.grad }
        end)
      end
    end
  end)

  it("raises naming the values", function()
    local x = attn.randn({ 1, 2, 4, 4 })
    assert.has_error(function() nn.max_pool2d(x, 2, { padding = 2 }) end,
      "max_pool2d: padding (2, 2) must be at most half of kernel_size (2, 2)")
    assert.has_error(function() nn.MaxPool2d(3, { stride = 0 }) end,
      "MaxPool2d: stride must be an integer >= 1 or a table {h, w} of them, got 0")
    assert.has_error(function() nn.max_pool2d(x, 5) end,
      "max_pool2d: kernel_size 5x5 is larger than the padded input 4x4 (input [1x2x4x4], padding 0x0)")
    assert.has_error(function() nn.avg_pool2d(x, { 2, 8 }, { padding = 1 }) end,
      "avg_pool2d: kernel_size 2x8 is larger than the padded input 6x6 (input [1x2x4x4], padding 1x1)")
    assert.has_error(function() nn.avg_pool2d(attn.randn({ 4, 4 }), 2) end,
      "avg_pool2d: input [4x4] must be (N, C, H, W) or (C, H, W)")
    assert.has_error(function() nn.AdaptiveAvgPool2d(0) end,
      "AdaptiveAvgPool2d: output_size must be an integer >= 1 or a table {h, w} of them, got 0")
    assert.has_error(function() nn.MaxPool2d(2, { ceil_mode = true }) end)
  end)
end)

describe("nn.Flatten", function()
  it("merges start_dim..end_dim (1-based: PyTorch's start_dim=1 is 2) and passes the gradient", function()
    local x = attn.randn({ 2, 3, 4, 5 }, "float64"):requires_grad_()
    assert.are.same({ 2, 60 }, nn.Flatten()(x):shape())
    assert.are.same({ 120 }, nn.Flatten(1)(x):shape())
    assert.are.same({ 2, 12, 5 }, nn.Flatten(2, 3)(x):shape())
    assert.are.same({ 2, 3, 20 }, nn.Flatten(-2, -1)(x):shape())
    local y = nn.Flatten()(x)
    assert.close(y, x:reshape({ 2, 60 }), { atol = 0, rtol = 0 })
    y:backward(attn.ones({ 2, 60 }, "float64"))
    assert.close(x.grad, attn.ones({ 2, 3, 4, 5 }, "float64"), { atol = 0, rtol = 0 })
    assert.error_matches(function() nn.Flatten(3, 2)(x) end, "Flatten: dims 3..2 do not fit input [2x3x4x5]", 1, true)
    assert.has_error(function() nn.Flatten(0) end, "Flatten: start_dim must be a non-zero integer (1-based), got 0")
    assert.are.equal("Flatten(start_dim=2, end_dim=-1)", tostring(nn.Flatten()))
  end)
end)
