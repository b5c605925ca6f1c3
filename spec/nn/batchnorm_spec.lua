-- nn.BatchNorm2d against per-channel loops in Lua (float64): training and eval, running
-- statistics, gradients by finite differences, PyTorch's state-dict keys, errors.
local attn = require "attn"
local nn = require "attn.nn"
local helper = require "helper"

-- Per-channel mean and biased variance of x (N, C, H, W) over N, H, W.
local function channel_stats(x)
  local X, s = x:totable(), x:shape()
  local mean, var, count = {}, {}, s[1] * s[3] * s[4]
  for c = 1, s[2] do
    local sum = 0
    for n = 1, s[1] do for h = 1, s[3] do for w = 1, s[4] do sum = sum + X[n][c][h][w] end end end
    mean[c] = sum / count
    local sq = 0
    for n = 1, s[1] do for h = 1, s[3] do for w = 1, s[4] do sq = sq + (X[n][c][h][w] - mean[c]) ^ 2 end end end
    var[c] = sq / count
  end
  return mean, var, count
end

-- (x - mean) / sqrt(var + eps) * weight + bias per channel.
local function normalise(x, mean, var, eps, weight, bias)
  local X, s = x:totable(), x:shape()
  for n = 1, s[1] do
    for c = 1, s[2] do
      for h = 1, s[3] do
        for w = 1, s[4] do
          local v = (X[n][c][h][w] - mean[c]) / math.sqrt(var[c] + eps)
          X[n][c][h][w] = weight and v * weight[c] + bias[c] or v
        end
      end
    end
  end
  return attn.tensor(X, "float64")
end

describe("nn.BatchNorm2d", function()
  it("normalises with batch statistics in training and moves the running ones (unbiased var)", function()
    attn.manual_seed(1)
    local m = nn.BatchNorm2d(3, { momentum = 0.2, dtype = "float64" })
    attn.no_grad(function()
      m.weight:copy_(attn.tensor({ 0.5, 2, -1 }, "float64"))
      m.bias:copy_(attn.tensor({ 0.1, -0.3, 0.7 }, "float64"))
    end)
    local rm, rv = { 0, 0, 0 }, { 1, 1, 1 }
    for step = 1, 2 do
      local x = attn.randn({ 4, 3, 3, 2 }, "float64") * step + step
      local mean, var, count = channel_stats(x)
      assert.close(m(x), normalise(x, mean, var, 1e-5, m.weight:totable(), m.bias:totable()),
        { atol = 1e-12, rtol = 0 })
      for c = 1, 3 do
        rm[c] = 0.8 * rm[c] + 0.2 * mean[c]
        rv[c] = 0.8 * rv[c] + 0.2 * var[c] * count / (count - 1)
      end
      assert.close(m.running_mean, rm, { atol = 1e-12, rtol = 0 })
      assert.close(m.running_var, rv, { atol = 1e-12, rtol = 0 })
      assert.are.equal(step, m.num_batches_tracked:item())
    end
    m:eval()
    local x = attn.randn({ 2, 3, 2, 2 }, "float64")
    assert.close(m(x), normalise(x, rm, rv, 1e-5, m.weight:totable(), m.bias:totable()), { atol = 1e-12, rtol = 0 })
    assert.are.equal(2, m.num_batches_tracked:item())
  end)

  it("passes gradcheck for input, weight and bias in training and in eval", function()
    attn.manual_seed(2)
    for _, training in ipairs { true, false } do
      local m = nn.BatchNorm2d(2, { dtype = "float64" })
      m.running_var:copy_(attn.tensor({ 0.5, 2 }, "float64"))
      m:train(training)
      attn.no_grad(function()
        m.weight:copy_(attn.randn({ 2 }, "float64"))
        m.bias:copy_(attn.randn({ 2 }, "float64"))
      end)
      local x = helper.param({ 3, 2, 2, 3 })
      helper.gradcheck(function(a) return m(a) end, { x, m.weight, m.bias })
    end
  end)

  it("without affine or running statistics: plain batch normalisation in both modes", function()
    attn.manual_seed(3)
    local m = nn.BatchNorm2d(2, { affine = false, track_running_stats = false, eps = 1e-3, dtype = "float64" })
    assert.is_nil(m.weight)
    assert.is_nil(m.running_mean)
    local x = attn.randn({ 2, 2, 3, 3 }, "float64")
    local mean, var = channel_stats(x)
    local e = normalise(x, mean, var, 1e-3)
    assert.close(m(x), e, { atol = 1e-12, rtol = 0 })
    m:eval()
    assert.close(m(x), e, { atol = 1e-12, rtol = 0 })
  end)

  it("has PyTorch's state-dict keys and repr, runs float32, and raises naming the shapes", function()
    local m = nn.BatchNorm2d(4)
    local keys = {}
    for k in pairs(m:state_dict()) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.are.same({ "bias", "num_batches_tracked", "running_mean", "running_var", "weight" }, keys)
    assert.are.equal("BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)", tostring(m))
    local x = attn.randn({ 2, 4, 3, 3 })
    local mean, var = channel_stats(x:to("float64"))
    assert.close(m(x), normalise(x:to("float64"), mean, var, 1e-5), { atol = 1e-5, rtol = 1e-5 })
    assert.error_matches(function() m(attn.randn({ 2, 3, 3, 3 })) end,
      "BatchNorm2d: input [2x3x3x3] must be (N, 4, H, W)", 1, true)
    assert.error_matches(function() m(attn.randn({ 2, 4, 3 })) end,
      "BatchNorm2d: input [2x4x3] must be (N, 4, H, W)", 1, true)
    assert.error_matches(function() m(attn.randn({ 1, 4, 1, 1 })) end,
      "BatchNorm2d: training needs more than one value per channel, got input [1x4x1x1]", 1, true)
    assert.has_error(function() nn.BatchNorm2d(0) end, "BatchNorm2d: num_features must be a positive integer, got 0")
  end)
end)
