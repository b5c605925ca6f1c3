--- `nn.GRU` and `nn.GRUCell`: PyTorch's gated recurrent unit, time-major by default like
-- `torch.nn.GRU`.
--
-- Parameters (PyTorch names and layouts, gate order r, z, n), for layer k = 0, 1, ...:
-- weight_ih_l{k} (3h, in_k), weight_hh_l{k} (3h, h), bias_ih_l{k} (3h),
-- bias_hh_l{k} (3h) (no biases with `bias = false`); in_0 = input_size, in_k = D h
-- above (D = 2 when bidirectional, whose backward direction's keys end in `_reverse`).
-- Every entry starts as U(-1/sqrt(h), 1/sqrt(h)). One step:
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
-- mask hashed from a seed so backward rebuilds it. A bidirectional GRU runs the
-- same kernel per layer and direction (the backward direction over the reversed
-- sequence), since a layer takes both directions' outputs of the one below.
-- `nn.GRU(..., {fused = false})` (or `attn.nn.set_fused(false)`, or dropout 1 in
-- training) composes the same model from tensor ops (one node per step) instead
-- (`composed_forward`; the choice is attn.nn.fused's rule). nn.RNN (attn.nn.rnn)
-- shares the layout, options and composed path.
-- @module attn.nn.gru
-- @usage
-- local rnn = nn.GRU{input_size = 8, num_hiddens = 16, num_layers = 2}
-- local outputs, state = rnn(X)        -- X (T, B, 8) -> (T, B, 16), (2, B, 16)
-- local outputs2, state2 = rnn(X, state)
-- local bi = nn.GRU(8, 16, 2, { bidirectional = true, batch_first = true })
-- local o, h_n = bi(Y)                 -- Y (B, T, 8) -> (B, T, 32), (4, B, 16)
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

-- ---------------------------------------------------------------- shared by the recurrent layers

-- Whether tensor t has the sizes in table want.
local function shape_equal(t, want)
  if core.dim(t) ~= #want then return false end
  for i = 1, #want do
    if core.size(t, i) ~= want[i] then return false end
  end
  return true
end

-- The options of nn.GRU and nn.RNN, in the table form and (but for the sizes) the positional
-- form's options table.
local LAYER_OPTIONS = { input_size = true, num_hiddens = true, hidden_size = true, num_layers = true, dropout = true,
  bias = true, batch_first = true, bidirectional = true, dtype = true }

local function int_option(who, v, what, min)
  if math.type(v) ~= "integer" or v < min then
    error(string.format("%s: %s must be an integer >= %d, got %s", who, what, min, tostring(v)), 5)
  end
  return v
end

--- The options of a recurrent layer's constructor (nn.GRU, nn.RNN): `{input_size =,
-- hidden_size | num_hiddens =, num_layers = 1, ...}` or positional `(input_size, hidden_size
-- [, num_layers [, opts | dropout]])` (a number in fourth place is the book's dropout).
-- `extra` lists the options only that class has. Checks sizes, dropout and flags; raises at
-- the user's call (init's caller).
-- @local
function M.layer_options(who, a, b, c, d, extra)
  local allowed = {}
  for k in pairs(LAYER_OPTIONS) do allowed[k] = true end
  for k in pairs(extra or {}) do allowed[k] = true end
  local o = {}
  if type(a) == "table" then
    for k, v in pairs(check.options(who, a, allowed, 5)) do o[k] = v end
  else
    local opts = type(d) == "number" and { dropout = d } or d
    for k, v in pairs(check.options(who, opts, allowed, 5)) do o[k] = v end
    for _, k in ipairs { "input_size", "num_hiddens", "hidden_size", "num_layers" } do
      if o[k] ~= nil then error(string.format("%s: %s is a positional argument, not an option", who, k), 4) end
    end
    o.input_size, o.num_hiddens, o.num_layers = a, b, c
  end
  o.num_hiddens = o.num_hiddens or o.hidden_size
  int_option(who, o.input_size, "input_size", 1)
  int_option(who, o.num_hiddens, "num_hiddens", 1)
  o.num_layers = int_option(who, o.num_layers or 1, "num_layers", 1)
  o.dropout = o.dropout or 0
  if type(o.dropout) ~= "number" or o.dropout < 0 or o.dropout > 1 then
    error(string.format("%s: dropout must be a probability in [0, 1], got %s", who, tostring(o.dropout)), 4)
  end
  for _, k in ipairs { "bias", "batch_first", "bidirectional", "fused" } do
    if o[k] ~= nil and type(o[k]) ~= "boolean" then
      error(string.format("%s: %s must be a boolean, got a %s", who, k, type(o[k])), 4)
    end
  end
  return o
end

--- Sets a recurrent layer's fields from `o` (M.layer_options) and registers its parameters
-- in PyTorch's names and order: for layer k, direction "" then "_reverse",
-- weight_ih_l{k} (G h, in_k), weight_hh_l{k} (G h, h), bias_ih_l{k}, bias_hh_l{k} (G h), every
-- entry U(-1/sqrt(h), 1/sqrt(h)); in_0 = input_size, in_k = D h above (D = 2 when
-- bidirectional). G is the number of gates (3 for a GRU, 1 for a plain RNN).
-- @local
function M.init_layers(m, who, o, G)
  local h, layers, in0 = o.num_hiddens, o.num_layers, o.input_size
  local D = o.bidirectional and 2 or 1
  m.input_size, m.hidden_size, m.num_hiddens = in0, h, h
  m.num_layers, m.dropout, m.bias = layers, o.dropout, o.bias ~= false
  m.batch_first, m.bidirectional = o.batch_first == true, o.bidirectional == true
  local dtype = o.dtype or "float32"
  -- every layer's weights, counted before any is made: a huge num_layers must fail at once
  -- instead of allocating layer after layer
  local per_elem = dtype == "float64" and 8 or 4
  local bytes = D * G * h * per_elem * ((in0 + h + 2.0) + (layers - 1.0) * (D * h + h + 2.0))
  if bytes > core.max_request() then
    error(string.format("%s: %d layers of %d hidden units need %.3g bytes of parameters, more than can be allocated "
      .. "(%.3g)", who, layers, h, bytes, core.max_request()), 4)
  end
  local bound = 1 / math.sqrt(h)
  local function param(name, shape)
    m:register_parameter(name, init.uniform_(attn.empty(shape, dtype), -bound, bound))
  end
  for k = 0, layers - 1 do
    local in_k = k == 0 and in0 or D * h
    for d = 1, D do
      local sfx = k .. (d == 2 and "_reverse" or "")
      param("weight_ih_l" .. sfx, { G * h, in_k })
      param("weight_hh_l" .. sfx, { G * h, h })
      if m.bias then
        param("bias_ih_l" .. sfx, { G * h })
        param("bias_hh_l" .. sfx, { G * h })
      end
    end
  end
end

--- Checks a recurrent layer's input X and initial state h0 (and nn.LSTM's initial cell c0) and
-- brings them to the layout the paths run on: X (T, B, in) time-major and batched, h0 and c0
-- (D L, B, h) or nil. Accepts X (T, B, in), (B, T, in) with batch_first, or unbatched (T, in)
-- with h0, c0 (D L, h). Returns X, h0, whether the caller's input was batched, and c0.
-- @local
function M.layer_input(m, who, X, h0, c0)
  local layout = m.batch_first and "(B, T, %d)" or "(T, B, %d)"
  local I, H = m.input_size, m.hidden_size
  if not attn.is_tensor(X) then
    error(string.format("%s: input must be a tensor %s or (T, %d), got a %s", who, layout:format(I), I, type(X)), 3)
  end
  local s = X:shape()
  if (#s ~= 3 and #s ~= 2) or s[#s] ~= I then
    error(string.format("%s: input %s must be %s or unbatched (T, %d)%s", who, shape_str(s), layout:format(I), I,
      m.batch_first and "" or " (time-major)"), 3)
  end
  local batched = #s == 3
  local x = X
  if not batched then
    x = X:unsqueeze(2)
  elseif m.batch_first then
    x = X:transpose(1, 2)
  end
  local T, B = x:size(1), x:size(2)
  local DL = (m.bidirectional and 2 or 1) * m.num_layers
  local function state(name, h)
    if h == nil then return nil end
    if not attn.is_tensor(h) then error(string.format("%s: %s must be a tensor, got a %s", who, name, type(h)), 4) end
    local want = batched and { DL, B, H } or { DL, H }
    if not shape_equal(h, want) then
      error(string.format("%s: %s %s must be (%snum_layers, %sh) = %s%s", who, name, shape_str(h),
        m.bidirectional and "2 * " or "", batched and "B, " or "", shape_str(want),
        batched and "" or " for the unbatched input " .. shape_str(s)), 4)
    end
    return batched and h or h:unsqueeze(2)
  end
  h0, c0 = state("h0", h0), state("c0", c0)
  if T == 0 then error(who .. ": input " .. shape_str(s) .. " has no time steps", 3) end
  return x, h0, batched, c0
end

--- The outputs (T, B, D h) and final state (D L, B, h) (and nn.LSTM's final cell cn) of the
-- paths in the caller's layout (M.layer_input): (B, T, D h) with batch_first, (T, D h) and
-- (D L, h) for unbatched input.
-- @local
function M.layer_output(m, out, hn, batched, cn)
  if not batched then return out:select(2, 1), hn:select(2, 1), cn and cn:select(2, 1) end
  if m.batch_first then return out:transpose(1, 2), hn, cn end
  return out, hn, cn
end

--- The composed multi-layer recurrence shared by nn.GRU, nn.RNN and nn.LSTM: for every layer
-- and direction, the input projections of all steps as one product, then `cell(gi_t, h, w_hh,
-- b_hh)` per step (the reverse direction walks the steps from the last); the directions'
-- outputs are concatenated, and dropout (stream seed + k when seed is given) acts on the output
-- of every layer but the last. X (T, B, in), h0 (D L, B, h) or nil. A cell with a memory
-- (nn.LSTM's) is called `cell(gi_t, h, w_hh, b_hh, c)` and returns h and c when `c0` is given:
-- (D L, B, h), or false for zeros. Returns outputs (T, B, D h) and the final states (D L, B, h)
-- in PyTorch's order (layer-major), then the final cells with a memory.
-- @local
function M.compose_layers(m, X, h0, seed, cell, c0)
  local T, B, H = X:size(1), X:size(2), m.hidden_size
  local D = m.bidirectional and 2 or 1
  local finals, cells, input = {}, {}, X
  for k = 0, m.num_layers - 1 do
    local dirs = {}
    for d = 1, D do
      local sfx = k .. (d == 2 and "_reverse" or "")
      local w_ih, w_hh = m["weight_ih_l" .. sfx], m["weight_hh_l" .. sfx]
      local b_ih, b_hh = m["bias_ih_l" .. sfx], m["bias_hh_l" .. sfx]
      local gi = input:reshape({ T * B, input:size(3) }):matmul(w_ih:t())
      if b_ih then gi = gi + b_ih end
      local steps = unbind(gi:reshape({ T, B, w_ih:size(1) }))
      local h = h0 and h0:select(1, k * D + d) or attn.zeros({ B, H }, X:dtype())
      local c = c0 ~= nil and (c0 and c0:select(1, k * D + d) or attn.zeros({ B, H }, X:dtype())) or nil
      local outs = {}
      for i = 1, T do
        local t = d == 1 and i or T + 1 - i
        h, c = cell(steps[t], h, w_hh, b_hh, c)
        outs[t] = h
      end
      finals[#finals + 1], cells[#cells + 1] = h, c
      dirs[d] = attn.stack(outs)
    end
    input = D == 1 and dirs[1] or attn.cat(dirs, 3)
    if k < m.num_layers - 1 then input = linear.dropout(input, m.dropout, m.training, seed and seed + k) end
  end
  return input, attn.stack(finals), c0 ~= nil and attn.stack(cells) or nil
end

--- The extra_repr of a recurrent layer: sizes, then the options that differ from PyTorch's
-- defaults (and attn's fused = false).
-- @local
function M.layer_repr(m, extra)
  local parts = { string.format("%d, %d", m.input_size, m.hidden_size) }
  if m.num_layers ~= 1 then parts[#parts + 1] = "num_layers=" .. m.num_layers end
  if extra then parts[#parts + 1] = extra end
  if not m.bias then parts[#parts + 1] = "bias=False" end
  if m.batch_first then parts[#parts + 1] = "batch_first=True" end
  if m.dropout ~= 0 then parts[#parts + 1] = string.format("dropout=%g", m.dropout) end
  if m.bidirectional then parts[#parts + 1] = "bidirectional=True" end
  if m.fused == false then parts[#parts + 1] = "fused=False" end
  return table.concat(parts, ", ")
end

--- Checks the operands of one cell step (gru_cell, nn.GRUCell, nn.RNNCell, nn.LSTMCell) in the
-- caller's terms: x (B, in) or unbatched (in), h (and nn.LSTMCell's cell c) like x with h
-- units, or nil. Returns x, h as (B, in), (B, h) (nil stays nil), whether x was batched, and c
-- as (B, h).
-- @local
function M.cell_input(who, x, h, I, H, c)
  if not attn.is_tensor(x) then
    error(string.format("%s: input must be a tensor (B, %d) or (%d), got a %s", who, I, I, type(x)), 3)
  end
  local s = x:shape()
  if (#s ~= 1 and #s ~= 2) or s[#s] ~= I then
    error(string.format("%s: input %s must be (B, %d) or unbatched (%d)", who, shape_str(s), I, I), 3)
  end
  local batched = #s == 2
  local function state(name, v)
    if v == nil then return nil end
    if not attn.is_tensor(v) then error(string.format("%s: %s must be a tensor, got a %s", who, name, type(v)), 4) end
    local want = batched and { s[1], H } or { H }
    if not shape_equal(v, want) then
      error(string.format("%s: %s %s must be %s for the input %s", who, name, shape_str(v), shape_str(want),
        shape_str(s)), 4)
    end
    return batched and v or v:unsqueeze(1)
  end
  h, c = state("h", h), state("c", c)
  return batched and x or x:unsqueeze(1), h, batched, c
end

-- ---------------------------------------------------------------- gru_cell

-- The 2-D weights of a cell as (G h, in) and (G h, h): returns h.
local function cell_weights(who, w_ih, w_hh, G)
  check.tensor(who, "w_ih", w_ih, 2, "(3 * hidden, input)", 4)
  check.tensor(who, "w_hh", w_hh, 2, "(3 * hidden, hidden)", 4)
  local H = w_hh:size(2)
  if w_hh:size(1) ~= G * H or w_ih:size(1) ~= G * H then
    error(string.format("%s: w_ih %s and w_hh %s must be (%d h, input) and (%d h, h) with h = %d", who,
      shape_str(w_ih), shape_str(w_hh), G, G, H), 3)
  end
  return H
end

--- A GRU cell for step-by-step decoders (PyTorch's `GRUCell` as a function): x (B, in) or
-- unbatched (in), h (B, h) or (h), or nil for zeros; weights as in nn.GRU's layer 0 (biases
-- may be nil). Returns h' (B, h) or (h). One fused node over the same C kernel as nn.GRU.
-- @raise naming the argument and its shape when x, h or the weights do not fit
function M.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
  local H = cell_weights("gru_cell", w_ih, w_hh, 3)
  local x2, h2, batched = M.cell_input("gru_cell", x, h, w_ih:size(2), H)
  local _, hn = M.gru(x2:unsqueeze(1), h2 and h2:unsqueeze(1), { w_ih, w_hh, b_ih or false, b_hh or false })
  hn = hn:select(1, 1)
  return batched and hn or hn:select(1, 1)
end

-- ---------------------------------------------------------------- GRU

local GRU = module.Module:extend("GRU")
M.GRU = GRU

--- `nn.GRU(input_size, hidden_size [, num_layers [, opts]])` (PyTorch's), or
-- `nn.GRU{input_size =, num_hiddens | hidden_size =, num_layers = 1, ...}`; opts `{dropout = 0,
-- bias = true, batch_first = false, bidirectional = false, dtype = "float32", fused = true}`. A
-- number in fourth place is the dropout (the book's `nn.GRU(e, h, l, p)`). The backward
-- direction's parameters end in `_reverse` (weight_ih_l0_reverse, ...), as PyTorch's.
function GRU:init(a, b, c, d)
  local o = M.layer_options("GRU", a, b, c, d, { fused = true })
  M.init_layers(self, "GRU", o, 3)
  self.fused = o.fused ~= false
end

--- forward(X [, h0]): X (T, B, input_size), (B, T, input_size) with batch_first, or
-- unbatched (T, input_size); h0 (D * num_layers, B, h) ((D * num_layers, h) unbatched) or nil
-- for zeros, D = 2 when bidirectional. Returns the last layer's outputs at every step (T, B,
-- D * h) ((B, T, D * h) with batch_first, (T, D * h) unbatched; the backward direction's in
-- the second half of the last dim) and the final states (D * num_layers, B, h) in PyTorch's
-- order (layer-major, forward direction first; the backward direction's final state is its
-- state after step 1).
function GRU:forward(X, h0)
  local x, h, batched = M.layer_input(self, "GRU", X, h0)
  local out, hn = fused.forward(self, x, h)
  return M.layer_output(self, out, hn, batched)
end

--- Whether the fused path can run (attn.nn.fused): always, but for dropout 1
-- in training, which the kernel refuses. X and h0 are as the paths take them.
function GRU:can_fuse()
  return not (self.training and self.dropout >= 1)
end

-- The sequence reversed along dim 1 (time), as a differentiable view copy: the index of T .. 1.
local function reversed(x, rev) return x:index_select(1, rev) end

--- The fused path, without the checks of forward: X (T, B, in) and h0 (D L, B, h) or nil as
-- M.layer_input leaves them. One direction: the whole stack as one node (`M.gru`). Both
-- directions: per layer, the kernel over the sequence and over the reversed sequence (a
-- layer takes both directions' outputs of the one below), the outputs concatenated, then the
-- dropout between layers. `seed` (optional) fixes the dropout mask.
function GRU:fused_forward(X, h0, seed)
  return M.fused_layers(self, X, h0, seed, function(x, h, _, params, p, s) return M.gru(x, h, params, p, s) end)
end

--- The fused path of a recurrent layer m (nn.GRU, nn.LSTM) over its kernel `run(x, h0, c0,
-- params, dropout, seed)` -> outputs, final states[, final cells] (M.gru, attn.nn.lstm's
-- lstm): one direction, the whole stack in one call; both directions, per layer and
-- direction (the reverse one over the reversed sequence), the outputs concatenated, then the
-- dropout between layers (stream seed + k). c0 (D L, B, h) or nil, for a kernel with a memory.
-- @local
function M.fused_layers(m, X, h0, seed, run, c0)
  local p = m.training and m.dropout or 0
  local params = m:flat_parameters()
  if not m.bidirectional then return run(X, h0, c0, params, p, seed) end
  local T = X:size(1)
  local rev = {}
  for t = 1, T do rev[t] = T + 1 - t end
  rev = attn.tensor(rev, "int64")
  local input, finals, cells = X, {}, {}
  for k = 0, m.num_layers - 1 do
    local dirs = {}
    for d = 1, 2 do
      local j = 2 * k + d -- the (layer, direction) index, 1-based, PyTorch's order
      local w = table.move(params, 4 * j - 3, 4 * j, 1, {})
      local x = d == 1 and input or reversed(input, rev)
      local out, hn, cn = run(x, h0 and h0:narrow(1, j, 1), c0 and c0:narrow(1, j, 1), w, 0)
      dirs[d] = d == 1 and out or reversed(out, rev)
      finals[j], cells[j] = hn, cn
    end
    input = attn.cat(dirs, 3)
    if k < m.num_layers - 1 then input = linear.dropout(input, p, p > 0, seed and seed + k) end
  end
  return input, attn.cat(finals, 1), #cells > 0 and attn.cat(cells, 1) or nil
end

--- The parameters as the fused kernels take them (`M.gru`, attn.nn.lstm's lstm): a flat list
-- of 4 entries per layer and direction (PyTorch's order: layer-major, forward direction
-- first), {weight_ih, weight_hh, bias_ih, bias_hh}, false for no bias.
function GRU:flat_parameters()
  local params = {}
  for k = 0, self.num_layers - 1 do
    for d = 1, self.bidirectional and 2 or 1 do
      local sfx, n = k .. (d == 2 and "_reverse" or ""), #params
      params[n + 1], params[n + 2] = self["weight_ih_l" .. sfx], self["weight_hh_l" .. sfx]
      params[n + 3], params[n + 4] = self["bias_ih_l" .. sfx] or false, self["bias_hh_l" .. sfx] or false
    end
  end
  return params
end

--- The composed path: the same model composed from tensor ops (one node per step), without
-- the checks of forward (X and h0 as fused_forward takes them). With a seed, the dropout
-- between layers drops what the fused path with that seed drops.
function GRU:composed_forward(X, h0, seed)
  return M.compose_layers(self, X, h0, seed, composed_cell)
end

function GRU:extra_repr() return M.layer_repr(self) end

-- ---------------------------------------------------------------- GRUCell

local GRUCell = module.Module:extend("GRUCell")
M.GRUCell = GRUCell

--- Sets up a cell's fields and its parameters weight_ih (G h, in), weight_hh (G h, h),
-- bias_ih, bias_hh (G h), every entry U(-1/sqrt(h), 1/sqrt(h)), as PyTorch's cells.
-- @local
function M.init_cell(m, who, input_size, hidden_size, opts, allowed, G)
  check.positive_int(who, "input_size", input_size, 5)
  check.positive_int(who, "hidden_size", hidden_size, 5)
  opts = check.options(who, opts, allowed, 5)
  if opts.bias ~= nil and type(opts.bias) ~= "boolean" then
    error(string.format("%s: bias must be a boolean, got a %s", who, type(opts.bias)), 4)
  end
  m.input_size, m.hidden_size, m.bias = input_size, hidden_size, opts.bias ~= false
  local dtype, bound = opts.dtype or "float32", 1 / math.sqrt(hidden_size)
  local function param(name, shape)
    m:register_parameter(name, init.uniform_(attn.empty(shape, dtype), -bound, bound))
  end
  param("weight_ih", { G * hidden_size, input_size })
  param("weight_hh", { G * hidden_size, hidden_size })
  if m.bias then
    param("bias_ih", { G * hidden_size })
    param("bias_hh", { G * hidden_size })
  end
  return opts
end

--- `nn.GRUCell(input_size, hidden_size [, {bias = true, dtype = "float32", fused = true}])`:
-- one GRU step as a module (PyTorch's GRUCell): weight_ih (3h, in), weight_hh (3h, h),
-- bias_ih, bias_hh (3h).
function GRUCell:init(input_size, hidden_size, opts)
  opts = M.init_cell(self, "GRUCell", input_size, hidden_size, opts, { bias = true, dtype = true, fused = true }, 3)
  self.fused = opts.fused ~= false
end

--- forward(x [, h]): x (B, input_size) or unbatched (input_size); h (B, h) or (h), nil for
-- zeros. Returns h' (B, h) or (h).
function GRUCell:forward(x, h)
  local x2, h2, batched = M.cell_input("GRUCell", x, h, self.input_size, self.hidden_size)
  local out = fused.forward(self, x2, h2)
  return batched and out or out:select(1, 1)
end

--- Whether the fused path can run (attn.nn.fused): always.
function GRUCell.can_fuse() return true end

--- The fused path: one step of the GRU kernel (as gru_cell), x (B, in), h (B, h) or nil.
function GRUCell:fused_forward(x, h)
  local _, hn = M.gru(x:unsqueeze(1), h and h:unsqueeze(1),
    { self.weight_ih, self.weight_hh, self.bias_ih or false, self.bias_hh or false })
  return hn:select(1, 1)
end

--- The composed path: the input projection and the composed cell node, x (B, in), h (B, h)
-- or nil.
function GRUCell:composed_forward(x, h)
  local gi = x:matmul(self.weight_ih:t())
  if self.bias_ih then gi = gi + self.bias_ih end
  h = h or attn.zeros({ x:size(1), self.hidden_size }, x:dtype())
  return composed_cell(gi, h, self.weight_hh, self.bias_hh)
end

function GRUCell:extra_repr()
  return string.format("%d, %d%s%s", self.input_size, self.hidden_size, self.bias and "" or ", bias=False",
    self.fused == false and ", fused=False" or "")
end

return M
