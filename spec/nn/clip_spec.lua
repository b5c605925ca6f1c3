-- clip_grad_norm_'s two C passes against its composed path and a norm
-- summed here in plain Lua numbers.
local attn = require "attn"
local helper = require "helper"
local clip = require "attn.nn.clip"

-- Parameters with grads of both dtypes, one strided, one huge, one missing.
local function make_params(scale)
  attn.manual_seed(11)
  local ps = {}
  for i, spec in ipairs { { { 7, 5 }, "float32" }, { { 33 }, "float64" }, { { 4, 6 }, "float32" }, { { 3 }, "float32" } } do
    ps[i] = attn.zeros(spec[1], spec[2])
    ps[i].grad = attn.randn(spec[1], spec[2]) * scale
  end
  ps[3].grad = (attn.randn({ 6, 4 }) * scale):transpose(1, 2)
  ps[4].grad = nil
  return ps
end

local function lua_norm(ps)
  local total = 0
  for _, p in ipairs(ps) do
    if p.grad then
      for _, x in ipairs(helper.flatten({ p.grad:totable() })) do total = total + x * x end
    end
  end
  return math.sqrt(total)
end

local function clone_grads(ps)
  local qs = {}
  for i, p in ipairs(ps) do
    qs[i] = attn.zeros(p:shape(), p:dtype())
    qs[i].grad = p.grad and p.grad:clone()
  end
  return qs
end

describe("nn.clip_grad_norm_ (fused)", function()
  for _, scale in ipairs { 0.01, 1, 1e20 } do
    it("gives the composed path's norm and scaled grads, grads of scale " .. scale, function()
      local ps = make_params(scale)
      assert.is_false(ps[3].grad:is_contiguous())
      local qs = clone_grads(ps)
      local expected = lua_norm(ps)
      local n1 = clip.clip_grad_norm_(ps, 1)
      local n2 = clip.clip_grad_norm_composed(qs, 1)
      assert.is_true(math.abs(n1 - expected) <= 1e-12 * expected, n1 .. " vs " .. expected)
      assert.is_true(math.abs(n1 - n2) <= 1e-12 * n2)
      for i = 1, 3 do
        local tol = ps[i].grad:dtype() == "float64" and 1e-12 or 1e-6
        assert.is_true(helper.compare(ps[i].grad, qs[i].grad, { rtol = tol, atol = 0 }), "grad " .. i)
      end
      assert.is_nil(ps[4].grad)
      if expected > 1 then
        assert.is_true(math.abs(lua_norm(ps) - 1) < 1e-6, "clipped norm " .. lua_norm(ps))
      end
    end)
  end

  it("leaves grads under the threshold bit for bit", function()
    local ps = make_params(0.01)
    local before = clone_grads(ps)
    clip.clip_grad_norm_(ps, 1e6)
    for i = 1, 3 do helper.assert_identical(ps[i].grad:contiguous(), before[i].grad:contiguous()) end
  end)

  it("returns 0 and changes nothing when no parameter has a grad", function()
    assert.are.equal(0, clip.clip_grad_norm_({ attn.zeros(3) }, 1))
  end)

  it("refuses a grad that is not a tensor", function()
    assert.has_error(function() attn.core.grads_norm({ attn.ones(2), 3 }) end, "grads_norm: tensors[2] is not a tensor")
    assert.has_error(function() attn.core.grads_norm({ attn.ones(2, "int64") }) end)
  end)
end)
