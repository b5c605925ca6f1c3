--- `attn.nn.init`: in-place parameter initialisers, as in `torch.nn.init`.
-- Every function fills its tensor in place outside autograd (so it works on
-- parameters that require grad), draws from the engine's generator (seed it with
-- `attn.manual_seed`), and returns the tensor.
-- @module attn.nn.init
local attn = require "attn"

local init = {}

local function check(t, fn)
  if not attn.is_tensor(t) then error(string.format("%s: expected a tensor, got a %s", fn, type(t)), 3) end
end

--- fan_in, fan_out of a weight of shape (out, in, ...) as PyTorch computes them.
-- @raise for tensors with fewer than 2 dims
function init.fans(t)
  check(t, "fans")
  local s = t:shape()
  if #s < 2 then
    error(string.format("fans: fan in and fan out need a tensor with at least 2 dims, got %s", attn.core.shape_str(s)), 2)
  end
  local receptive = 1
  for d = 3, #s do receptive = receptive * s[d] end
  return s[2] * receptive, s[1] * receptive
end

--- Fills t with U(a, b) (defaults 0, 1).
function init.uniform_(t, a, b)
  check(t, "uniform_")
  attn.no_grad(function() attn.core.uniform_(t, a or 0, b or 1) end)
  return t
end

--- Fills t with N(mean, std^2) (defaults 0, 1).
function init.normal_(t, mean, std)
  check(t, "normal_")
  attn.no_grad(function() attn.core.normal_(t, mean or 0, std or 1) end)
  return t
end

--- Fills t with a constant.
function init.constant_(t, value)
  check(t, "constant_")
  attn.no_grad(function() attn.core.fill_(t, value) end)
  return t
end

--- Fills t with zeros.
function init.zeros_(t) return init.constant_(t, 0) end

--- Fills t with ones.
function init.ones_(t) return init.constant_(t, 1) end

--- Xavier/Glorot uniform: U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out)).
function init.xavier_uniform_(t, gain)
  check(t, "xavier_uniform_")
  local fan_in, fan_out = init.fans(t)
  local bound = (gain or 1) * math.sqrt(6 / (fan_in + fan_out))
  return init.uniform_(t, -bound, bound)
end

--- Xavier/Glorot normal: N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)).
function init.xavier_normal_(t, gain)
  check(t, "xavier_normal_")
  local fan_in, fan_out = init.fans(t)
  return init.normal_(t, 0, (gain or 1) * math.sqrt(2 / (fan_in + fan_out)))
end

--- Kaiming/He uniform over fan_in with leaky-ReLU slope `a` (default 0):
-- bound = sqrt(6 / ((1 + a^2) * fan_in)). With a = sqrt(5) this is PyTorch's
-- Linear default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
function init.kaiming_uniform_(t, a)
  check(t, "kaiming_uniform_")
  local fan_in = init.fans(t)
  local bound = math.sqrt(6 / ((1 + (a or 0) ^ 2) * fan_in))
  return init.uniform_(t, -bound, bound)
end

return init
