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

  it("sums grads of many blocks the same on any thread count, as the composed path", function()
    -- 2 x 65536 + 7 and 65536 entries: the C pass cuts tensors into blocks of 65536 summed over
    -- the worker pool, then adds them in order
    attn.manual_seed(5)
    local function params()
      local ps = { attn.zeros(2 * 65536 + 7), attn.zeros(256, 256), attn.zeros(5) }
      ps[1].grad, ps[2].grad, ps[3].grad = attn.randn(2 * 65536 + 7), attn.randn(256, 256), attn.randn(5)
      return ps
    end
    local ps = params()
    local threads, norms = attn.get_num_threads(), {}
    for n = 1, 3 do
      attn.set_num_threads(n)
      norms[n] = clip.clip_grad_norm_(clone_grads(ps), 1e30)
    end
    attn.set_num_threads(threads)
    assert.are.equal(norms[1], norms[2])
    assert.are.equal(norms[1], norms[3])
    local composed = clip.clip_grad_norm_composed(clone_grads(ps), 1e30)
    assert.is_true(math.abs(norms[1] - composed) <= 1e-12 * composed, norms[1] .. " vs " .. composed)
    -- the scaling (one pool job over the list) is each grad's own mul by max_norm / (norm + 1e-6)
    for n = 1, 3 do
      attn.set_num_threads(n)
      local qs = clone_grads(ps)
      clip.clip_grad_norm_(qs, 2)
      for i = 1, 3 do helper.assert_identical(qs[i].grad, ps[i].grad * (2 / (norms[1] + 1e-6))) end
    end
    attn.set_num_threads(threads)
  end)

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

-- PyTorch's torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type):
--     total = (sum over every grad entry x of |x|^p)^(1/p)       (p = inf: max |x|)
--     clip_coef = max_norm / (total + 1e-6)
--     every grad *= min(clip_coef, 1)                            (a no-op when clip_coef >= 1)
--     returns total
-- and clip_grad_value_(params, v): every grad entry clamped to [-v, v].
-- The expected values below are these formulas over the entries in plain Lua numbers.
local function lua_pnorm(ps, p)
  local total = 0
  for _, q in ipairs(ps) do
    if q.grad then
      for _, x in ipairs(helper.flatten({ q.grad:totable() })) do
        if p == math.huge then
          total = math.max(total, math.abs(x))
        else
          total = total + math.abs(x) ^ p
        end
      end
    end
  end
  return p == math.huge and total or total ^ (1 / p)
end

local function grads_table(ps)
  local out = {}
  for i, q in ipairs(ps) do out[i] = q.grad and helper.flatten({ q.grad:totable() }) end
  return out
end

describe("nn.clip_grad_norm_ against PyTorch's formula", function()
  for _, p in ipairs { 2, 1, 3, 0.5, math.huge } do
    for _, max_norm in ipairs { 0.5, 1e6 } do
      it(string.format("norm_type %s, max_norm %g: the total norm, then grads * max_norm / (norm + 1e-6)", p,
        max_norm), function()
        local ps = make_params(1)
        local before = grads_table(ps)
        local qs = clone_grads(ps)
        local expected = lua_pnorm(ps, p)
        local n1 = clip.clip_grad_norm_(ps, max_norm, p)
        local n2 = clip.clip_grad_norm_composed(qs, max_norm, p)
        assert.is_true(math.abs(n1 - expected) <= 1e-12 * expected, n1 .. " vs " .. expected)
        assert.is_true(math.abs(n2 - expected) <= 1e-12 * expected, n2 .. " vs " .. expected)
        local coef = max_norm / (expected + 1e-6)
        if coef > 1 then coef = 1 end
        local after, after_ref = grads_table(ps), grads_table(qs)
        for i = 1, 3 do
          local tol = ps[i].grad:dtype() == "float64" and 1e-14 or 1e-6
          for j, x in ipairs(before[i]) do
            local want = x * coef
            assert.is_true(math.abs(after[i][j] - want) <= tol * math.abs(want) + 1e-300,
              string.format("grad %d[%d]: %.17g vs %.17g", i, j, after[i][j], want))
            assert.is_true(math.abs(after_ref[i][j] - want) <= tol * math.abs(want) + 1e-300)
          end
        end
        assert.is_nil(ps[4].grad)
      end)
    end
  end

  it("divides by norm + 1e-6: a norm of exactly max_norm is still scaled, by max_norm / (max_norm + 1e-6)", function()
    local a = attn.zeros({ 2 }, "float64")
    a.grad = attn.tensor({ 3, 4 }, "float64")
    assert.equal(5, clip.clip_grad_norm_({ a }, 5))
    assert.same({ 3 * 5 / (5 + 1e-6), 4 * 5 / (5 + 1e-6) }, a.grad:totable())
  end)

  it("takes 'inf' as math.huge, and a float32 grad's inf norm exactly", function()
    local a = attn.zeros({ 3 })
    a.grad = attn.tensor({ -7, 2, 5 })
    assert.equal(7, clip.clip_grad_norm_({ a }, 100, "inf"))
    assert.equal(7, clip.clip_grad_norm_({ a }, 100, math.huge))
  end)

  it("refuses a norm_type that is not > 0, and raises on a non-finite norm when asked", function()
    local a = attn.zeros({ 2 })
    a.grad = attn.tensor({ 1, 0 / 0 })
    for _, bad in ipairs { 0, -1, "two" } do
      assert.error_matches(function() clip.clip_grad_norm_({ a }, 1, bad) end, "norm_type must be a number > 0")
    end
    assert.error_matches(function() clip.clip_grad_norm_({ a }, 1, 2, true) end, "error_if_nonfinite")
    -- without it, as PyTorch: the coefficient is NaN and so is every grad
    local n = clip.clip_grad_norm_({ a }, 1)
    assert.is_true(n ~= n)
    assert.is_true(a.grad:totable()[1] ~= a.grad:totable()[1])
  end)
end)

describe("nn.clip_grad_value_", function()
  for _, dtype in ipairs { "float32", "float64" } do
    it("clamps every grad entry to [-v, v] in place (" .. dtype .. "), as the composed path", function()
      attn.manual_seed(5)
      local ps = { attn.zeros({ 4, 5 }, dtype), attn.zeros({ 6 }, dtype), attn.zeros({ 2 }, dtype) }
      ps[1].grad = attn.randn({ 4, 5 }, dtype) * 2
      ps[2].grad = (attn.randn({ 3, 2 }, dtype) * 2):transpose(1, 2):reshape({ 6 })
      local qs = clone_grads(ps)
      local before = grads_table(ps)
      assert.is_nil(attn.nn.clip_grad_value_(ps, 0.75))
      clip.clip_grad_value_composed(qs, 0.75)
      local after = grads_table(ps)
      for i = 1, 2 do
        for j, x in ipairs(before[i]) do
          local want = math.max(-0.75, math.min(0.75, x))
          assert.equal(want, after[i][j])
        end
        helper.assert_identical(ps[i].grad:contiguous(), qs[i].grad:contiguous())
      end
      assert.is_nil(ps[3].grad)
    end)
  end

  it("accepts a module and refuses a negative clip value", function()
    local m = attn.nn.Linear(3, 2)
    m(attn.ones({ 2, 3 }) * 100):sum():backward()
    attn.nn.clip_grad_value_(m, 0.5)
    for _, p in ipairs(m:parameters()) do
      for _, x in ipairs(helper.flatten({ p.grad:totable() })) do assert.is_true(math.abs(x) <= 0.5) end
    end
    assert.error_matches(function() attn.nn.clip_grad_value_(m, -1) end, "clip_value must be a non%-negative number")
  end)
end)
