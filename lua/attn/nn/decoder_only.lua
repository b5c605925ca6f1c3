--- A decoder-only Transformer language model as practised today (Llama/Mistral style) with a
-- key/value cache: pre-norm RMSNorm blocks, rotary positions (attn.rope), grouped-query
-- attention, a SwiGLU feed-forward network and an optional sliding window with a rolling cache.
--
-- **Batches of different lengths are right-padded**: sample b's tokens sit at indices 1..L_b and
-- its token t is at position t - 1, whatever the other samples' lengths; causal attention keeps
-- the padding (which comes after the real tokens) out of every real token's keys, so no extra
-- mask and no position offsets are needed, and a padded sample's numbers equal its unpadded
-- ones. The pad id is 1 (any valid id: it is never attended to); read sample b's outputs at its
-- own last index L_b.
--
-- **The cache** (`model:new_cache(B)`) is preallocated once: per layer, keys and values of
-- (B * num_kv_heads, S, head_dim), S = `window` when there is one (a rolling buffer: position p
-- lives in slot p mod S) and `max_len` otherwise. It takes a prompt while empty (the prefill),
-- then one token per sample per call, each sample at its own position. Running past S without a
-- window raises, naming the sizes.
--
-- Attention runs on `attn.dot_product_attention` with heads as a dimension, (B, heads, N,
-- head_dim), one kernel call through one internal function (`attend`): with num_kv_heads <
-- num_heads, the kernel maps query head h to key/value head ceil(h / group) (consecutive, as
-- Llama's repeat_kv), so the key/value rows (the cache's included) are never copied.
-- @module attn.nn.decoder_only
local attn = require "attn"
local core = require "attn.core"
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local containers = require "attn.nn.containers"
local modern = require "attn.nn.modern"
local check = require "attn.check"

local Module = module.Module
local Linear, Dropout, Embedding = linear.Linear, linear.Dropout, linear.Embedding
local RMSNorm, SwiGLU = modern.RMSNorm, modern.SwiGLU
local shape_str = core.shape_str

local M = {}

-- ---------------------------------------------------------------- attention over grouped heads

-- Attention of q (B*H, Nq, dh) (batch-major heads) over k, v (B*Hkv, Nk, dh) or
-- (B, Hkv, Nk, dh) (views allowed: the cache's rows), H = Hkv * group, as one kernel call with
-- heads as a dimension: grouped-query attention maps query head h to key/value head
-- ceil(h / group) inside the kernel, and K and V are never copied. `o` holds the kernel's
-- options (causal, window, valid_lens (B) per sample, dropout, training, need_weights).
-- Returns (B*H, Nq, dh) and the weights (B*H, Nq, Nk) or nil.
local function attend(q, k, v, group, o)
  local BH, Nq, dh = q:size(1), q:size(2), q:size(3)
  if k:dim() == 3 then
    -- query row r (0-based, b*H + h) uses key/value row r // group (b*Hkv + h // group) whatever
    -- the split of the rows into samples, so without per-sample options the rows go as
    -- BH / group samples of `group` query heads over one key/value head each
    k, v = k:reshape({ k:size(1), 1, k:size(2), dh }), v:reshape({ v:size(1), 1, v:size(2), v:size(3) })
  end
  local H = k:size(2) * group
  local out, w = attn.dot_product_attention(q:reshape({ BH // H, H, Nq, dh }), k, v, o)
  out = out:reshape({ BH, Nq, out:size(4) })
  if w ~= nil then w = w:reshape({ BH, Nq, w:size(4) }) end
  return out, w
end
M._attend = attend

-- ---------------------------------------------------------------- CausalSelfAttention

--- `nn.CausalSelfAttention{d_model, num_heads, num_kv_heads = num_heads, dropout = 0,
-- rope = true, rope_base = 10000, interleaved = false, window}`: causal multi-head
-- self-attention with grouped-query heads (num_kv_heads must divide num_heads) and rotary
-- positions on q and k. Children wq (d_model -> H*dh), wk, wv (d_model -> Hkv*dh), wo, without
-- bias (Llama's keys). Driven by DecoderOnlyTransformer (forward(x, state)); `keep_weights =
-- true` keeps the last call's weights in `attention_weights`, (B, H, Nq, Nk).
-- @type CausalSelfAttention
local CausalSelfAttention = Module:extend("CausalSelfAttention")
M.CausalSelfAttention = CausalSelfAttention

local function need_int(who, o, name, default)
  local v = o[name]
  if v == nil then v = default end
  check.positive_int(who, name, v, 5)
  return v
end

function CausalSelfAttention:init(opts)
  local who = "CausalSelfAttention"
  opts = check.options(who, opts, { d_model = true, num_heads = true, num_kv_heads = true, dropout = true, rope = true,
    rope_base = true, interleaved = true, window = true, dtype = true }, 4)
  local D, H = need_int(who, opts, "d_model"), need_int(who, opts, "num_heads")
  local Hkv = need_int(who, opts, "num_kv_heads", H)
  if D % H ~= 0 then error(string.format("%s: d_model %d is not divisible by num_heads %d", who, D, H), 3) end
  if H % Hkv ~= 0 then
    error(string.format("%s: num_kv_heads %d does not divide num_heads %d", who, Hkv, H), 3)
  end
  local dh = D // H
  if opts.rope ~= false and dh % 2 ~= 0 then
    error(string.format("%s: rotary positions need an even head size, got d_model %d / num_heads %d = %d", who, D,
      H, dh), 3)
  end
  if opts.window ~= nil then need_int(who, opts, "window") end
  self.num_heads, self.num_kv_heads, self.head_dim = H, Hkv, dh
  self.window = opts.window
  self.rope = opts.rope ~= false
  self.rope_base = opts.rope_base or 10000
  self.interleaved = opts.interleaved == true
  self.attn_dropout = opts.dropout or 0
  local lin = { bias = false, dtype = opts.dtype }
  self.wq = Linear(D, H * dh, lin)
  self.wk = Linear(D, Hkv * dh, lin)
  self.wv = Linear(D, Hkv * dh, lin)
  self.wo = Linear(H * dh, D, lin)
end

-- q or k (B*heads, N, dh) rotated at `positions` (nil: 0..N-1; else a (B, N) Lua table).
local function rotate(self, x, heads, positions)
  if not self.rope then return x end
  local ropts = { base = self.rope_base, interleaved = self.interleaved, positions = positions }
  if positions == nil then return attn.rope(x, ropts) end
  local BH, N, dh = x:size(1), x:size(2), x:size(3)
  return attn.rope(x:reshape({ BH // heads, heads, N, dh }), ropts):reshape({ BH, N, dh })
end

-- Copies rows `from`..`from + n - 1` (0-based positions, along dim 2) of src (Hkv, N, dh) to
-- the cache rows dst (Hkv, S, dh) at slots position mod S, in contiguous runs. src_start is the
-- 0-based index in src of position `from`.
local function write_slots(dst, src, src_start, from, n)
  local S = dst:size(2)
  local done = 0
  while done < n do
    local slot = (from + done) % S
    local run = math.min(n - done, S - slot)
    core.copy_(core.narrow(dst, 2, slot + 1, run), core.narrow(src, 2, src_start + done + 1, run))
    done = done + run
  end
end

--- forward(x (B, N, d_model), state) -> (B, N, d_model). `state` (made by
-- DecoderOnlyTransformer) holds `lens` (each sample's real length, for the prefill) or
-- `positions` (each sample's position, for a one-token decode step), and the layer's cache
-- `k`, `v` (or nil: no cache).
function CausalSelfAttention:forward(x, state)
  state = state or {}
  local H, Hkv = self.num_heads, self.num_kv_heads
  local B, N = x:size(1), x:size(2)
  local group = H // Hkv
  local q = attn.split_heads(self.wq(x), H)
  local k = attn.split_heads(self.wk(x), Hkv)
  local v = attn.split_heads(self.wv(x), Hkv)
  local keep = self.keep_weights == true
  local o = { dropout = self.attn_dropout, training = self.training, need_weights = keep }
  local out, w
  if state.positions == nil then
    -- the whole sequence (training, recompute, prefill): causal, windowed
    q, k = rotate(self, q, H, nil), rotate(self, k, Hkv, nil)
    o.causal = true
    if self.window then o.window = self.window - 1 end
    out, w = attend(q, k:reshape({ B, Hkv, N, self.head_dim }), v:reshape({ B, Hkv, N, self.head_dim }), group, o)
    if state.k ~= nil then -- prefill: each sample's real positions (the last S of them)
      local S = state.k:size(2)
      for b = 1, B do
        local L = state.lens[b]
        local from = math.max(0, L - S)
        local rows = (b - 1) * Hkv + 1
        write_slots(core.narrow(state.k, 1, rows, Hkv), core.narrow(k, 1, rows, Hkv), from, from, L - from)
        write_slots(core.narrow(state.v, 1, rows, Hkv), core.narrow(v, 1, rows, Hkv), from, from, L - from)
      end
    end
  else
    -- one new token per sample at its own position: write it, attend over the filled slots
    local pos = state.positions
    local ptab = {}
    for b = 1, B do ptab[b] = { pos[b] } end
    q, k = rotate(self, q, H, ptab), rotate(self, k, Hkv, ptab)
    local S = state.k:size(2)
    local lens, filled = {}, 0
    for b = 1, B do
      local rows = (b - 1) * Hkv + 1
      write_slots(core.narrow(state.k, 1, rows, Hkv), core.narrow(k, 1, rows, Hkv), 0, pos[b], 1)
      write_slots(core.narrow(state.v, 1, rows, Hkv), core.narrow(v, 1, rows, Hkv), 0, pos[b], 1)
      lens[b] = math.min(pos[b] + 1, S)
      if lens[b] > filled then filled = lens[b] end
    end
    o.valid_lens = attn.tensor(lens, x:dtype()) -- (per sample: every head of it)
    -- the filled slots of the cache as (B, Hkv, filled, head_dim) views
    local ck = state.k:reshape({ B, Hkv, S, self.head_dim }):narrow(3, 1, filled)
    local cv = state.v:reshape({ B, Hkv, S, self.head_dim }):narrow(3, 1, filled)
    out, w = attend(q, ck, cv, group, o)
  end
  if keep and w ~= nil then
    rawget(self, "_attrs").attention_weights = w:detach():reshape({ B, H, N, w:size(3) })
  end
  return self.wo(attn.merge_heads(out, H))
end

function CausalSelfAttention:extra_repr()
  return string.format("num_heads=%d, num_kv_heads=%d, rope=%s, window=%s", self.num_heads, self.num_kv_heads,
    tostring(self.rope), tostring(self.window))
end

-- ---------------------------------------------------------------- block

--- `nn.DecoderOnlyBlock{...}` (the options of CausalSelfAttention, and ffn_hidden, eps):
-- x + attention(attention_norm(x)), then h + feed_forward(ffn_norm(h)), the pre-norm block of
-- Llama. Children attention, attention_norm (RMSNorm), feed_forward (SwiGLU), ffn_norm, dropout.
-- @type DecoderOnlyBlock
local DecoderOnlyBlock = Module:extend("DecoderOnlyBlock")
M.DecoderOnlyBlock = DecoderOnlyBlock

function DecoderOnlyBlock:init(opts)
  local D = opts.d_model
  self.attention = CausalSelfAttention { d_model = D, num_heads = opts.num_heads, num_kv_heads = opts.num_kv_heads,
    dropout = opts.dropout, rope = opts.rope, rope_base = opts.rope_base, interleaved = opts.interleaved,
    window = opts.window, dtype = opts.dtype }
  self.attention_norm = RMSNorm(D, { eps = opts.eps, dtype = opts.dtype })
  self.feed_forward = SwiGLU(D, opts.ffn_hidden, D, { dtype = opts.dtype })
  self.ffn_norm = RMSNorm(D, { eps = opts.eps, dtype = opts.dtype })
  self.dropout = Dropout(opts.dropout or 0)
end

--- forward(x (B, N, d_model), state) -> (B, N, d_model); state as CausalSelfAttention's.
function DecoderOnlyBlock:forward(x, state)
  local h = x + self.dropout(self.attention(self.attention_norm(x), state))
  return h + self.dropout(self.feed_forward(self.ffn_norm(h)))
end

-- ---------------------------------------------------------------- sampling

-- A splitmix64 stream: generate's draws, reproducible from a seed and independent of the
-- engine's generator (which training uses).
local function stream(seed)
  local s = seed
  return function()
    s = s + 0x9E3779B97F4A7C15
    local z = s
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    z = z ~ (z >> 31)
    return (z >> 11) * 2.0 ^ -53 -- uniform in [0, 1)
  end
end

--- The sampling filter of `generate` on one row of logits (a Lua list), as Hugging Face's
-- warpers apply them: divided by `temperature` (default 1), then outside the `top_k` largest
-- (ties with the k-th value kept) set to -inf, then top-p (nucleus): in descending order of
-- probability, a token is kept while the probability of the tokens before it is below `top_p`
-- (the most likely token always stays). Returns a new list.
-- @tparam table logits a list of numbers
-- @tparam[opt] table opts `temperature` (> 0), `top_k` (integer >= 1), `top_p` (in (0, 1])
-- @treturn table the filtered logits (-math.huge where removed)
function M.filter_logits(logits, opts)
  opts = check.options("filter_logits", opts, { temperature = true, top_k = true, top_p = true })
  -- a Lua list as documented (a tensor's length is its first dim, whatever its other ones: one of
  -- 2^63 - 1 rows looped for ever, the fuzzer)
  if type(logits) ~= "table" or getmetatable(logits) ~= nil then
    error(string.format("filter_logits: logits must be a list of numbers, got %s",
      attn.is_tensor(logits) and "a tensor " .. attn.core.shape_str(logits:shape()) or "a " .. type(logits)), 2)
  end
  local V = #logits
  local t = opts.temperature or 1
  if type(t) ~= "number" or t ~= t or t <= 0 then
    error(string.format("filter_logits: temperature must be > 0, got %s", tostring(opts.temperature)), 2)
  end
  local out = {}
  for i = 1, V do out[i] = logits[i] / t end
  local order = {}
  for i = 1, V do order[i] = i end
  table.sort(order, function(a, b) return out[a] > out[b] or (out[a] == out[b] and a < b) end)
  local k = opts.top_k
  if k ~= nil then
    if math.type(k) ~= "integer" or k < 1 then
      error(string.format("filter_logits: top_k must be a positive integer, got %s", tostring(k)), 2)
    end
    if k < V then
      local kth = out[order[k]]
      for i = 1, V do
        if out[i] < kth then out[i] = -math.huge end
      end
    end
  end
  local p = opts.top_p
  if p ~= nil then
    if type(p) ~= "number" or not (p > 0 and p <= 1) then
      error(string.format("filter_logits: top_p must be in (0, 1], got %s", tostring(p)), 2)
    end
    local m, z = out[order[1]], 0
    for i = 1, V do z = z + math.exp(out[i] - m) end
    local before = 0
    for _, i in ipairs(order) do
      local prob = math.exp(out[i] - m) / z
      if before >= p then out[i] = -math.huge end
      before = before + prob
    end
  end
  return out
end

-- A draw from softmax(logits) (a Lua list) with the uniform u; the argmax when greedy.
local function draw(logits, u, greedy)
  local best, m = 1, -math.huge
  for i, l in ipairs(logits) do
    if l > m then best, m = i, l end
  end
  if greedy then return best end
  local z = 0
  for _, l in ipairs(logits) do z = z + math.exp(l - m) end
  local target, acc = u * z, 0
  for i, l in ipairs(logits) do
    acc = acc + math.exp(l - m)
    if acc > target then return i end
  end
  return best
end

-- ---------------------------------------------------------------- the model

--- `nn.DecoderOnlyTransformer{vocab_size, d_model, num_heads, num_kv_heads = num_heads,
-- num_layers, ffn_hidden = 8 * d_model // 3, max_len = 512, window, dropout = 0,
-- rope_base = 10000, interleaved = false, eps = 1e-5, tie_embeddings = true, dtype}`: token
-- embedding (N(0, 0.02^2)), num_layers DecoderOnlyBlocks, a final RMSNorm and the output
-- projection (the embedding's weight when tied). Keys: tok_embeddings.weight,
-- layers.0.attention.wq.weight, layers.0.attention_norm.weight, layers.0.feed_forward.w1.weight,
-- ..., norm.weight, output.weight (untied only). forward(ids (B, N) [, state]) -> logits
-- (B, N, vocab_size); ids are 1-based token ids, right-padded (module doc).
-- @type DecoderOnlyTransformer
local DecoderOnlyTransformer = Module:extend("DecoderOnlyTransformer")
M.DecoderOnlyTransformer = DecoderOnlyTransformer

function DecoderOnlyTransformer:init(opts)
  local who = "DecoderOnlyTransformer"
  opts = check.options(who, opts, { vocab_size = true, d_model = true, num_heads = true, num_kv_heads = true,
    num_layers = true, ffn_hidden = true, max_len = true, window = true, dropout = true, rope_base = true,
    interleaved = true, eps = true, tie_embeddings = true, dtype = true }, 4)
  local V, D = need_int(who, opts, "vocab_size"), need_int(who, opts, "d_model")
  local L = need_int(who, opts, "num_layers")
  self.vocab_size, self.d_model, self.num_layers = V, D, L
  self.max_len = need_int(who, opts, "max_len", 512)
  self.window = opts.window
  self.tie_embeddings = opts.tie_embeddings ~= false
  local block = { d_model = D, num_heads = opts.num_heads, num_kv_heads = opts.num_kv_heads, dropout = opts.dropout,
    rope_base = opts.rope_base, interleaved = opts.interleaved, window = opts.window, dtype = opts.dtype,
    ffn_hidden = need_int(who, opts, "ffn_hidden", math.max(1, 8 * D // 3)), eps = opts.eps or 1e-5 }
  self.tok_embeddings = Embedding(V, D, { dtype = opts.dtype })
  attn.nn.init.normal_(self.tok_embeddings.weight, 0, 0.02)
  self.layers = containers.ModuleList()
  for _ = 1, L do self.layers:append(DecoderOnlyBlock(block)) end
  self.norm = RMSNorm(D, { eps = block.eps, dtype = opts.dtype })
  if not self.tie_embeddings then self.output = Linear(D, V, { bias = false, dtype = opts.dtype }) end
end

--- The number of key/value slots of a cache: the window, or max_len.
function DecoderOnlyTransformer:cache_size() return self.window or self.max_len end

--- A preallocated cache for B samples: {k = {per layer (B*Hkv, S, dh)}, v = {...}, positions =
-- {each sample's next position}, size = S, batch = B}, zeros, in the model's dtype.
function DecoderOnlyTransformer:new_cache(B)
  check.positive_int("new_cache", "B", B)
  local S, dtype = self:cache_size(), self.tok_embeddings.weight:dtype()
  local cache = { k = {}, v = {}, positions = {}, size = S, batch = B }
  for i, blk in ipairs(self.layers) do
    local a = blk.attention
    cache.k[i] = attn.zeros({ B * a.num_kv_heads, S, a.head_dim }, dtype)
    cache.v[i] = attn.zeros({ B * a.num_kv_heads, S, a.head_dim }, dtype)
  end
  for b = 1, B do cache.positions[b] = 0 end
  return cache
end

-- ids as a (B, N) tensor from a tensor or a list of lists (right-padded with 1); lens[b].
local function batch_ids(who, ids, V)
  if attn.is_tensor(ids) then
    if ids:dim() ~= 2 then error(string.format("%s: ids %s must be (B, N)", who, shape_str(ids)), 3) end
    local lens = {}
    for b = 1, ids:size(1) do lens[b] = ids:size(2) end
    return ids, lens
  end
  if type(ids) ~= "table" or type(ids[1]) ~= "table" then
    error(who .. ": ids must be a (B, N) tensor or a list of lists of token ids", 3)
  end
  local N, lens = 0, {}
  for b, row in ipairs(ids) do
    if #row == 0 then error(string.format("%s: sample %d is empty", who, b), 3) end
    lens[b] = #row
    N = math.max(N, #row)
  end
  local rows = {}
  for b, row in ipairs(ids) do
    local r = {}
    for t = 1, N do
      local id = row[t] or 1
      if math.type(id) ~= "integer" or id < 1 or id > V then
        error(string.format("%s: sample %d token %d is %s, not an id in 1..%d", who, b, t, tostring(id), V), 3)
      end
      r[t] = id
    end
    rows[b] = r
  end
  return attn.tensor(rows, "int64"), lens
end

function DecoderOnlyTransformer:forward(ids, cache)
  local who = "DecoderOnlyTransformer"
  local X, lens = batch_ids(who, ids, self.vocab_size)
  local B, N = X:size(1), X:size(2)
  local S = self.max_len
  local decode = cache ~= nil and cache.started
  if cache ~= nil then
    if cache.batch ~= B then
      error(string.format("%s: the cache holds %d samples, ids have %d", who, cache.batch, B), 2)
    end
    if decode and N ~= 1 then
      error(string.format("%s: a started cache takes one token per sample per call, got ids %s", who,
        shape_str(X)), 2)
    end
  end
  if not self.window then
    for b = 1, B do
      local last = (decode and cache.positions[b] or 0) + lens[b]
      if last > S then
        error(string.format("%s: cache overflow: sample %d needs %d positions, more than max_len %d (no window)",
          who, b, last, S), 2)
      end
    end
  end
  local h = self.tok_embeddings(X)
  for i, blk in ipairs(self.layers) do
    local state
    if cache ~= nil then
      state = { k = cache.k[i], v = cache.v[i], lens = lens, positions = decode and cache.positions or nil }
    end
    h = blk(h, state)
  end
  h = self.norm(h)
  if cache ~= nil then
    for b = 1, B do cache.positions[b] = (decode and cache.positions[b] or 0) + lens[b] end
    cache.started = true
  end
  if self.tie_embeddings then return h:matmul(self.tok_embeddings.weight:t()) end
  return self.output(h)
end

--- The attention weights of the last forward, one (B, H, Nq, Nk) per layer, when
-- `keep_weights(true)` was set (nil otherwise).
function DecoderOnlyTransformer:attention_weights()
  local out = {}
  for i, blk in ipairs(self.layers) do out[i] = blk.attention.attention_weights end
  return out
end

--- Keeps (or stops keeping) every layer's attention weights at the next forwards.
function DecoderOnlyTransformer:keep_weights(flag)
  for _, blk in ipairs(self.layers) do blk.attention.keep_weights = flag ~= false end
  return self
end

-- Each sample's logits at its last real index, as Lua lists.
local function last_rows(logits, lens)
  local rows = {}
  for b, L in ipairs(lens) do rows[b] = core.totable(logits:select(1, b):select(1, L)) end
  return rows
end

--- Samples continuations of prompts, in eval mode and without gradients.
-- @tparam table|Tensor prompt_ids a (B, N) tensor or a list of B lists of token ids (lengths
--   may differ: right-padded, module doc)
-- @tparam[opt] table opts `max_new_tokens` (default 32), `temperature` (default 1; 0 is greedy),
--   `top_k`, `top_p` (filter_logits), `seed` (integer; default 0), `cache` (default true;
--   false recomputes the whole prefix at every step), `keep_logits` (keep each step's (B, V)
--   logits, before the filter, in the second result's `logits`)
-- @treturn table B lists of new token ids
-- @treturn table {logits = {per step a list of B lists}} (with keep_logits)
-- @raise on cache overflow without a window, naming the sizes
function DecoderOnlyTransformer:generate(prompt_ids, opts)
  local who = "generate"
  opts = check.options(who, opts, { max_new_tokens = true, temperature = true, top_k = true, top_p = true,
    seed = true, cache = true, keep_logits = true })
  local n_new = opts.max_new_tokens or 32
  if math.type(n_new) ~= "integer" or n_new < 0 then
    error(string.format("%s: max_new_tokens must be a non-negative integer, got %s", who, tostring(n_new)), 2)
  end
  local temperature = opts.temperature or 1
  local greedy = temperature == 0
  local filter = { temperature = not greedy and temperature or nil, top_k = opts.top_k, top_p = opts.top_p }
  local u = stream(opts.seed or 0)
  local X, lens = batch_ids(who, prompt_ids, self.vocab_size)
  local B = X:size(1)
  local seqs = {} -- the recompute path's sequences (Lua lists)
  local prompt = core.totable(X)
  for b = 1, B do seqs[b] = table.move(prompt[b], 1, lens[b], 1, {}) end
  local use_cache = opts.cache ~= false
  local was_training = self.training
  self:eval()
  local new, kept, ones = {}, {}, {}
  for b = 1, B do new[b], ones[b] = {}, 1 end
  local ok, err = pcall(attn.no_grad, function()
    local cache = use_cache and self:new_cache(B) or nil
    local logits = last_rows(self:forward(seqs, cache), lens)
    for step = 1, n_new do
      if opts.keep_logits then kept[step] = logits end
      local next_ids = {}
      for b = 1, B do
        local row = greedy and logits[b] or M.filter_logits(logits[b], filter)
        local id = draw(row, u(), greedy)
        new[b][step], next_ids[b] = id, { id }
        seqs[b][#seqs[b] + 1] = id
      end
      if step == n_new then break end
      if use_cache then
        logits = last_rows(self:forward(attn.tensor(next_ids, "int64"), cache), ones)
      else
        local ls = {}
        for b = 1, B do ls[b] = #seqs[b] end
        logits = last_rows(self:forward(seqs), ls)
      end
    end
  end)
  self:train(was_training)
  if not ok then error(err, 0) end
  return new, { logits = opts.keep_logits and kept or nil }
end

function DecoderOnlyTransformer:extra_repr()
  return string.format("vocab_size=%d, d_model=%d, num_layers=%d, max_len=%d, window=%s, tie_embeddings=%s",
    self.vocab_size, self.d_model, self.num_layers, self.max_len, tostring(self.window),
    tostring(self.tie_embeddings))
end

return M
