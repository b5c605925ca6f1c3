--- Layers of today's decoder-only Transformers (Llama, Mistral) that the book's chapter predates:
-- RMSNorm, SwiGLU and RotaryEmbedding, with PyTorch's / Llama's names.
-- @module attn.nn.modern
local attn = require "attn"
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local check = require "attn.check"
local autograd = require "attn.autograd"
local fused = require "attn.nn.fused"

local core = attn.core
local Module = module.Module
local Linear = linear.Linear

local M = {}

-- ---------------------------------------------------------------- RMSNorm

-- The machine epsilon of a dtype, PyTorch's torch.finfo(dtype).eps.
local FINFO_EPS = { float32 = 2.0 ^ -23, float64 = 2.0 ^ -52 }

--- `nn.RMSNorm(d [, {eps, elementwise_affine = true, dtype = "float32"}])` (Zhang & Sennrich,
-- arXiv:1910.07467): y = x / sqrt(mean(x^2) + eps) * weight over the last dim d. Parameter
-- `weight` (ones), PyTorch 2.4's key. `eps` defaults to nil, which, as in PyTorch, means the
-- machine epsilon of the input's dtype at each call (2^-23 for float32, 2^-52 for float64);
-- Llama passes 1e-5 or 1e-6 explicitly. Two paths (attn.nn.fused): a fused node over the
-- LayerNorm kernel's rows without the centring (src/nn/attn_layernorm.h: one pass forward, one
-- backward, sums in double) and the composed differentiable tensor ops.
-- @type RMSNorm
local RMSNorm = Module:extend("RMSNorm")
M.RMSNorm = RMSNorm

function RMSNorm:init(d, opts)
  if type(d) == "table" and #d == 1 then d = d[1] end
  check.positive_int("RMSNorm", "normalized_shape", d, 4)
  opts = check.options("RMSNorm", opts, { eps = true, elementwise_affine = true, dtype = true }, 4)
  if opts.eps ~= nil and (type(opts.eps) ~= "number" or not (opts.eps >= 0 and opts.eps < math.huge)) then
    error(string.format("RMSNorm: eps must be nil or a finite number >= 0, got %s", tostring(opts.eps)), 3)
  end
  self.normalized_shape = { d }
  self.eps = opts.eps
  self.elementwise_affine = opts.elementwise_affine ~= false
  if self.elementwise_affine then
    self:register_parameter("weight", attn.ones({ d }, opts.dtype or "float32"))
  else
    self:register_parameter("weight", nil)
  end
end

local function eps_of(m, x) return m.eps or FINFO_EPS[core.dtype(x)] or FINFO_EPS.float32 end

function RMSNorm:forward(x)
  local d = self.normalized_shape[1]
  if not attn.is_tensor(x) or x:dim() < 1 or x:size(x:dim()) ~= d then
    error(string.format("RMSNorm: input must be a tensor (..., %d), got %s", d,
      attn.is_tensor(x) and attn.core.shape_str(x) or ("a " .. type(x))), 2)
  end
  return fused.forward(self, x)
end

--- Whether the fused node can run this call (attn.nn.fused): a float input and, with an
-- affine weight, one of the input's dtype.
function RMSNorm:can_fuse(x)
  local w = self.weight
  return core.dtype(x) ~= "int64" and (w == nil or core.dtype(w) == core.dtype(x))
end

--- The fused path: one node over the C kernel (rows of d entries, statistics in double).
function RMSNorm:fused_forward(x)
  local weight, n = self.weight, self.normalized_shape[1]
  local xc, w = core.contiguous(x), weight and core.contiguous(weight)
  local y, saved = core.rms_norm_forward(xc, n, w, eps_of(self, x))
  return autograd.record("rms_norm", y, { x, weight or false }, function(g)
    local dx, dw = core.rms_norm_backward(xc, n, w, saved, core.contiguous(g), weight ~= nil)
    if weight == nil then return dx end
    return dx, dw
  end)
end

--- The composed path: x * rsqrt(mean(x^2) + eps) * weight as tensor ops.
function RMSNorm:composed_forward(x)
  local y = x * (x:square():mean(x:dim(), true) + eps_of(self, x)):sqrt():reciprocal()
  if self.weight ~= nil then y = y * self.weight end
  return y
end

function RMSNorm:extra_repr()
  return string.format("(%d,), eps=%s, elementwise_affine=%s", self.normalized_shape[1], tostring(self.eps),
    self.elementwise_affine and "True" or "False")
end

-- ---------------------------------------------------------------- SwiGLU

--- silu(x) = x * sigmoid(x) (PyTorch's F.silu), differentiable.
function M.silu(x) return x * x:sigmoid() end

--- `nn.SwiGLU(d_in, hidden [, d_out = d_in] [, {bias = false, dtype}])` (Shazeer 2020,
-- arXiv:2002.05202; Llama's FeedForward): w2(silu(w1 x) * w3 x). Children w1 (d_in -> hidden),
-- w3 (d_in -> hidden), w2 (hidden -> d_out), without bias by default (as Llama).
-- @type SwiGLU
local SwiGLU = Module:extend("SwiGLU")
M.SwiGLU = SwiGLU

function SwiGLU:init(d_in, hidden, d_out, opts)
  if type(d_out) == "table" then d_out, opts = nil, d_out end
  opts = check.options("SwiGLU", opts, { bias = true, dtype = true }, 4)
  local lin = { bias = opts.bias == true, dtype = opts.dtype }
  self.w1 = Linear(d_in, hidden, lin)
  self.w2 = Linear(hidden, d_out or d_in, lin)
  self.w3 = Linear(d_in, hidden, lin)
end

function SwiGLU:forward(x) return self.w2(M.silu(self.w1(x)) * self.w3(x)) end

-- ---------------------------------------------------------------- RotaryEmbedding

--- `nn.RotaryEmbedding(dim [, {base = 10000, interleaved = false}])`: attn.rope as a module
-- (no parameters; the angle tables are cached by attn.rope). forward(x (..., N, dim)
-- [, positions]) -> (..., N, dim); positions are 0-based, as attn.rope's.
-- @type RotaryEmbedding
local RotaryEmbedding = Module:extend("RotaryEmbedding")
M.RotaryEmbedding = RotaryEmbedding

function RotaryEmbedding:init(dim, opts)
  check.positive_int("RotaryEmbedding", "dim", dim, 4)
  if dim % 2 ~= 0 then error(string.format("RotaryEmbedding: dim must be even, got %d", dim), 3) end
  opts = check.options("RotaryEmbedding", opts, { base = true, interleaved = true }, 4)
  self.dim = dim
  self.base = opts.base or 10000
  self.interleaved = opts.interleaved == true
end

function RotaryEmbedding:forward(x, positions)
  if attn.is_tensor(x) and x:size(x:dim()) ~= self.dim then
    error(string.format("RotaryEmbedding: input %s must end in dim %d", attn.core.shape_str(x), self.dim), 2)
  end
  return attn.rope(x, { positions = positions, base = self.base, interleaved = self.interleaved })
end

function RotaryEmbedding:extra_repr()
  return string.format("dim=%d, base=%g, interleaved=%s", self.dim, self.base, tostring(self.interleaved))
end

return M
