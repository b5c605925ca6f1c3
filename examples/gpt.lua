-- A small character-level GPT on the French side of the Tatoeba English-French file: a
-- decoder-only Transformer as practised today (pre-norm RMSNorm, rotary positions, grouped-query
-- attention, SwiGLU; nn.DecoderOnlyTransformer), trained on 90% of the sentences, with the
-- per-character perplexity of the held-out 10%, samples, heatmaps of a few heads, and the key/
-- value cache checked against recomputing the prefix (equal logits, and how much faster).
-- The last line is the summary: held-out perplexity, cache speed-up, max logit difference.
local attn = require "attn"
local cli = require "attn.d2l.cli"
local plot = require "attn.plot"

local opts = cli.start(arg, {
  name = "gpt",
  description = "A character-level decoder-only Transformer on French sentences, sampled with a KV cache.",
  options = {
    { "steps", "integer", 400, "training steps" },
    { "batch", "integer", 16, "sequences per step" },
    { "context", "integer", 64, "training sequence length (characters)" },
    { "d_model", "integer", 64, "model width" },
    { "heads", "integer", 4, "query heads" },
    { "kv_heads", "integer", 2, "key/value heads (grouped-query attention)" },
    { "layers", "integer", 2, "blocks" },
    { "lr", "number", 3e-3, "Adam learning rate" },
    { "new_tokens", "integer", 256, "tokens generated for the cache speed-up" },
    { "temperature", "number", 0.8, "sampling temperature" },
    { "top_k", "integer", 20, "top-k of the samples" },
  },
})
if opts.smoke then
  opts.steps, opts.batch, opts.context, opts.d_model, opts.layers, opts.new_tokens = 20, 4, 32, 32, 1, 48
end
attn.manual_seed(opts.seed)
local nn = attn.nn

-- ---------------------------------------------------------------- data: French sentences as characters

local path = opts.data or "data/fra-eng-sample.txt"
local fh = assert(io.open(path, "r"))
local sentences = {}
for line in fh:lines() do
  local fra = line:match("^[^\t]*\t([^\t]*)")
  if fra and #fra > 0 then sentences[#sentences + 1] = fra end
end
fh:close()
local n_train = math.floor(#sentences * 0.9)
local function codes(list, from, to)
  local out = {}
  for i = from, to do
    for _, c in utf8.codes(list[i]) do out[#out + 1] = c end
    out[#out + 1] = 10 -- one sentence per line
  end
  return out
end
local train_codes, held_codes = codes(sentences, 1, n_train), codes(sentences, n_train + 1, #sentences)
-- the vocabulary: id 1 is the unknown character (held-out characters never seen in training)
local vocab, id_of = { "?" }, {}
for _, c in ipairs(train_codes) do
  if not id_of[c] then
    vocab[#vocab + 1] = utf8.char(c)
    id_of[c] = #vocab
  end
end
local function ids_of(list)
  local out = {}
  for i, c in ipairs(list) do out[i] = id_of[c] or 1 end
  return out
end
local train_ids, held_ids = ids_of(train_codes), ids_of(held_codes)
local function text_of(ids)
  local parts = {}
  for i, id in ipairs(ids) do parts[i] = vocab[id] end
  return table.concat(parts)
end
print(string.format("gpt: %d sentences (%d training, %d held out), %d training characters, vocabulary %d",
  #sentences, n_train, #sentences - n_train, #train_ids, #vocab))

-- ---------------------------------------------------------------- model and training

local T = opts.context
local model = nn.DecoderOnlyTransformer {
  vocab_size = #vocab, d_model = opts.d_model, num_heads = opts.heads, num_kv_heads = opts.kv_heads,
  num_layers = opts.layers, max_len = math.max(1024, opts.new_tokens + 64), dropout = 0,
}
local optimizer = assert(attn.optim.Adam { params = model:parameters(), lr = opts.lr })

-- A batch of random windows: inputs (B, T) and next-character targets (B, T).
local function batch(ids, B)
  local x, y = {}, {}
  for b = 1, B do
    local s = math.random(1, #ids - T - 1)
    x[b], y[b] = table.move(ids, s, s + T - 1, 1, {}), table.move(ids, s + 1, s + T, 1, {})
  end
  return attn.tensor(x, "int64"), attn.tensor(y, "int64")
end

local function loss_of(x, y)
  local logits = model(x)
  return nn.cross_entropy(logits:reshape({ -1, #vocab }), y:reshape({ -1 })):mean()
end

math.randomseed(opts.seed)
model:train()
local t0 = attn.clock()
for step = 1, opts.steps do
  local x, y = batch(train_ids, opts.batch)
  optimizer:zero_grad()
  local loss = loss_of(x, y)
  loss:backward()
  nn.clip_grad_norm_(model:parameters(), 1)
  optimizer:step()
  if step == 1 or step % 100 == 0 or step == opts.steps then
    print(string.format("step %4d  loss %.3f  (%.1f s)", step, loss:item(), attn.clock() - t0))
  end
end
model:eval()

-- ---------------------------------------------------------------- held-out perplexity

-- Every held-out character after the first of its window is predicted once (windows of T + 1).
local nll, count = 0, 0
attn.no_grad(function()
  for s = 1, #held_ids - 1, T do
    local n = math.min(T, #held_ids - s)
    local x = attn.tensor({ table.move(held_ids, s, s + n - 1, 1, {}) }, "int64")
    local y = attn.tensor({ table.move(held_ids, s + 1, s + n, 1, {}) }, "int64")
    nll = nll + nn.cross_entropy(model(x):reshape({ -1, #vocab }), y:reshape({ -1 })):sum():item()
    count = count + n
  end
end)
local perplexity = math.exp(nll / count)
print(string.format("held-out: %d characters, per-character perplexity %.2f", count, perplexity))

-- ---------------------------------------------------------------- samples (a batch of prompts of different lengths)

local prompts = { "Je ", "Il est ", "Nous avons " }
local prompt_ids = {}
for i, p in ipairs(prompts) do
  local cs = {}
  for _, c in utf8.codes(p) do cs[#cs + 1] = c end
  prompt_ids[i] = ids_of(cs)
end
local samples = model:generate(prompt_ids, { max_new_tokens = 60, temperature = opts.temperature,
  top_k = opts.top_k, seed = opts.seed })
for i, p in ipairs(prompts) do
  print(string.format("sample %d: %s", i, (p .. text_of(samples[i])):gsub("\n", " | ")))
end

-- ---------------------------------------------------------------- heatmaps of the heads

local line = table.move(held_ids, 1, math.min(40, #held_ids), 1, {})
model:keep_weights(true)
attn.no_grad(function() model(attn.tensor({ line }, "int64")) end)
model:keep_weights(false)
local per_layer = {}
for i, w in ipairs(model:attention_weights()) do per_layer[i] = w:select(1, 1) end
local labels = {}
for i, id in ipairs(line) do labels[i] = vocab[id] == "\n" and "|" or vocab[id] end
os.execute("mkdir -p '" .. opts.out .. "'")
local titles = {}
for h = 1, opts.heads do titles[h] = "head " .. h end
local figure = assert(plot.heatmaps(attn.stack(per_layer, 1), { path = opts.out .. "/heads.png",
  xlabel = "Keys", ylabel = "Queries", titles = titles, row_labels = labels, col_labels = labels }))
print("heatmaps of every layer's heads: " .. figure)

-- ---------------------------------------------------------------- the cache against recomputing

local n_new = opts.new_tokens
local function timed(cache)
  local start = attn.clock()
  local out, info = model:generate({ prompt_ids[2] }, { max_new_tokens = n_new, temperature = 0, cache = cache,
    keep_logits = true })
  return attn.clock() - start, out, info.logits
end
local t_cache, out_cache, logits_cache = timed(true)
local t_plain, out_plain, logits_plain = timed(false)
local max_diff = 0
for s = 1, n_new do
  local a, b = logits_cache[s][1], logits_plain[s][1]
  for v = 1, #a do max_diff = math.max(max_diff, math.abs(a[v] - b[v])) end
end
local same = table.concat(out_cache[1], ",") == table.concat(out_plain[1], ",")
print(string.format("generation of %d tokens: %.3f s with the cache, %.3f s recomputing (%s tokens)", n_new,
  t_cache, t_plain, same and "the same" or "different"))
print(string.format("gpt: held-out perplexity %.2f, cache speed-up %.1fx at %d tokens, cache %s recompute " ..
  "(max diff %.1e)", perplexity, t_plain / t_cache, n_new, (same and max_diff < 1e-3) and "equals" or "differs from",
  max_diff))
