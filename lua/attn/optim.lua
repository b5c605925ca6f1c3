--- Optimizers: SGD (momentum, dampening, Nesterov, L2 weight decay), Adam
-- (bias-corrected moments, L2 weight decay added to the gradient) and AdamW
-- (decoupled weight decay), with the update rules of PyTorch's `torch.optim`.
--
-- An optimizer holds a list of parameter tensors. `opt:step()` updates every
-- parameter whose `.grad` is set, in place and outside autograd; parameters
-- with `.grad == nil` are skipped (and their state is left untouched).
-- Moment buffers are tensors of the parameter's dtype and shape. The few
-- temporaries a step needs are released as soon as the step is done, so a
-- training loop stays flat in memory.
--
-- **Fused updates.** By default a step is one C call over every parameter
-- that has a gradient (`core.adam_steps`, `core.sgd_steps`; a step over the
-- Transformer's 64 parameters paid ~1.7 us of Lua and binding per parameter
-- with one call each), and each parameter's update is one pass that does
-- element by element the very float operations of the composed tensor-op
-- path, in the same order and dtype, so both give the same bits;
-- `{fused = false}` (PyTorch's option name) or `attn.nn.set_fused(false)`
-- (every fused path off) selects the composed path, which the specs compare
-- the fused one against. A fused update allocates nothing; a parameter, grad
-- or buffer that is not contiguous takes the composed path.
--
-- Hyper-parameters are plain fields (`opt.lr`, `opt.momentum`, `opt.betas`,
-- ...) read at every step, so a learning-rate schedule may assign `opt.lr`.
-- @module attn.optim
-- @usage
-- local opt = attn.optim.Adam(model:parameters(), {lr = 1e-3}) -- or Adam{params = ..., lr = 1e-3}
-- for _ = 1, steps do
--   opt:zero_grad()
--   local loss = criterion(model(x), y)
--   loss:backward()
--   opt:step()
-- end
local core = require "attn.core"
local autograd = require "attn.autograd"
local check = require "attn.check"
local fused_paths = require "attn.nn.fused"

local optim = {}

local is_tensor = autograd.is_tensor
local free = core.free

-- ---------------------------------------------------------------- validation
-- Validators return nil or an error message; the public entry points raise it
-- with level 2, so the error points at the caller's line.

local function params_error(name, params)
  if type(params) ~= "table" or is_tensor(params) then
    return string.format("%s: params must be a non-empty list of tensors, got a %s", name,
      is_tensor(params) and "tensor (wrap it in a table: {t})" or type(params))
  end
  local n = #params
  if n == 0 then return name .. ": params must be a non-empty list of tensors, got an empty list" end
  for k in pairs(params) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      return string.format("%s: params must be a list (array) of tensors; found key '%s'", name, tostring(k))
    end
  end
  local seen = {}
  for i = 1, n do
    local p = params[i]
    if not is_tensor(p) then return string.format("%s: params[%d] must be a tensor, got a %s", name, i, type(p)) end
    local dt = core.dtype(p)
    if dt ~= "float32" and dt ~= "float64" then
      return string.format("%s: params[%d] must be a floating tensor (float32 or float64), got %s", name, i, dt)
    end
    if seen[p] then return string.format("%s: params[%d] is the same tensor as params[%d]", name, i, seen[p]) end
    seen[p] = i
  end
end

local function options_error(name, opts, allowed)
  if type(opts) ~= "table" then
    return string.format("%s: expected a table of options like {params = ..., lr = ...}, got a %s", name, type(opts))
  end
  return check.unknown_option(name, opts, allowed)
end

-- Both call forms give one options table: PyTorch's Adam(params, {lr = ...})
-- (params first: a list or a tensor; the options optional) and the table
-- form Adam{params = ..., lr = ...}. Returns the table, or nil and a message.
local function call_options(name, a, b)
  local positional = b ~= nil or is_tensor(a) or (type(a) == "table" and a[1] ~= nil)
  if not positional then return a end
  if type(b) ~= "table" and b ~= nil then
    return nil, string.format("%s: options must be a table like {lr = 0.01}, got a %s", name, type(b))
  end
  local opts = {}
  for k, v in pairs(b or {}) do opts[k] = v end
  if opts.params ~= nil then
    return nil, string.format("%s: params given twice (as the first argument and in the options)", name)
  end
  opts.params = a
  return opts
end

-- A non-negative number, or the message saying why not.
local function nonneg_error(name, arg, v)
  if type(v) ~= "number" or v ~= v then
    return string.format("%s: %s must be a number, got %s", name, arg, type(v) == "number" and "nan" or type(v))
  end
  if v < 0 then return string.format("%s: %s must be >= 0, got %s", name, arg, tostring(v)) end
end

local function same_shape(a, b)
  local as, bs = core.shape(a), core.shape(b)
  if #as ~= #bs then return false end
  for d = 1, #as do
    if as[d] ~= bs[d] then return false end
  end
  return true
end

local shape_str = core.shape_str -- "[2x3]" from a tensor or a table of sizes

-- ---------------------------------------------------------------- shared methods

--- The methods every optimiser has (`attn.optim.Optimizer`, the base of SGD,
-- Adam and AdamW): `zero_grad`, `step`, `state_dict`, `load_state_dict`.
-- @type Optimizer
local Optimizer = {}
Optimizer.__index = Optimizer

--- Sets every parameter's `.grad` to nil.
function Optimizer:zero_grad()
  for _, p in ipairs(self.params) do p.grad = nil end
end

-- Empties the lists after a step: they must not keep the grads alive.
local function empty(b)
  local p, g, st, step, m, v, buf, first = b.p, b.g, b.st, b.step, b.m, b.v, b.buf, b.first
  local vmax = b.vmax
  for k = 1, b.n do
    p[k], g[k], st[k], step[k], m[k], v[k], buf[k], first[k] = nil, nil, nil, nil, nil, nil, nil, nil
    vmax[k] = nil
  end
  b.n = 0
end

-- The fused step's lists (entry k: parameter, grad, state, new step count,
-- buffers), kept between steps so that a step allocates no Lua tables (their
-- garbage made the next collection steps land in the optimizer).
function Optimizer:_lists()
  local b = self._batch
  if b == nil then
    b = { n = 0, p = {}, g = {}, st = {}, step = {}, m = {}, v = {}, buf = {}, first = {}, vmax = {} }
    self._batch = b
  end
  if b.n ~= 0 then empty(b) end -- a step that raised while gathering
  return b
end

-- Raises (at the caller of step) on the first grad that is not a tensor or
-- whose shape or dtype differs from its parameter's.
local function check_grads(self)
  for i, p in ipairs(self.params) do
    local g = p.grad
    if g ~= nil then
      if not is_tensor(g) then
        error(string.format("%s.step: params[%d].grad must be a tensor or nil, got a %s", self.name, i, type(g)), 3)
      end
      if not same_shape(p, g) or core.dtype(p) ~= core.dtype(g) then
        error(string.format("%s.step: params[%d] is %s %s but its grad is %s %s", self.name, i, core.dtype(p),
          shape_str(p), core.dtype(g), shape_str(g)), 3)
      end
    end
  end
end

--- Updates every parameter that has a gradient (one optimisation step).
-- Runs under attn.no_grad; the parameters are changed in place. All
-- gradients are checked before any parameter changes.
-- @raise when a hyper-parameter was set to an invalid value, or a grad's
--   shape or dtype differs from its parameter's
function Optimizer:step()
  local msg = self:_hyper_error()
  if msg then error(msg, 2) end
  -- the fused call checks every grad in C before it changes anything; only
  -- when it refuses does check_grads run, for the message naming params[i]
  local use_fused = fused_paths.choose(self, self.fused)
  if not use_fused then check_grads(self) end
  autograd.no_grad(function()
    -- fused: the parameters with grads gathered for one C call; a step
    -- count moves once the call has taken its parameter
    local batch = use_fused and self:_lists() or nil
    for i, p in ipairs(self.params) do
      local g = p.grad
      if g ~= nil then
        local st = self.state[i]
        if st == nil then
          st = { step = 0 }
          self.state[i] = st
        end
        if batch then
          local k = batch.n + 1
          batch.n, batch.p[k], batch.g[k], batch.st[k], batch.step[k] = k, p, g, st, st.step + 1
          self:_gather(batch, k, p, st)
        else
          st.step = st.step + 1
          self:_update(p, g, st)
        end
      end
    end
    if batch then
      local ok, left = pcall(self._fused_steps, self, batch)
      if not ok then
        empty(batch)
        check_grads(self)
        error(left, 0)
      end
      for k = 1, batch.n do self:_keep(batch, k) end
      if left then
        for _, k in ipairs(left) do self:_update_left(batch, k) end
      end
      empty(batch)
    end
  end)
  self.steps = self.steps + 1
end

local function copy_table(t)
  if type(t) ~= "table" then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = copy_table(v) end
  return c
end

--- A snapshot of the optimizer: hyper-parameters, step counts and copies of
-- the state tensors (Adam: `exp_avg`, `exp_avg_sq`; SGD: `momentum_buffer`),
-- keyed by the parameter's position in the list. Later steps do not change it.
-- @treturn table `{optimizer = name, steps = n, nparams = #params, hyper = {lr = ..., ...},
--   state = {[i] = {step = k, exp_avg = tensor, ...}}}`
function Optimizer:state_dict()
  local hyper = {}
  for _, k in ipairs(self.hyper_names) do hyper[k] = copy_table(self[k]) end
  local state = {}
  for i, st in pairs(self.state) do
    local s = {}
    for k, v in pairs(st) do s[k] = is_tensor(v) and core.clone(v) or v end
    state[i] = s
  end
  return { optimizer = self.name, steps = self.steps, nparams = #self.params, hyper = hyper, state = state }
end

-- The restored state table, or nil and a message.
local function restore_state(self, s)
  local name = self.name .. ".load_state_dict"
  if type(s) ~= "table" then return nil, string.format("%s: expected a table, got a %s", name, type(s)) end
  if s.optimizer ~= self.name then
    return nil, string.format("%s: state is for optimizer '%s', not %s", name, tostring(s.optimizer), self.name)
  end
  if s.nparams ~= nil and s.nparams ~= #self.params then
    return nil, string.format("%s: state has %s params, optimizer has %d", name, tostring(s.nparams), #self.params)
  end
  local state = {}
  for i, st in pairs(s.state or {}) do
    local p = self.params[i]
    if p == nil then return nil, string.format("%s: state for params[%s], which does not exist", name, tostring(i)) end
    if type(st) ~= "table" or math.type(st.step) ~= "integer" or st.step < 0 then
      return nil, string.format("%s: state of params[%d] has no integer step count", name, i)
    end
    local c = {}
    for k, v in pairs(st) do
      if is_tensor(v) then
        if not same_shape(p, v) then
          return nil, string.format("%s: %s of params[%d] is %s, param is %s", name, k, i, shape_str(v), shape_str(p))
        end
        v = core.dtype(v) == core.dtype(p) and core.clone(v) or core.to(v, core.dtype(p))
      end
      c[k] = v
    end
    state[i] = c
  end
  return state
end

--- Restores a snapshot from `state_dict` (of an optimizer of the same kind
-- over parameters of the same shapes, in the same order). The tensors are
-- copied, so `s` stays usable. Hyper-parameters are restored too, as in
-- PyTorch; assign `opt.lr` afterwards to override.
-- @tparam table s
-- @raise when the kind, the parameter count or a buffer's shape does not match
function Optimizer:load_state_dict(s)
  local state, msg = restore_state(self, s)
  if not state then error(msg, 2) end
  local saved = {}
  for _, k in ipairs(self.hyper_names) do saved[k] = self[k] end
  for k, v in pairs(s.hyper or {}) do
    if saved[k] ~= nil then self[k] = copy_table(v) end
  end
  msg = self:_hyper_error()
  if msg then
    for k, v in pairs(saved) do self[k] = v end
    error(self.name .. ".load_state_dict: " .. msg, 2)
  end
  self.state = state
  self.steps = s.steps or 0
end

-- fused: the option as given (nil means true), or nil and a message.
local function new_optimizer(class, name, opts, hyper_names)
  local fused = opts.fused
  if fused == nil then fused = true end
  if type(fused) ~= "boolean" then
    return nil, string.format("%s: fused must be a boolean, got a %s", name, type(fused))
  end
  local list = {}
  for i = 1, #opts.params do list[i] = opts.params[i] end
  return setmetatable({ name = name, params = list, state = {}, steps = 0, hyper_names = hyper_names,
    fused = fused }, class)
end


-- ---------------------------------------------------------------- SGD

local SGD = setmetatable({}, { __index = Optimizer })
SGD.__index = SGD

local sgd_options = { params = true, lr = true, momentum = true, dampening = true, weight_decay = true,
  nesterov = true, maximize = true, fused = true }

--- Stochastic gradient descent, as torch.optim.SGD (PyTorch >= 1.13, whose
-- `maximize` negates the gradient before the weight decay):
--
--     grad = -grad                                      (maximize)
--     g = grad + weight_decay * p
--     buf = g (first step), else buf = momentum * buf + (1 - dampening) * g
--     g = nesterov and g + momentum * buf or buf        (when momentum ~= 0)
--     p = p - lr * g
-- Call it as PyTorch does, `SGD(params, {lr = 0.1})`, or with one table,
-- `SGD{params = params, lr = 0.1}`.
-- @param params_or_opts the list of parameter tensors, or the options table with `params` in it
-- @tparam[opt] table opts `params` (list of tensors), `lr` (required, >= 0), `momentum` (0),
--   `dampening` (0), `weight_decay` (0), `nesterov` (false; needs momentum > 0 and dampening 0),
--   `maximize` (false: ascend the objective instead),
--   `fused` (true: one C pass per parameter; false: the composed path)
-- @treturn SGD
-- @raise on a missing or invalid argument, naming the optimizer and the argument
function optim.SGD(params_or_opts, opts)
  local msg
  opts, msg = call_options("SGD", params_or_opts, opts)
  msg = msg or options_error("SGD", opts, sgd_options) or params_error("SGD", opts.params)
  if msg then error(msg, 2) end
  if opts.lr == nil then error("SGD: lr is required", 2) end
  local self
  self, msg = new_optimizer(SGD, "SGD", opts, { "lr", "momentum", "dampening", "weight_decay", "nesterov",
    "maximize" })
  if not self then error(msg, 2) end
  self.lr = opts.lr
  self.momentum = opts.momentum or 0
  self.dampening = opts.dampening or 0
  self.weight_decay = opts.weight_decay or 0
  if opts.nesterov == nil then self.nesterov = false else self.nesterov = opts.nesterov end
  if opts.maximize == nil then self.maximize = false else self.maximize = opts.maximize end
  msg = self:_hyper_error()
  if msg then error(msg, 2) end
  return self
end

function SGD:_hyper_error()
  for _, k in ipairs { "lr", "momentum", "dampening", "weight_decay" } do
    local msg = nonneg_error("SGD", k, self[k])
    if msg then return msg end
  end
  for _, k in ipairs { "nesterov", "maximize" } do
    if type(self[k]) ~= "boolean" then return string.format("SGD: %s must be a boolean, got a %s", k, type(self[k])) end
  end
  if self.nesterov and (self.momentum <= 0 or self.dampening ~= 0) then
    return string.format("SGD: nesterov requires momentum > 0 and dampening = 0 (got momentum %s, dampening %s)",
      tostring(self.momentum), tostring(self.dampening))
  end
end

-- Fused step, per parameter k of the batch: its momentum buffer (a new one
-- is written whole by the kernel's first step). The state changes only in
-- _keep, once the call has succeeded.
function SGD:_gather(b, k, p, st)
  if self.momentum == 0 then return end
  local buf = st.momentum_buffer
  b.first[k] = buf == nil
  b.buf[k] = buf or core.empty(core.shape(p), core.dtype(p))
end

function SGD._keep(_, b, k)
  local st = b.st[k]
  st.step = b.step[k]
  if b.first[k] then st.momentum_buffer = b.buf[k] end
end

function SGD:_fused_steps(b)
  local mom = self.momentum ~= 0
  return core.sgd_steps(b.p, b.g, mom and b.buf or nil, mom and b.first or nil, self.lr, self.momentum, self.dampening,
    self.weight_decay, self.nesterov, self.maximize)
end

-- A parameter the kernel left (an operand not contiguous): the composed path,
-- which makes a new buffer itself.
function SGD:_update_left(b, k)
  if b.first[k] then b.st[k].momentum_buffer = nil end
  self:_update(b.p[k], b.g[k], b.st[k])
end


-- The reference path: whole-tensor ops, as torch.optim.SGD writes them.
function SGD:_update(p, g, st)
  local lr, mom, wd = self.lr, self.momentum, self.weight_decay
  local d -- d_p, a temporary we own
  local neg = self.maximize and core.neg(g) or nil
  if wd ~= 0 then
    d = core.mul(p, wd)
    d:add_(neg or g)
  else
    d = neg or core.clone(g)
  end
  if neg and neg ~= d then free(neg) end
  if mom ~= 0 then
    local buf = st.momentum_buffer
    if buf == nil then
      st.momentum_buffer = core.clone(d)
      buf = st.momentum_buffer
    else
      buf:mul_(mom)
      if self.dampening ~= 0 then
        local scaled = core.mul(d, 1 - self.dampening)
        buf:add_(scaled)
        free(scaled)
      else
        buf:add_(d)
      end
    end
    if self.nesterov then
      local ahead = core.mul(buf, mom)
      d:add_(ahead)
      free(ahead)
    else
      d:copy_(buf)
    end
  end
  p:sub_(d:mul_(lr))
  free(d)
end

-- ---------------------------------------------------------------- Adam / AdamW

local Adam = setmetatable({}, { __index = Optimizer })
Adam.__index = Adam

local adam_options = { params = true, lr = true, betas = true, eps = true, weight_decay = true, amsgrad = true,
  maximize = true, fused = true }

local function new_adam(name, params_or_opts, opts, default_wd)
  local msg
  opts, msg = call_options(name, params_or_opts, opts)
  msg = msg or options_error(name, opts, adam_options) or params_error(name, opts.params)
  if msg then return nil, msg end
  local self
  self, msg = new_optimizer(Adam, name, opts, { "lr", "betas", "eps", "weight_decay", "amsgrad", "maximize" })
  if not self then return nil, msg end
  self.decoupled = name == "AdamW"
  self.lr = opts.lr == nil and 1e-3 or opts.lr
  local betas = opts.betas or { 0.9, 0.999 }
  self.betas = type(betas) == "table" and { betas[1], betas[2] } or betas
  self.eps = opts.eps == nil and 1e-8 or opts.eps
  self.weight_decay = opts.weight_decay == nil and default_wd or opts.weight_decay
  if opts.amsgrad == nil then self.amsgrad = false else self.amsgrad = opts.amsgrad end
  if opts.maximize == nil then self.maximize = false else self.maximize = opts.maximize end
  msg = self:_hyper_error()
  if msg then return nil, msg end
  return self
end

function Adam:_hyper_error()
  local name = self.name
  for _, k in ipairs { "lr", "eps", "weight_decay" } do
    local msg = nonneg_error(name, k, self[k])
    if msg then return msg end
  end
  for _, k in ipairs { "amsgrad", "maximize" } do
    if type(self[k]) ~= "boolean" then return string.format("%s: %s must be a boolean, got a %s", name, k, type(self[k])) end
  end
  if type(self.betas) ~= "table" then
    return string.format("%s: betas must be a table {beta1, beta2}, got a %s", name, type(self.betas))
  end
  for j = 1, 2 do
    local b = self.betas[j]
    if type(b) ~= "number" or not (b >= 0 and b < 1) then
      return string.format("%s: betas[%d] must be a number in [0, 1), got %s", name, j, tostring(b))
    end
  end
end

--- Adam, as torch.optim.Adam. At step t:
--
--     g = -grad if maximize, else grad
--     g = g + weight_decay * p                         (L2, added to the gradient)
--     m = beta1 * m + (1 - beta1) * g
--     v = beta2 * v + (1 - beta2) * g^2
--     vmax = max(vmax, v), and v below reads vmax      (amsgrad; state `max_exp_avg_sq`)
--     p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
-- Call it as PyTorch does, `Adam(params, {lr = 0.005})`, or with one table,
-- `Adam{params = params, lr = 0.005}`.
-- @param params_or_opts the list of parameter tensors, or the options table with `params` in it
-- @tparam[opt] table opts `params` (list of tensors), `lr` (1e-3), `betas` ({0.9, 0.999}, each in [0, 1)),
--   `eps` (1e-8), `weight_decay` (0), `amsgrad` (false), `maximize` (false: ascend the objective),
--   `fused` (true: one C pass per parameter; false: the composed path)
-- @treturn Adam
-- @raise on an invalid argument, naming the optimizer and the argument
function optim.Adam(params_or_opts, opts)
  local self, msg = new_adam("Adam", params_or_opts, opts, 0)
  if not self then error(msg, 2) end
  return self
end

--- AdamW, as torch.optim.AdamW: Adam without the L2 term; each parameter is
-- decayed first, `p = p * (1 - lr * weight_decay)`. Same options as Adam,
-- but `weight_decay` defaults to 0.01 (PyTorch's default). Both call forms.
-- @param params_or_opts the list of parameter tensors, or the options table with `params` in it
-- @tparam[opt] table opts
-- @treturn Adam
-- @raise on an invalid argument, naming the optimizer and the argument
function optim.AdamW(params_or_opts, opts)
  local self, msg = new_adam("AdamW", params_or_opts, opts, 1e-2)
  if not self then error(msg, 2) end
  return self
end

-- The moment buffers of a parameter (new zero ones before its first step),
-- and amsgrad's running maximum of v (nil without amsgrad; zeros when amsgrad
-- was switched on after earlier steps, as at a first step).
local function moments(p, st, amsgrad)
  local m, v, vmax = st.exp_avg, st.exp_avg_sq, nil
  if m == nil then
    m = core.full(core.shape(p), 0, core.dtype(p))
    v = core.full(core.shape(p), 0, core.dtype(p))
  end
  if amsgrad then vmax = st.max_exp_avg_sq or core.full(core.shape(p), 0, core.dtype(p)) end
  return m, v, vmax
end

function Adam:_gather(b, k, p, st)
  b.m[k], b.v[k], b.vmax[k] = moments(p, st, self.amsgrad)
end

function Adam:_keep(b, k)
  local st = b.st[k]
  st.step, st.exp_avg, st.exp_avg_sq = b.step[k], b.m[k], b.v[k]
  if self.amsgrad then st.max_exp_avg_sq = b.vmax[k] end
end

function Adam:_fused_steps(b)
  return core.adam_steps(b.p, b.g, b.m, b.v, b.step, self.lr, self.betas[1], self.betas[2], self.eps,
    self.weight_decay, self.decoupled, self.maximize, self.amsgrad and b.vmax or nil)
end

function Adam:_update_left(b, k) self:_update(b.p[k], b.g[k], b.st[k]) end

function Adam:_update(p, g, st)
  local m, v, vmax = moments(p, st, self.amsgrad)
  st.exp_avg, st.exp_avg_sq = m, v
  if vmax then st.max_exp_avg_sq = vmax end
  self:_update_composed(p, g, m, v, st.step, vmax)
end

-- The reference path: whole-tensor ops, as torch.optim.Adam writes them.
function Adam:_update_composed(p, g, m, v, t, vmax)
  local lr, eps, wd = self.lr, self.eps, self.weight_decay
  local beta1, beta2 = self.betas[1], self.betas[2]

  local neg = self.maximize and core.neg(g) or nil
  if neg then g = neg end
  local grad, own_grad = g, false
  if wd ~= 0 then
    if self.decoupled then
      p:mul_(1 - lr * wd)
    else
      grad, own_grad = core.mul(p, wd), true
      grad:add_(g)
    end
  end
  local work = core.mul(grad, 1 - beta1) -- reused for each scaled term
  m:mul_(beta1):add_(work)
  work:copy_(grad):mul_(grad):mul_(1 - beta2)
  v:mul_(beta2):add_(work)
  if own_grad then free(grad) end
  if neg then free(neg) end

  if vmax then
    local mx = core.maximum(vmax, v)
    vmax:copy_(mx)
    free(mx)
  end
  local denom = core.sqrt(vmax or v)
  denom:div_(math.sqrt(1 - beta2 ^ t)):add_(eps)
  work:copy_(m):div_(denom):mul_(lr / (1 - beta1 ^ t))
  p:sub_(work)
  free(denom)
  free(work)
end

-- ---------------------------------------------------------------- checkpoint files

-- Metadata values are strings: integers in decimal, floats in hex ("%a", exact).
local function encode_number(v)
  if math.type(v) == "integer" then return string.format("%d", v) end
  return string.format("%a", v)
end

local function encode_value(v)
  if type(v) == "boolean" then return tostring(v) end
  if type(v) == "number" then return encode_number(v) end
  if type(v) == "string" then return "s:" .. v end
  error("optim.flatten_state: cannot store a " .. type(v), 3)
end

local function decode_value(s)
  if s == "true" then return true end
  if s == "false" then return false end
  if s:sub(1, 2) == "s:" then return s:sub(3) end
  return tonumber(s)
end

--- Flattens a `state_dict()` into the two tables that `attn.save` takes:
-- tensors named "state.<i>.<buffer>" and string metadata (kind, step counts,
-- hyper-parameters).
-- @tparam table s from `opt:state_dict()`
-- @treturn {[string]=Tensor,...} tensors
-- @treturn {[string]=string,...} metadata
-- @usage
-- assert(attn.save("optim.safetensors", attn.optim.flatten_state(opt:state_dict())))
function optim.flatten_state(s)
  if type(s) ~= "table" or type(s.optimizer) ~= "string" then
    error("optim.flatten_state: expected a table from opt:state_dict()", 2)
  end
  local tensors = {}
  local meta = { ["optim.optimizer"] = s.optimizer, ["optim.steps"] = encode_number(s.steps or 0) }
  if s.nparams then meta["optim.nparams"] = encode_number(s.nparams) end
  for k, v in pairs(s.hyper or {}) do
    if type(v) == "table" then
      for j, x in ipairs(v) do meta["optim.hyper." .. k .. "." .. j] = encode_value(x) end
    else
      meta["optim.hyper." .. k] = encode_value(v)
    end
  end
  for i, st in pairs(s.state or {}) do
    for k, v in pairs(st) do
      if is_tensor(v) then
        tensors["state." .. i .. "." .. k] = v
      else
        meta["optim.state." .. i .. "." .. k] = encode_value(v)
      end
    end
  end
  return tensors, meta
end

--- Rebuilds a state dict from `flatten_state`'s tables (as `attn.load`
-- returns them), for `opt:load_state_dict`.
-- @tparam {[string]=Tensor,...} tensors
-- @tparam {[string]=string,...} metadata
-- @treturn table state dict
-- @raise when the metadata names no optimizer
function optim.unflatten_state(tensors, metadata)
  if type(tensors) ~= "table" or type(metadata) ~= "table" or type(metadata["optim.optimizer"]) ~= "string" then
    error("optim.unflatten_state: expected the tensors and metadata of optim.flatten_state", 2)
  end
  local s = { optimizer = metadata["optim.optimizer"], steps = decode_value(metadata["optim.steps"] or "0"),
    nparams = metadata["optim.nparams"] and decode_value(metadata["optim.nparams"]), hyper = {}, state = {} }
  local function slot(i)
    i = math.tointeger(tonumber(i))
    s.state[i] = s.state[i] or {}
    return s.state[i]
  end
  for key, v in pairs(metadata) do
    local name, j = key:match("^optim%.hyper%.([%w_]+)%.(%d+)$")
    if name then
      s.hyper[name] = s.hyper[name] or {}
      s.hyper[name][tonumber(j)] = decode_value(v)
    else
      name = key:match("^optim%.hyper%.([%w_]+)$")
      if name then
        s.hyper[name] = decode_value(v)
      else
        local i, k = key:match("^optim%.state%.(%d+)%.([%w_]+)$")
        if i then slot(i)[k] = decode_value(v) end
      end
    end
  end
  for key, t in pairs(tensors) do
    local i, k = tostring(key):match("^state%.(%d+)%.([%w_]+)$")
    if i then slot(i)[k] = t end
  end
  return s
end

optim.Optimizer = Optimizer

--- The learning-rate schedulers (`attn.lr_scheduler`): StepLR, MultiStepLR,
-- ExponentialLR, LambdaLR, CosineAnnealingLR, LinearLR, SequentialLR, NoamLR.
-- @field lr_scheduler
optim.lr_scheduler = require "attn.lr_scheduler"

return optim
