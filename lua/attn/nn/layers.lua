--- More layers of `attn.nn`: Identity, GELU, BatchNorm1d and BatchNorm2d (the book compares
-- batch with layer normalisation), with PyTorch's names and behaviour.
-- @module attn.nn.layers
local attn = require "attn"
local module = require "attn.nn.module"
local check = require "attn.check"

local Module = module.Module
local shape_str = attn.core.shape_str

local M = {}

-- ---------------------------------------------------------------- Identity

--- `nn.Identity()`: returns its input unchanged (extra arguments are ignored).
-- @type Identity
local Identity = Module:extend("Identity")
M.Identity = Identity

function Identity.forward(_, x) return x end

-- ---------------------------------------------------------------- GELU

-- The standard normal CDF Phi(x) = (1 + erf(x / sqrt 2)) / 2 elementwise (libm's erf, exact to
-- double rounding; differentiable).
local function normal_cdf(x) return (attn.erf(x * (1 / math.sqrt(2))) + 1) * 0.5 end
M.normal_cdf = normal_cdf

--- `nn.GELU([{approximate = "none"|"tanh"}])`: x * Phi(x), Phi the standard
-- normal CDF (PyTorch's default; libm's erfc, exact to double rounding in float64); "tanh" is the
-- approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
-- @type GELU
local GELU = Module:extend("GELU")
M.GELU = GELU

function GELU:init(opts)
  opts = check.options("GELU", opts, { approximate = true }, 4)
  local a = opts.approximate or "none"
  if a ~= "none" and a ~= "tanh" then
    error(string.format("GELU: approximate must be 'none' or 'tanh', got '%s'", tostring(a)), 3)
  end
  self.approximate = a
end

function GELU:forward(x)
  if not attn.is_tensor(x) then error("GELU: input must be a tensor, got a " .. type(x), 2) end
  if self.approximate == "tanh" then
    local inner = (x + x:pow(3) * 0.044715) * math.sqrt(2 / math.pi)
    return x * (inner:tanh() + 1) * 0.5
  end
  return attn.gelu(x)
end

function GELU:extra_repr() return string.format("approximate='%s'", self.approximate) end

-- ---------------------------------------------------------------- BatchNorm1d

--- `nn.BatchNorm1d(num_features [, {eps = 1e-5, momentum = 0.1, affine = true,
-- track_running_stats = true}])`: input (N, C) or (N, C, L), normalised per
-- channel C. In training the batch statistics are used (biased variance over N
-- and L) and the running estimates move: running = (1 - momentum) * running +
-- momentum * batch, with the unbiased variance for running_var; in eval mode
-- the running estimates are used. Parameters weight (ones) and bias (zeros);
-- buffers running_mean (zeros), running_var (ones), num_batches_tracked (a
-- scalar), as PyTorch's state dict has them.
-- @type BatchNorm1d
local BatchNorm1d = Module:extend("BatchNorm1d")
M.BatchNorm1d = BatchNorm1d

-- The shared constructor of BatchNorm1d and BatchNorm2d (fn names the class in errors).
local function batch_norm_init(self, fn, num_features, opts)
  check.positive_int(fn, "num_features", num_features, 5)
  opts = check.options(fn, opts,
    { eps = true, momentum = true, affine = true, track_running_stats = true, dtype = true }, 5)
  local dtype = opts.dtype or "float32"
  self.num_features = num_features
  self.eps = opts.eps or 1e-5
  self.momentum = opts.momentum or 0.1
  self.affine = opts.affine ~= false
  self.track_running_stats = opts.track_running_stats ~= false
  if self.affine then
    self:register_parameter("weight", attn.ones({ num_features }, dtype))
    self:register_parameter("bias", attn.zeros({ num_features }, dtype))
  end
  if self.track_running_stats then
    self:register_buffer("running_mean", attn.zeros({ num_features }, dtype))
    self:register_buffer("running_var", attn.ones({ num_features }, dtype))
    self:register_buffer("num_batches_tracked", attn.zeros({}, dtype))
  end
end

function BatchNorm1d:init(num_features, opts) batch_norm_init(self, "BatchNorm1d", num_features, opts) end

-- The shared forward: x normalised per channel over rows (N * ..., C), the channels last,
-- statistics reshaped to view to broadcast against x (fn names the class in errors).
local function batch_norm_forward(self, fn, x, rows, view)
  local n = rows:size(1)
  local mean, var
  if self.training or not self.track_running_stats then
    if n < 2 and self.training then
      error(string.format("%s: training needs more than one value per channel, got input %s", fn, shape_str(x)), 3)
    end
    mean = rows:mean(1)
    var = (rows - mean):square():mean(1)
    if self.training and self.track_running_stats then
      local m = self.momentum
      attn.no_grad(function()
        local core = attn.core
        local bm, bv = mean:detach(), var:detach() * (n / math.max(n - 1, 1))
        core.copy_(self.running_mean, self.running_mean * (1 - m) + bm * m)
        core.copy_(self.running_var, self.running_var * (1 - m) + bv * m)
        core.copy_(self.num_batches_tracked, self.num_batches_tracked + 1)
      end)
    end
  else
    mean, var = self.running_mean, self.running_var
  end
  local y = (x - mean:reshape(view)) / (var:reshape(view) + self.eps):sqrt()
  if self.affine then y = y * self.weight:reshape(view) + self.bias:reshape(view) end
  return y
end

function BatchNorm1d:forward(x)
  if not attn.is_tensor(x) then error("BatchNorm1d: input must be a tensor, got a " .. type(x), 2) end
  local s, C = x:shape(), self.num_features
  if (#s ~= 2 and #s ~= 3) or s[2] ~= C then
    error(string.format("BatchNorm1d: input %s must be (N, %d) or (N, %d, L)", shape_str(s), C, C), 2)
  end
  -- channels last, flattened: (N * L, C)
  local rows = #s == 2 and x or x:transpose(2, 3):reshape({ -1, C })
  return batch_norm_forward(self, "BatchNorm1d", x, rows, #s == 2 and { 1, C } or { 1, C, 1 })
end

function BatchNorm1d:extra_repr()
  return string.format("%d, eps=%g, momentum=%g, affine=%s, track_running_stats=%s", self.num_features, self.eps,
    self.momentum, self.affine and "True" or "False", self.track_running_stats and "True" or "False")
end


-- ---------------------------------------------------------------- BatchNorm2d

--- `nn.BatchNorm2d(num_features [, {eps = 1e-5, momentum = 0.1, affine = true,
-- track_running_stats = true}])`: BatchNorm1d over images (N, C, H, W), each channel normalised
-- over N, H and W; the same parameters, buffers (PyTorch's state-dict keys weight, bias,
-- running_mean, running_var, num_batches_tracked) and training and eval behaviour.
-- @type BatchNorm2d
local BatchNorm2d = BatchNorm1d:extend("BatchNorm2d")
M.BatchNorm2d = BatchNorm2d

function BatchNorm2d:init(num_features, opts) batch_norm_init(self, "BatchNorm2d", num_features, opts) end

function BatchNorm2d:forward(x)
  if not attn.is_tensor(x) then error("BatchNorm2d: input must be a tensor, got a " .. type(x), 2) end
  local s, C = x:shape(), self.num_features
  if #s ~= 4 or s[2] ~= C then
    error(string.format("BatchNorm2d: input %s must be (N, %d, H, W)", shape_str(s), C), 2)
  end
  -- channels last, flattened: (N * H * W, C)
  local rows = x:reshape({ s[1], C, -1 }):transpose(2, 3):reshape({ -1, C })
  return batch_norm_forward(self, "BatchNorm2d", x, rows, { 1, C, 1, 1 })
end

return M
