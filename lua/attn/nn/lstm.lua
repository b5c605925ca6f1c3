--- `nn.LSTM` and `nn.LSTMCell`: PyTorch's long short-term memory, time-major by default like
-- `torch.nn.LSTM`.
--
-- Parameters (PyTorch names and layouts, gate order i, f, g, o), for layer k = 0, 1, ...:
-- weight_ih_l{k} (4h, in_k), weight_hh_l{k} (4h, h), bias_ih_l{k}, bias_hh_l{k} (4h) (no
-- biases with `bias = false`); in_0 = input_size, in_k = D h above (D = 2 when bidirectional,
-- whose backward direction's keys end in `_reverse`). Every entry starts as U(-1/sqrt(h),
-- 1/sqrt(h)). One step from the state h and the cell c:
--
--     i  = sigmoid(W_ii x + b_ii + W_hi h + b_hi)
--     f  = sigmoid(W_if x + b_if + W_hf h + b_hf)
--     g  = tanh(W_ig x + b_ig + W_hg h + b_hg)
--     o  = sigmoid(W_io x + b_io + W_ho h + b_ho)
--     c' = f * c + i * g
--     h' = o * tanh(c')
--
-- The fused path is nn.GRU's (attn.nn.gru) over its own C kernel (attn_lstm.h): every layer
-- and step of one direction in one C call and one autograd node, the input projections of all
-- steps one product per layer, backward one C call; a bidirectional LSTM runs it per layer and
-- direction. Dropout (training only) acts on the outputs of every layer but the last, with
-- nn.GRU's seeded masks. `{fused = false}` (or `attn.nn.set_fused(false)`, or dropout 1 in
-- training) composes the same model from tensor ops, one cell at a time (`composed_forward`).
-- `proj_size` (PyTorch's projected LSTM) is not supported.
-- @module attn.nn.lstm
-- @usage
-- local lstm = nn.LSTM(8, 16, 2, { batch_first = true })
-- local out, state = lstm(X)             -- X (B, T, 8) -> (B, T, 16), {h_n, c_n} (2, B, 16) each
-- local out2 = lstm(X2, state)           -- continue from {h_n, c_n}
-- local cell = nn.LSTMCell(8, 16)
-- local h, c = cell(x)                   -- x (B, 8) -> (B, 16), (B, 16); then cell(x2, {h, c})
local attn = require "attn"
local autograd = require "attn.autograd"
local module = require "attn.nn.module"
local gru = require "attn.nn.gru"
local fused = require "attn.nn.fused"

local core = attn.core

local M = {}

local function contiguous(t) return t and core.contiguous(t) or nil end

--- The fused multi-layer LSTM of one direction as one autograd node.
-- X (T, B, in); h0, c0 (L, B, h) or nil for zeros; params a flat list of 4 entries per layer
-- {weight_ih, weight_hh, bias_ih, bias_hh} (false for no bias); dropout between layers (0 when
-- not training); seed fixes the dropout mask (drawn from the generator when nil). Returns the
-- outputs (T, B, h), the final states and the final cells (L, B, h).
-- @usage local out, hn, cn = lstm.lstm(X, nil, nil, { w_ih, w_hh, b_ih, b_hh })
function M.lstm(X, h0, c0, params, dropout, seed)
  dropout = dropout or 0
  local x, h, c = core.contiguous(X), contiguous(h0), contiguous(c0)
  local out, hn, cn, saved
  out, hn, cn, saved, seed = core.lstm_forward(x, h, c, params, dropout, seed)
  local inputs = { X, h0 or false, c0 or false }
  for i = 1, #params do inputs[i + 3] = params[i] end
  autograd.record("lstm", { out, hn, cn }, inputs, function(gout, ghn, gcn)
    local dx, dh0, dc0, grads = core.lstm_backward(x, h, c, params, dropout, seed, saved, contiguous(gout),
      contiguous(ghn), contiguous(gcn))
    return dx, dh0, dc0, table.unpack(grads, 1, #params)
  end)
  return out, hn, cn
end

--- One step of one layer as one autograd node over the same C kernel (a decoder's cell: no
-- sequence views around it). x (B, in); h, c (B, h) or nil for zeros; params {weight_ih,
-- weight_hh, bias_ih, bias_hh} (false for no bias). Returns h' and c' (B, h).
-- @usage local h, c = lstm.lstm_step(x, h, c, { w_ih, w_hh, b_ih, b_hh })
function M.lstm_step(x, h, c, params)
  local xc, hc, cc = core.contiguous(x), contiguous(h), contiguous(c)
  local _, hn, cn, saved = core.lstm_forward(xc, hc, cc, params, 0)
  autograd.record("lstm_step", { hn, cn }, { x, h or false, c or false, table.unpack(params) }, function(ghn, gcn)
    local dx, dh, dc, grads = core.lstm_backward(xc, hc, cc, params, 0, 0, saved, nil, contiguous(ghn),
      contiguous(gcn))
    return dx, dh, dc, table.unpack(grads, 1, #params)
  end)
  return hn, cn
end

--- One LSTM step of the composed path, written with differentiable tensor ops (the reference
-- the fused kernel is held to): gi (B, 4h) the input projection W_ih x + b_ih, h and c (B, h),
-- w_hh (4h, h), b_hh (4h) or nil. Returns h' and c' (B, h).
function M.composed_cell(gi, h, w_hh, b_hh, c)
  local H = h:size(2)
  local a = gi + h:matmul(w_hh:t())
  if b_hh then a = a + b_hh end
  local i, f = a:narrow(2, 1, H):sigmoid(), a:narrow(2, H + 1, H):sigmoid()
  local g, o = a:narrow(2, 2 * H + 1, H):tanh(), a:narrow(2, 3 * H + 1, H):sigmoid()
  local c2 = f * c + i * g
  return o * c2:tanh(), c2
end

-- The caller's state: nil, or {h, c} of two tensors (PyTorch's (h_0, c_0) tuple).
local function state_pair(who, state)
  if state == nil then return nil, nil end
  if type(state) ~= "table" or attn.is_tensor(state) or not attn.is_tensor(state[1])
    or not attn.is_tensor(state[2]) then
    error(string.format("%s: the state must be a table {h, c} of two tensors, got a %s", who,
      attn.is_tensor(state) and "tensor" or type(state)), 3)
  end
  return state[1], state[2]
end

-- ---------------------------------------------------------------- LSTM

local LSTM = module.Module:extend("LSTM")
M.LSTM = LSTM

--- `nn.LSTM(input_size, hidden_size [, num_layers [, opts]])` (PyTorch's), or
-- `nn.LSTM{input_size =, hidden_size | num_hiddens =, num_layers = 1, ...}`; opts `{dropout = 0,
-- bias = true, batch_first = false, bidirectional = false, dtype = "float32", fused = true}`
-- (`proj_size` only as 0). A number in fourth place is the dropout, as for nn.GRU.
-- @raise naming the option when proj_size is not 0
function LSTM:init(a, b, c, d)
  local o = gru.layer_options("LSTM", a, b, c, d, { fused = true, proj_size = true })
  if o.proj_size ~= nil and o.proj_size ~= 0 then
    error(string.format("LSTM: proj_size %s is not supported (only 0, no projection)", tostring(o.proj_size)), 3)
  end
  gru.init_layers(self, "LSTM", o, 4)
  self.fused = o.fused ~= false
end

--- forward(X [, {h0, c0}]): X (T, B, input_size), (B, T, input_size) with batch_first, or
-- unbatched (T, input_size); h0 and c0 (D * num_layers, B, h) ((D * num_layers, h) unbatched),
-- or no state for zeros, D = 2 when bidirectional. Returns the last layer's outputs at every
-- step (T, B, D * h) ((B, T, D * h) with batch_first, (T, D * h) unbatched; the backward
-- direction's in the second half of the last dim) and `{h_n, c_n}`, the final states and cells
-- (D * num_layers, B, h) in PyTorch's order (layer-major, forward direction first).
-- @raise naming the argument and the shapes when X or the state does not fit
function LSTM:forward(X, state)
  local h0, c0 = state_pair("LSTM", state)
  local x, h, batched, c = gru.layer_input(self, "LSTM", X, h0, c0)
  local out, hn, cn = fused.forward(self, x, h, c)
  out, hn, cn = gru.layer_output(self, out, hn, batched, cn)
  return out, { hn, cn }
end

--- Whether the fused path can run (attn.nn.fused): always, but for dropout 1 in training,
-- which the kernel refuses.
function LSTM:can_fuse()
  return not (self.training and self.dropout >= 1)
end

--- The fused path, without the checks of forward: X (T, B, in), h0 and c0 (D L, B, h) or nil
-- as nn.GRU's layer_input leaves them; returns outputs, final states and final cells (T, B, D
-- h), (D L, B, h), (D L, B, h). One direction: the whole stack as one node (`M.lstm`); both:
-- per layer and direction, as nn.GRU. `seed` (optional) fixes the dropout mask.
function LSTM:fused_forward(X, h0, c0, seed)
  return gru.fused_layers(self, X, h0, seed, M.lstm, c0)
end

--- The composed path: the same model from tensor ops (`M.composed_cell` per step), without
-- the checks of forward (arguments and results as fused_forward's). With a seed, the dropout
-- between layers drops what the fused path with that seed drops.
function LSTM:composed_forward(X, h0, c0, seed)
  return gru.compose_layers(self, X, h0, seed, M.composed_cell, c0 or false)
end

--- The parameters as `M.lstm` takes them: nn.GRU's flat_parameters (4 entries per layer and
-- direction, false for no bias).
-- @function LSTM:flat_parameters
LSTM.flat_parameters = gru.GRU.flat_parameters

function LSTM:extra_repr() return gru.layer_repr(self) end

-- ---------------------------------------------------------------- LSTMCell

local LSTMCell = module.Module:extend("LSTMCell")
M.LSTMCell = LSTMCell

--- `nn.LSTMCell(input_size, hidden_size [, {bias = true, dtype = "float32", fused = true}])`:
-- one LSTM step as a module (PyTorch's LSTMCell): weight_ih (4h, in), weight_hh (4h, h),
-- bias_ih, bias_hh (4h).
function LSTMCell:init(input_size, hidden_size, opts)
  opts = gru.init_cell(self, "LSTMCell", input_size, hidden_size, opts, { bias = true, dtype = true, fused = true }, 4)
  self.fused = opts.fused ~= false
end

--- forward(x [, {h, c}]): x (B, input_size) or unbatched (input_size); h and c (B, h) or (h),
-- or no state for zeros. Returns h' and c' (B, h) or (h) (PyTorch's tuple as two values).
-- One fused C step (the nn.LSTM kernel over one step) unless fused paths are off.
-- @raise naming the argument and the shapes when x or the state does not fit
function LSTMCell:forward(x, state)
  local h, c = state_pair("LSTMCell", state)
  local x2, h2, batched, c2 = gru.cell_input("LSTMCell", x, h, self.input_size, self.hidden_size, c)
  local hn, cn = fused.forward(self, x2, h2, c2)
  if batched then return hn, cn end
  return hn:select(1, 1), cn:select(1, 1)
end

--- Whether the fused path can run (attn.nn.fused): always.
function LSTMCell.can_fuse() return true end

--- The fused path: one step of the LSTM kernel (`M.lstm_step`), x (B, in), h and c (B, h) or
-- nil; returns h' and c' (B, h).
function LSTMCell:fused_forward(x, h, c)
  return M.lstm_step(x, h, c, { self.weight_ih, self.weight_hh, self.bias_ih or false, self.bias_hh or false })
end

--- The composed path: the input projection and `M.composed_cell`, x (B, in), h and c (B, h) or
-- nil.
function LSTMCell:composed_forward(x, h, c)
  local gi = x:matmul(self.weight_ih:t())
  if self.bias_ih then gi = gi + self.bias_ih end
  local zeros = function() return attn.zeros({ x:size(1), self.hidden_size }, x:dtype()) end
  return M.composed_cell(gi, h or zeros(), self.weight_hh, self.bias_hh, c or zeros())
end

function LSTMCell:extra_repr()
  return string.format("%d, %d%s%s", self.input_size, self.hidden_size, self.bias and "" or ", bias=False",
    self.fused == false and ", fused=False" or "")
end

return M
