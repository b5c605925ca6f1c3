-- The fused optimizer updates (one C pass per parameter) against the composed
-- tensor-op path they replace: the same bits, step after step, for every
-- option that changes the arithmetic, in both float dtypes.
local attn = require "attn"
local helper = require "helper"

local optim = attn.optim

-- Five steps of `kind` with `opts` on the same parameters and gradients,
-- once fused and once composed; returns both parameter lists and optimizers.
local function run_both(kind, opts, dtype)
  attn.manual_seed(7)
  local shapes = { { 5, 7 }, { 13 }, { 3, 2, 4 } }
  local ps, qs = {}, {}
  for i, s in ipairs(shapes) do
    ps[i] = attn.randn(s, dtype)
    qs[i] = ps[i]:clone()
  end
  local o1 = optim[kind](ps, helper.with(opts, { fused = true }))
  local o2 = optim[kind](qs, helper.with(opts, { fused = false }))
  for step = 1, 5 do
    for i, s in ipairs(shapes) do
      -- a parameter without a gradient at step 3 keeps its state untouched
      local g = (i ~= 2 or step ~= 3) and attn.randn(s, dtype) * 3 or nil
      ps[i].grad, qs[i].grad = g, g and g:clone()
    end
    o1:step()
    o2:step()
  end
  return ps, qs, o1, o2
end

-- The same random grads on both lists, then one step of each optimizer.
local function step_both(ps, qs, o1, o2)
  for i = 1, #ps do
    local g = attn.randn(ps[i]:shape())
    ps[i].grad, qs[i].grad = g, g:clone()
  end
  o1:step()
  o2:step()
end

local cases = {
  { "Adam", { lr = 1e-2 } },
  { "Adam", { lr = 3e-2, betas = { 0.8, 0.99 }, eps = 1e-6, weight_decay = 0.1 } },
  { "AdamW", { lr = 1e-2 } },
  { "AdamW", { lr = 5e-2, weight_decay = 0.3, betas = { 0.5, 0.9 } } },
  { "SGD", { lr = 0.1 } },
  { "SGD", { lr = 0.1, weight_decay = 0.05 } },
  { "SGD", { lr = 0.1, momentum = 0.9 } },
  { "SGD", { lr = 0.1, momentum = 0.9, dampening = 0.3, weight_decay = 0.01 } },
  { "SGD", { lr = 0.05, momentum = 0.8, nesterov = true, weight_decay = 0.02 } },
  { "Adam", { lr = 1e-2, amsgrad = true } },
  { "Adam", { lr = 3e-2, maximize = true, weight_decay = 0.1 } },
  { "AdamW", { lr = 5e-2, amsgrad = true, maximize = true, weight_decay = 0.3 } },
  { "SGD", { lr = 0.1, maximize = true } },
  { "SGD", { lr = 0.1, momentum = 0.9, dampening = 0.3, weight_decay = 0.01, maximize = true } },
}

describe("fused optimizer steps", function()
  for _, dtype in ipairs { "float32", "float64" } do
    for _, case in ipairs(cases) do
      local kind, opts = case[1], case[2]
      local label = kind .. " " .. require("cjson").encode(opts) .. " " .. dtype
      it("give the composed path's bits over five steps: " .. label, function()
        local ps, qs, o1, o2 = run_both(kind, opts, dtype)
        for i = 1, #ps do helper.assert_identical(ps[i], qs[i]) end
        local s1, s2 = o1:state_dict(), o2:state_dict()
        for i, st in pairs(s2.state) do
          assert.are.equal(st.step, s1.state[i].step)
          for k, v in pairs(st) do
            if attn.is_tensor(v) then helper.assert_identical(s1.state[i][k], v) end
          end
        end
        -- and the update moved the parameters (the comparison is not vacuous)
        attn.manual_seed(7)
        assert.is_true((ps[1] - attn.randn({ 5, 7 }, dtype)):abs():max():item() > 1e-3)
      end)
    end
  end

  it("give the same bits on 1 and 3 threads (entries split over the pool)", function()
    local function run(n)
      attn.set_num_threads(n)
      attn.manual_seed(13)
      local p = attn.randn({ 300, 400 })
      local opt = optim.AdamW({ p }, { lr = 0.01 })
      for _ = 1, 3 do
        p.grad = attn.randn({ 300, 400 })
        opt:step()
      end
      return p
    end
    local p1 = run(1)
    local p3 = run(3)
    attn.set_num_threads(2)
    helper.assert_identical(p3, p1)
  end)

  it("update a list of parameters as one pool job: the composed path's bits on 1 and 3 threads", function()
    -- sizes below, at and past the pool's blocks (32768 entries); the last two parameters are
    -- views of one storage, which the core updates one after the other instead
    local function run(n, fused)
      attn.set_num_threads(n)
      attn.manual_seed(17)
      local shared = attn.randn(2 * 40000)
      local ps = { attn.randn(256), attn.randn(128, 256), attn.randn(300, 400), attn.randn(7),
        shared:narrow(1, 1, 40000), shared:narrow(1, 40001, 40000) }
      local opt = optim.Adam(ps, { lr = 0.01, fused = fused })
      for _ = 1, 3 do
        for _, p in ipairs(ps) do p.grad = attn.randn(p:shape()) end
        opt:step()
      end
      return ps
    end
    local want = run(1, false)
    for _, n in ipairs { 1, 3 } do
      local got = run(n, true)
      for i = 1, #want do helper.assert_identical(got[i], want[i]) end
    end
    attn.set_num_threads(2)
  end)

  it("allocate nothing once the state exists", function()
    local p = attn.randn({ 64, 64 })
    p.grad = attn.randn({ 64, 64 })
    for _, opt in ipairs { optim.Adam({ p }), optim.SGD({ p }, { lr = 0.1, momentum = 0.9, weight_decay = 0.1 }) } do
      opt:step()
      collectgarbage()
      local before = attn.memory()
      attn.core.peak_memory(true)
      opt:step()
      assert.are.equal(before, attn.core.peak_memory())
    end
  end)

  it("leave a non-contiguous parameter to the composed path, with the same result", function()
    local base = attn.randn({ 6, 4 })
    local p, q = base:clone():transpose(1, 2), base:clone():transpose(1, 2)
    assert.is_false(p:is_contiguous())
    local g = attn.randn({ 4, 6 })
    p.grad, q.grad = g, g:clone()
    local o1, o2 = optim.Adam({ p }, { lr = 0.1 }), optim.Adam({ q }, { lr = 0.1, fused = false })
    o1:step()
    o2:step()
    helper.assert_identical(p:contiguous(), q:contiguous())
  end)

  it("update every parameter in one call, leaving the non-contiguous ones to the composed path", function()
    -- a contiguous, a transposed and a contiguous parameter: the call updates
    -- 1 and 3, the composed path 2 (SGD's first momentum step included)
    for _, case in ipairs { { "Adam", { lr = 0.1, weight_decay = 0.1 } }, { "AdamW", { lr = 0.1 } },
      { "SGD", { lr = 0.1, momentum = 0.9, nesterov = true } }, { "SGD", { lr = 0.1 } } } do
      attn.manual_seed(3)
      local base = { attn.randn({ 3, 5 }), attn.randn({ 6, 4 }), attn.randn({ 7 }) }
      local function params()
        return { base[1]:clone(), base[2]:clone():transpose(1, 2), base[3]:clone() }
      end
      local ps, qs = params(), params()
      local o1 = optim[case[1]](ps, helper.with(case[2], { fused = true }))
      local o2 = optim[case[1]](qs, helper.with(case[2], { fused = false }))
      for _ = 1, 3 do step_both(ps, qs, o1, o2) end
      for i = 1, 3 do helper.assert_identical(ps[i]:contiguous(), qs[i]:contiguous()) end
      assert.are.equal(3, o1.state[2].step)
    end
  end)

  it("change nothing when one grad of the step is refused, and name it", function()
    local ps = { attn.randn({ 2 }), attn.randn({ 2 }), attn.randn({ 3 }) }
    local before = { ps[1]:clone(), ps[2]:clone(), ps[3]:clone() }
    for _, kind in ipairs { "Adam", "SGD" } do
      local opt = optim[kind](ps, { lr = 0.1, momentum = kind == "SGD" and 0.9 or nil })
      ps[1].grad, ps[2].grad, ps[3].grad = attn.ones({ 2 }), attn.ones({ 2 }), attn.ones({ 1, 3 })
      assert.has_error(function() opt:step() end,
        kind .. ".step: params[3] is float32 [3] but its grad is float32 [1x3]")
      ps[3].grad = "x"
      assert.has_error(function() opt:step() end, kind .. ".step: params[3].grad must be a tensor or nil, got a string")
      for i = 1, 3 do helper.assert_identical(ps[i], before[i]) end
      for i = 1, 3 do assert.same({ step = 0 }, opt.state[i] or { step = 0 }) end -- no buffer, no step counted
      -- the refused steps left no state behind: the next step is a first step
      local qs = { ps[1]:clone(), ps[2]:clone(), ps[3]:clone() }
      local ref = optim[kind](qs, { lr = 0.1, momentum = kind == "SGD" and 0.9 or nil, fused = false })
      step_both(ps, qs, opt, ref)
      for i = 1, 3 do helper.assert_identical(ps[i], qs[i]) end
      for i = 1, 3 do before[i] = ps[i]:clone() end
    end
  end)

  it("are refused by the multi-parameter core calls before any write", function()
    local core = attn.core
    local p, g, m, v = attn.zeros(4), attn.ones(4), attn.zeros(4), attn.zeros(4)
    local q = attn.zeros(2)
    local function adam(ps, gs, steps)
      return core.adam_steps(ps, gs, { m, attn.zeros(2) }, { v, attn.zeros(2) }, steps, 0.1, 0.9, 0.999, 1e-8, 0,
        false)
    end
    assert.has_error(function() adam({ p, q }, { g, attn.ones(2, 1) }, { 1, 1 }) end,
      "adam_steps: grad [2x1], the parameter [2] (parameter 2)")
    assert.has_error(function() adam({ p, q }, { g, attn.ones(2) }, { 1, 0 }) end,
      "adam_steps: step must be >= 1, got 0 (parameter 2)")
    assert.has_error(function() adam({ p, q }, { g }, { 1, 1 }) end, "adam_steps: grads has 1 entries, params 2")
    assert.has_error(function() adam({ p, q }, { g, 5 }, { 1, 1 }) end, "adam_steps: grads[2] is not a tensor")
    assert.has_error(function() adam({ p, q }, { g, attn.ones(2) }, { 1 }) end,
      "adam_steps: steps has 1 entries, params 2")
    assert.has_error(function() core.sgd_steps({ p }, { g }, { p }, { true }, 0.1, 0.9, 0, 0, false) end,
      "sgd_steps: operand 1 shares memory with operand 3 (parameter 1)")
    helper.assert_identical(p, attn.zeros(4)) -- the first parameter was not written either
    -- and the list of positions left to the caller
    local wide = attn.zeros(4, 2)
    local left = core.sgd_steps({ p, wide:select(2, 1) }, { g, g }, nil, nil, 0.5, 0, 0, 0, false)
    assert.same({ 2 }, left)
    helper.assert_identical(p, attn.full({ 4 }, -0.5))
    helper.assert_identical(wide, attn.zeros(4, 2))
    assert.is_nil(core.sgd_steps({ p }, { g }, nil, nil, 0.5, 0, 0, 0, false))
  end)

  it("refuse a fused option that is not a boolean", function()
    assert.has_error(function() optim.Adam({ attn.zeros(2) }, { fused = 1 }) end,
      "Adam: fused must be a boolean, got a number")
  end)

  it("are refused by the core on mismatched, strided or aliasing operands", function()
    local core = attn.core
    local p, g, m, v = attn.zeros(4), attn.ones(4), attn.zeros(4), attn.zeros(4)
    assert.has_error(function() core.adam_step(p, attn.ones(5), m, v, 0.1, 0.9, 0.999, 1e-8, 0, false, 1) end,
      "adam_step: operand 2 is float32 [5], the parameter float32 [4]")
    assert.has_error(function() core.adam_step(p, g, m, p, 0.1, 0.9, 0.999, 1e-8, 0, false, 1) end,
      "adam_step: operand 1 shares memory with operand 4")
    local wide = attn.zeros(4, 2)
    assert.has_error(function() core.sgd_step(wide:select(2, 1), g, nil, 0.1, 0, 0, 0, false, false) end,
      "sgd_step: operand 1 [4] is not contiguous")
    assert.has_error(function() core.adam_step(p, g, m, v, 0.1, 0.9, 0.999, 1e-8, 0, false, 0) end,
      "adam_step: step must be >= 1, got 0")
    assert.has_error(function() core.adam_step(attn.zeros(4, "int64"), g, m, v, 0.1, 0.9, 0.999, 1e-8, 0, false, 1) end)
  end)
end)
