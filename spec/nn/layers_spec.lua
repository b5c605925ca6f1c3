-- Identity, GELU and BatchNorm1d against closed forms, the book's numbers and
-- PyTorch's documented running-statistics rule.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn

-- erf by its Maclaurin series (converges for the |x| <= 4 used here), in double.
local function erf(x)
  local sum, term, n = 0, x, 0
  repeat
    local add = term / (2 * n + 1)
    sum = sum + add
    n = n + 1
    term = -term * x * x / n
  until math.abs(add) < 1e-17 and n > 5
  return 2 / math.sqrt(math.pi) * sum
end

describe("nn.Identity", function()
  it("returns its input", function()
    local x = attn.randn({ 2, 3 })
    assert.equal(x, nn.Identity()(x, "ignored"))
  end)
end)

describe("nn.GELU", function()
  it("matches x * Phi(x) from a series erf, and the tanh form", function()
    local xs = { -4, -2.5, -1, -0.3, 0, 0.2, 1, 1.7, 3, 4 }
    local want, want_tanh = {}, {}
    for i, x in ipairs(xs) do
      want[i] = x * 0.5 * (1 + erf(x / math.sqrt(2)))
      local e2 = math.exp(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3))
      want_tanh[i] = 0.5 * x * (1 + (e2 - 1) / (e2 + 1))
    end
    local x = attn.tensor(xs, "float64")
    assert.close(nn.GELU()(x), want, { atol = 5e-7, rtol = 0 })
    assert.close(nn.GELU({ approximate = "tanh" })(x), want_tanh, { atol = 1e-12 })
    assert.error_matches(function() nn.GELU({ approximate = "erf" }) end, "approximate must be 'none' or 'tanh'", nil,
      true)
  end)

  it("passes gradcheck away from the kink of |x| at 0", function()
    local x = attn.tensor({ { -2, -0.7, 0.4 }, { 1.1, 2.5, -0.1 } }, "float64"):requires_grad_(true)
    helper.gradcheck(function(v) return nn.GELU()(v) end, { x })
  end)
end)

describe("nn.BatchNorm1d", function()
  it("gives the book's [[-1, -1], [1, 1]] where LayerNorm gives [[-1, 1], [-1, 1]]", function()
    local X = attn.tensor({ { 1, 2 }, { 2, 3 } })
    assert.close(nn.BatchNorm1d(2)(X), { { -1, -1 }, { 1, 1 } }, { atol = 1e-4 })
    assert.close(nn.LayerNorm(2)(X), { { -1, 1 }, { -1, 1 } }, { atol = 1e-4 })
  end)

  it("tracks running statistics in training and uses them in eval, with PyTorch's state dict", function()
    local bn = nn.BatchNorm1d(3, { momentum = 0.5 })
    assert.same({ "weight", "bias", "running_mean", "running_var", "num_batches_tracked" }, bn:state_dict_keys())
    assert.same({}, bn.num_batches_tracked:shape())
    local rows = { { 1, 0, 2 }, { 3, 4, 2 }, { 5, 2, 8 }, { 7, 6, 4 } }
    local X = attn.tensor(rows, "float64")
    bn:to("float64")
    bn(X)
    -- per column: mean and unbiased variance by hand
    local mean, var = {}, {}
    for c = 1, 3 do
      local s, s2 = 0, 0
      for r = 1, 4 do s = s + rows[r][c] end
      mean[c] = s / 4
      for r = 1, 4 do s2 = s2 + (rows[r][c] - mean[c]) ^ 2 end
      var[c] = s2 / 3
    end
    local rm, rv = {}, {}
    for c = 1, 3 do rm[c], rv[c] = 0.5 * mean[c], 0.5 + 0.5 * var[c] end
    assert.close(bn.running_mean, rm, { atol = 1e-12 })
    assert.close(bn.running_var, rv, { atol = 1e-12 })
    assert.equal(1, bn.num_batches_tracked:item())
    -- eval: (x - running_mean) / sqrt(running_var + eps)
    bn:eval()
    local y = bn(attn.tensor({ { 1, 1, 1 } }, "float64")):totable()[1]
    for c = 1, 3 do assert.near((1 - rm[c]) / math.sqrt(rv[c] + 1e-5), y[c], 1e-12) end
    assert.equal(1, bn.num_batches_tracked:item()) -- eval does not count
  end)

  it("normalises (N, C, L) per channel over N and L and checks shapes", function()
    local bn = nn.BatchNorm1d(2)
    local X = attn.randn({ 3, 2, 4 }) * 3 + 1
    local Y = bn(X)
    local per_channel = Y:transpose(2, 3):reshape({ -1, 2 })
    assert.close(per_channel:mean(1), { 0, 0 }, { atol = 1e-5 })
    assert.close(per_channel:square():mean(1), { 1, 1 }, { atol = 1e-3 })
    assert.error_matches(function() bn(attn.ones({ 3, 4 })) end, "BatchNorm1d: input [3x4] must be (N, 2)", nil, true)
    assert.error_matches(function() bn(attn.ones({ 1, 2 })) end, "more than one value per channel", nil, true)
  end)
end)
