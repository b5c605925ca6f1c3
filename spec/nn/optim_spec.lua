-- Optimizers against update sequences computed here with plain Lua numbers
-- (the PyTorch formulas written out per element), plus convergence,
-- skipping, state_dict round trips, memory and argument validation.
local attn = require "attn"
local helper = require "helper"

-- Fixed gradients for three steps of a 3-element parameter.
local X0 = { 1.0, -2.0, 0.5 }
local GRADS = {
  { 0.5, -1.0, 2.0 },
  { 0.25, 0.75, -1.5 },
  { -0.4, 0.1, 0.3 },
}

local function copy(list)
  local c = {}
  for i, v in ipairs(list) do c[i] = v end
  return c
end

-- ---------------------------------------------------------------- scalar references

-- SGD per element: d = g + wd*x; buf = d on the first step, else
-- mom*buf + (1 - damp)*d; d = nesterov and d + mom*buf or buf; x = x - lr*d.
local function sgd_reference(x0, grads, h)
  local x, buf, history = copy(x0), {}, {}
  local lr, mom, damp, wd = h.lr, h.momentum or 0, h.dampening or 0, h.weight_decay or 0
  for step, g in ipairs(grads) do
    for i = 1, #x do
      local d = g[i] + wd * x[i]
      if mom ~= 0 then
        if buf[i] == nil then
          buf[i] = d
        else
          buf[i] = mom * buf[i] + (1 - damp) * d
        end
        if h.nesterov then d = d + mom * buf[i] else d = buf[i] end
      end
      x[i] = x[i] - lr * d
    end
    history[step] = copy(x)
  end
  return history
end

-- Adam per element with bias-corrected moments; decoupled = AdamW.
local function adam_reference(x0, grads, h, decoupled)
  local x, m, v, history = copy(x0), {}, {}, {}
  local lr, eps, wd = h.lr or 1e-3, h.eps or 1e-8, h.weight_decay or (decoupled and 1e-2 or 0)
  local b1, b2 = (h.betas or {})[1] or 0.9, (h.betas or {})[2] or 0.999
  for t, g in ipairs(grads) do
    for i = 1, #x do
      local gi = g[i]
      if decoupled then
        x[i] = x[i] * (1 - lr * wd)
      else
        gi = gi + wd * x[i]
      end
      m[i] = b1 * (m[i] or 0) + (1 - b1) * gi
      v[i] = b2 * (v[i] or 0) + (1 - b2) * gi * gi
      local m_hat = m[i] / (1 - b1 ^ t)
      local v_hat = v[i] / (1 - b2 ^ t)
      x[i] = x[i] - lr * m_hat / (math.sqrt(v_hat) + eps)
    end
    history[t] = copy(x)
  end
  return history
end

-- Runs `make(params)` over a float64 copy of X0 with GRADS; returns the
-- parameter after each step.
local function run(make, dtype)
  local p = attn.tensor(X0, { dtype = dtype or "float64", requires_grad = true })
  local opt = make { p }
  local history = {}
  for step, g in ipairs(GRADS) do
    p.grad = attn.tensor(g, dtype or "float64")
    opt:step()
    history[step] = p:totable()
  end
  return history, p, opt
end

local function assert_history(actual, expected, tol)
  assert.are.equal(#expected, #actual)
  for step = 1, #expected do
    local ok, msg = helper.compare(actual[step], expected[step], tol or { atol = 1e-12, rtol = 1e-12 })
    assert(ok, "step " .. step .. ": " .. tostring(msg))
  end
end

-- A parameter, its optimizer and a loop of `steps` steps on given gradients.
local function steps(opt, p, grads)
  for _, g in ipairs(grads) do
    p.grad = attn.tensor(g, p:dtype())
    opt:step()
  end
end

-- PyTorch's torch.optim.Adam/AdamW step (_single_tensor_adam, PyTorch >= 1.13), per element:
--     grad = -grad if maximize
--     AdamW: param = param * (1 - lr * weight_decay);  Adam: grad = grad + weight_decay * param
--     exp_avg = beta1 * exp_avg + (1 - beta1) * grad
--     exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad^2
--     bias_correction1 = 1 - beta1^t;  bias_correction2 = 1 - beta2^t
--     amsgrad: max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq)
--              denom = sqrt(max_exp_avg_sq) / sqrt(bias_correction2) + eps
--     else:    denom = sqrt(exp_avg_sq) / sqrt(bias_correction2) + eps
--     param = param - (lr / bias_correction1) * exp_avg / denom
local function adam_pytorch(x0, grads, h, decoupled)
  local x, m, v, vmax, history = copy(x0), {}, {}, {}, {}
  local lr, eps, wd = h.lr or 1e-3, h.eps or 1e-8, h.weight_decay or (decoupled and 1e-2 or 0)
  local b1, b2 = (h.betas or {})[1] or 0.9, (h.betas or {})[2] or 0.999
  for t, g in ipairs(grads) do
    for i = 1, #x do
      local gi = h.maximize and -g[i] or g[i]
      if decoupled then x[i] = x[i] * (1 - lr * wd) else gi = gi + wd * x[i] end
      m[i] = b1 * (m[i] or 0) + (1 - b1) * gi
      v[i] = b2 * (v[i] or 0) + (1 - b2) * gi * gi
      local bc1, bc2 = 1 - b1 ^ t, 1 - b2 ^ t
      local denom
      if h.amsgrad then
        vmax[i] = math.max(vmax[i] or 0, v[i])
        denom = math.sqrt(vmax[i]) / math.sqrt(bc2) + eps
      else
        denom = math.sqrt(v[i]) / math.sqrt(bc2) + eps
      end
      x[i] = x[i] - (lr / bc1) * m[i] / denom
    end
    history[t] = copy(x)
  end
  return history, vmax
end

-- PyTorch's SGD (_single_tensor_sgd, >= 1.13): d = -grad if maximize, then as sgd_reference.
local function sgd_pytorch(x0, grads, h)
  if not h.maximize then return sgd_reference(x0, grads, h) end
  local neg = {}
  for s, g in ipairs(grads) do
    neg[s] = {}
    for i, gi in ipairs(g) do neg[s][i] = -gi end
  end
  return sgd_reference(x0, neg, h)
end

-- Gradients whose second moments shrink (large, then small), so amsgrad's maximum matters.
local SHRINKING = {
  { 2.0, -3.0, 1.5 },
  { 0.1, 0.05, -0.2 },
  { 0.01, -0.02, 0.03 },
  { -0.05, 0.01, 0.02 },
}

local function run_on(make, grads, dtype)
  local p = attn.tensor(X0, { dtype = dtype, requires_grad = true })
  local opt = make { p }
  local history = {}
  for step, g in ipairs(grads) do
    p.grad = attn.tensor(g, dtype)
    opt:step()
    history[step] = p:totable()
  end
  return history, p, opt
end

describe("optim amsgrad and maximize against PyTorch's algorithm", function()
  local adam_cases = {
    { "Adam amsgrad", { lr = 0.1, amsgrad = true, betas = { 0.9, 0.5 } } },
    { "Adam amsgrad, L2", { lr = 0.05, amsgrad = true, weight_decay = 0.1, betas = { 0.8, 0.9 } } },
    { "Adam maximize", { lr = 0.1, maximize = true, weight_decay = 0.1 } },
    { "Adam amsgrad maximize", { lr = 0.1, amsgrad = true, maximize = true, eps = 1e-3, betas = { 0.9, 0.6 } } },
    { "AdamW amsgrad maximize", { lr = 0.1, amsgrad = true, maximize = true, weight_decay = 0.2, betas = { 0.9, 0.5 } },
      true },
  }
  for _, dtype in ipairs { "float64", "float32" } do
    local tol = dtype == "float64" and { atol = 1e-12, rtol = 1e-12 } or { atol = 1e-5, rtol = 1e-5 }
    for _, fused in ipairs { true, false } do
      for _, case in ipairs(adam_cases) do
        local name, h, decoupled = case[1], case[2], case[3]
        it(string.format("%s, %s, fused = %s", name, dtype, tostring(fused)), function()
          local kind = decoupled and "AdamW" or "Adam"
          local actual, _, opt = run_on(function(ps)
            return attn.optim[kind](ps, helper.with(h, { fused = fused }))
          end, SHRINKING, dtype)
          local expected, vmax = adam_pytorch(X0, SHRINKING, h, decoupled)
          assert_history(actual, expected, tol)
          if h.amsgrad then
            assert.is_true(helper.compare(opt.state[1].max_exp_avg_sq, vmax, tol))
          else
            assert.is_nil(opt.state[1].max_exp_avg_sq)
          end
        end)
      end
      for _, h in ipairs { { lr = 0.1, maximize = true }, { lr = 0.1, maximize = true, weight_decay = 0.1, momentum = 0.9 },
        { lr = 0.05, maximize = true, momentum = 0.8, nesterov = true, weight_decay = 0.02 } } do
        it(string.format("SGD %s, %s, fused = %s", require("cjson").encode(h), dtype, tostring(fused)), function()
          local actual = run_on(function(ps) return attn.optim.SGD(ps, helper.with(h, { fused = fused })) end,
            SHRINKING, dtype)
          assert_history(actual, sgd_pytorch(X0, SHRINKING, h), tol)
        end)
      end
    end
  end

  it("amsgrad changes the steps once the second moment shrinks (the case is not vacuous)", function()
    local with = adam_pytorch(X0, SHRINKING, { lr = 0.1, amsgrad = true, betas = { 0.9, 0.5 } })
    local without = adam_pytorch(X0, SHRINKING, { lr = 0.1, betas = { 0.9, 0.5 } })
    assert.are.same(with[1], without[1])
    assert.is_true(math.abs(with[4][1] - without[4][1]) > 1e-3)
  end)

  it("maximize ascends: f = sum(x^2) grows", function()
    local p = attn.tensor({ 1.0, -2.0 }, { dtype = "float64", requires_grad = true })
    local opt = attn.optim.Adam({ p }, { lr = 0.1, maximize = true })
    local before = (p * p):sum():item()
    for _ = 1, 5 do
      opt:zero_grad()
      ;(p * p):sum():backward()
      opt:step()
    end
    assert.is_true((p * p):sum():item() > before)
  end)

  it("refuses amsgrad or maximize that are not booleans", function()
    local p = attn.zeros({ 2 })
    assert.error_matches(function() attn.optim.Adam({ p }, { amsgrad = 1 }) end, "Adam: amsgrad must be a boolean")
    assert.error_matches(function() attn.optim.SGD({ p }, { lr = 1, maximize = "yes" }) end,
      "SGD: maximize must be a boolean")
  end)
end)

-- ---------------------------------------------------------------- SGD

describe("optim.SGD", function()
  local cases = {
    { "plain", { lr = 0.1 } },
    { "momentum", { lr = 0.1, momentum = 0.9 } },
    { "momentum with dampening", { lr = 0.05, momentum = 0.8, dampening = 0.3 } },
    { "nesterov", { lr = 0.1, momentum = 0.9, nesterov = true } },
    { "weight decay", { lr = 0.1, weight_decay = 0.01 } },
    { "momentum, nesterov and weight decay", { lr = 0.2, momentum = 0.5, nesterov = true, weight_decay = 0.1 } },
  }
  for _, case in ipairs(cases) do
    it("matches the hand-computed update sequence: " .. case[1], function()
      local h = case[2]
      local actual = run(function(params)
        local opts = {}
        for k, v in pairs(h) do opts[k] = v end
        opts.params = params
        return attn.optim.SGD(opts)
      end)
      assert_history(actual, sgd_reference(X0, GRADS, h))
    end)
  end

  it("works on float32 parameters, keeping the dtype", function()
    local h = { lr = 0.1, momentum = 0.9 }
    local actual, p, opt = run(function(params)
      return attn.optim.SGD { params = params, lr = h.lr, momentum = h.momentum }
    end, "float32")
    assert_history(actual, sgd_reference(X0, GRADS, h), { atol = 1e-6, rtol = 1e-5 })
    assert.are.equal("float32", p:dtype())
    assert.are.equal("float32", opt:state_dict().state[1].momentum_buffer:dtype())
  end)

  it("first momentum step equals plain SGD (buffer starts at the gradient)", function()
    local a = run(function(params) return attn.optim.SGD { params = params, lr = 0.1 } end)
    local b = run(function(params)
      return attn.optim.SGD { params = params, lr = 0.1, momentum = 0.9, dampening = 0.5 }
    end)
    helper.assert_close(b[1], a[1], { atol = 1e-15, rtol = 0 })
  end)

  it("minimises (x - 3)^2 through autograd", function()
    local x = attn.tensor({ 0.0, 10.0 }, { dtype = "float64", requires_grad = true })
    local opt = attn.optim.SGD { params = { x }, lr = 0.1, momentum = 0.5 }
    for _ = 1, 200 do
      opt:zero_grad()
      local loss = (x - 3):square():sum()
      loss:backward()
      opt:step()
    end
    helper.assert_close(x, { 3, 3 }, { atol = 1e-8 })
  end)
end)

-- ---------------------------------------------------------------- Adam / AdamW

describe("optim.Adam", function()
  local cases = {
    { "defaults", {} },
    { "custom betas, large lr", { lr = 0.1, betas = { 0.8, 0.99 } } },
    { "eps outside the square root", { lr = 0.05, eps = 0.1 } },
    { "L2 weight decay", { lr = 0.01, weight_decay = 0.1 } },
    { "beta1 = 0", { lr = 0.01, betas = { 0, 0.5 } } },
  }
  for _, case in ipairs(cases) do
    it("matches the hand-computed update sequence: " .. case[1], function()
      local h = case[2]
      local actual = run(function(params)
        return attn.optim.Adam { params = params, lr = h.lr, betas = h.betas, eps = h.eps,
          weight_decay = h.weight_decay }
      end)
      assert_history(actual, adam_reference(X0, GRADS, h, false))
    end)
  end

  it("first step moves each element by lr * g / (|g| + eps)", function()
    local actual = run(function(params) return attn.optim.Adam { params = params, lr = 0.1 } end)
    local expected = {}
    for i, x in ipairs(X0) do
      local g = GRADS[1][i]
      expected[i] = x - 0.1 * g / (math.abs(g) + 1e-8)
    end
    helper.assert_close(actual[1], expected, { atol = 1e-12 })
  end)

  it("works on float32 parameters with float32 moments", function()
    local h = { lr = 0.01 }
    local actual, _, opt = run(function(params) return attn.optim.Adam { params = params, lr = h.lr } end, "float32")
    assert_history(actual, adam_reference(X0, GRADS, h, false), { atol = 1e-6, rtol = 1e-5 })
    local st = opt:state_dict().state[1]
    assert.are.equal("float32", st.exp_avg:dtype())
    assert.are.equal("float32", st.exp_avg_sq:dtype())
    assert.are.equal(3, st.step)
  end)

  it("follows gradients from autograd (loss = sum(c * x^2))", function()
    local c = { 1.0, 0.5, 2.0 }
    local x = attn.tensor(X0, { dtype = "float64", requires_grad = true })
    local ct = attn.tensor(c, "float64")
    local opt = attn.optim.Adam { params = { x }, lr = 0.05 }
    local ref, m, v = copy(X0), { 0, 0, 0 }, { 0, 0, 0 }
    for t = 1, 4 do
      opt:zero_grad()
      local loss = (ct * x:square()):sum()
      loss:backward()
      opt:step()
      for i = 1, 3 do
        local g = 2 * c[i] * ref[i]
        m[i] = 0.9 * m[i] + 0.1 * g
        v[i] = 0.999 * v[i] + 0.001 * g * g
        ref[i] = ref[i] - 0.05 * (m[i] / (1 - 0.9 ^ t)) / (math.sqrt(v[i] / (1 - 0.999 ^ t)) + 1e-8)
      end
    end
    helper.assert_close(x, ref, { atol = 1e-12 })
  end)

  it("minimises (x - 3)^2", function()
    local x = attn.tensor({ 0.0, 5.0, -4.0 }, { dtype = "float64", requires_grad = true })
    local opt = attn.optim.Adam { params = { x }, lr = 0.1 }
    for _ = 1, 1000 do
      opt:zero_grad()
      local loss = (x - 3):square():sum()
      loss:backward()
      opt:step()
    end
    helper.assert_close(x, { 3, 3, 3 }, { atol = 1e-3 })
  end)

  it("leaves the parameters as autograd leaves (updates are not recorded)", function()
    local x = attn.tensor({ 1.0, 2.0 }, { requires_grad = true })
    local opt = attn.optim.Adam { params = { x }, lr = 0.1 }
    local loss = (x * x):sum()
    loss:backward()
    assert.is_true(attn.is_grad_enabled())
    opt:step()
    assert.is_nil(x.grad_fn)
    assert.is_true(x.requires_grad)
    assert.is_true(attn.is_grad_enabled())
  end)
end)

describe("optim.AdamW", function()
  local cases = {
    { "default weight decay 0.01", { lr = 0.1 } },
    { "weight decay 0.5, custom betas", { lr = 0.05, weight_decay = 0.5, betas = { 0.7, 0.95 } } },
    { "no weight decay equals Adam", { lr = 0.05, weight_decay = 0 } },
  }
  for _, case in ipairs(cases) do
    it("matches the hand-computed update sequence: " .. case[1], function()
      local h = case[2]
      local actual = run(function(params)
        return attn.optim.AdamW { params = params, lr = h.lr, betas = h.betas, weight_decay = h.weight_decay }
      end)
      assert_history(actual, adam_reference(X0, GRADS, h, true))
    end)
  end

  it("decouples the decay: differs from Adam's L2 term", function()
    local h = { lr = 0.05, weight_decay = 0.5 }
    local w = run(function(params) return attn.optim.AdamW { params = params, lr = h.lr, weight_decay = 0.5 } end)
    local l2 = run(function(params) return attn.optim.Adam { params = params, lr = h.lr, weight_decay = 0.5 } end)
    assert.is_false((helper.compare(w[3], l2[3], { atol = 1e-6 })))
  end)
end)

-- ---------------------------------------------------------------- shared behaviour

describe("optimizers", function()
  local makers = {
    SGD = function(params) return attn.optim.SGD { params = params, lr = 0.1, momentum = 0.9, weight_decay = 0.01 } end,
    ["SGD maximize"] = function(params)
      return attn.optim.SGD { params = params, lr = 0.1, momentum = 0.9, weight_decay = 0.01, maximize = true }
    end,
    ["Adam amsgrad maximize"] = function(params)
      return attn.optim.Adam { params = params, lr = 0.1, weight_decay = 0.01, amsgrad = true, maximize = true }
    end,
    Adam = function(params) return attn.optim.Adam { params = params, lr = 0.1, weight_decay = 0.01 } end,
    AdamW = function(params) return attn.optim.AdamW { params = params, lr = 0.1 } end,
  }

  for name, make in pairs(makers) do
    describe(name, function()
      it("zero_grad sets every grad to nil", function()
        local a = attn.tensor({ 1.0, 2.0 }, { requires_grad = true })
        local b = attn.tensor({ 3.0 }, { requires_grad = true })
        local opt = make { a, b }
        local loss = (a * a):sum() + (b * b):sum()
        loss:backward()
        assert.is_not_nil(a.grad)
        assert.is_not_nil(b.grad)
        opt:zero_grad()
        assert.is_nil(a.grad)
        assert.is_nil(b.grad)
      end)

      it("skips parameters whose grad is nil, leaving value and state alone", function()
        local a = attn.tensor({ 1.0, 2.0 }, { dtype = "float64", requires_grad = true })
        local b = attn.tensor({ 3.0, 4.0, 5.0 }, { dtype = "float64", requires_grad = true })
        local opt = make { a, b }
        a.grad = attn.tensor({ 0.5, 0.5 }, "float64")
        opt:step()
        opt:step()
        assert.are.same({ 3.0, 4.0, 5.0 }, b:totable())
        assert.are_not.same({ 1.0, 2.0 }, a:totable())
        local s = opt:state_dict()
        assert.are.equal(2, s.state[1].step)
        assert.is_nil(s.state[2])
      end)

      it("counts steps per parameter (a late parameter starts its own count)", function()
        local a = attn.tensor({ 1.0 }, { dtype = "float64", requires_grad = true })
        local b = attn.tensor({ 1.0 }, { dtype = "float64", requires_grad = true })
        local opt = make { a, b }
        a.grad = attn.tensor({ 0.3 }, "float64")
        opt:step()
        b.grad = attn.tensor({ 0.3 }, "float64")
        opt:step()
        -- b's first step equals a's first step from the same start
        local fresh = attn.tensor({ 1.0 }, { dtype = "float64", requires_grad = true })
        local opt2 = make { fresh }
        fresh.grad = attn.tensor({ 0.3 }, "float64")
        opt2:step()
        assert.are.same(fresh:totable(), b:totable())
        assert.are.equal(2, opt:state_dict().state[1].step)
        assert.are.equal(1, opt:state_dict().state[2].step)
      end)

      it("state_dict round trip resumes identically", function()
        local more = { { 0.3, -0.2, 0.1 }, { -0.5, 0.4, 0.9 } }
        local p = attn.tensor(X0, { dtype = "float64", requires_grad = true })
        local opt = make { p }
        steps(opt, p, GRADS)
        local saved_value = p:totable()
        local snapshot = opt:state_dict()
        assert.are.equal(3, snapshot.steps)
        -- carry on without interruption
        steps(opt, p, more)
        local uninterrupted = p:totable()
        -- a fresh optimizer with other hyper-parameters, restored from the snapshot
        local q = attn.tensor(saved_value, { dtype = "float64", requires_grad = true })
        local restored = make { q }
        restored.lr = 123
        restored:load_state_dict(snapshot)
        assert.are.equal(0.1, restored.lr)
        steps(restored, q, more)
        assert.are.same(uninterrupted, q:totable())
        -- the snapshot did not follow the original's later steps, so it loads again
        local r = attn.tensor(saved_value, { dtype = "float64", requires_grad = true })
        local again = make { r }
        again:load_state_dict(snapshot)
        steps(again, r, more)
        assert.are.same(uninterrupted, r:totable())
      end)

      it("resumes identically from a checkpoint file (flatten_state + attn.save/load)", function()
        local more = { { 0.3, -0.2, 0.1 }, { -0.5, 0.4, 0.9 } }
        local p = attn.tensor(X0, { dtype = "float64", requires_grad = true })
        local opt = make { p }
        steps(opt, p, GRADS)
        local saved_value = p:totable()
        local tensors, meta = attn.optim.flatten_state(opt:state_dict())
        for _, v in pairs(meta) do assert.are.equal("string", type(v)) end
        steps(opt, p, more)
        local uninterrupted = p:totable()

        local path = os.tmpname()
        assert(attn.save(path, tensors, meta))
        local loaded, loaded_meta = assert(attn.load(path))
        os.remove(path)
        local q = attn.tensor(saved_value, { dtype = "float64", requires_grad = true })
        local restored = make { q }
        restored:load_state_dict(attn.optim.unflatten_state(loaded, loaded_meta))
        assert.are.same(opt.betas, restored.betas)
        assert.are.equal(math.type(opt.lr), math.type(restored.lr))
        steps(restored, q, more)
        assert.are.same(uninterrupted, q:totable())
      end)

      it("load_state_dict rejects a mismatched state", function()
        local p = attn.tensor({ 1.0, 2.0 }, { requires_grad = true })
        local opt = make { p }
        p.grad = attn.tensor { 1.0, 1.0 }
        opt:step()
        local s = opt:state_dict()
        local other = make { attn.tensor({ 1.0, 2.0, 3.0 }, { requires_grad = true }) }
        local oname = name:match("^%S+") -- "SGD maximize" is an SGD
        assert.error_matches(function() other:load_state_dict(s) end, oname .. "%.load_state_dict: .*%[2%].*%[3%]")
        local two = make { attn.tensor { 1.0, 2.0 }, attn.tensor { 3.0 } }
        assert.error_matches(function() two:load_state_dict(s) end, "state has 1 params, optimizer has 2")
        local kind = oname == "SGD" and attn.optim.Adam { params = { p } } or attn.optim.SGD { params = { p }, lr = 1 }
        assert.error_matches(function() kind:load_state_dict(s) end, "state is for optimizer '" .. oname .. "'")
        assert.error_matches(function() opt:load_state_dict(42) end, "expected a table, got a number")
      end)

      it("keeps live memory flat over many steps", function()
        local p = attn.randn({ 64, 64 }):requires_grad_()
        local opt = make { p }
        p.grad = attn.randn { 64, 64 }
        opt:step()
        local live = attn.memory()
        for _ = 1, 50 do
          opt:step()
          assert.is_true(attn.memory() <= live)
        end
      end)

      it("rejects a grad of the wrong shape before changing anything", function()
        local a = attn.tensor({ 1.0, 2.0 }, { requires_grad = true })
        local b = attn.tensor({ 1.0, 2.0 }, { requires_grad = true })
        local opt = make { a, b }
        a.grad = attn.tensor { 1.0, 1.0 }
        b.grad = attn.tensor { 1.0, 1.0, 1.0 }
        assert.error_matches(function() opt:step() end,
          name:match("^%S+") .. "%.step: params%[2%] is float32 %[2%] but its grad is float32 %[3%]")
        assert.are.same({ 1.0, 2.0 }, a:totable())
      end)
    end)
  end
end)

-- ---------------------------------------------------------------- validation

describe("optimizer argument validation", function()
  local p = attn.tensor({ 1.0 }, { requires_grad = true })
  local cases = {
    { function() attn.optim.SGD { params = { p } } end, "SGD: lr is required" },
    { function() attn.optim.SGD { params = { p }, lr = -0.1 } end, "SGD: lr must be >= 0, got %-0.1" },
    { function() attn.optim.SGD { params = { p }, lr = "fast" } end, "SGD: lr must be a number, got string" },
    { function() attn.optim.SGD { params = { p }, lr = 0.1, momentum = -1 } end, "SGD: momentum must be >= 0" },
    { function() attn.optim.SGD { params = { p }, lr = 0.1, weight_decay = -1 } end, "SGD: weight_decay must be >= 0" },
    { function() attn.optim.SGD { params = { p }, lr = 0.1, nesterov = true } end,
      "SGD: nesterov requires momentum > 0 and dampening = 0" },
    { function() attn.optim.SGD { params = { p }, lr = 0.1, momentum = 0.9, dampening = 0.1, nesterov = true } end,
      "SGD: nesterov requires momentum > 0 and dampening = 0" },
    { function() attn.optim.SGD { params = {}, lr = 0.1 } end,
      "SGD: params must be a non%-empty list of tensors, got an empty list" },
    { function() attn.optim.SGD { lr = 0.1 } end, "SGD: params must be a non%-empty list of tensors, got a nil" },
    { function() attn.optim.SGD { params = p, lr = 0.1 } end, "SGD: params must be .*got a tensor" },
    { function() attn.optim.SGD { params = { p, 3 }, lr = 0.1 } end,
      "SGD: params%[2%] must be a tensor, got a number" },
    { function() attn.optim.SGD { params = { p, p }, lr = 0.1 } end,
      "SGD: params%[2%] is the same tensor as params%[1%]" },
    { function() attn.optim.SGD { params = { p }, lr = 0.1, momentun = 0.9 } end, "SGD: unknown option 'momentun'" },
    { function() attn.optim.SGD(nil) end, "SGD: expected a table of options" },
    { function() attn.optim.Adam { params = { p }, lr = -1 } end, "Adam: lr must be >= 0, got %-1" },
    { function() attn.optim.Adam { params = { p }, betas = { 1.0, 0.999 } } end,
      "Adam: betas%[1%] must be a number in %[0, 1%), got 1.0" },
    { function() attn.optim.Adam { params = { p }, betas = { 0.9, -0.1 } } end,
      "Adam: betas%[2%] must be a number in %[0, 1%), got %-0.1" },
    { function() attn.optim.Adam { params = { p }, betas = 0.9 } end, "Adam: betas must be a table" },
    { function() attn.optim.Adam { params = { p }, eps = -1e-8 } end, "Adam: eps must be >= 0" },
    { function() attn.optim.Adam { params = {} } end, "Adam: params must be a non%-empty list" },
    { function() attn.optim.AdamW { params = { p }, weight_decay = -0.01 } end, "AdamW: weight_decay must be >= 0" },
    { function() attn.optim.AdamW { params = { p }, betas = { 0.9, 1 } } end,
      "AdamW: betas%[2%] must be a number in %[0, 1%)" },
    { function() attn.optim.AdamW { params = { p }, amsgrads = true } end, "AdamW: unknown option 'amsgrads'" },
  }
  for i, case in ipairs(cases) do
    it("case " .. i .. ": " .. case[2]:gsub("%%", ""), function()
      assert.error_matches(case[1], case[2])
    end)
  end

  it("accepts PyTorch's call form Adam(params, {lr = ...}) with the same result as the table form", function()
    local forms = {
      SGD = { { lr = 0.1, momentum = 0.9 } },
      Adam = { { lr = 0.05, betas = { 0.8, 0.9 } }, {} },
      AdamW = { { lr = 0.05, weight_decay = 0.1 } },
    }
    for name, option_sets in pairs(forms) do
      for _, opts in ipairs(option_sets) do
        local a = attn.tensor({ 1.0, -2.0 }, { dtype = "float64", requires_grad = true })
        local b = attn.tensor({ 1.0, -2.0 }, { dtype = "float64", requires_grad = true })
        local table_form = { params = { a } }
        for k, v in pairs(opts) do table_form[k] = v end
        local oa = attn.optim[name](table_form)
        local ob = next(opts) and attn.optim[name]({ b }, opts) or attn.optim[name]({ b })
        assert.is_nil(opts.params) -- the caller's options table is not modified
        for step = 1, 3 do
          a.grad = attn.tensor({ step, 0.5 }, "float64")
          b.grad = attn.tensor({ step, 0.5 }, "float64")
          oa:step()
          ob:step()
        end
        assert.are_not.same({ 1.0, -2.0 }, b:totable())
        assert.are.same(a:totable(), b:totable())
      end
    end
    assert.error_matches(function() attn.optim.Adam({ p }, { params = { p } }) end,
      "Adam: params given twice %(as the first argument and in the options%)")
    assert.error_matches(function() attn.optim.SGD({ p }, 0.1) end,
      "SGD: options must be a table like {lr = 0.01}, got a number")
    assert.error_matches(function() attn.optim.SGD(p, { lr = 0.1 }) end, "SGD: params must be .*got a tensor")
    assert.error_matches(function() attn.optim.SGD({ p }, { lr = 0.1, mom = 1 }) end, "SGD: unknown option 'mom'")
    assert.error_matches(function() attn.optim.SGD({ p }) end, "SGD: lr is required")
  end)

  it("rechecks hyper-parameters assigned after construction", function()
    local opt = attn.optim.Adam { params = { p } }
    opt.lr = -1
    assert.error_matches(function() opt:step() end, "Adam: lr must be >= 0")
  end)

  it("accepts lr = 0 (no change) and the documented defaults", function()
    local x = attn.tensor({ 1.0, 2.0 }, { requires_grad = true })
    local opt = attn.optim.SGD { params = { x }, lr = 0 }
    x.grad = attn.tensor { 1.0, 1.0 }
    opt:step()
    assert.are.same({ 1.0, 2.0 }, x:totable())
    local adam = attn.optim.Adam { params = { x } }
    assert.are.equal(1e-3, adam.lr)
    assert.are.same({ 0.9, 0.999 }, adam.betas)
    assert.are.equal(1e-8, adam.eps)
    assert.are.equal(0, adam.weight_decay)
    assert.are.equal(1e-2, attn.optim.AdamW({ params = { x } }).weight_decay)
  end)
end)
