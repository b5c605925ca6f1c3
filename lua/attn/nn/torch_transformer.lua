--- PyTorch's Transformer classes (`torch.nn.TransformerEncoderLayer`,
-- `TransformerDecoderLayer`, `TransformerEncoder`, `TransformerDecoder`,
-- `Transformer`) with PyTorch's constructors, options, forwards and state-dict
-- keys (`self_attn.in_proj_weight`, `linear1.weight`, `norm1.weight`,
-- `layers.0.linear1.weight`, `encoder.norm.weight`, ...), so a state dict saved
-- from PyTorch loads unchanged and a forward gives PyTorch's numbers.
--
-- Attention is `nn.MultiheadAttention` (attn.nn.torch_attention: its mask
-- rules apply to every mask argument here, int64 0/1 masks being boolean and
-- float masks additive). The residual + LayerNorm steps run as the fused
-- `add_layer_norm` node and linear1 + relu as `linear_relu`.
--
-- **Names.** The book's (d2l) TransformerEncoder and TransformerDecoder keep
-- their names: `nn.TransformerEncoder` and `nn.TransformerDecoder` build
-- PyTorch's class when the first argument is a module (`nn.TransformerEncoder(layer, 6)`)
-- and the book's when it is the vocabulary size (an integer); anything else
-- raises. The unambiguous names are `nn.TorchTransformerEncoder`,
-- `nn.TorchTransformerDecoder` (PyTorch's) and `nn.D2LTransformerEncoder`,
-- `nn.D2LTransformerDecoder` (the book's).
--
-- The numbers are those of PyTorch's own (slow) path; PyTorch's eval-mode
-- fast path (`torch._transformer_encoder_layer_fwd`, nested tensors) may
-- return zeros at padded positions where this returns the computed rows.
-- @module attn.nn.torch_transformer
local attn = require "attn"
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local containers = require "attn.nn.containers"
local layers = require "attn.nn.layers"
local check = require "attn.check"
local init = require "attn.nn.init"
local torch_attention = require "attn.nn.torch_attention"

local core = attn.core
local Module = module.Module
local Linear, Dropout, LayerNorm = linear.Linear, linear.Dropout, linear.LayerNorm
local MultiheadAttention = torch_attention.MultiheadAttention
local is_module, is_tensor = module.is_module, attn.is_tensor

local M = {}

-- ---------------------------------------------------------------- deep copy

-- A copy of v sharing nothing mutable with it (Python's copy.deepcopy, which PyTorch's
-- TransformerEncoder uses for its layers): modules and plain tables are copied field by field,
-- tensors cloned (a parameter becomes a new leaf requiring grad, without .grad), classes,
-- functions and other values kept. `seen` maps what was copied to its copy, so shared parts
-- stay shared (and caches keyed by tensor identity point at the copies).
local function deep_copy(v, seen)
  if seen[v] ~= nil then return seen[v] end
  if is_tensor(v) then
    local c = core.clone(v)
    if v._rg and v.grad_fn == nil then c:requires_grad_() end
    seen[v] = c
    return c
  end
  if type(v) ~= "table" then return v end
  local mt = getmetatable(v)
  if mt ~= nil and not is_module(v) then return v end -- a class or another object: shared
  local c = {}
  seen[v] = c
  for k, x in pairs(v) do rawset(c, deep_copy(k, seen), deep_copy(x, seen)) end
  return setmetatable(c, mt)
end

--- A deep copy of module `m`: the same class, structure and values, new
-- tensors (parameters are new leaves). PyTorch's `copy.deepcopy(module)`.
-- @tparam Module m
-- @treturn Module
-- @usage local layers = {layer, nn.deep_copy(layer)}
function M.deep_copy(m)
  if not is_module(m) then error("deep_copy: expected a module, got a " .. type(m), 2) end
  local c = deep_copy(m, {})
  module.invalidate() -- (a new tree: cached parameter lists must not take it for the old one)
  return c
end

-- ---------------------------------------------------------------- shared pieces

local layer_options = { dim_feedforward = true, dropout = true, activation = true, layer_norm_eps = true,
  batch_first = true, norm_first = true, dtype = true }

local activations = { relu = true, gelu = true }
local gelu = layers.GELU() -- (no state: one instance serves every layer)

-- The options of a layer constructor (PyTorch's defaults), checked.
local function read_layer_options(who, d_model, nhead, opts)
  check.positive_int(who, "d_model", d_model, 5)
  check.positive_int(who, "nhead", nhead, 5)
  opts = check.options(who, opts, layer_options, 5)
  local o = { dim_feedforward = opts.dim_feedforward or 2048, dropout = opts.dropout, activation = opts.activation or
    "relu", layer_norm_eps = opts.layer_norm_eps or 1e-5, batch_first = opts.batch_first == true,
    norm_first = opts.norm_first == true, dtype = opts.dtype or "float32" }
  if o.dropout == nil then o.dropout = 0.1 end
  check.positive_int(who, "dim_feedforward", o.dim_feedforward, 5)
  local a = o.activation
  if not (activations[a] or type(a) == "function" or is_module(a)) then
    error(string.format("%s: activation must be 'relu', 'gelu', a function or a module, got %s", who, tostring(a)), 4)
  end
  return o
end

-- The children every layer has, in PyTorch's order after its attention: linear1, dropout,
-- linear2, norm1, norm2 (, norm3), dropout1, dropout2 (, dropout3), activation.
local function feed_forward_and_norms(self, d_model, o, n)
  self.linear1 = Linear(d_model, o.dim_feedforward, { dtype = o.dtype })
  self.dropout = Dropout(o.dropout)
  self.linear2 = Linear(o.dim_feedforward, d_model, { dtype = o.dtype })
  self.norm_first = o.norm_first
  for i = 1, n do self["norm" .. i] = LayerNorm(d_model, { eps = o.layer_norm_eps, dtype = o.dtype }) end
  for i = 1, n do self["dropout" .. i] = Dropout(o.dropout) end
  self.activation = o.activation -- (a module registers as child "activation", as in PyTorch)
  self.batch_first = o.batch_first
end

-- linear2(dropout(activation(linear1(x)))): linear1 and relu as one node (linear_relu).
local function feed_forward(self, x)
  local a, h = self.activation
  if a == "relu" then
    h = self.linear1:forward_relu(x)
  elseif a == "gelu" then
    h = gelu(self.linear1(x))
  else
    h = a(self.linear1(x))
  end
  return self.linear2(self.dropout(h))
end

-- norm(x + dropout(y)) as one node (add_layer_norm).
local function add_norm(norm, x, y, dropout) return norm:forward_add(x, y, dropout.p, dropout.training) end

-- x + dropout(y) (norm_first's residual).
local function residual(x, y, dropout) return x + dropout(y) end

-- self-attention of x with one mask pair; only the output (PyTorch: need_weights=False).
local function self_attention(mha, x, mask, padding, is_causal)
  return (mha(x, x, x, { attn_mask = mask, key_padding_mask = padding, need_weights = false, is_causal = is_causal }))
end

-- ---------------------------------------------------------------- TransformerEncoderLayer

--- `nn.TransformerEncoderLayer(d_model, nhead [, {dim_feedforward = 2048,
-- dropout = 0.1, activation = "relu"|"gelu"|function|module, layer_norm_eps =
-- 1e-5, batch_first = false, norm_first = false, dtype = "float32"}])`: PyTorch's
-- encoder layer, children self_attn (MultiheadAttention), linear1, dropout,
-- linear2, norm1, norm2, dropout1, dropout2.
-- forward(src [, {src_mask, src_key_padding_mask, is_causal}]) -> src's shape:
-- (S, N, E), (N, S, E) with batch_first, or (S, E).
-- @type TransformerEncoderLayer
local TransformerEncoderLayer = Module:extend("TransformerEncoderLayer")
M.TransformerEncoderLayer = TransformerEncoderLayer

function TransformerEncoderLayer:init(d_model, nhead, opts)
  local o = read_layer_options("TransformerEncoderLayer", d_model, nhead, opts)
  self.self_attn = MultiheadAttention(d_model, nhead, { dropout = o.dropout, batch_first = o.batch_first,
    dtype = o.dtype })
  feed_forward_and_norms(self, d_model, o, 2)
end

function TransformerEncoderLayer:forward(src, opts)
  opts = check.options("TransformerEncoderLayer", opts, { src_mask = true, src_key_padding_mask = true,
    is_causal = true }, 4)
  local mask, padding, causal = opts.src_mask, opts.src_key_padding_mask, opts.is_causal
  local x = src
  if self.norm_first then
    x = residual(x, self_attention(self.self_attn, self.norm1(x), mask, padding, causal), self.dropout1)
    return residual(x, feed_forward(self, self.norm2(x)), self.dropout2)
  end
  x = add_norm(self.norm1, x, self_attention(self.self_attn, x, mask, padding, causal), self.dropout1)
  return add_norm(self.norm2, x, feed_forward(self, x), self.dropout2)
end

-- ---------------------------------------------------------------- TransformerDecoderLayer

--- `nn.TransformerDecoderLayer(d_model, nhead [, opts])`, opts as for
-- TransformerEncoderLayer: PyTorch's decoder layer, children self_attn,
-- multihead_attn (both MultiheadAttention), linear1, dropout, linear2, norm1,
-- norm2, norm3, dropout1, dropout2, dropout3.
-- forward(tgt, memory [, {tgt_mask, memory_mask, tgt_key_padding_mask,
-- memory_key_padding_mask, tgt_is_causal, memory_is_causal}]) -> tgt's shape.
-- @type TransformerDecoderLayer
local TransformerDecoderLayer = Module:extend("TransformerDecoderLayer")
M.TransformerDecoderLayer = TransformerDecoderLayer

function TransformerDecoderLayer:init(d_model, nhead, opts)
  local o = read_layer_options("TransformerDecoderLayer", d_model, nhead, opts)
  local mha = { dropout = o.dropout, batch_first = o.batch_first, dtype = o.dtype }
  self.self_attn = MultiheadAttention(d_model, nhead, mha)
  self.multihead_attn = MultiheadAttention(d_model, nhead, mha)
  feed_forward_and_norms(self, d_model, o, 3)
end

local decoder_options = { tgt_mask = true, memory_mask = true, tgt_key_padding_mask = true,
  memory_key_padding_mask = true, tgt_is_causal = true, memory_is_causal = true }

-- Attention of x over memory (PyTorch's _mha_block).
local function cross_attention(mha, x, memory, o)
  return (mha(x, memory, memory, { attn_mask = o.memory_mask, key_padding_mask = o.memory_key_padding_mask,
    need_weights = false, is_causal = o.memory_is_causal }))
end

function TransformerDecoderLayer:forward(tgt, memory, opts)
  local o = check.options("TransformerDecoderLayer", opts, decoder_options, 4)
  local x = tgt
  if self.norm_first then
    x = residual(x, self_attention(self.self_attn, self.norm1(x), o.tgt_mask, o.tgt_key_padding_mask,
      o.tgt_is_causal), self.dropout1)
    x = residual(x, cross_attention(self.multihead_attn, self.norm2(x), memory, o), self.dropout2)
    return residual(x, feed_forward(self, self.norm3(x)), self.dropout3)
  end
  x = add_norm(self.norm1, x, self_attention(self.self_attn, x, o.tgt_mask, o.tgt_key_padding_mask,
    o.tgt_is_causal), self.dropout1)
  x = add_norm(self.norm2, x, cross_attention(self.multihead_attn, x, memory, o), self.dropout2)
  return add_norm(self.norm3, x, feed_forward(self, x), self.dropout3)
end

-- ---------------------------------------------------------------- stacks

-- More layers than any model has. Each is a deep copy of the layer, so a count like 2^40 of a
-- small one ran for ever rather than running out of memory (the API fuzzer).
local MAX_LAYERS = 1 << 16

-- layers (a ModuleList of num_layers deep copies of `layer`, keys layers.0.*, ...) and norm.
local function stack(self, who, layer, num_layers, opts)
  if not is_module(layer) then
    error(string.format("%s: the first argument must be a layer module, got a %s", who, type(layer)), 4)
  end
  check.positive_int(who, "num_layers", num_layers, 5)
  if num_layers > MAX_LAYERS then
    error(string.format("%s: num_layers must be at most %d (a deep copy of the layer each), got %d", who, MAX_LAYERS,
      num_layers), 4)
  end
  opts = check.options(who, opts, { norm = true }, 5)
  if opts.norm ~= nil and not is_module(opts.norm) then
    error(string.format("%s: norm must be a module (nn.LayerNorm) or nil, got a %s", who, type(opts.norm)), 4)
  end
  local list = containers.ModuleList()
  for _ = 1, num_layers do list:append(M.deep_copy(layer)) end
  self.layers = list
  self.num_layers = num_layers
  self.norm = opts.norm
end

-- x through every layer of a stack (each called with x and the same further arguments), then norm.
local function run_stack(self, x, ...)
  for _, layer in ipairs(self.layers) do x = layer(x, ...) end
  if self.norm ~= nil then x = self.norm(x) end
  return x
end

--- PyTorch's `nn.TransformerEncoder(encoder_layer, num_layers [, {norm}])`
-- (reachable as `nn.TransformerEncoder` with a module first, and as
-- `nn.TorchTransformerEncoder`): num_layers (at most 65536) deep copies of encoder_layer (all
-- starting with its values, as PyTorch's) in `layers` (keys layers.0.*, ...),
-- then norm (key norm.*) when given.
-- forward(src [, {mask, src_key_padding_mask, is_causal}]) -> src's shape.
-- @type TorchTransformerEncoder
local TorchTransformerEncoder = Module:extend("TransformerEncoder")
M.TorchTransformerEncoder = TorchTransformerEncoder

function TorchTransformerEncoder:init(encoder_layer, num_layers, opts)
  stack(self, "TransformerEncoder", encoder_layer, num_layers, opts)
end

function TorchTransformerEncoder:forward(src, opts)
  opts = check.options("TransformerEncoder", opts, { mask = true, src_key_padding_mask = true, is_causal = true }, 4)
  local o = { src_mask = opts.mask, src_key_padding_mask = opts.src_key_padding_mask, is_causal = opts.is_causal }
  return run_stack(self, src, o)
end

--- PyTorch's `nn.TransformerDecoder(decoder_layer, num_layers [, {norm}])`
-- (also `nn.TorchTransformerDecoder`): layers.0.*, ... and norm.*.
-- forward(tgt, memory [, opts]) with the options of TransformerDecoderLayer's forward.
-- @type TorchTransformerDecoder
local TorchTransformerDecoder = Module:extend("TransformerDecoder")
M.TorchTransformerDecoder = TorchTransformerDecoder

function TorchTransformerDecoder:init(decoder_layer, num_layers, opts)
  stack(self, "TransformerDecoder", decoder_layer, num_layers, opts)
end

function TorchTransformerDecoder:forward(tgt, memory, opts)
  opts = check.options("TransformerDecoder", opts, decoder_options, 4)
  return run_stack(self, tgt, memory, opts)
end

-- ---------------------------------------------------------------- Transformer

--- `nn.Transformer([{d_model = 512, nhead = 8, num_encoder_layers = 6,
-- num_decoder_layers = 6, dim_feedforward = 2048, dropout = 0.1, activation =
-- "relu", layer_norm_eps = 1e-5, batch_first = false, norm_first = false,
-- custom_encoder, custom_decoder, dtype}])`: PyTorch's Transformer, children
-- encoder (TransformerEncoder with norm) and decoder (TransformerDecoder with
-- norm); every parameter of more than one dim is xavier_uniform_ initialised,
-- as PyTorch's. forward(src, tgt [, {src_mask, tgt_mask, memory_mask,
-- src_key_padding_mask, tgt_key_padding_mask, memory_key_padding_mask,
-- src_is_causal, tgt_is_causal, memory_is_causal}]) -> tgt's shape.
-- @type Transformer
local Transformer = Module:extend("Transformer")
M.Transformer = Transformer

local transformer_options = { d_model = true, nhead = true, num_encoder_layers = true, num_decoder_layers = true,
  dim_feedforward = true, dropout = true, activation = true, layer_norm_eps = true, batch_first = true,
  norm_first = true, custom_encoder = true, custom_decoder = true, dtype = true }

function Transformer:init(opts)
  opts = check.options("Transformer", opts, transformer_options, 4)
  local d_model, nhead = opts.d_model or 512, opts.nhead or 8
  local lo = {}
  for k in pairs(layer_options) do lo[k] = opts[k] end
  local eps, dtype = opts.layer_norm_eps or 1e-5, opts.dtype or "float32"
  self.encoder = opts.custom_encoder or TorchTransformerEncoder(TransformerEncoderLayer(d_model, nhead, lo),
    opts.num_encoder_layers or 6, { norm = LayerNorm(d_model, { eps = eps, dtype = dtype }) })
  self.decoder = opts.custom_decoder or TorchTransformerDecoder(TransformerDecoderLayer(d_model, nhead, lo),
    opts.num_decoder_layers or 6, { norm = LayerNorm(d_model, { eps = eps, dtype = dtype }) })
  for _, p in ipairs(self:parameters()) do
    if p:dim() > 1 then init.xavier_uniform_(p) end
  end
  self.d_model, self.nhead, self.batch_first = d_model, nhead, opts.batch_first == true
end

local forward_options = { src_mask = true, tgt_mask = true, memory_mask = true, src_key_padding_mask = true,
  tgt_key_padding_mask = true, memory_key_padding_mask = true, src_is_causal = true, tgt_is_causal = true,
  memory_is_causal = true }

function Transformer:forward(src, tgt, opts)
  opts = check.options("Transformer", opts, forward_options, 4)
  check.tensor("Transformer", "src", src, nil, nil, 4)
  check.tensor("Transformer", "tgt", tgt, nil, nil, 4)
  local sd, td = src:dim(), tgt:dim()
  local batch = self.batch_first and 1 or 2
  if sd ~= td or (sd == 3 and src:size(batch) ~= tgt:size(batch)) then
    error(string.format("Transformer: the batch number of src %s and tgt %s must be equal", attn.core.shape_str(src),
      attn.core.shape_str(tgt)), 3)
  end
  if src:size(sd) ~= self.d_model or tgt:size(td) ~= self.d_model then
    error(string.format("Transformer: the feature number of src %s and tgt %s must be equal to d_model %d",
      attn.core.shape_str(src), attn.core.shape_str(tgt), self.d_model), 3)
  end
  local memory = self.encoder(src, { mask = opts.src_mask, src_key_padding_mask = opts.src_key_padding_mask,
    is_causal = opts.src_is_causal })
  return self.decoder(tgt, memory, { tgt_mask = opts.tgt_mask, memory_mask = opts.memory_mask,
    tgt_key_padding_mask = opts.tgt_key_padding_mask, memory_key_padding_mask = opts.memory_key_padding_mask,
    tgt_is_causal = opts.tgt_is_causal, memory_is_causal = opts.memory_is_causal })
end

--- `nn.Transformer.generate_square_subsequent_mask(sz [, dtype = "float32"])`:
-- the (sz, sz) float mask with -inf strictly above the diagonal and 0 elsewhere
-- (PyTorch's), for tgt_mask. Also callable on an instance,
-- `model:generate_square_subsequent_mask(sz)`.
-- @tparam integer sz
-- @tparam[opt="float32"] string dtype
-- @treturn Tensor (sz, sz)
-- @usage local mask = nn.Transformer.generate_square_subsequent_mask(5)
function Transformer.generate_square_subsequent_mask(sz, dtype, ...)
  if is_module(sz) then return Transformer.generate_square_subsequent_mask(dtype, ...) end
  check.positive_int("generate_square_subsequent_mask", "sz", sz)
  dtype = dtype or "float32"
  local above = core.gt(core.reshape(attn.arange(0, sz, dtype), 1, sz), core.reshape(attn.arange(0, sz, dtype), sz, 1))
  return core.masked_fill(attn.zeros({ sz, sz }, dtype), above, -math.huge)
end

-- ---------------------------------------------------------------- the shared names

-- nn.TransformerEncoder / nn.TransformerDecoder: PyTorch's class when called with a module first,
-- the book's when called with the vocabulary size; anything else raises (never a guess).
local function dispatcher(name, torch_class, d2l_class)
  local d = {}
  local function which(first)
    if is_module(first) then return torch_class end
    if math.type(first) == "integer" then return d2l_class end
    error(string.format("nn.%s: the first argument must be a layer module (PyTorch's %s(layer, num_layers " ..
      "[, {norm}]), also nn.Torch%s) or the vocabulary size (the book's %s(vocab_size, ...), also nn.D2L%s), " ..
      "got %s", name, name, name, name, name, math.type(first) or type(first)), 4)
  end
  return setmetatable(d, {
    __call = function(_, first, ...) return which(first)(first, ...) end,
    __index = function(_, k)
      if k == "__name" then return name end
      error(string.format("nn.%s names two classes (PyTorch's and the book's): use nn.Torch%s or nn.D2L%s for '%s'",
        name, name, name, tostring(k)), 2)
    end,
    __tostring = function() return "class " .. name .. " (PyTorch's or the book's, by the first argument)" end,
  })
end

--- Dispatchers for nn.TransformerEncoder / nn.TransformerDecoder over PyTorch's
-- classes here and the book's given (attn.nn.transformer's).
-- @tparam table d2l the book's classes {TransformerEncoder =, TransformerDecoder =}
-- @treturn table {TransformerEncoder =, TransformerDecoder =}, callable like classes
function M.dispatchers(d2l)
  return {
    TransformerEncoder = dispatcher("TransformerEncoder", TorchTransformerEncoder, d2l.TransformerEncoder),
    TransformerDecoder = dispatcher("TransformerDecoder", TorchTransformerDecoder, d2l.TransformerDecoder),
  }
end

return M
