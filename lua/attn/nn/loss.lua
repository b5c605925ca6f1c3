--- Loss functions of `attn.nn`: cross-entropy with 1-based class ids, and the
-- book's masked sequence loss together with the true per-token mean.
--
-- **d2l's loss scaling (pitfall 5).** `MaskedSoftmaxCELoss` follows the book: a
-- sequence's loss is the sum of its valid tokens' cross-entropies divided by
-- the padded length T (all positions, pads included), not by its valid length.
-- With per-token losses l[b][t] and valid lengths v[b]:
--
--     book[b]        = (sum over t <= v[b] of l[b][t]) / T
--     token_mean     = (sum over b, t <= v[b] of l[b][t]) / (sum over b of v[b])
--     sum_b book[b] / sum_b v[b] = token_mean / T          (exactly, for any lengths)
--
-- The left side of the last line is what d2l's `train_seq2seq` prints as "loss"
-- (e.g. 0.020), so the per-token cross-entropy is T times larger (about 0.20 for
-- T = 10). `nn.masked_token_mean` returns the token mean and that book number.
-- @module attn.nn.loss
local attn = require "attn"
local module = require "attn.nn.module"
local check = require "attn.check"

local Module = module.Module
local core = require "attn.core"
local autograd = require "attn.autograd"
local fused = require "attn.nn.fused"

local M = {}

local shape_str = require("attn.core").shape_str -- "[2x3]" from a tensor or a table of sizes

-- A table of labels becomes a tensor; shapes and ids are checked in the core.
local function as_labels(who, labels)
  if type(labels) == "table" and not attn.is_tensor(labels) then return attn.tensor(labels, "float64") end
  if not attn.is_tensor(labels) then error(string.format("%s: labels must be a tensor or a table", who), 4) end
  return labels
end

local function contiguous(t) return core.is_contiguous(t) and t or core.contiguous(t) end

-- The fused node: -log_softmax(logits)[label] per row (labels' shape), times
-- the 0/1 mask of rows t <= valid_len[b] when valid_len is given (rows read as
-- (B, steps)). One forward kernel checks the ids (1-based, int64 or integral
-- floats) and saves each row's max and log-sum (saved.stats (R, 2), the layout
-- attn_softmax_ce_saved_layout, with the 0-based ids as saved.index); backward
-- is one pass, (softmax - onehot) * g. With label smoothing eps (0 when nil)
-- each row's loss is (1 - eps) * -log p[y] + eps * -mean log p, in the same
-- passes. Returns the loss and the number of rows that count.
local function softmax_ce(who, logits, labels, valid_len, steps, eps)
  local strides = core.stride(logits) -- the kernel reads rows anywhere, each with unit stride
  local x = strides[#strides] == 1 and logits or core.contiguous(logits)
  local loss, saved, count = core.softmax_ce_forward(x, as_labels(who, labels), valid_len, steps, who, eps)
  local out = autograd.record("cross_entropy", loss, { logits }, function(g)
    return core.softmax_ce_backward(x, valid_len, steps, saved, contiguous(g), eps)
  end)
  return out, count
end

local function check_logits(who, logits)
  if not attn.is_tensor(logits) or logits:dim() < 1 then
    error(string.format("%s: logits must be a tensor (..., C)", who), 4)
  end
end

--- Per-element cross-entropy: logits (..., C), labels (...) 1-based -> (...).
-- Computed as -log_softmax(logits)[label] by one C kernel and one autograd
-- node (see `attn_loss.h`): the ids are checked in the core (range 1..C,
-- integrality of float ids), each row's max and log-sum are kept for
-- backward, which is (softmax(logits) - onehot(label)) * g in one pass.
-- With fused paths off (`attn.nn.set_fused(false)`) it is `cross_entropy_composed`.
-- @tparam Tensor logits (..., C), float32 or float64
-- @param labels (...) 1-based class ids: a tensor (int64, or float holding integers) or a table
-- @tparam[opt] string who the name errors give (default "cross_entropy")
-- @treturn Tensor (...) per-element losses
function M.cross_entropy(logits, labels, who)
  who = who or "cross_entropy"
  if not fused.choose("cross_entropy") then return M.cross_entropy_composed(logits, labels, who) end
  check_logits(who, logits)
  return (softmax_ce(who, logits, labels))
end

--- The composed path of `cross_entropy` (the specs compare the fused node
-- against it): log_softmax, gather, squeeze and neg, each its own autograd node.
-- @tparam Tensor logits (..., C)
-- @param labels (...) 1-based class ids
-- @tparam[opt] string who the name errors give (default "cross_entropy")
-- @treturn Tensor (...)
function M.cross_entropy_composed(logits, labels, who)
  who = who or "cross_entropy"
  check_logits(who, logits)
  labels = as_labels(who, labels)
  local d = logits:dim()
  local index = core.unsqueeze(labels, d)
  return -(logits:log_softmax(d):gather(d, index):squeeze(d))
end

-- ---------------------------------------------------------------- CrossEntropyLoss, NLLLoss

local reductions = { mean = true, sum = true, none = true }

-- The options shared by CrossEntropyLoss and NLLLoss, checked and stored on self.
local function loss_options(self, who, opts, allowed)
  opts = check.options(who, opts, allowed, 5)
  local r = opts.reduction or "mean"
  if not reductions[r] then
    error(string.format("%s: reduction must be 'mean', 'sum' or 'none', got '%s'", who, tostring(r)), 4)
  end
  self.reduction = r
  local w = opts.weight
  if w ~= nil then
    if type(w) == "table" and not attn.is_tensor(w) then w = attn.tensor(w, "float64") end
    if not attn.is_tensor(w) or w:dim() ~= 1 or (w:dtype() ~= "float32" and w:dtype() ~= "float64") then
      error(string.format("%s: weight must be a float tensor (C) of per-class weights", who), 4)
    end
    self:register_buffer("weight", w)
  end
  local ii = opts.ignore_index
  if ii == nil then ii = -100 end
  if math.type(ii) ~= "integer" then
    error(string.format("%s: ignore_index must be an integer, got %s", who, tostring(ii)), 4)
  end
  self.ignore_index = ii
  local cd = opts.class_dim
  if cd ~= nil and cd ~= 2 and cd ~= -1 then
    error(string.format("%s: class_dim must be 2 (PyTorch's (N, C, d...)) or -1 (class-last (..., C)), got %s", who,
      tostring(cd)), 4)
  end
  self.class_dim = cd or 2
  return opts
end

-- label_smoothing (0 when nil), checked to lie in [0, 1]; an error at the caller of init.
local function smoothing(who, eps)
  if eps == nil then return 0 end
  if type(eps) ~= "number" or not (eps >= 0 and eps <= 1) then
    error(string.format("%s: label_smoothing must be a number in [0, 1], got %s", who, tostring(eps)), 4)
  end
  return eps
end

local function same_sizes(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i] ~= b[i] then return false end
  end
  return true
end

-- The input moved to class-last (a contiguous copy for (N, C, d...)), the
-- target likewise (probabilities) or as ids of the rows' shape, whether the
-- target holds probabilities, and whether the call was unbatched. Raises
-- naming both shapes when the target fits neither form.
local function class_last(who, input, target, class_dim)
  if not attn.is_tensor(input) or input:dim() < 1 or (input:dtype() ~= "float32" and input:dtype() ~= "float64") then
    error(string.format("%s: input must be a float tensor (N, C), (N, C, d1, ...) or (C)", who), 4)
  end
  local shape, nd = input:shape(), input:dim()
  local unbatched = class_dim == 2 and nd == 1
  if type(target) == "number" then target = attn.tensor({ target }, "float64"):reshape({}) end
  if type(target) == "table" and not attn.is_tensor(target) then target = attn.tensor(target, "float64") end
  if not attn.is_tensor(target) then
    error(string.format("%s: target must be a tensor, a table or (unbatched) a number", who), 4)
  end
  local tshape = target:shape()
  local probs = same_sizes(tshape, shape)
  if probs and target:dtype() ~= input:dtype() then
    error(string.format("%s: probability target %s must have the input's dtype %s, got %s", who,
      shape_str(tshape), input:dtype(), target:dtype()), 4)
  end
  local rows = {} -- the ids' shape (a 0-d target when unbatched)
  if unbatched then -- luacheck: ignore 542 (no dims)
  elseif class_dim == 2 then
    for d = 1, nd do
      if d ~= 2 then rows[#rows + 1] = shape[d] end
    end
  else
    for d = 1, nd - 1 do rows[d] = shape[d] end
  end
  if not probs and not same_sizes(tshape, rows) then
    local hint = ""
    if class_dim == 2 and nd >= 3 and #tshape == nd - 1 then
      local last = {}
      for d = 1, nd - 1 do last[d] = shape[d] end
      if same_sizes(tshape, last) then hint = " (for class-last logits (..., C), pass {class_dim = -1})" end
    end
    error(string.format("%s: target %s must be class ids %s or probabilities %s for input %s%s", who,
      shape_str(tshape), shape_str(rows), shape_str(shape), shape_str(shape), hint), 4)
  end
  local x = input
  if unbatched then
    x = input:reshape({ 1, shape[1] })
    target = probs and target:reshape({ 1, shape[1] }) or target:reshape({ 1 })
  elseif class_dim == 2 and nd >= 3 then
    local perm = { 1 }
    for d = 3, nd do perm[#perm + 1] = d end
    perm[#perm + 1] = 2
    x = input:permute(perm)
    if probs then target = target:permute(perm) end
  end
  return x, target, probs, unbatched
end

-- The ids with ignore_index replaced by class 1, the 0/1 keep mask in dtype
-- (nil when no id is ignored), and the per-row weights w[y] * keep (nil when
-- there are neither weights nor ignored ids).
local function ids_and_weights(ids, ignore_index, weight, dtype)
  local hit = core.eq(ids, ignore_index)
  local any = core.sum(hit):item() > 0
  local keep
  if any then
    local ne = core.ne(ids, ignore_index)
    ids = core.where(ne, ids, 1)
    keep = core.to(ne, dtype)
  end
  if weight == nil then return ids, keep, keep end
  local w = weight:dtype() == dtype and weight or weight:to(dtype)
  local wy = w:index_select(1, core.to(ids, "int64"):reshape({ -1 })):reshape(ids:shape())
  if keep then wy = wy * keep end
  return ids, keep, wy
end

-- The reduced loss from per-row losses and the mean's divisor (the sum of
-- the rows' weights: PyTorch's sum of w[y_i] over the rows not ignored).
local function reduce(per_row, reduction, divisor, unbatched)
  if reduction == "sum" then return per_row:sum() end
  if reduction == "none" then return unbatched and per_row:reshape({}) or per_row end
  if divisor == nil then return per_row:mean() end
  return per_row:sum() / divisor
end

-- The per-row losses of class-last x (rows..., C) against ids or probabilities
-- t, composed from tensor ops (log_softmax, gather, sum), and the mean's
-- divisor (nil: the number of rows).
local function composed_rows(who, x, t, probs, o)
  local eps, d, C = o.label_smoothing or 0, x:dim(), x:size(x:dim())
  local weight = o.weight
  if weight and weight:dtype() ~= x:dtype() then weight = weight:to(x:dtype()) end
  if probs then
    if eps > 0 then t = t * (1 - eps) + eps / C end
    local prod = x:log_softmax(d) * t
    if weight then prod = prod * weight end
    local per_row = -prod:sum(d)
    return per_row, per_row:numel()
  end
  local ids, keep, wy = ids_and_weights(t, o.ignore_index or -100, o.weight, x:dtype())
  core.check_ids(ids, C, who, "label")
  local logp = x:log_softmax(d)
  local per_row = -(logp:gather(d, core.unsqueeze(ids, d)):squeeze(d))
  if eps ~= 0 then per_row = per_row * (1 - eps) end
  if wy then per_row = per_row * wy end
  if eps ~= 0 then
    local smooth = -(weight and logp * weight or logp):sum(d) / C
    if keep then smooth = smooth * keep end
    per_row = per_row + smooth * eps
  end
  return per_row, wy and wy:sum():item()
end

--- PyTorch's cross-entropy with its options, on PyTorch's layout (or
-- class-last with `class_dim = -1`). With p = softmax over the classes, a
-- row i of class id y_i (1-based), class weights w (1 when not given),
-- keep_i = 0 when y_i == ignore_index, eps = label_smoothing and C classes:
--
--     nll_i    = -log p[i, y_i]
--     smooth_i = -sum_c w_c log p[i, c] / C
--     loss_i   = keep_i * ((1 - eps) * w_{y_i} * nll_i + eps * smooth_i)
--     mean     = sum_i loss_i / sum_i keep_i * w_{y_i}
-- With probability targets t (the input's shape): t = (1 - eps) t + eps / C,
-- loss_i = -sum_c w_c t[i, c] log p[i, c], mean = sum_i loss_i / rows.
--
-- Paths: ids run the fused kernel (`attn_loss.h`, one forward and one
-- backward pass over the logits, label smoothing included), weights and
-- ignore_index adding products over the rows only; probability targets,
-- label smoothing together with class weights, or fused paths off
-- (`attn.nn.set_fused(false)`), take the composed path (`cross_entropy_loss_composed`).
-- @tparam Tensor input (N, C), (N, C, d1, ...) or (C); with class_dim -1, (..., C)
-- @param target ids (N), (N, d1, ...) or a number (unbatched); or probabilities of the input's shape
-- @tparam table o `weight` (tensor (C) or nil), `ignore_index`, `label_smoothing`, `reduction`, `class_dim`
-- @tparam[opt] string who the name errors give
-- @treturn Tensor the reduced loss, or the per-row losses (reduction "none")
function M.cross_entropy_loss(input, target, o, who)
  who = who or "cross_entropy_loss"
  local x, t, probs, unbatched = class_last(who, input, target, o.class_dim or 2)
  local per_row, divisor
  local eps = o.label_smoothing or 0
  if fused.choose("cross_entropy_loss", not probs and (eps == 0 or o.weight == nil)) then
    -- without class weights wy is the keep mask, which scales both terms of a smoothed row
    local ids, _, wy = ids_and_weights(t, o.ignore_index or -100, o.weight, x:dtype())
    per_row = softmax_ce(who, x, ids, nil, nil, eps)
    if wy then per_row = per_row * wy end
    divisor = wy and wy:sum():item()
  else
    per_row, divisor = composed_rows(who, x, t, probs, o)
  end
  return reduce(per_row, o.reduction, divisor, unbatched)
end

--- The composed path of `cross_entropy_loss` (the specs compare the fused
-- kernel against it): log_softmax, gather and sums, each its own autograd
-- node. Same arguments and result.
-- @tparam Tensor input (N, C), (N, C, d1, ...) or (C); with class_dim -1, (..., C)
-- @param target ids or probabilities, as `cross_entropy_loss`
-- @tparam table o the options, as `cross_entropy_loss`
-- @tparam[opt] string who the name errors give
-- @treturn Tensor the reduced loss, or the per-row losses (reduction "none")
function M.cross_entropy_loss_composed(input, target, o, who)
  who = who or "cross_entropy_loss"
  local x, t, probs, unbatched = class_last(who, input, target, o.class_dim or 2)
  local per_row, divisor = composed_rows(who, x, t, probs, o)
  return reduce(per_row, o.reduction, divisor, unbatched)
end

--- `nn.CrossEntropyLoss{weight, ignore_index = -100, label_smoothing = 0,
-- reduction = "mean", class_dim = 2}`, PyTorch's: called as loss(input,
-- target) with input (N, C), (N, C, d1, ...) or (C) (unbatched) logits and
-- target (N), (N, d1, ...) or a number of 1-based class ids (int64 or float
-- holding integers; a table is read as one), or probabilities of the input's
-- shape (its dtype). `ignore_index` is compared with the target as given (a
-- 1-based id, or -100, which matches no class, by default): those rows give
-- 0 and leave the mean's divisor. `class_dim = -1` reads the engine's
-- class-last form instead, input (..., C) and target (...); a target that
-- fits neither layout raises naming both shapes (no layout is guessed). The
-- formulas are `cross_entropy_loss`'s.
-- @type CrossEntropyLoss
local CrossEntropyLoss = Module:extend("CrossEntropyLoss")
M.CrossEntropyLoss = CrossEntropyLoss

function CrossEntropyLoss:init(opts)
  opts = loss_options(self, "CrossEntropyLoss", opts, { reduction = true, weight = true, ignore_index = true,
    label_smoothing = true, class_dim = true })
  self.label_smoothing = smoothing("CrossEntropyLoss", opts.label_smoothing)
end

function CrossEntropyLoss:forward(input, target)
  return M.cross_entropy_loss(input, target, self, "CrossEntropyLoss")
end

function CrossEntropyLoss:extra_repr()
  local parts = { "reduction=" .. self.reduction }
  if self.ignore_index ~= -100 then parts[#parts + 1] = "ignore_index=" .. self.ignore_index end
  if self.label_smoothing ~= 0 then parts[#parts + 1] = "label_smoothing=" .. self.label_smoothing end
  if self.class_dim ~= 2 then parts[#parts + 1] = "class_dim=" .. self.class_dim end
  return table.concat(parts, ", ")
end

--- `nn.NLLLoss{weight, ignore_index = -100, reduction = "mean", class_dim =
-- 2}`, PyTorch's, on log-probabilities: loss(input, target) with the layouts
-- of CrossEntropyLoss (class ids only),
--
--     loss_i = -keep_i * w_{y_i} * input[i, y_i];   mean = sum_i loss_i / sum_i keep_i * w_{y_i}
-- @type NLLLoss
local NLLLoss = Module:extend("NLLLoss")
M.NLLLoss = NLLLoss

function NLLLoss:init(opts)
  loss_options(self, "NLLLoss", opts, { reduction = true, weight = true, ignore_index = true, class_dim = true })
end

function NLLLoss:forward(input, target)
  local x, t, probs, unbatched = class_last("NLLLoss", input, target, self.class_dim)
  if probs then error("NLLLoss: target must hold class ids, not probabilities of the input's shape", 2) end
  local ids, _, wy = ids_and_weights(t, self.ignore_index, self.weight, x:dtype())
  local d = x:dim()
  core.check_ids(ids, x:size(d), "NLLLoss", "target")
  local per_row = -(x:gather(d, core.unsqueeze(ids, d)):squeeze(d))
  if wy then per_row = per_row * wy end
  return reduce(per_row, self.reduction, wy and wy:sum():item(), unbatched)
end

function NLLLoss:extra_repr() return "reduction=" .. self.reduction end

-- ---------------------------------------------------------------- masked losses

-- valid_len as B lengths (a table becomes a tensor of dtype), contiguous.
local function lengths(who, B, valid_len, dtype)
  if type(valid_len) == "table" and not attn.is_tensor(valid_len) then valid_len = attn.tensor(valid_len, dtype) end
  if not attn.is_tensor(valid_len) or valid_len:numel() ~= B then
    error(string.format("%s: valid_len must be a tensor or table of %d lengths", who, B), 4)
  end
  return contiguous(valid_len)
end

local function check_pred(who, pred)
  if not attn.is_tensor(pred) or pred:dim() ~= 3 then
    error(string.format("%s: pred must be a tensor (B, T, V), got %s", who,
      attn.is_tensor(pred) and shape_str(pred:shape()) or type(pred)), 4)
  end
end

-- Per-token losses (B, T) masked by valid length (label-smoothed by eps when given), the count
-- of valid tokens, and T. With fused paths off, the composed path (`masked_ce_composed`, or
-- `masked_smoothed_composed` for eps > 0).
local function masked_ce(who, pred, label, valid_len, eps)
  if not fused.choose("masked_ce") then
    if (eps or 0) ~= 0 then return M.masked_smoothed_composed(pred, label, valid_len, eps, who), nil, pred:size(2) end
    local l, mask = M.masked_ce_composed(pred, label, valid_len, who)
    return l, math.tointeger(core.sum(mask):item()), pred:size(2)
  end
  check_pred(who, pred)
  local B, T = pred:size(1), pred:size(2)
  local l, count = softmax_ce(who, pred, label, lengths(who, B, valid_len, pred:dtype()), T, eps)
  return l, count, T
end

--- The composed path of the masked per-token loss (the specs compare the
-- fused node against it): `cross_entropy_composed` times a 0/1 mask (B, T) of
-- the positions t <= valid_len[b], built by arange and a comparison.
-- @tparam Tensor pred (B, T, V)
-- @param label (B, T) 1-based ids
-- @param valid_len (B) lengths
-- @tparam[opt] string who the name errors give (default "masked_ce_composed")
-- @treturn Tensor (B, T) masked per-token losses
-- @treturn Tensor (B, T) the mask
function M.masked_ce_composed(pred, label, valid_len, who)
  who = who or "masked_ce_composed"
  check_pred(who, pred)
  local B, T = pred:size(1), pred:size(2)
  local lens = lengths(who, B, valid_len, pred:dtype()):reshape({ B, 1 }):to(pred:dtype())
  local mask = attn.core.le(attn.arange(1, T + 1, pred:dtype()):reshape({ 1, T }), lens)
  return M.cross_entropy_composed(pred, label, who) * mask, mask
end

--- Deprecated alias of `cross_entropy_composed` (the old name), kept for one
-- release: "reference" now names only the C kernels' plain reference path.
-- @see cross_entropy_composed
M.cross_entropy_reference = M.cross_entropy_composed

--- Deprecated alias of `masked_ce_composed` (the old name), kept for one
-- release: "reference" now names only the C kernels' plain reference path.
-- @see masked_ce_composed
M.masked_ce_reference = M.masked_ce_composed

--- `nn.MaskedSoftmaxCELoss{label_smoothing = 0}`: loss(pred (B, T, V), label
-- (B, T), valid_len (B)) -> (B), d2l's per-sequence loss: the cross-entropies
-- of the first valid_len[b] tokens summed and divided by T (the book's
-- scaling, see the module comment). Labels are 1-based class ids. With
-- label_smoothing eps, each token's loss is PyTorch's (class-last, V classes):
-- (1 - eps) * -log p[y] + eps * -sum_c log p[c] / V. The fused kernel runs
-- with or without smoothing; with fused paths off, the composed paths
-- (`masked_ce_composed`, `masked_smoothed_composed`).
-- @type MaskedSoftmaxCELoss
local MaskedSoftmaxCELoss = Module:extend("MaskedSoftmaxCELoss")
M.MaskedSoftmaxCELoss = MaskedSoftmaxCELoss

function MaskedSoftmaxCELoss:init(opts)
  opts = check.options("MaskedSoftmaxCELoss", opts, { label_smoothing = true }, 4)
  self.label_smoothing = smoothing("MaskedSoftmaxCELoss", opts.label_smoothing)
end

function MaskedSoftmaxCELoss:forward(pred, label, valid_len)
  local l = masked_ce("MaskedSoftmaxCELoss", pred, label, valid_len, self.label_smoothing)
  return l:mean(2)
end

--- The composed path of the label-smoothed masked per-token loss (the specs
-- compare the fused kernel against it): log_softmax, gather and mean, each
-- its own autograd node, times the 0/1 mask of `masked_ce_composed`:
-- ((1 - eps) * -log p[y] + eps * -mean_c log p[c]) * mask.
-- @tparam Tensor pred (B, T, V)
-- @param label (B, T) 1-based ids
-- @param valid_len (B) lengths
-- @tparam number eps label smoothing in [0, 1]
-- @tparam[opt] string who the name errors give (default "masked_smoothed_composed")
-- @treturn Tensor (B, T) masked per-token losses
function M.masked_smoothed_composed(pred, label, valid_len, eps, who)
  who = who or "masked_smoothed_composed"
  check_pred(who, pred)
  local B, T, V = pred:size(1), pred:size(2), pred:size(3)
  label = as_labels(who, label)
  core.check_ids(label, V, who, "label")
  local lens = lengths(who, B, valid_len, pred:dtype()):reshape({ B, 1 }):to(pred:dtype())
  local mask = attn.core.le(attn.arange(1, T + 1, pred:dtype()):reshape({ 1, T }), lens)
  local logp = pred:log_softmax(3)
  local nll = -(logp:gather(3, core.unsqueeze(label, 3)):squeeze(3))
  local smooth = -logp:mean(3)
  return (nll * (1 - eps) + smooth * eps) * mask
end

function MaskedSoftmaxCELoss:extra_repr()
  return self.label_smoothing ~= 0 and "label_smoothing=" .. self.label_smoothing or ""
end

--- The true mean cross-entropy per valid token, and d2l's printed number.
-- Returns token_mean (a scalar tensor, differentiable; 0 when no token is
-- valid), book (= token_mean / T, what d2l's train_seq2seq prints) and the
-- number of valid tokens.
function M.masked_token_mean(pred, label, valid_len)
  local l, count, T = masked_ce("masked_token_mean", pred, label, valid_len)
  local mean = l:sum() / math.max(count, 1)
  return mean, mean / T, count
end

return M
