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
-- floats) and saves each row's max and log-sum; backward is one pass,
-- (softmax - onehot) * g. Returns the loss and the number of rows that count.
local function softmax_ce(who, logits, labels, valid_len, steps)
  local strides = core.stride(logits) -- the kernel reads rows anywhere, each with unit stride
  local x = strides[#strides] == 1 and logits or core.contiguous(logits)
  local loss, stats, index, count = core.softmax_ce_forward(x, as_labels(who, labels), valid_len, steps, who)
  local out = autograd.record("cross_entropy", loss, { logits }, function(g)
    return core.softmax_ce_backward(x, index, valid_len, steps, stats, contiguous(g))
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

-- ---------------------------------------------------------------- CrossEntropyLoss

--- `nn.CrossEntropyLoss{reduction = "mean"|"sum"|"none"}`: called as
-- loss(logits (..., C), labels (...)) with 1-based class ids (tensor or table).
-- @type CrossEntropyLoss
local CrossEntropyLoss = Module:extend("CrossEntropyLoss")
M.CrossEntropyLoss = CrossEntropyLoss

local reductions = { mean = true, sum = true, none = true }

function CrossEntropyLoss:init(opts)
  opts = check.options("CrossEntropyLoss", opts, { reduction = true }, 4)
  local r = opts.reduction or "mean"
  if not reductions[r] then
    error(string.format("CrossEntropyLoss: reduction must be 'mean', 'sum' or 'none', got '%s'", tostring(r)), 3)
  end
  self.reduction = r
end

function CrossEntropyLoss:forward(logits, labels)
  local l = M.cross_entropy(logits, labels, "CrossEntropyLoss")
  if self.reduction == "mean" then return l:mean() end
  if self.reduction == "sum" then return l:sum() end
  return l
end

function CrossEntropyLoss:extra_repr() return "reduction=" .. self.reduction end

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

-- Per-token losses (B, T) masked by valid length, the count of valid tokens, and T. With
-- fused paths off, the composed path (`masked_ce_composed`).
local function masked_ce(who, pred, label, valid_len)
  if not fused.choose("masked_ce") then
    local l, mask = M.masked_ce_composed(pred, label, valid_len, who)
    return l, math.tointeger(core.sum(mask):item()), pred:size(2)
  end
  check_pred(who, pred)
  local B, T = pred:size(1), pred:size(2)
  local l, count = softmax_ce(who, pred, label, lengths(who, B, valid_len, pred:dtype()), T)
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

--- `nn.MaskedSoftmaxCELoss()`: loss(pred (B, T, V), label (B, T), valid_len (B))
-- -> (B), d2l's per-sequence loss: the cross-entropies of the first valid_len[b]
-- tokens summed and divided by T (the book's scaling, see the module comment).
-- Labels are 1-based class ids.
-- @type MaskedSoftmaxCELoss
local MaskedSoftmaxCELoss = Module:extend("MaskedSoftmaxCELoss")
M.MaskedSoftmaxCELoss = MaskedSoftmaxCELoss

function MaskedSoftmaxCELoss.forward(_, pred, label, valid_len)
  local l = masked_ce("MaskedSoftmaxCELoss", pred, label, valid_len)
  return l:mean(2)
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
