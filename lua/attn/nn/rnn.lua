--- `nn.RNN` and `nn.RNNCell`: PyTorch's Elman recurrences, composed from tensor ops.
--
-- One step of layer k (gate count 1, PyTorch's names and layouts):
--
--     h' = act(W_ih x + b_ih + W_hh h + b_hh),   act = tanh or relu
--
-- with weight_ih_l{k} (h, in_k), weight_hh_l{k} (h, h), bias_ih_l{k}, bias_hh_l{k} (h), the
-- backward direction's ending in `_reverse`; every entry U(-1/sqrt(h), 1/sqrt(h)). Layout,
-- options, bidirectional order and dropout between layers are nn.GRU's (attn.nn.gru); there
-- is no fused path (the input projections of all steps are one product per layer and
-- direction, then one node per step of tensor ops).
-- @module attn.nn.rnn
-- @usage
-- local rnn = nn.RNN(8, 16, 2, { nonlinearity = "relu", batch_first = true })
-- local outputs, h_n = rnn(X)          -- X (B, T, 8) -> (B, T, 16), (2, B, 16)
local attn = require "attn"
local module = require "attn.nn.module"
local gru = require "attn.nn.gru"

local M = {}

local ACTIVATIONS = { tanh = "tanh", relu = "relu" }

local function activation(who, v)
  v = v or "tanh"
  if ACTIVATIONS[v] == nil then
    error(string.format("%s: nonlinearity must be 'tanh' or 'relu', got %s", who, tostring(v)), 5)
  end
  return v
end

-- One step as a function of the input projection gi (B, h) (bias included), the state h
-- (B, h) and the recurrent weights.
local function step(act)
  return function(gi, h, w_hh, b_hh)
    local a = gi + h:matmul(w_hh:t())
    if b_hh then a = a + b_hh end
    return a[act](a)
  end
end

-- ---------------------------------------------------------------- RNN

local RNN = module.Module:extend("RNN")
M.RNN = RNN

--- `nn.RNN(input_size, hidden_size [, num_layers [, opts]])` or `nn.RNN{input_size =,
-- hidden_size =, ...}`; opts `{nonlinearity = "tanh"|"relu", dropout = 0, bias = true,
-- batch_first = false, bidirectional = false, dtype = "float32"}`.
function RNN:init(a, b, c, d)
  local o = gru.layer_options("RNN", a, b, c, d, { nonlinearity = true })
  self.nonlinearity = activation("RNN", o.nonlinearity)
  gru.init_layers(self, "RNN", o, 1)
end

--- forward(X [, h0]): as nn.GRU's forward (shapes, batch_first, unbatched input,
-- bidirectional order). Returns outputs and the final states.
function RNN:forward(X, h0)
  local x, h, batched = gru.layer_input(self, "RNN", X, h0)
  local out, hn = gru.compose_layers(self, x, h, nil, step(self.nonlinearity))
  return gru.layer_output(self, out, hn, batched)
end

function RNN:extra_repr()
  return gru.layer_repr(self, self.nonlinearity ~= "tanh" and "nonlinearity='" .. self.nonlinearity .. "'" or nil)
end

-- ---------------------------------------------------------------- RNNCell

local RNNCell = module.Module:extend("RNNCell")
M.RNNCell = RNNCell

--- `nn.RNNCell(input_size, hidden_size [, {bias = true, nonlinearity = "tanh"|"relu", dtype}])`:
-- one step as a module, weight_ih (h, in), weight_hh (h, h), bias_ih, bias_hh (h).
function RNNCell:init(input_size, hidden_size, opts)
  opts = gru.init_cell(self, "RNNCell", input_size, hidden_size, opts,
    { bias = true, dtype = true, nonlinearity = true }, 1)
  self.nonlinearity = activation("RNNCell", opts.nonlinearity)
end

--- forward(x [, h]): x (B, input_size) or unbatched (input_size); h (B, h) or (h), nil for
-- zeros. Returns h' (B, h) or (h).
function RNNCell:forward(x, h)
  local x2, h2, batched = gru.cell_input("RNNCell", x, h, self.input_size, self.hidden_size)
  local gi = x2:matmul(self.weight_ih:t())
  if self.bias_ih then gi = gi + self.bias_ih end
  h2 = h2 or attn.zeros({ x2:size(1), self.hidden_size }, x2:dtype())
  local out = step(self.nonlinearity)(gi, h2, self.weight_hh, self.bias_hh)
  return batched and out or out:select(1, 1)
end

function RNNCell:extra_repr()
  return string.format("%d, %d%s%s", self.input_size, self.hidden_size, self.bias and "" or ", bias=False",
    self.nonlinearity ~= "tanh" and ", nonlinearity='" .. self.nonlinearity .. "'" or "")
end

return M
