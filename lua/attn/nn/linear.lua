--- Basic layers of `attn.nn`: Linear, Embedding, Dropout, LayerNorm and ReLU
-- (Sequential is in attn.nn.containers), with PyTorch's parameter names, layouts and default initialisation.
-- @module attn.nn.linear
local attn = require "attn"
local module = require "attn.nn.module"
local init = require "attn.nn.init"
local autograd = require "attn.autograd"
local check = require "attn.check"
local fused = require "attn.nn.fused"

local Module = module.Module
local core = attn.core

local M = {}

local shape_str = core.shape_str -- "[2x3]" from a tensor or a table of sizes

-- ---------------------------------------------------------------- dropout (functional)

--- Inverted dropout: in training, zeroes each entry with probability p and
-- scales the rest by 1/(1-p); identity when not training or p = 0.
-- The mask is the engine's one dropout mechanism (src/core/attn_dropout.h), as in
-- the attention kernels and the fused GRU: a hash of a seed drawn from the
-- generator (so `attn.manual_seed` fixes it) and of each entry's row-major
-- index, rebuilt from the seed in backward, the same on every thread count.
-- `seed` (an integer, optional) picks the stream instead: the fused GRU's
-- layer k uses seed + k, so the composed GRU can drop the same entries.
function M.dropout(x, p, training, seed)
  if not training or p == 0 then return x end
  local out
  out, seed = core.dropout(x, p, seed)
  return autograd.record("dropout", out, { x }, function(g) return (core.dropout(g, p, seed)) end)
end

-- ---------------------------------------------------------------- Linear

--- `nn.Linear(in_features, out_features [, {bias = true}])`: y = x W^T + b.
-- weight (out, in) and bias (out), both U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's
-- kaiming-uniform with a = sqrt(5)); input (..., in) -> (..., out).
-- @type Linear
local Linear = Module:extend("Linear")
M.Linear = Linear

function Linear:init(in_features, out_features, opts)
  check.positive_int("Linear", "in_features", in_features, 4)
  check.positive_int("Linear", "out_features", out_features, 4)
  opts = check.options("Linear", opts, { bias = true, dtype = true }, 4)
  self.in_features, self.out_features = in_features, out_features
  local dtype = opts.dtype or "float32"
  self:register_parameter("weight", attn.empty({ out_features, in_features }, dtype))
  init.kaiming_uniform_(self.weight, math.sqrt(5))
  if opts.bias ~= false then
    local bound = 1 / math.sqrt(in_features)
    self:register_parameter("bias", init.uniform_(attn.empty({ out_features }, dtype), -bound, bound))
  else
    self:register_parameter("bias", nil)
  end
end

-- y = x W^T + b over the rows of x: y (x's shape with out_features last),
-- and what backward needs (x as rows, its rank, out_features).
local function affine_forward(x, weight, bias)
  local s = core.shape(x)
  local n = #s
  local fin, fout = core.size(weight, 2), core.size(weight, 1)
  local x2 = n == 2 and x or core.reshape(x, -1, fin)
  local wt = core.transpose(weight, 1, 2)
  local y = bias and core.addmm(bias, x2, wt) or core.matmul(x2, wt) -- the bias rows start the product
  if n ~= 2 then
    s[n] = fout
    y = core.reshape(y, s)
  end
  return y, x2, n, fout
end

-- Gradients of affine_forward for output gradient g: dx = g W, dW = g^T x,
-- db = the column sums of g, over x and g flattened to rows.
local function affine_backward(g, x, x2, n, fout, weight, bias)
  local g2 = n == 2 and g or core.reshape(g, -1, fout)
  local dx = core.matmul(g2, weight)
  if n ~= 2 then dx = core.reshape(dx, core.shape(x)) end
  return dx, core.matmul(core.transpose(g2, 1, 2), x2), bias and core.sum(g2, 1) or nil
end

--- The affine map y = x W^T + b as one autograd node (instead of transpose,
-- matmul, reshape and add): x (..., in), weight (out, in), bias (out) or nil
-- -> (..., out). Backward: dx = g W, dW = g^T x, db = the column sums of g,
-- over x and g flattened to rows.
-- @usage local y = linear.linear(x, m.weight, m.bias)
function M.linear(x, weight, bias)
  local y, x2, n, fout = affine_forward(x, weight, bias)
  return autograd.record("linear", y, { x, weight, bias or false }, function(g)
    return affine_backward(g, x, x2, n, fout, weight, bias)
  end)
end

--- relu(x W^T + b) as one autograd node, the first half of the book's
-- PositionWiseFFN: the same numbers as `linear` then `relu`, forward and
-- backward (the gradient passes where the output is positive, which is where
-- the affine map is), one node and no saved pre-activation instead of two.
-- With fused paths off (`attn.nn.set_fused(false)`) it is those two nodes.
-- @usage local h = linear.linear_relu(x, m.weight, m.bias)
function M.linear_relu(x, weight, bias)
  if not fused.choose("linear_relu") then return M.linear(x, weight, bias):relu() end
  local z, x2, n, fout = affine_forward(x, weight, bias)
  local y = core.relu(z)
  return autograd.record("linear_relu", y, { x, weight, bias or false }, function(g)
    return affine_backward(core.mul(g, core.gt(y, 0)), x, x2, n, fout, weight, bias)
  end)
end

-- Raises (at the caller's caller) unless x is a tensor (..., in_features).
local function check_linear_input(self, x)
  check.tensor("Linear", "input", x)
  local s = x:shape()
  local n = #s
  if n == 0 or s[n] ~= self.in_features then
    error(string.format("Linear: input %s has last dim %s, expected in_features = %d (weight %s)", shape_str(s),
      tostring(s[n]), self.in_features, shape_str(self.weight:shape())), 3)
  end
end

function Linear:forward(x)
  check_linear_input(self, x)
  return M.linear(x, self.weight, self.bias)
end

--- relu(self(x)) as one node (`linear_relu`), with forward's input checks.
-- @usage local h = ffn.dense1:forward_relu(x)
function Linear:forward_relu(x)
  check_linear_input(self, x)
  return M.linear_relu(x, self.weight, self.bias)
end

function Linear:extra_repr()
  return string.format("in_features=%d, out_features=%d, bias=%s", self.in_features, self.out_features,
    self.bias ~= nil and "True" or "False")
end

-- ---------------------------------------------------------------- Embedding

--- `nn.Embedding(num_embeddings, embedding_dim [, {padding_idx, max_norm, norm_type = 2,
-- dtype}])`: a lookup table, weight (n, d) ~ N(0, 1).
-- forward(ids): ids are 1-based token ids, a tensor of any shape or a (nested) Lua
-- table; returns (ids shape..., d). Gradients flow to the weight rows used.
--
-- PyTorch's options, with ids 1-based as everywhere in attn: `padding_idx` is a 1-based id
-- (PyTorch's `padding_idx = 0` is attn's 1), or negative counting from the end (-1 the last
-- row, as PyTorch's); its row starts as zeros and never receives a gradient (its value is
-- looked up as it is). `max_norm`: before each lookup, every row the ids name whose
-- `norm_type`-norm exceeds max_norm is scaled in place in the weight by max_norm / (norm +
-- 1e-7) (PyTorch's embedding_renorm_, outside autograd).
-- @type Embedding
local Embedding = Module:extend("Embedding")
M.Embedding = Embedding

function Embedding:init(num_embeddings, embedding_dim, opts)
  check.positive_int("Embedding", "num_embeddings", num_embeddings, 4)
  check.positive_int("Embedding", "embedding_dim", embedding_dim, 4)
  opts = check.options("Embedding", opts, { dtype = true, padding_idx = true, max_norm = true, norm_type = true }, 4)
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  local pad = opts.padding_idx
  if pad ~= nil then
    if math.type(pad) ~= "integer" or pad == 0 or pad > num_embeddings or pad < -num_embeddings then
      error(string.format("Embedding: padding_idx must be a 1-based id in 1..%d or -%d..-1 (from the end), got %s",
        num_embeddings, num_embeddings, tostring(pad)), 3)
    end
    if pad < 0 then pad = num_embeddings + 1 + pad end
    self.padding_idx = pad
  end
  for _, k in ipairs { "max_norm", "norm_type" } do
    local v = opts[k]
    if v ~= nil and (type(v) ~= "number" or v ~= v or v <= 0) then -- (NaN too)
      error(string.format("Embedding: %s must be a positive number, got %s", k, tostring(v)), 3)
    end
  end
  self.max_norm, self.norm_type = opts.max_norm, opts.norm_type or 2
  local weight = attn.randn({ num_embeddings, embedding_dim }, opts.dtype or "float32")
  if pad then core.fill_(core.select(weight, 1, pad), 0) end
  self:register_parameter("weight", weight)
end

-- PyTorch's embedding_renorm_: each distinct row of weight named by the flat ids whose p-norm
-- exceeds max_norm scaled by max_norm / (norm + 1e-7), in place, outside autograd.
local function renorm_rows(weight, flat, max_norm, p)
  local seen, rows = {}, {}
  for _, id in ipairs(core.totable(flat)) do
    id = math.tointeger(id)
    if not seen[id] then
      seen[id] = true
      rows[#rows + 1] = id
    end
  end
  local norms = core.index_select(weight, 1, rows):norm(p, 2):totable()
  for i, norm in ipairs(norms) do
    if norm > max_norm then core.mul_(core.select(weight, 1, rows[i]), max_norm / (norm + 1e-7)) end
  end
end

--- forward(ids): ids of any dtype (int64 preferred; float ids must hold
-- integers), validated in the core against 1..num_embeddings.
function Embedding:forward(ids)
  if type(ids) == "table" and not attn.is_tensor(ids) then ids = attn.tensor(ids, "float64") end
  check.tensor("Embedding", "ids", ids)
  local shape = ids:shape()
  -- the output is sized before the ids are walked: a huge expanded view of ids fails at once
  shape[#shape + 1] = self.embedding_dim
  core.check_size("Embedding", "output", shape, self.weight:dtype())
  shape[#shape] = nil
  core.check_ids(ids, self.num_embeddings, "Embedding", "token id", "ids " .. shape_str(shape))
  shape[#shape + 1] = self.embedding_dim
  local weight, flat, pad = self.weight, ids:reshape({ -1 }), self.padding_idx
  if self.max_norm then renorm_rows(weight, flat, self.max_norm, self.norm_type) end
  if pad == nil then return weight:index_select(1, flat):reshape(shape) end
  local out = core.index_select(weight, 1, flat)
  out = autograd.record("embedding", out, { weight }, function(g)
    local gw = core.full(core.shape(weight), 0, core.dtype(weight))
    core.index_add_(gw, 1, flat, g)
    core.fill_(core.select(gw, 1, pad), 0) -- the padding row learns nothing
    return gw
  end)
  return out:reshape(shape)
end

function Embedding:extra_repr()
  local s = string.format("%d, %d", self.num_embeddings, self.embedding_dim)
  if self.padding_idx then s = s .. ", padding_idx=" .. self.padding_idx end
  if self.max_norm then s = s .. string.format(", max_norm=%g", self.max_norm) end
  if self.norm_type ~= 2 then s = s .. string.format(", norm_type=%g", self.norm_type) end
  return s
end

-- ---------------------------------------------------------------- Dropout

--- `nn.Dropout(p)`: inverted dropout in training mode, identity in eval mode or
-- with p = 0. The mask comes from `attn.bernoulli` (the engine's generator).
-- @type Dropout
local Dropout = Module:extend("Dropout")
M.Dropout = Dropout

function Dropout:init(p)
  p = p or 0.5
  if type(p) ~= "number" or p < 0 or p > 1 then
    error(string.format("Dropout: p must be a probability in [0, 1], got %s", tostring(p)), 3)
  end
  self.p = p
end

function Dropout:forward(x)
  check.tensor("Dropout", "input", x)
  return M.dropout(x, self.p, self.training)
end

function Dropout:extra_repr() return string.format("p=%g, inplace=False", self.p) end

-- ---------------------------------------------------------------- LayerNorm

--- `nn.LayerNorm(normalized_shape [, {eps = 1e-5, elementwise_affine = true}])`:
-- normalises over the trailing dims given (a number d or a shape table), with
-- the biased variance as PyTorch: y = (x - mean) / sqrt(var + eps) * weight + bias.
-- weight starts at ones and bias at zeros, both of shape normalized_shape.
-- @type LayerNorm
local LayerNorm = Module:extend("LayerNorm")
M.LayerNorm = LayerNorm

function LayerNorm:init(normalized_shape, opts)
  if type(normalized_shape) == "number" then normalized_shape = { normalized_shape } end
  if type(normalized_shape) ~= "table" or #normalized_shape == 0 then
    error("LayerNorm: normalized_shape must be a size or a non-empty table of sizes", 3)
  end
  for _, d in ipairs(normalized_shape) do check.positive_int("LayerNorm", "normalized_shape entry", d, 4) end
  opts = check.options("LayerNorm", opts, { eps = true, elementwise_affine = true, dtype = true }, 4)
  self.normalized_shape = { table.unpack(normalized_shape) }
  self.eps = opts.eps or 1e-5
  if type(self.eps) ~= "number" or not (self.eps >= 0 and self.eps < math.huge) then -- NaN fails too
    error(string.format("LayerNorm: eps must be a finite number >= 0, got %s", tostring(opts.eps)), 3)
  end
  self.elementwise_affine = opts.elementwise_affine ~= false
  local n = 1
  for _, d in ipairs(normalized_shape) do n = n * d end
  self.normalized_numel = n
  if self.elementwise_affine then
    self:register_parameter("weight", attn.ones(self.normalized_shape, opts.dtype or "float32"))
    self:register_parameter("bias", attn.zeros(self.normalized_shape, opts.dtype or "float32"))
  end
end

-- Raises (at the caller's caller) unless x is a tensor ending with normalized_shape.
local function check_norm_input(self, x)
  check.tensor("LayerNorm", "input", x)
  local s, ns = x:shape(), self.normalized_shape
  local k, n = #ns, #s
  local ok = n >= k
  for i = 1, k do ok = ok and s[n - k + i] == ns[i] end
  if not ok then
    error(string.format("LayerNorm: input %s does not end with normalized_shape %s", shape_str(s), shape_str(ns)), 3)
  end
end

function LayerNorm:forward(x)
  check_norm_input(self, x)
  return fused.forward(self, x)
end

--- Whether the kernel node can run (attn.nn.fused): always (forward checked x); the
-- switch and the `fused` field still choose.
function LayerNorm.can_fuse() return true end

local layer_norm_node -- the kernel node, below

--- The fused path: the C kernel node (`layer_norm`; the dispatcher has chosen).
function LayerNorm:fused_forward(x)
  return layer_norm_node(x, self.normalized_numel, self.weight, self.bias, self.eps)
end

--- The composed path: the same node from tensor ops (`layer_norm_composed`).
function LayerNorm:composed_forward(x)
  return M.layer_norm_composed(x, self.normalized_numel, self.weight, self.bias, self.eps)
end

--- self(dropout(y, p, training) + x) as one node (`add_layer_norm`): the
-- book's AddNorm. x and y are tensors of one shape ending with normalized_shape.
-- @usage local z = addnorm.ln:forward_add(x, y, 0.1, true)
function LayerNorm:forward_add(x, y, p, training)
  check_norm_input(self, x)
  check.tensor("LayerNorm", "input", y)
  if not core.same_shape(x, y) then
    error(string.format("LayerNorm: the two inputs of forward_add differ in shape: %s and %s", shape_str(x),
      shape_str(y)), 2)
  end
  return M.add_layer_norm(x, y, p, training, self.normalized_numel, self.weight, self.bias, self.eps)
end

--- Layer normalisation over the last entries of x as one autograd node
-- backed by the C kernel (attn_layernorm.h): rows of n = normalized_numel
-- entries become (x - mean) / sqrt(var + eps) (biased variance), then times
-- weight plus bias when given (both of n entries, any shape). Forward saves
-- the per-row mean and 1/std (float64, saved.mean and saved.rstd of the
-- layout attn_layer_norm_saved_layout); backward is one pass over the rows
-- for dx and one over the columns for the weight and bias gradients. With
-- fused paths off (`attn.nn.set_fused(false)`) it is `layer_norm_composed`.
-- @usage local y = linear.layer_norm(x, 8, w, b, 1e-5)
function M.layer_norm(x, n, weight, bias, eps)
  if not fused.choose("layer_norm") then return M.layer_norm_composed(x, n, weight, bias, eps) end
  return layer_norm_node(x, n, weight, bias, eps)
end

layer_norm_node = function(x, n, weight, bias, eps)
  local xc = core.contiguous(x)
  local w, b = weight and core.contiguous(weight), bias and core.contiguous(bias)
  local y, saved = core.layer_norm_forward(xc, n, w, b, eps)
  return autograd.record("layer_norm", y, { x, weight or false, bias or false }, function(g)
    local dx, dw, db = core.layer_norm_backward(xc, n, w, saved, core.contiguous(g), weight ~= nil or bias ~= nil)
    if weight == nil and bias == nil then return dx end
    return dx, weight and dw or nil, bias and core.reshape(db, core.shape(bias)) or nil
  end)
end

--- layer_norm(dropout(y) + x) as one autograd node, the book's AddNorm:
-- the same numbers as the three nodes dropout (as `M.dropout(y, p, training,
-- seed)`, drawing the same seed), add and `layer_norm`, forward and backward,
-- without their intermediate gradients. x and y broadcast as in add; the
-- rest as `layer_norm`. With fused paths off (`attn.nn.set_fused(false)`) it
-- is those three nodes (`layer_norm` composed too).
-- @usage local z = linear.add_layer_norm(x, y, 0.1, true, 32, ln.weight, ln.bias, 1e-5)
function M.add_layer_norm(x, y, p, training, n, weight, bias, eps, seed)
  if not fused.choose("add_layer_norm") then
    return M.layer_norm_composed(M.dropout(y, p, training, seed) + x, n, weight, bias, eps)
  end
  local drop = training and p ~= 0
  local d = y
  if drop then d, seed = core.dropout(y, p, seed) end
  local sum = core.add(d, x)
  local w, b = weight and core.contiguous(weight), bias and core.contiguous(bias)
  local out, saved = core.layer_norm_forward(sum, n, w, b, eps)
  return autograd.record("add_layer_norm", out, { x, y, weight or false, bias or false }, function(g)
    local ds, dw, db = core.layer_norm_backward(sum, n, w, saved, core.contiguous(g), weight ~= nil or bias ~= nil)
    local dy = drop and (core.dropout(ds, p, seed)) or ds
    return autograd.sum_to(ds, core.shape(x)), autograd.sum_to(dy, core.shape(y)), weight and dw or nil,
      bias and core.reshape(db, core.shape(bias)) or nil
  end)
end

--- The same node composed from core ops (`layer_norm`'s composed path, which
-- the specs check the kernel against). Backward, with xhat the normalised row
-- and d = g * weight: dx = (d - mean(d) - xhat mean(d xhat)) / std.
-- @usage local y = linear.layer_norm_composed(x, 8, w, b, 1e-5)
function M.layer_norm_composed(x, n, weight, bias, eps)
  local s = core.shape(x)
  local x2 = core.reshape(x, -1, n)
  local xc = core.sub(x2, core.mean(x2, 2, true))
  local std = core.sqrt(core.add(core.mean(core.square(xc), 2, true), eps))
  local xhat = core.div(xc, std)
  local w = weight and core.reshape(weight, n)
  local y = w and core.mul(xhat, w) or xhat
  if bias then y = core.add(y, core.reshape(bias, n)) end
  return autograd.record("layer_norm", core.reshape(y, s), { x, weight or false, bias or false }, function(g)
    local g2 = core.reshape(g, -1, n)
    local d = w and core.mul(g2, w) or g2
    local dx = core.sub(core.sub(d, core.mean(d, 2, true)), core.mul(xhat, core.mean(core.mul(d, xhat), 2, true)))
    dx = core.reshape(core.div(dx, std), s)
    return dx, weight and core.reshape(core.sum(core.mul(g2, xhat), 1), core.shape(weight)) or nil,
      bias and core.reshape(core.sum(g2, 1), core.shape(bias)) or nil
  end)
end

--- Deprecated alias of `layer_norm_composed` (the old name), kept for one
-- release: "reference" now names only the C kernels' plain reference path.
-- @see layer_norm_composed
M.layer_norm_reference = M.layer_norm_composed

function LayerNorm:extra_repr()
  local ns = self.normalized_shape
  local shape = #ns == 1 and "(" .. ns[1] .. ",)" or "(" .. table.concat(ns, ", ") .. ")" -- Python tuple style
  return string.format("%s, eps=%g, elementwise_affine=%s", shape, self.eps,
    self.elementwise_affine and "True" or "False")
end

-- ---------------------------------------------------------------- ReLU

--- `nn.ReLU()`: max(x, 0) elementwise.
-- @type ReLU
local ReLU = Module:extend("ReLU")
M.ReLU = ReLU

function ReLU.forward(_, x)
  check.tensor("ReLU", "input", x)
  return x:relu()
end

-- ---------------------------------------------------------------- Sequential

-- Sequential lives with the other containers; exported here too for the code
-- that takes it from this module.
M.Sequential = require("attn.nn.containers").Sequential

return M
