--- Evaluation metrics for sequence models: the book's BLEU, and token accuracy
-- and perplexity over a padded batch of logits.
-- @module attn.d2l.metrics
local attn = require "attn"
local loss = require "attn.nn.loss"
local data = require "attn.d2l.data"

local metrics = {}

local function as_tokens(v, who, what)
  if type(v) == "string" then
    if v == "" then return {} end
    return data.split(v)
  end
  if type(v) ~= "table" then
    error(string.format("%s: %s must be a string or a list of tokens, got a %s", who, what, type(v)), 3)
  end
  return v
end

-- The n-gram starting at token i, as one string key (tokens joined by "\0",
-- which no token of a text contains).
local function ngram(tokens, i, n) return table.concat(tokens, "\0", i, i + n - 1) end

--- BLEU as the book defines it (d2l `bleu`):
-- exp(min(0, 1 - len_label / len_pred)) * prod over n of p_n ^ (1 / 2^n),
-- with p_n the clipped n-gram precision. The product runs over n = 1..min(k, len_pred)
-- (the later edition's guard: v0.17 divides by zero when the prediction is
-- shorter than k), and an empty prediction scores 0.
-- @param pred_tokens the prediction: a list of tokens, or a string split on spaces
-- @param label_tokens the reference, the same way
-- @tparam integer k the longest n-gram (the book uses 2)
-- @treturn number in [0, 1]
-- @raise on a bad argument
-- @usage metrics.bleu("il est paresseux .", "il est calme .", 2) --> 0.658
function metrics.bleu(pred_tokens, label_tokens, k)
  local pred = as_tokens(pred_tokens, "bleu", "pred_tokens")
  local label = as_tokens(label_tokens, "bleu", "label_tokens")
  if math.type(k) ~= "integer" or k < 1 then error("bleu: k must be a positive integer, got " .. tostring(k), 2) end
  local len_pred, len_label = #pred, #label
  if len_pred == 0 then return 0 end
  local score = math.exp(math.min(0, 1 - len_label / len_pred))
  for n = 1, math.min(k, len_pred) do
    local label_subs, matches = {}, 0
    for i = 1, len_label - n + 1 do
      local g = ngram(label, i, n)
      label_subs[g] = (label_subs[g] or 0) + 1
    end
    for i = 1, len_pred - n + 1 do
      local g = ngram(pred, i, n)
      if (label_subs[g] or 0) > 0 then
        matches = matches + 1
        label_subs[g] = label_subs[g] - 1
      end
    end
    score = score * (matches / (len_pred - n + 1)) ^ (0.5 ^ n)
  end
  return score
end

-- Logits (B, T, V), and the 0/1 mask (B, T) of the first valid_lens[b] steps, in float64.
local function valid_mask(who, logits, valid_lens)
  if not attn.is_tensor(logits) or logits:dim() ~= 3 then
    error(string.format("%s: logits must be a tensor (B, T, V), got %s", who,
      attn.is_tensor(logits) and attn.core.shape_str(logits:shape()) or type(logits)), 3)
  end
  local B, T = logits:size(1), logits:size(2)
  if attn.is_tensor(valid_lens) then valid_lens = valid_lens:to("float64") end
  return attn.sequence_mask(attn.ones({ B, T }, "float64"), valid_lens)
end

--- Token accuracy of a padded batch: the share of valid positions where the
-- arg-max of the logits is the label.
-- @tparam Tensor logits (B, T, V)
-- @param labels (B, T) 1-based ids, tensor or table
-- @param valid_lens (B) tensor or table: positions t <= valid_lens[b] count
-- @treturn number accuracy (NaN when no position is valid)
-- @treturn integer correct positions
-- @treturn integer valid positions
function metrics.accuracy(logits, labels, valid_lens)
  local mask = valid_mask("accuracy", logits, valid_lens)
  if not attn.is_tensor(labels) then labels = attn.tensor(labels, "float64") end
  local pred = logits:argmax(3):to("float64")
  local hit = pred:eq(labels:to("float64"):reshape(pred:shape())) * mask
  local correct, total = math.tointeger(hit:sum():item()), math.tointeger(mask:sum():item())
  return correct / total, correct, total
end

--- Perplexity of a padded batch: exp of the mean cross-entropy per valid token.
-- @tparam Tensor logits (B, T, V)
-- @param labels (B, T) 1-based ids, tensor or table
-- @param valid_lens (B) tensor or table
-- @treturn number perplexity (NaN when no position is valid)
-- @treturn number the summed cross-entropy of the valid tokens (nats)
-- @treturn integer valid positions
function metrics.perplexity(logits, labels, valid_lens)
  valid_mask("perplexity", logits, valid_lens)
  return attn.no_grad(function()
    local mean, _, count = loss.masked_token_mean(logits, labels, valid_lens)
    count = math.tointeger(count)
    if count == 0 then return 0 / 0, 0, 0 end
    local m = mean:item()
    return math.exp(m), m * count, count
  end)
end

return metrics
