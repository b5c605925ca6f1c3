--- Gradient clipping by global L2 norm (d2l's grad_clipping, PyTorch's clip_grad_norm_).
-- @module attn.nn.clip
local attn = require "attn"
local module = require "attn.nn.module"
local fused = require "attn.nn.fused"

local core = attn.core

local M = {}

-- The parameter list (a module gives its parameters), or an error at the caller of the caller.
local function check_args(params, max_norm)
  if module.is_module(params) then params = params:parameters() end
  if type(params) ~= "table" or attn.is_tensor(params) then
    error("clip_grad_norm_: params must be a list of tensors or a module", 3)
  end
  if type(max_norm) ~= "number" or max_norm < 0 then
    error("clip_grad_norm_: max_norm must be a non-negative number, got " .. tostring(max_norm), 3)
  end
  return params
end

--- Clips gradients in place by their global L2 norm, as PyTorch's
-- `clip_grad_norm_`: the norm of all gradients taken together (parameters
-- without `.grad` are skipped); if it exceeds max_norm, every gradient is
-- scaled in place by max_norm / norm. `nn.clip_grad_norm` is the same function
-- (the name before the in-place underscore). Two passes in C: one sums the
-- squares of every gradient in double (`core.grads_norm`), one scales them
-- (`core.grads_scale_`), without a temporary per gradient. With fused paths
-- off (`attn.nn.set_fused(false)`) it is `clip_grad_norm_composed`.
-- @param params a list of tensors, or a module (its parameters)
-- @tparam number max_norm the largest allowed norm (>= 0)
-- @treturn number the norm before clipping
-- @raise when params is not a list or a module, or max_norm is negative
-- @usage loss:backward(); nn.clip_grad_norm_(model, 1); opt:step()
function M.clip_grad_norm_(params, max_norm)
  params = check_args(params, max_norm)
  if not fused.choose("clip_grad_norm_") then return M.clip_grad_norm_composed(params, max_norm) end
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
  local norm = core.grads_norm(dense)
  for _, c in ipairs(copies) do core.free(c) end
  if norm > max_norm then core.grads_scale_(grads, max_norm / norm) end
  return norm
end

--- The composed path of `clip_grad_norm_` (the specs compare the C passes
-- against it): each gradient converted to float64, squared and summed by
-- tensor ops, then each scaled by its own `mul_`. Same arguments and result.
-- @param params a list of tensors, or a module (its parameters)
-- @tparam number max_norm the largest allowed norm (>= 0)
-- @treturn number the norm before clipping
function M.clip_grad_norm_composed(params, max_norm)
  params = check_args(params, max_norm)
  local total = 0
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      -- squared in double: a float32 entry above ~1.8e19 squares to inf in float32
      local g64 = core.dtype(g) == "float64" and g or core.to(g, "float64")
      local g2 = core.square(g64)
      local sq = core.sum(g2)
      total = total + sq:item()
      core.free(g2)
      core.free(sq)
      if g64 ~= g then core.free(g64) end
    end
  end
  local norm = math.sqrt(total)
  if norm > max_norm then
    local scale = max_norm / norm
    for _, p in ipairs(params) do
      if p.grad ~= nil then core.mul_(p.grad, scale) end
    end
  end
  return norm
end

--- Deprecated alias of `clip_grad_norm_composed` (the old name), kept for one
-- release: "reference" now names only the C kernels' plain reference path.
-- @see clip_grad_norm_composed
M.clip_grad_norm_reference = M.clip_grad_norm_composed

return M
