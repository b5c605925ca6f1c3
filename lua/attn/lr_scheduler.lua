--- Learning-rate schedulers, as PyTorch's `torch.optim.lr_scheduler`
-- (reached as `attn.optim.lr_scheduler`): StepLR, MultiStepLR, ExponentialLR,
-- LambdaLR, CosineAnnealingLR, LinearLR, SequentialLR, and the Transformer
-- paper's inverse-square-root warmup (NoamLR).
--
-- A scheduler sets its optimizer's `lr` field (attn's optimizers have one
-- parameter group). Step counting is PyTorch's (2.x): constructing a scheduler
-- takes its first step, so `last_epoch` is 0 afterwards and `opt.lr` holds the
-- rate of the first optimizer step; call `sched:step()` after each
-- `opt:step()`. The first scheduler made on an optimizer records its lr as
-- `opt.initial_lr` (PyTorch's `initial_lr`); every scheduler's base lr is that.
--
-- Each `step()` computes the lr as PyTorch's `get_lr` does: the recursive
-- (chainable) form from the current `opt.lr` for StepLR, MultiStepLR,
-- ExponentialLR, CosineAnnealingLR and LinearLR, from the base lr for
-- LambdaLR and NoamLR. SequentialLR restarts a scheduler at its milestone
-- with PyTorch's `step(0)`, which takes the closed form at epoch 0.
-- @module attn.lr_scheduler
-- @usage
-- local sched = attn.optim.lr_scheduler.StepLR(opt, { step_size = 30, gamma = 0.1 })
-- for epoch = 1, 100 do train_epoch(); opt:step(); sched:step() end
local check = require "attn.check"

local M = {}

--- The methods every scheduler has: `step`, `get_last_lr`, `state_dict`,
-- `load_state_dict`; fields `last_epoch` and `base_lrs` as PyTorch's.
-- @type LRScheduler
local LRScheduler = {}
LRScheduler.__index = LRScheduler
M.LRScheduler = LRScheduler

local function number_option(name, key, v, lo, open_lo)
  if type(v) ~= "number" or v ~= v or (open_lo and v <= lo) or (not open_lo and v < lo) then
    error(string.format("%s: %s must be a number %s %s, got %s", name, key, open_lo and ">" or ">=", tostring(lo),
      tostring(v)), 3)
  end
  return v
end

local function integer_option(name, key, v, lo)
  if math.type(v) ~= "integer" or v < lo then
    error(string.format("%s: %s must be an integer >= %d, got %s", name, key, lo, tostring(v)), 3)
  end
  return v
end

-- A new scheduler of `class` on `optimizer` with the checked options (a
-- non-table second argument is the first required option, as PyTorch's
-- positional call StepLR(opt, 30)); the initial step is left to the caller.
local function new(class, name, optimizer, opts, allowed, positional)
  if type(optimizer) ~= "table" or type(optimizer.lr) ~= "number" then
    error(string.format("%s: optimizer must be an attn.optim optimizer (a table with a number lr), got a %s", name,
      type(optimizer)), 3)
  end
  if positional and opts ~= nil and (type(opts) ~= "table" or (positional == "milestones" and opts[1] ~= nil)) then
    opts = { [positional] = opts }
  end
  opts = check.options(name, opts, allowed, 4)
  if optimizer.initial_lr == nil then optimizer.initial_lr = optimizer.lr end
  local self = setmetatable({ kind = name, optimizer = optimizer, last_epoch = -1, _step_count = 0,
    base_lrs = { optimizer.initial_lr }, _last_lr = { optimizer.lr } }, class)
  return self, opts
end

-- PyTorch's _initial_step: the step count starts over and one step is taken.
function LRScheduler:_initial_step()
  self._step_count = 0
  self:step()
end

-- Sets the optimizer's lr and the last lr.
function LRScheduler:_set(lr)
  self.optimizer.lr = lr
  self._last_lr = { lr }
end

--- Advances the schedule by one step (call it after `opt:step()`): the epoch
-- count moves on and the optimizer's lr is set to the new rate.
function LRScheduler:step()
  self._step_count = self._step_count + 1
  self.last_epoch = self.last_epoch + 1
  self:_set(self:get_lr())
end

-- PyTorch's step(epoch): jumps to `epoch`, by the closed form when the
-- scheduler has one (SequentialLR calls it with 0 at a milestone).
function LRScheduler:_step_to(epoch)
  self._step_count = self._step_count + 1
  self.last_epoch = epoch
  self:_set(self._closed_form and self:_closed_form() or self:get_lr())
end

--- The lr the last step set, as PyTorch's list of one per parameter group.
-- @treturn {number} `{lr}`
function LRScheduler:get_last_lr() return { self._last_lr[1] } end

-- Each table is copied once (`seen`), so a table reached twice, or a cycle, costs one copy and
-- the copy keeps the sharing (a hostile state could otherwise take exponential time).
local function copy_plain(t, seen)
  seen = seen or {}
  if seen[t] then return seen[t] end
  local c = {}
  seen[t] = c
  for k, v in pairs(t) do
    if type(v) == "table" then v = copy_plain(v, seen) end
    if type(v) ~= "function" then c[k] = v end
  end
  return c
end

--- The scheduler's state as a plain table (PyTorch's: every field but the
-- optimizer; LambdaLR's function is not saved, as PyTorch does not save a
-- lambda). Only numbers, strings, booleans and tables of them.
-- @treturn table
function LRScheduler:state_dict()
  local s, seen = {}, {}
  for k, v in pairs(self) do
    if k ~= "optimizer" and k ~= "_schedulers" and type(v) ~= "function" then
      s[k] = type(v) == "table" and copy_plain(v, seen) or v
    end
  end
  return s
end

--- Restores a `state_dict` of a scheduler of the same kind; the schedule then
-- continues from the saved step. Restore the optimizer's own state too (its
-- `lr` is in it), as in PyTorch.
-- @tparam table s
-- @raise when s is not a state of this kind of scheduler
function LRScheduler:load_state_dict(s)
  if type(s) ~= "table" or s.kind ~= self.kind then
    error(string.format("%s.load_state_dict: expected the state of a %s, got %s", self.kind, self.kind,
      type(s) == "table" and "a " .. tostring(s.kind) or "a " .. type(s)), 2)
  end
  local seen = {}
  for k, v in pairs(s) do
    if k ~= "_schedulers" then self[k] = type(v) == "table" and copy_plain(v, seen) or v end
  end
end

local function subclass()
  local class = setmetatable({}, { __index = LRScheduler })
  class.__index = class
  return class
end

-- ---------------------------------------------------------------- StepLR

local StepLR = subclass()

--- `StepLR(opt, {step_size, gamma = 0.1})`: the lr times gamma every
-- step_size steps. PyTorch's get_lr: lr unchanged unless last_epoch > 0 and
-- last_epoch % step_size == 0, then lr * gamma (closed form: base_lr *
-- gamma^floor(last_epoch / step_size)).
-- @param optimizer an attn.optim optimizer
-- @tparam table opts `step_size` (integer >= 1; or given as the second argument), `gamma` (0.1)
-- @treturn LRScheduler
function M.StepLR(optimizer, opts)
  local self
  self, opts = new(StepLR, "StepLR", optimizer, opts, { step_size = true, gamma = true }, "step_size")
  self.step_size = integer_option("StepLR", "step_size", opts.step_size, 1)
  self.gamma = number_option("StepLR", "gamma", opts.gamma == nil and 0.1 or opts.gamma, 0)
  self:_initial_step()
  return self
end

function StepLR:get_lr()
  local lr = self.optimizer.lr
  if self.last_epoch == 0 or self.last_epoch % self.step_size ~= 0 then return lr end
  return lr * self.gamma
end

function StepLR:_closed_form() return self.base_lrs[1] * self.gamma ^ (self.last_epoch // self.step_size) end

-- ---------------------------------------------------------------- MultiStepLR

local MultiStepLR = subclass()

-- The number of milestones <= epoch (Python's bisect_right on the sorted list).
local function bisect_right(list, x)
  local n = 0
  for _, m in ipairs(list) do
    if m <= x then n = n + 1 end
  end
  return n
end

--- `MultiStepLR(opt, {milestones, gamma = 0.1})`: the lr times gamma at each
-- milestone (a milestone listed twice multiplies twice, as PyTorch's Counter).
-- @param optimizer an attn.optim optimizer
-- @tparam table opts `milestones` (list of integers; or given as the second argument), `gamma` (0.1)
-- @treturn LRScheduler
function M.MultiStepLR(optimizer, opts)
  local self
  self, opts = new(MultiStepLR, "MultiStepLR", optimizer, opts, { milestones = true, gamma = true }, "milestones")
  if type(opts.milestones) ~= "table" then error("MultiStepLR: milestones must be a list of integers", 2) end
  local ms = {}
  for i, m in ipairs(opts.milestones) do ms[i] = integer_option("MultiStepLR", "milestones[" .. i .. "]", m, 0) end
  table.sort(ms)
  self.milestones = ms
  self.gamma = number_option("MultiStepLR", "gamma", opts.gamma == nil and 0.1 or opts.gamma, 0)
  self:_initial_step()
  return self
end

function MultiStepLR:get_lr()
  local hits = 0
  for _, m in ipairs(self.milestones) do
    if m == self.last_epoch then hits = hits + 1 end
  end
  if hits == 0 then return self.optimizer.lr end
  return self.optimizer.lr * self.gamma ^ hits
end

function MultiStepLR:_closed_form() return self.base_lrs[1] * self.gamma ^ bisect_right(self.milestones, self.last_epoch) end

-- ---------------------------------------------------------------- ExponentialLR

local ExponentialLR = subclass()

--- `ExponentialLR(opt, {gamma})`: the lr times gamma at every step.
-- @param optimizer an attn.optim optimizer
-- @tparam table opts `gamma` (required; or given as the second argument)
-- @treturn LRScheduler
function M.ExponentialLR(optimizer, opts)
  local self
  self, opts = new(ExponentialLR, "ExponentialLR", optimizer, opts, { gamma = true }, "gamma")
  self.gamma = number_option("ExponentialLR", "gamma", opts.gamma, 0)
  self:_initial_step()
  return self
end

function ExponentialLR:get_lr()
  if self.last_epoch == 0 then return self.optimizer.lr end
  return self.optimizer.lr * self.gamma
end

function ExponentialLR:_closed_form() return self.base_lrs[1] * self.gamma ^ self.last_epoch end

-- ---------------------------------------------------------------- LambdaLR

local LambdaLR = subclass()

--- `LambdaLR(opt, {lr_lambda})`: lr = base_lr * lr_lambda(last_epoch). The
-- function is not in the state dict (pass it again when restoring).
-- @param optimizer an attn.optim optimizer
-- @tparam table opts `lr_lambda` (function of the epoch count; or given as the second argument)
-- @treturn LRScheduler
function M.LambdaLR(optimizer, opts)
  local self
  self, opts = new(LambdaLR, "LambdaLR", optimizer, opts, { lr_lambda = true }, "lr_lambda")
  if type(opts.lr_lambda) ~= "function" then
    error("LambdaLR: lr_lambda must be a function, got a " .. type(opts.lr_lambda), 2)
  end
  self.lr_lambda = opts.lr_lambda
  self:_initial_step()
  return self
end

function LambdaLR:get_lr() return self.base_lrs[1] * self.lr_lambda(self.last_epoch) end

-- ---------------------------------------------------------------- CosineAnnealingLR

local CosineAnnealingLR = subclass()

--- `CosineAnnealingLR(opt, {T_max, eta_min = 0})`: PyTorch's recursive form
-- (what its step() computes), which for last_epoch <= T_max equals the closed
-- form eta_min + (base_lr - eta_min) * (1 + cos(pi * last_epoch / T_max)) / 2
-- up to rounding:
--
--     last_epoch == 0: lr
--     (last_epoch - 1 - T_max) % (2 T_max) == 0: lr + (base_lr - eta_min) * (1 - cos(pi / T_max)) / 2
--     else: (1 + cos(pi e / T_max)) / (1 + cos(pi (e - 1) / T_max)) * (lr - eta_min) + eta_min
-- @param optimizer an attn.optim optimizer
-- @tparam table opts `T_max` (integer >= 1; or given as the second argument), `eta_min` (0)
-- @treturn LRScheduler
function M.CosineAnnealingLR(optimizer, opts)
  local self
  self, opts = new(CosineAnnealingLR, "CosineAnnealingLR", optimizer, opts, { T_max = true, eta_min = true }, "T_max")
  self.T_max = integer_option("CosineAnnealingLR", "T_max", opts.T_max, 1)
  self.eta_min = number_option("CosineAnnealingLR", "eta_min", opts.eta_min or 0, 0)
  self:_initial_step()
  return self
end

function CosineAnnealingLR:get_lr()
  local e, T, lr, eta = self.last_epoch, self.T_max, self.optimizer.lr, self.eta_min
  if e == 0 then return lr end
  if (e - 1 - T) % (2 * T) == 0 then return lr + (self.base_lrs[1] - eta) * (1 - math.cos(math.pi / T)) / 2 end
  return (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T)) * (lr - eta) + eta
end

function CosineAnnealingLR:_closed_form()
  local eta = self.eta_min
  return eta + (self.base_lrs[1] - eta) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
end

-- ---------------------------------------------------------------- LinearLR

local LinearLR = subclass()

--- `LinearLR(opt, {start_factor = 1/3, end_factor = 1, total_iters = 5})`:
-- the lr factor moves linearly from start_factor to end_factor over
-- total_iters steps (a warmup when start_factor < 1), PyTorch's recursive form:
--
--     last_epoch == 0: lr * start_factor;   last_epoch > total_iters: lr
--     else: lr * (1 + (end - start) / (total_iters * start + (last_epoch - 1) * (end - start)))
-- (closed form: base_lr * (start + (end - start) * min(total_iters, last_epoch) / total_iters)).
-- @param optimizer an attn.optim optimizer
-- @tparam[opt] table opts `start_factor` in (0, 1], `end_factor` in [0, 1], `total_iters` (integer >= 1)
-- @treturn LRScheduler
function M.LinearLR(optimizer, opts)
  local self
  self, opts = new(LinearLR, "LinearLR", optimizer, opts,
    { start_factor = true, end_factor = true, total_iters = true })
  local s = opts.start_factor == nil and 1 / 3 or opts.start_factor
  local e = opts.end_factor == nil and 1 or opts.end_factor
  if type(s) ~= "number" or not (s > 0 and s <= 1) then
    error("LinearLR: start_factor must be a number in (0, 1], got " .. tostring(s), 2)
  end
  if type(e) ~= "number" or not (e >= 0 and e <= 1) then
    error("LinearLR: end_factor must be a number in [0, 1], got " .. tostring(e), 2)
  end
  self.start_factor, self.end_factor = s, e
  self.total_iters = integer_option("LinearLR", "total_iters", opts.total_iters or 5, 1)
  self:_initial_step()
  return self
end

function LinearLR:get_lr()
  local lr, e, s, f, n = self.optimizer.lr, self.last_epoch, self.start_factor, self.end_factor, self.total_iters
  if e == 0 then return lr * s end
  if e > n then return lr end
  return lr * (1 + (f - s) / (n * s + (e - 1) * (f - s)))
end

function LinearLR:_closed_form()
  local s, f, n = self.start_factor, self.end_factor, self.total_iters
  return self.base_lrs[1] * (s + (f - s) * math.min(n, self.last_epoch) / n)
end

-- ---------------------------------------------------------------- NoamLR

local NoamLR = subclass()

--- `NoamLR(opt, {d_model, warmup_steps = 4000, factor = 1})`: the
-- Transformer paper's schedule (Vaswani et al., 2017, eq. 3), an absolute
-- rate (the optimizer's own lr is not used):
--
--     lr = factor * d_model^-0.5 * min(s^-0.5, s * warmup_steps^-1.5),   s = last_epoch + 1
-- s is the 1-based number of the optimizer step the rate is for: after
-- construction (last_epoch 0) the first step runs at s = 1; the rate rises
-- linearly to its peak at s = warmup_steps, then falls as 1/sqrt(s).
-- @param optimizer an attn.optim optimizer
-- @tparam table opts `d_model` (> 0; or given as the second argument), `warmup_steps` (integer >= 1), `factor` (1)
-- @treturn LRScheduler
function M.NoamLR(optimizer, opts)
  local self
  self, opts = new(NoamLR, "NoamLR", optimizer, opts, { d_model = true, warmup_steps = true, factor = true },
    "d_model")
  self.d_model = number_option("NoamLR", "d_model", opts.d_model, 0, true)
  self.warmup_steps = integer_option("NoamLR", "warmup_steps", opts.warmup_steps or 4000, 1)
  self.factor = number_option("NoamLR", "factor", opts.factor or 1, 0)
  self:_initial_step()
  return self
end

function NoamLR:get_lr()
  local s = self.last_epoch + 1
  return self.factor * self.d_model ^ -0.5 * math.min(s ^ -0.5, s * self.warmup_steps ^ -1.5)
end

--- The same scheduler as `NoamLR` (the name fairseq and others use).
-- @function InverseSqrtLR
M.InverseSqrtLR = M.NoamLR

-- ---------------------------------------------------------------- SequentialLR

local SequentialLR = subclass()

--- `SequentialLR(opt, {schedulers = {...}, milestones = {...}})`: runs
-- schedulers[1] until milestones[1], then schedulers[2] (restarted at epoch
-- 0 by PyTorch's step(0), its closed form), and so on; #milestones must be
-- #schedulers - 1. As PyTorch 2.x: construction resets opt.lr to
-- opt.initial_lr, undoes the initial step of every scheduler and takes it
-- again for the first only. The usual warmup: `SequentialLR(opt, {schedulers =
-- {LinearLR(opt, {start_factor = 0.1, total_iters = 5}), CosineAnnealingLR(opt, {T_max = 95})},
-- milestones = {5}})`.
-- @param optimizer an attn.optim optimizer
-- @tparam table opts `schedulers` (schedulers on this optimizer), `milestones` (increasing integers)
-- @treturn LRScheduler
function M.SequentialLR(optimizer, opts)
  local self
  self, opts = new(SequentialLR, "SequentialLR", optimizer, opts, { schedulers = true, milestones = true })
  local list, ms = opts.schedulers, opts.milestones
  if type(list) ~= "table" or #list == 0 then error("SequentialLR: schedulers must be a non-empty list", 2) end
  for i, s in ipairs(list) do
    if getmetatable(s) == nil or s.optimizer ~= optimizer then
      error(string.format("SequentialLR: schedulers[%d] must be a scheduler of the same optimizer", i), 2)
    end
  end
  if type(ms) ~= "table" or #ms ~= #list - 1 then
    error(string.format("SequentialLR: expected %d milestones (one fewer than schedulers), got %s", #list - 1,
      type(ms) == "table" and tostring(#ms) or type(ms)), 2)
  end
  self._schedulers, self.milestones = {}, {}
  for i, s in ipairs(list) do self._schedulers[i] = s end
  for i, m in ipairs(ms) do self.milestones[i] = integer_option("SequentialLR", "milestones[" .. i .. "]", m, 1) end
  self.last_epoch = 0
  optimizer.lr = optimizer.initial_lr
  for _, s in ipairs(self._schedulers) do s.last_epoch = s.last_epoch - 1 end
  self._schedulers[1]:_initial_step()
  self._last_lr = self._schedulers[1]:get_last_lr()
  return self
end

function SequentialLR:step()
  self.last_epoch = self.last_epoch + 1
  local idx = bisect_right(self.milestones, self.last_epoch) + 1
  local s = self._schedulers[idx]
  if idx > 1 and self.milestones[idx - 1] == self.last_epoch then s:_step_to(0) else s:step() end
  self._last_lr = s:get_last_lr()
end

function SequentialLR:state_dict()
  local st = LRScheduler.state_dict(self)
  st._schedulers = {}
  for i, s in ipairs(self._schedulers) do st._schedulers[i] = s:state_dict() end
  return st
end

function SequentialLR:load_state_dict(s)
  LRScheduler.load_state_dict(self, s)
  for i, sub in ipairs(self._schedulers) do
    if type(s._schedulers) ~= "table" or s._schedulers[i] == nil then
      error("SequentialLR.load_state_dict: the state has no scheduler " .. i, 2)
    end
    sub:load_state_dict(s._schedulers[i])
  end
end

return M
