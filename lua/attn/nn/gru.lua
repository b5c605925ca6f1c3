--- `nn.GRU`: a multi-layer gated recurrent unit, time-major like `torch.nn.GRU`.
--
-- Parameters (PyTorch names and layouts, gate order r, z, n), for layer k = 0, 1, ...:
-- weight_ih_l{k} (3h, in_k), weight_hh_l{k} (3h, h), bias_ih_l{k} (3h),
-- bias_hh_l{k} (3h); in_0 = input_size, in_k = h above. Every entry starts as
-- U(-1/sqrt(h), 1/sqrt(h)). One step:
--
--     r  = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
--     z  = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
--     n  = tanh(W_in x + b_in + r * (W_hn h + b_hn))
--     h' = (1 - z) * n + z * h
--
-- By default the whole forward (every layer, every step) is one C call and one
-- autograd node (`M.gru`, over attn_rnn.h): the input projections of all steps
-- are one GEMM per layer, the recurrent products one GEMM per step, the gate
-- math one vectorised pass per step, and backward is one C call too. Dropout
-- (training mode only) acts on the outputs of every layer but the last, with a
-- mask hashed from a seed so backward rebuilds it. `nn.GRU{..., fused = false}`
-- (or `attn.nn.set_fused(false)`, or dropout 1 in training) composes the same
-- model from tensor ops (one node per step) instead (`composed_forward`; the
-- choice is attn.nn.fused's rule).
-- @module attn.nn.gru
-- @usage
-- local rnn = nn.GRU{input_size = 8, num_hiddens = 16, num_layers = 2}
-- local outputs, state = rnn(X)        -- X (T, B, 8) -> (T, B, 16), (2, B, 16)
-- local outputs2, state2 = rnn(X, state)
local attn = require "attn"
local autograd = require "attn.autograd"
local module = require "attn.nn.module"
local init = require "attn.nn.init"
local linear = require "attn.nn.linear"
local check = require "attn.check"
local fused = require "attn.nn.fused"

local core = attn.core
local record = autograd.record

local M = {}

local shape_str = core.shape_str -- "[2x3]" from a tensor or a table of sizes

-- ---------------------------------------------------------------- autograd helpers

--- Splits x along dim 1 into a list of views (one node; backward writes the
-- slices' gradients into one tensor). With keepdim the views keep dim 1 (size
-- 1), as narrow would make them.
local function unbind(x, keepdim)
  local n = core.size(x, 1)
  if n > core.max_request() // 64 then -- sized before building: an expanded view may name 2^62 slices
    error(string.format("unbind: %d slices are more than memory can hold", n), 2)
  end
  local function slice(t, i) return keepdim and core.narrow(t, 1, i, 1) or core.select(t, 1, i) end
  local outs = {}
  for t = 1, n do outs[t] = slice(x, t) end
  if n == 0 then return outs end
  record("unbind", outs, { x }, function(...)
    local gs = table.pack(...)
    -- every slice is written, so no zero fill but for the slices no gradient reached
    local gin = core.empty(core.shape(x), core.dtype(x))
    for t = 1, n do
      if gs[t] ~= nil then
        core.copy_(slice(gin, t), gs[t])
      else
        core.fill_(slice(gin, t), 0)
      end
    end
    return gin
  end)
  return outs
end
M.unbind = unbind


--- One GRU step of the composed path as a single autograd node.
-- gi (B, 3h): input projection W_ih x + b_ih; h (B, h); w_hh (3h, h); b_hh (3h).
-- Returns h' (B, h).
local function composed_cell(gi, h, w_hh, b_hh)
  local H = core.size(h, 2)
  local gh = core.matmul(h, core.transpose(w_hh, 1, 2))
  if b_hh then gh = core.add(gh, b_hh) end
  local r = core.sigmoid(core.add(core.narrow(gi, 2, 1, H), core.narrow(gh, 2, 1, H)))
  local z = core.sigmoid(core.add(core.narrow(gi, 2, H + 1, H), core.narrow(gh, 2, H + 1, H)))
  local ghn = core.narrow(gh, 2, 2 * H + 1, H)
  local n = core.tanh(core.add(core.narrow(gi, 2, 2 * H + 1, H), core.mul(r, ghn)))
  local out = core.add(n, core.mul(z, core.sub(h, n)))
  return record("gru_cell", out, { gi, h, w_hh, b_hh or false }, function(g)
    local dn = core.sub(g, core.mul(g, z))                   -- g * (1 - z)
    local dz = core.mul(g, core.sub(h, n))                   -- g * (h - n)
    local dan = core.mul(dn, core.sub(1, core.square(n)))    -- through tanh
    local daz = core.mul(dz, core.mul(z, core.sub(1, z)))    -- through sigmoid
    local dr = core.mul(dan, ghn)
    local dar = core.mul(dr, core.mul(r, core.sub(1, r)))
    local dgi = core.cat({ dar, daz, dan }, 2)
    local dgh = core.cat({ dar, daz, core.mul(dan, r) }, 2)
    local dh = core.add(core.mul(g, z), core.matmul(dgh, w_hh))
    local dw = core.matmul(core.transpose(dgh, 1, 2), h)
    local db = b_hh and core.sum(dgh, 1) or nil
    return dgi, dh, dw, db
  end)
end
M.composed_cell = composed_cell

-- ---------------------------------------------------------------- fused GRU (C)

local function contiguous(t) return t and core.contiguous(t) or nil end

--- The fused multi-layer GRU as one autograd node.
-- X (T, B, in); h0 (L, B, h) or nil for zeros; params a flat list of 4
-- entries per layer {weight_ih, weight_hh, bias_ih, bias_hh} (false for no
-- bias); dropout between layers (0 when not training); seed fixes the dropout
-- mask (drawn from the generator when nil). Returns outputs (T, B, h) and the
-- final state (L, B, h).
-- @usage local out, hn = gru.gru(X, nil, { w_ih, w_hh, b_ih, b_hh })
function M.gru(X, h0, params, dropout, seed)
  dropout = dropout or 0
  local x, h = core.contiguous(X), contiguous(h0)
  local out, hn, saved
  out, hn, saved, seed = core.gru_forward(x, h, params, dropout, seed)
  local inputs = { X, h0 or false }
  for i = 1, #params do inputs[i + 2] = params[i] end
  record("gru", { out, hn }, inputs, function(gout, ghn)
    local dx, dh0, grads = core.gru_backward(x, h, params, dropout, seed, saved, contiguous(gout), contiguous(ghn))
    return dx, dh0, table.unpack(grads, 1, #params)
  end)
  return out, hn
end

--- A GRU cell for step-by-step decoders (PyTorch's `GRUCell`): x (B, in),
-- h (B, h), weights as in nn.GRU's layer 0 (biases may be nil). Returns h'
-- (B, h). One fused node over the same C kernel as nn.GRU.
function M.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
  local _, hn = M.gru(x:unsqueeze(1), h:unsqueeze(1), { w_ih, w_hh, b_ih or false, b_hh or false })
  return hn:select(1, 1)
end

-- ---------------------------------------------------------------- GRU

local GRU = module.Module:extend("GRU")
M.GRU = GRU

local function check_int(v, what, min)
  if math.type(v) ~= "integer" or v < min then
    error(string.format("GRU: %s must be an integer >= %d, got %s", what, min, tostring(v)), 4)
  end
end

--- `nn.GRU{input_size =, num_hiddens =, num_layers = 1, dropout = 0, bias = true}`
-- or `nn.GRU(input_size, num_hiddens [, num_layers [, dropout]])`
-- (`hidden_size` is accepted for `num_hiddens`).
function GRU:init(a, b, c, d)
  local o
  if type(a) == "table" then
    o = check.options("GRU", a, { input_size = true, num_hiddens = true, hidden_size = true,
      num_layers = true, dropout = true, bias = true, dtype = true, fused = true }, 4)
  else
    o = { input_size = a, num_hiddens = b, num_layers = c, dropout = d }
  end
  local h = o.num_hiddens or o.hidden_size
  check_int(o.input_size, "input_size", 1)
  check_int(h, "num_hiddens", 1)
  local layers = o.num_layers or 1
  check_int(layers, "num_layers", 1)
  local p = o.dropout or 0
  if type(p) ~= "number" or p < 0 or p > 1 then
    error(string.format("GRU: dropout must be a probability in [0, 1], got %s", tostring(p)), 3)
  end
  self.input_size, self.hidden_size, self.num_hiddens = o.input_size, h, h
  self.num_layers, self.dropout, self.bias = layers, p, o.bias ~= false
  self.fused = o.fused ~= false
  local dtype = o.dtype or "float32"
  -- every layer's weights, counted before any is made: a huge num_layers must
  -- fail at once instead of allocating layer after layer
  local per_elem = dtype == "float64" and 8 or 4
  local bytes = 3.0 * h * (o.input_size + h + 2) * per_elem + (layers - 1.0) * 3.0 * h * (2.0 * h + 2) * per_elem
  if bytes > attn.core.max_request() then
    error(string.format("GRU: %d layers of %d hidden units need %.3g bytes of parameters, more than can be allocated " ..
      "(%.3g)", layers, h, bytes, attn.core.max_request()), 3)
  end
  local bound = 1 / math.sqrt(h)
  for k = 0, layers - 1 do
    local in_k = k == 0 and o.input_size or h
    self:register_parameter("weight_ih_l" .. k, init.uniform_(attn.empty({ 3 * h, in_k }, dtype), -bound, bound))
    self:register_parameter("weight_hh_l" .. k, init.uniform_(attn.empty({ 3 * h, h }, dtype), -bound, bound))
    if self.bias then
      self:register_parameter("bias_ih_l" .. k, init.uniform_(attn.empty({ 3 * h }, dtype), -bound, bound))
      self:register_parameter("bias_hh_l" .. k, init.uniform_(attn.empty({ 3 * h }, dtype), -bound, bound))
    end
  end
end

--- forward(X [, h0]): X (T, B, input_size), h0 (num_layers, B, h) or nil for zeros.
-- Returns outputs (T, B, h) (last layer, every step) and the final state
-- (num_layers, B, h).
function GRU:forward(X, h0)
  if not attn.is_tensor(X) then error("GRU: input must be a tensor (T, B, input_size), got a " .. type(X), 2) end
  local s = X:shape()
  if #s ~= 3 or s[3] ~= self.input_size then
    error(string.format("GRU: input %s must be (T, B, %d) (time-major)", shape_str(s), self.input_size), 2)
  end
  local T, B, H = s[1], s[2], self.hidden_size
  if h0 ~= nil then
    if not attn.is_tensor(h0) then error("GRU: h0 must be a tensor, got a " .. type(h0), 2) end
    local hs = h0:shape()
    if #hs ~= 3 or hs[1] ~= self.num_layers or hs[2] ~= B or hs[3] ~= H then
      error(string.format("GRU: h0 %s must be (num_layers, B, h) = %s", shape_str(hs),
        shape_str({ self.num_layers, B, H })), 2)
    end
  end
  if T == 0 then error("GRU: input " .. shape_str(s) .. " has no time steps", 2) end
  return fused.forward(self, X, h0)
end

--- Whether the fused path can run (attn.nn.fused): always, but for dropout 1
-- in training, which the kernel refuses. X and h0 are forward's, checked.
function GRU:can_fuse()
  return not (self.training and self.dropout >= 1)
end

--- The fused path: the whole forward as one node (`M.gru`), without the
-- shape checks of forward. `seed` (optional) fixes the dropout mask.
function GRU:fused_forward(X, h0, seed)
  return M.gru(X, h0, self:flat_parameters(), self.training and self.dropout or 0, seed)
end

--- The parameters as the fused kernels take them (`M.gru`): a flat list of 4
-- entries per layer, {weight_ih, weight_hh, bias_ih, bias_hh}, false for no bias.
function GRU:flat_parameters()
  local params = {}
  for k = 0, self.num_layers - 1 do
    params[4 * k + 1], params[4 * k + 2] = self["weight_ih_l" .. k], self["weight_hh_l" .. k]
    params[4 * k + 3], params[4 * k + 4] = self["bias_ih_l" .. k] or false, self["bias_hh_l" .. k] or false
  end
  return params
end

--- The composed path: the same model composed from tensor ops (one node per
-- step), without the shape checks of forward. With a seed, the dropout
-- between layers drops what the fused path (`M.gru` with that seed) drops.
function GRU:composed_forward(X, h0, seed)
  local T, B, H = X:size(1), X:size(2), self.hidden_size
  local finals = {}
  local input = X
  for k = 0, self.num_layers - 1 do
    local w_ih, w_hh = self["weight_ih_l" .. k], self["weight_hh_l" .. k]
    local b_ih, b_hh = self["bias_ih_l" .. k], self["bias_hh_l" .. k]
    local in_k = input:size(3)
    local gi = input:reshape({ T * B, in_k }):matmul(w_ih:t())
    if b_ih then gi = gi + b_ih end
    local steps = unbind(gi:reshape({ T, B, 3 * H }))
    local h = h0 and h0:select(1, k + 1) or attn.zeros({ B, H }, X:dtype())
    local outs = {}
    for t = 1, T do
      h = composed_cell(steps[t], h, w_hh, b_hh)
      outs[t] = h
    end
    finals[k + 1] = h
    input = attn.stack(outs)
    if k < self.num_layers - 1 then input = linear.dropout(input, self.dropout, self.training, seed and seed + k) end
  end
  return input, attn.stack(finals)
end

function GRU:extra_repr()
  local parts = { string.format("%d, %d", self.input_size, self.hidden_size) }
  if self.num_layers ~= 1 then parts[#parts + 1] = "num_layers=" .. self.num_layers end
  if not self.bias then parts[#parts + 1] = "bias=False" end
  if not self.fused then parts[#parts + 1] = "fused=False" end
  if self.dropout ~= 0 then parts[#parts + 1] = string.format("dropout=%g", self.dropout) end
  return table.concat(parts, ", ")
end

return M
