--- Gradient clipping by global L2 norm (d2l's grad_clipping, PyTorch's clip_grad_norm_).
-- @module attn.nn.clip
local attn = require "attn"
local module = require "attn.nn.module"

local core = attn.core

local M = {}

--- Clips gradients in place by their global L2 norm, as PyTorch's
-- `clip_grad_norm_`: the norm of all gradients taken together (parameters
-- without `.grad` are skipped); if it exceeds max_norm, every gradient is
-- scaled in place by max_norm / norm. `nn.clip_grad_norm` is the same function
-- (the name before the in-place underscore).
-- @param params a list of tensors, or a module (its parameters)
-- @tparam number max_norm the largest allowed norm (>= 0)
-- @treturn number the norm before clipping
-- @raise when params is not a list or a module, or max_norm is negative
-- @usage loss:backward(); nn.clip_grad_norm_(model, 1); opt:step()
function M.clip_grad_norm_(params, max_norm)
  if module.is_module(params) then params = params:parameters() end
  if type(params) ~= "table" or attn.is_tensor(params) then
    error("clip_grad_norm_: params must be a list of tensors or a module", 2)
  end
  if type(max_norm) ~= "number" or max_norm < 0 then
    error("clip_grad_norm_: max_norm must be a non-negative number, got " .. tostring(max_norm), 2)
  end
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

return M
