--- Gradient clipping by global L2 norm (d2l's grad_clipping, PyTorch's clip_grad_norm_).
-- @module attn.nn.clip
local attn = require "attn"
local module = require "attn.nn.module"

local core = attn.core

local M = {}

--- clip_grad_norm(params, max_norm): the L2 norm of all gradients taken together
-- (parameters without `.grad` are skipped). If it exceeds max_norm, every
-- gradient is scaled in place by max_norm / norm. `params` is a list of tensors
-- or a module. Returns the norm before clipping (a number).
function M.clip_grad_norm(params, max_norm)
  if module.is_module(params) then params = params:parameters() end
  if type(params) ~= "table" or attn.is_tensor(params) then
    error("clip_grad_norm: params must be a list of tensors or a module", 2)
  end
  if type(max_norm) ~= "number" or max_norm < 0 then
    error("clip_grad_norm: max_norm must be a non-negative number, got " .. tostring(max_norm), 2)
  end
  local total = 0
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      local g2 = core.square(g)
      local sq = core.sum(g2)
      total = total + sq:item()
      core.free(g2)
      core.free(sq)
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
