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

local M = {}

local shape_str = require("attn.core").shape_str -- "[2x3]" from a tensor or a table of sizes

-- Labels as a tensor (int64, or float holding integers), checked in the core
-- against the logits' shape (..., C) and the class range 1..C.
local function check_labels(who, logits, labels)
  if type(labels) == "table" and not attn.is_tensor(labels) then labels = attn.tensor(labels, "float64") end
  if not attn.is_tensor(labels) then error(string.format("%s: labels must be a tensor or a table", who), 4) end
  local ls, ps = labels:shape(), logits:shape()
  local ok = #ls == #ps - 1
  for i = 1, #ls do ok = ok and ls[i] == ps[i] end
  if not ok then
    error(string.format("%s: labels %s must have the shape of logits %s without its last (class) dim", who,
      shape_str(ls), shape_str(ps)), 4)
  end
  local ctx = string.format("labels %s, logits %s", shape_str(ls), shape_str(ps))
  attn.core.check_ids(labels, ps[#ps], who, "label", ctx)
  return labels
end

--- Per-element cross-entropy: logits (..., C), labels (...) 1-based -> (...).
-- Computed as -log_softmax(logits)[label], as one autograd node whose
-- backward is (softmax(logits) - onehot(label)) * g in one pass over the
-- saved log-probabilities (instead of log_softmax, gather, squeeze and neg).
function M.cross_entropy(logits, labels, who)
  who = who or "cross_entropy"
  if not attn.is_tensor(logits) or logits:dim() < 1 then
    error(string.format("%s: logits must be a tensor (..., C)", who), 3)
  end
  labels = check_labels(who, logits, labels)
  local d = logits:dim()
  local logp = core.log_softmax(logits, d)
  local index = core.unsqueeze(labels, d)
  local out = core.neg(core.squeeze(core.gather(logp, d, index), d))
  return autograd.record("cross_entropy", out, { logits }, function(g)
    local gu = core.unsqueeze(g, d)
    local dlogits = core.mul(core.exp(logp), gu)
    return core.scatter_add_(dlogits, d, index, core.contiguous(core.neg(gu)))
  end)
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

-- 0/1 mask (B, T) of positions t <= valid_len[b].
local function length_mask(B, T, valid_len, dtype, who)
  if type(valid_len) == "table" and not attn.is_tensor(valid_len) then valid_len = attn.tensor(valid_len, dtype) end
  if not attn.is_tensor(valid_len) or valid_len:numel() ~= B then
    error(string.format("%s: valid_len must be a tensor or table of %d lengths", who, B), 4)
  end
  local lens = valid_len:reshape({ B, 1 }):to(dtype)
  local steps = attn.arange(1, T + 1, dtype):reshape({ 1, T })
  return attn.core.le(steps, lens)
end

local function masked_ce(who, pred, label, valid_len)
  if not attn.is_tensor(pred) or pred:dim() ~= 3 then
    error(string.format("%s: pred must be a tensor (B, T, V), got %s", who,
      attn.is_tensor(pred) and shape_str(pred:shape()) or type(pred)), 3)
  end
  local B, T = pred:size(1), pred:size(2)
  local l = M.cross_entropy(pred, label, who)
  local mask = length_mask(B, T, valid_len, pred:dtype(), who)
  return l * mask, mask, T
end

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
  local l, mask, T = masked_ce("masked_token_mean", pred, label, valid_len)
  local count = mask:sum():item()
  local mean = l:sum() / math.max(count, 1)
  return mean, mean / T, count
end

return M
