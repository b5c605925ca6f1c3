--- Gradient clipping by global norm (d2l's grad_clipping, PyTorch's clip_grad_norm_) and by value
-- (PyTorch's clip_grad_value_).
-- @module attn.nn.clip
local attn = require "attn"
local module = require "attn.nn.module"
local fused = require "attn.nn.fused"

local core = attn.core

local M = {}

local INF = math.huge

-- The parameter list (a module gives its parameters) and the norm type (2 when
-- nil; "inf" is math.huge as PyTorch's float('inf')), or an error at the
-- caller of the caller.
local function check_args(params, max_norm, norm_type, error_if_nonfinite)
  if module.is_module(params) then params = params:parameters() end
  if type(params) ~= "table" or attn.is_tensor(params) then
    error("clip_grad_norm_: params must be a list of tensors or a module", 3)
  end
  if type(max_norm) ~= "number" or max_norm < 0 then
    error("clip_grad_norm_: max_norm must be a non-negative number, got " .. tostring(max_norm), 3)
  end
  if norm_type == nil then norm_type = 2 end
  if norm_type == "inf" then norm_type = INF end
  if type(norm_type) ~= "number" or norm_type ~= norm_type or norm_type <= 0 then
    error("clip_grad_norm_: norm_type must be a number > 0 or math.huge (inf), got " .. tostring(norm_type), 3)
  end
  if error_if_nonfinite ~= nil and type(error_if_nonfinite) ~= "boolean" then
    error("clip_grad_norm_: error_if_nonfinite must be a boolean, got a " .. type(error_if_nonfinite), 3)
  end
  return params, norm_type
end

-- PyTorch's clip coefficient: max_norm / (norm + 1e-6), clamped to 1 (a
-- gradient is scaled when it is below 1; a NaN norm makes it NaN, and
-- torch.clamp keeps NaN, so every gradient becomes NaN there too). Returns
-- the scale, or nil when the gradients stay as they are.
local function clip_scale(norm, max_norm, error_if_nonfinite)
  if error_if_nonfinite and (norm ~= norm or norm == INF) then
    error(string.format("clip_grad_norm_: the total norm of the gradients is %s (error_if_nonfinite)",
      tostring(norm)), 3)
  end
  local coef = max_norm / (norm + 1e-6)
  if coef >= 1 then return nil end
  return coef
end

--- Clips gradients in place by their global norm, as PyTorch's
-- `torch.nn.utils.clip_grad_norm_`: the norm of all gradients taken together
-- (parameters without `.grad` are skipped),
--
--     total = (sum over every gradient entry x of |x|^p)^(1/p)   (p = inf: max |x|)
--     coef  = max_norm / (total + 1e-6);   every gradient *= coef when coef < 1
--
-- `nn.clip_grad_norm` is the same function (the name before the in-place
-- underscore). Two passes in C: one sums the powers of every gradient in
-- double (`core.grads_norm`), one scales them (`core.grads_scale_`), without
-- a temporary per gradient. With fused paths off (`attn.nn.set_fused(false)`)
-- it is `clip_grad_norm_composed`.
-- @param params a list of tensors, or a module (its parameters)
-- @tparam number max_norm the largest allowed norm (>= 0)
-- @tparam[opt=2] number norm_type p > 0, or math.huge (or "inf") for the largest |x|
-- @tparam[opt=false] boolean error_if_nonfinite raise when the total norm is NaN or inf
-- @treturn number the total norm before clipping
-- @raise when params is not a list or a module, max_norm is negative or norm_type is not > 0
-- @usage loss:backward(); nn.clip_grad_norm_(model, 1); opt:step()
function M.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite)
  params, norm_type = check_args(params, max_norm, norm_type, error_if_nonfinite)
  if not fused.choose("clip_grad_norm_") then
    return M.clip_grad_norm_composed(params, max_norm, norm_type, error_if_nonfinite)
  end
  -- the norm reads contiguous grads (a strided one is copied); the scaling
  -- writes the grads themselves, any strides
  local grads, dense, copies = {}, {}, {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      grads[#grads + 1] = g
      if core.is_contiguous(g) then
        dense[#dense + 1] = g
      else
        dense[#dense + 1] = core.contiguous(g)
        copies[#copies + 1] = dense[#dense]
      end
    end
  end
  local norm = core.grads_norm(dense, norm_type)
  for _, c in ipairs(copies) do core.free(c) end
  local scale = clip_scale(norm, max_norm, error_if_nonfinite)
  if scale then core.grads_scale_(grads, scale) end
  return norm
end

--- The composed path of `clip_grad_norm_` (the specs compare the C passes
-- against it): each gradient converted to float64, raised to the power (or
-- its largest |x| taken) and summed by tensor ops, then each scaled by its own
-- `mul_`. Same arguments and result.
-- @param params a list of tensors, or a module (its parameters)
-- @tparam number max_norm the largest allowed norm (>= 0)
-- @tparam[opt=2] number norm_type p > 0, or math.huge
-- @tparam[opt=false] boolean error_if_nonfinite
-- @treturn number the norm before clipping
function M.clip_grad_norm_composed(params, max_norm, norm_type, error_if_nonfinite)
  params, norm_type = check_args(params, max_norm, norm_type, error_if_nonfinite)
  local total = 0
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      -- in double: a float32 entry above ~1.8e19 squares to inf in float32
      local g64 = core.dtype(g) == "float64" and g or core.to(g, "float64")
      local a = norm_type == 2 and core.square(g64) or core.abs(g64)
      if norm_type ~= 2 and norm_type ~= 1 and norm_type ~= INF then
        local pw = core.pow(a, norm_type)
        core.free(a)
        a = pw
      end
      local r = norm_type == INF and core.max(a) or core.sum(a)
      local v = r:item()
      if norm_type == INF then
        if v > total or v ~= v then total = v end
      else
        total = total + v
      end
      core.free(a)
      core.free(r)
      if g64 ~= g then core.free(g64) end
    end
  end
  local norm = total -- p = 1 and p = inf
  if norm_type == 2 then
    norm = math.sqrt(total)
  elseif norm_type ~= 1 and norm_type ~= INF then
    norm = total ^ (1 / norm_type)
  end
  local scale = clip_scale(norm, max_norm, error_if_nonfinite)
  if scale then
    for _, p in ipairs(params) do
      if p.grad ~= nil then core.mul_(p.grad, scale) end
    end
  end
  return norm
end

-- The parameter list and the clip value, or an error at the caller's caller.
local function check_value_args(params, clip_value)
  if module.is_module(params) then params = params:parameters() end
  if type(params) ~= "table" or attn.is_tensor(params) then
    error("clip_grad_value_: params must be a list of tensors or a module", 3)
  end
  if type(clip_value) ~= "number" or clip_value ~= clip_value or clip_value < 0 then
    error("clip_grad_value_: clip_value must be a non-negative number, got " .. tostring(clip_value), 3)
  end
  return params
end

--- Clamps every gradient entry in place to [-clip_value, clip_value], as
-- PyTorch's `torch.nn.utils.clip_grad_value_` (parameters without `.grad` are
-- skipped; NaN entries stay NaN). One C call over all gradients
-- (`core.grads_clamp_`), any strides. With fused paths off
-- (`attn.nn.set_fused(false)`) it is `clip_grad_value_composed`.
-- @param params a list of tensors, or a module (its parameters)
-- @tparam number clip_value the largest allowed |entry| (>= 0)
-- @raise when params is not a list or a module, or clip_value is negative
-- @usage loss:backward(); nn.clip_grad_value_(model, 0.5); opt:step()
function M.clip_grad_value_(params, clip_value)
  params = check_value_args(params, clip_value)
  if not fused.choose("clip_grad_value_") then return M.clip_grad_value_composed(params, clip_value) end
  local grads = {}
  for _, p in ipairs(params) do
    if p.grad ~= nil then grads[#grads + 1] = p.grad end
  end
  core.grads_clamp_(grads, -clip_value, clip_value)
end

--- The composed path of `clip_grad_value_` (the specs compare the C pass
-- against it): `maximum`, `minimum` and `copy_` per gradient. Same arguments.
-- @param params a list of tensors, or a module (its parameters)
-- @tparam number clip_value the largest allowed |entry| (>= 0)
function M.clip_grad_value_composed(params, clip_value)
  params = check_value_args(params, clip_value)
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      local lo = core.maximum(g, -clip_value)
      local c = core.minimum(lo, clip_value)
      core.copy_(g, c)
      core.free(lo)
      core.free(c)
    end
  end
end

--- Deprecated alias of `clip_grad_norm_composed` (the old name), kept for one
-- release: "reference" now names only the C kernels' plain reference path.
-- @see clip_grad_norm_composed
M.clip_grad_norm_reference = M.clip_grad_norm_composed

return M
