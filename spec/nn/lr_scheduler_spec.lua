-- attn.optim.lr_scheduler against closed forms written here, with PyTorch's
-- step counting: constructing a scheduler takes the first step (last_epoch
-- 0, opt.lr = the rate at epoch 0); each sched:step() moves to the next epoch.
-- So lrs[e + 1] below is opt.lr after construction and e steps, and the
-- closed forms (PyTorch's _get_closed_form_lr) are, with base = the initial lr:
--     StepLR:            base * gamma^floor(e / step_size)
--     MultiStepLR:       base * gamma^(number of milestones <= e)
--     ExponentialLR:     base * gamma^e
--     LambdaLR:          base * f(e)
--     CosineAnnealingLR: eta_min + (base - eta_min) * (1 + cos(pi e / T_max)) / 2
--     LinearLR:          base * (start + (end - start) * min(e, total_iters) / total_iters)
--     NoamLR:            factor * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5), s = e + 1
--     SequentialLR:      schedulers[k] at epoch e - milestones[k - 1], restarted at 0 at its milestone
-- The steps compute the recursive (chainable) forms, as PyTorch's step() does;
-- they equal the closed forms up to rounding.
local attn = require "attn"

local sched = attn.optim.lr_scheduler

local function new_opt(lr)
  return attn.optim.SGD({ attn.zeros({ 2 }, "float64") }, { lr = lr or 0.1, momentum = 0.9 })
end

-- opt.lr after construction and after each of n steps.
local function lrs(s, opt, n)
  local out = { opt.lr }
  for _ = 1, n do
    s:step()
    out[#out + 1] = opt.lr
  end
  return out
end

local function assert_seq(actual, closed, rtol)
  for e = 0, #actual - 1 do
    local want = closed(e)
    assert(math.abs(actual[e + 1] - want) <= (rtol or 1e-13) * math.abs(want) + 1e-300,
      string.format("epoch %d: lr %.17g, closed form %.17g", e, actual[e + 1], want))
  end
end

local cases = {
  { "StepLR", function(o) return sched.StepLR(o, { step_size = 3, gamma = 0.5 }) end,
    function(e) return 0.1 * 0.5 ^ (e // 3) end },
  { "StepLR positional", function(o) return sched.StepLR(o, 4) end, function(e) return 0.1 * 0.1 ^ (e // 4) end },
  { "MultiStepLR", function(o) return sched.MultiStepLR(o, { milestones = { 7, 2, 7 }, gamma = 0.3 }) end,
    function(e) return 0.1 * 0.3 ^ ((e >= 2 and 1 or 0) + (e >= 7 and 2 or 0)) end },
  { "ExponentialLR", function(o) return sched.ExponentialLR(o, { gamma = 0.9 }) end,
    function(e) return 0.1 * 0.9 ^ e end },
  { "LambdaLR", function(o) return sched.LambdaLR(o, function(e) return 1 / (1 + e) end) end,
    function(e) return 0.1 / (1 + e) end },
  { "CosineAnnealingLR", function(o) return sched.CosineAnnealingLR(o, { T_max = 5, eta_min = 0.01 }) end,
    function(e) return 0.01 + (0.1 - 0.01) * (1 + math.cos(math.pi * e / 5)) / 2 end },
  { "LinearLR warmup", function(o) return sched.LinearLR(o, { start_factor = 0.25, total_iters = 4 }) end,
    function(e) return 0.1 * (0.25 + 0.75 * math.min(e, 4) / 4) end },
  { "LinearLR decay", function(o) return sched.LinearLR(o, { start_factor = 1, end_factor = 0.2, total_iters = 6 }) end,
    function(e) return 0.1 * (1 - 0.8 * math.min(e, 6) / 6) end },
  { "NoamLR", function(o) return sched.NoamLR(o, { d_model = 512, warmup_steps = 4 }) end,
    function(e) return 512 ^ -0.5 * math.min((e + 1) ^ -0.5, (e + 1) * 4 ^ -1.5) end },
  { "SequentialLR warmup + cosine", function(o)
    return sched.SequentialLR(o, { schedulers = { sched.LinearLR(o, { start_factor = 0.1, total_iters = 3 }),
      sched.CosineAnnealingLR(o, { T_max = 6 }) }, milestones = { 3 } })
  end, function(e)
    if e < 3 then return 0.1 * (0.1 + 0.9 * e / 3) end
    return 0.1 * (1 + math.cos(math.pi * (e - 3) / 6)) / 2
  end },
  { "SequentialLR exponential, step, exponential", function(o)
    return sched.SequentialLR(o, { schedulers = { sched.ExponentialLR(o, 0.5), sched.StepLR(o, 2),
      sched.ExponentialLR(o, 0.9) }, milestones = { 2, 5 } })
  end, function(e)
    if e < 2 then return 0.1 * 0.5 ^ e end
    if e < 5 then return 0.1 * 0.1 ^ ((e - 2) // 2) end
    return 0.1 * 0.9 ^ (e - 5)
  end },
}

describe("attn.optim.lr_scheduler", function()
  for _, case in ipairs(cases) do
    local name, make, closed = case[1], case[2], case[3]
    it(name .. ": construction sets the epoch-0 rate; each step follows the closed form", function()
      local opt = new_opt()
      local s = make(opt)
      assert.equal(0, s.last_epoch)
      local seq = lrs(s, opt, 20)
      assert_seq(seq, closed)
      assert.equal(20, s.last_epoch)
      assert.same({ opt.lr }, s:get_last_lr())
    end)

    it(name .. ": state_dict / load_state_dict mid-run continues identically", function()
      local opt = new_opt()
      local s = make(opt)
      lrs(s, opt, 7)
      local saved_opt, saved_s = opt:state_dict(), s:state_dict()
      local rest = lrs(s, opt, 9)
      local opt2 = new_opt(0.5)
      local s2 = make(opt2)
      lrs(s2, opt2, 2) -- somewhere else entirely
      opt2:load_state_dict(saved_opt)
      s2:load_state_dict(saved_s)
      assert.equal(7, s2.last_epoch)
      assert.same(rest, lrs(s2, opt2, 9))
    end)
  end

  it("CosineAnnealingLR's recursive steps are PyTorch's, exactly, and stay on the closed form past T_max", function()
    local opt = new_opt()
    local s = sched.CosineAnnealingLR(opt, { T_max = 4, eta_min = 0.02 })
    local seq = lrs(s, opt, 16)
    -- PyTorch's get_lr, step by step in plain Lua numbers
    local lr, base, eta, T = 0.1, 0.1, 0.02, 4
    for e = 1, 16 do
      if (e - 1 - T) % (2 * T) == 0 then
        lr = lr + (base - eta) * (1 - math.cos(math.pi / T)) / 2
      else
        lr = (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T)) * (lr - eta) + eta
      end
      assert.equal(lr, seq[e + 1])
    end
    assert_seq(seq, function(e) return eta + (base - eta) * (1 + math.cos(math.pi * e / T)) / 2 end, 1e-12)
  end)

  it("NoamLR rises linearly to its peak at warmup_steps, then falls as 1/sqrt(step)", function()
    local opt = new_opt()
    local seq = lrs(sched.InverseSqrtLR(opt, { d_model = 64, warmup_steps = 10, factor = 2 }), opt, 40)
    local peak = 2 * 64 ^ -0.5 * 10 ^ -0.5
    assert.is_true(math.abs(seq[10] - peak) < 1e-15)
    for e = 1, 9 do assert.is_true(seq[e] < seq[e + 1]) end
    for e = 10, 40 do assert.is_true(seq[e + 1] < seq[e]) end
    assert.is_true(math.abs(seq[40] * math.sqrt(40) - 2 * 64 ^ -0.5) < 1e-15)
  end)

  it("state_dict copies a table reached twice once, and a cycle without looping (make fuzz, seed 20261122)", function()
    local s = sched.StepLR(new_opt(), { step_size = 3, gamma = 0.5 })
    local shared = { 1, 2 }
    shared.self = shared
    s.extra_a, s.extra_b = shared, shared
    local d = s:state_dict()
    assert.are.equal(d.extra_a, d.extra_b)
    assert.are.equal(d.extra_a, d.extra_a.self)
    assert.are_not.equal(shared, d.extra_a)
    assert.are.same({ 1, 2 }, { d.extra_a[1], d.extra_a[2] })
  end)

  it("the optimizer steps with the scheduled rate", function()
    local p = attn.tensor({ 1.0 }, "float64")
    local opt = attn.optim.SGD({ p }, { lr = 1 })
    local s = sched.StepLR(opt, { step_size = 1, gamma = 0.5 })
    local expected = 1
    for k = 0, 3 do
      p.grad = attn.tensor({ 1.0 }, "float64")
      opt:step()
      expected = expected - 0.5 ^ k
      s:step()
    end
    assert.equal(expected, p:totable()[1])
  end)

  it("the first scheduler on an optimizer records initial_lr; later ones take it as base", function()
    local opt = new_opt(0.2)
    sched.ExponentialLR(opt, 0.5):step()
    assert.equal(0.2, opt.initial_lr)
    local s = sched.StepLR(opt, 2)
    assert.same({ 0.2 }, s.base_lrs)
  end)

  it("refuses bad options and state, naming the scheduler and argument", function()
    local opt = new_opt()
    assert.error_matches(function() sched.StepLR(opt, { step_size = 0 }) end, "StepLR: step_size must be an integer >= 1")
    assert.error_matches(function() sched.StepLR(opt, { step = 2 }) end, "StepLR: unknown option 'step'")
    assert.error_matches(function() sched.StepLR({}, 2) end, "StepLR: optimizer must be an attn.optim optimizer")
    assert.error_matches(function() sched.LambdaLR(opt, 3) end, "LambdaLR: lr_lambda must be a function")
    assert.error_matches(function() sched.LinearLR(opt, { start_factor = 0 }) end, "start_factor must be a number in")
    assert.error_matches(function() sched.NoamLR(opt, { d_model = 0 }) end, "NoamLR: d_model must be a number > 0")
    assert.error_matches(function()
      sched.SequentialLR(opt, { schedulers = { sched.StepLR(opt, 2) }, milestones = { 3 } })
    end, "SequentialLR: expected 0 milestones")
    local s = sched.StepLR(opt, 2)
    assert.error_matches(function() s:load_state_dict(sched.ExponentialLR(new_opt(), 0.5):state_dict()) end,
      "StepLR.load_state_dict: expected the state of a StepLR, got a ExponentialLR")
  end)
end)
