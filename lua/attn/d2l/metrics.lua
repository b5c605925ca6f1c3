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

--- Corpus BLEU (Papineni et al., 2002), as sacreBLEU and multi-bleu compute it
-- on already tokenised text: for n = 1..N the clipped n-gram matches and the
-- candidate n-gram counts are each summed over the whole corpus,
-- p_n = matches_n / candidates_n, and
--
--     BLEU = BP * exp(sum over n of log(p_n) / N),   BP = min(1, exp(1 - r / c))
-- with c and r the total candidate and reference lengths. One reference per
-- sentence; any p_n of 0 gives 0.
-- @tparam table preds the predictions: strings (split on spaces) or token lists
-- @tparam table refs the references, the same way, in the same order
-- @tparam[opt] integer max_n the longest n-gram (4)
-- @treturn number BLEU in [0, 1] (multiply by 100 for the usual figure)
-- @treturn table `{precisions = {p_1, ...}, matches = {...}, totals = {...}, bp =, pred_len =, ref_len =}`;
--   the lists stop at max_n or at the first order longer than every prediction (0 from there on)
-- @raise on a bad argument or lists of different lengths
-- @usage metrics.corpus_bleu({"il est calme ."}, {"il est calme ."}) --> 1
function metrics.corpus_bleu(preds, refs, max_n)
  if type(preds) ~= "table" or type(refs) ~= "table" then error("corpus_bleu: preds and refs must be lists", 2) end
  if #preds ~= #refs then
    error(string.format("corpus_bleu: %d predictions for %d references", #preds, #refs), 2)
  end
  max_n = max_n or 4
  if math.type(max_n) ~= "integer" or max_n < 1 then
    error("corpus_bleu: max_n must be a positive integer, got " .. tostring(max_n), 2)
  end
  -- orders past the longest prediction have no candidates: p_n is 0 there, and so the score;
  -- the lists stop at the first such order (a huge max_n costs nothing)
  local pred_tokens, ref_tokens, longest = {}, {}, 0
  for s = 1, #preds do
    pred_tokens[s] = as_tokens(preds[s], "corpus_bleu", "a prediction")
    ref_tokens[s] = as_tokens(refs[s], "corpus_bleu", "a reference")
    longest = math.max(longest, #pred_tokens[s])
  end
  local orders = math.min(max_n, longest + 1)
  local matches, totals, c, r = {}, {}, 0, 0
  for n = 1, orders do matches[n], totals[n] = 0, 0 end
  for s = 1, #preds do
    local pred, ref = pred_tokens[s], ref_tokens[s]
    c, r = c + #pred, r + #ref
    for n = 1, orders do
      local counts = {}
      for i = 1, #ref - n + 1 do
        local g = ngram(ref, i, n)
        counts[g] = (counts[g] or 0) + 1
      end
      for i = 1, #pred - n + 1 do
        local g = ngram(pred, i, n)
        if (counts[g] or 0) > 0 then
          matches[n] = matches[n] + 1
          counts[g] = counts[g] - 1
        end
      end
      totals[n] = totals[n] + math.max(#pred - n + 1, 0)
    end
  end
  local bp = c == 0 and 0 or math.min(1, math.exp(1 - r / c))
  local precisions, log_sum = {}, 0
  for n = 1, orders do
    precisions[n] = totals[n] > 0 and matches[n] / totals[n] or 0
    log_sum = log_sum + (precisions[n] > 0 and math.log(precisions[n]) or -math.huge)
  end
  local score = log_sum == -math.huge and 0 or bp * math.exp(log_sum / max_n)
  return score, { precisions = precisions, matches = matches, totals = totals, bp = bp, pred_len = c, ref_len = r }
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
