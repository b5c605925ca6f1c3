--- Attention layers of `attn.nn`, built on the functional attention API
-- (attn.dot_product_attention, attn.additive_attention, attn.split_heads, ...),
-- with the parameter names of the book's PyTorch classes.
--
-- After each call in eval mode, `m.attention_weights` holds the attention
-- weights (before dropout, detached from the graph) as the book stores them; for
-- MultiHeadAttention they are per head, (B, num_heads, Nq, Nk), never averaged.
-- In training mode the weights are not materialised (the kernel then needs no
-- (Nq x Nk) matrix) and attention_weights is nil, unless `m.keep_weights = true`.
-- The numbers are the same either way.
-- @module attn.nn.attention
local attn = require "attn"
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local check = require "attn.check"
local attention = require "attn.attention"
local core = require "attn.core"
local fused = require "attn.nn.fused"

local Module = module.Module
local Linear, Dropout, Embedding = linear.Linear, linear.Dropout, linear.Embedding

local M = {}

local shape_str = core.shape_str -- "[2x3]" from a tensor or a table of sizes
local is_tensor = attn.is_tensor
local fits_last = core.fits_last

-- Options given either as a table or positionally, in the order of `names`.
local function read_options(who, names, first, ...)
  local o = {}
  if type(first) == "table" and not is_tensor(first) then
    check.options(who, first, names, 5)
    for k, v in pairs(first) do o[k] = v end
  else
    local args = table.pack(first, ...)
    for i, n in ipairs(names) do o[n] = args[i] end
  end
  return o
end

local function need_int(who, o, name)
  check.positive_int(who, name, o[name], 5) -- (not a tail call: the level counts this frame)
  return o[name]
end

-- Lengths given as a table become a tensor of the dtype of `like` (the queries) when it is one.
local function valid_lens_tensor(v, like)
  if v == nil or is_tensor(v) then return v end
  if type(v) == "table" then return attn.tensor(v, is_tensor(like) and core.dtype(like) or nil) end
  error("valid_lens must be a tensor, a table or nil, got a " .. type(v), 3)
end

-- The weights as the layer keeps them: detached from the graph. A weights tensor no node
-- produced (nothing recorded) is already detached and is kept as it is, with no new view.
local function detach(t)
  if t ~= nil and t._rg then return t:detach() end
  return t
end

-- Stores the weights of the last call in `m.attention_weights`. They are a detached tensor or
-- nil, never a parameter, buffer or child, so the field is written without the registration
-- checks of a module assignment (which cost more than a small attention call).
local function keep_weights(m, w) rawget(m, "_attrs").attention_weights = detach(w) end

-- The forwards below read their module's fields as `m.k` would (Module.__index: the attribute
-- table `a = rawget(m, "_attrs")`, then the class) without a call of __index per field: at the
-- book's sizes the glue around a fused call cost a third of it.
local function field(a, m, k)
  local v = a[k]
  if v == nil then return getmetatable(m)[k] end
  return v
end

-- True when x is a 3-D tensor whose last dim is the in_features of the Linear child with
-- attributes `lin` (one C call); anything else (a child without in_features too) goes through
-- the composed path, whose children raise their own errors.
local function fits(x, lin)
  local n = lin.in_features
  return math.type(n) == "integer" and fits_last(x, 3, n)
end

-- The kernel options of one layer call (attn.attention._layer_options): the caller's opts, the
-- lengths as a tensor of the queries' dtype, the dropout of the layer's Dropout child, and the
-- weights when `m` (the module computing them, attributes `a`) is in eval mode or `keep` is set
-- (pitfall 9).
local function kernel_options(fn, m, a, keep, opts, valid_lens, queries)
  local dropout = a.dropout
  return attention._layer_options(fn, opts, valid_lens_tensor(valid_lens, queries), dropout.p, dropout.training,
    not m.training or keep == true)
end

-- ---------------------------------------------------------------- DotProductAttention

--- `nn.DotProductAttention{dropout = 0}` (or `(dropout)`): scaled dot-product
-- attention. forward(queries (B, Nq, d), keys (B, Nk, d), values (B, Nk, dv),
-- valid_lens [, opts]) -> (B, Nq, dv); opts are passed on to
-- attn.dot_product_attention (mask, causal, window, scale).
-- @type DotProductAttention
local DotProductAttention = Module:extend("DotProductAttention")
M.DotProductAttention = DotProductAttention

function DotProductAttention:init(...)
  local o = read_options("DotProductAttention", { "dropout" }, ...)
  self.dropout = Dropout(o.dropout or 0)
end

function DotProductAttention:forward(queries, keys, values, valid_lens, opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("DotProductAttention: opts must be a table, got a " .. type(opts), 2)
  end
  local a = rawget(self, "_attrs")
  local o = kernel_options("dot_product_attention", self, a, field(a, self, "keep_weights"), opts, valid_lens,
    queries)
  local out, weights = attention._dot_product_attention(queries, keys, values, o)
  a.attention_weights = detach(weights)
  return out
end

-- ---------------------------------------------------------------- AdditiveAttention

--- `nn.AdditiveAttention{key_size, query_size, num_hiddens, dropout}` (or
-- positional in that order): score(q, k) = w_v^T tanh(W_q q + W_k k).
-- Children W_k (key_size -> num_hiddens), W_q (query_size -> num_hiddens) and
-- w_v (num_hiddens -> 1), all without bias, and dropout; state dict keys
-- "W_k.weight", "W_q.weight", "w_v.weight" (1, num_hiddens).
-- forward(queries (B, Nq, query_size), keys (B, Nk, key_size), values (B, Nk, dv),
-- valid_lens) -> (B, Nq, dv).
-- @type AdditiveAttention
local AdditiveAttention = Module:extend("AdditiveAttention")
M.AdditiveAttention = AdditiveAttention

function AdditiveAttention:init(...)
  local who = "AdditiveAttention"
  local o = read_options(who, { "key_size", "query_size", "num_hiddens", "dropout" }, ...)
  local ks, qs, h = need_int(who, o, "key_size"), need_int(who, o, "query_size"), need_int(who, o, "num_hiddens")
  self.W_k = Linear(ks, h, { bias = false })
  self.W_q = Linear(qs, h, { bias = false })
  self.w_v = Linear(h, 1, { bias = false })
  self.dropout = Dropout(o.dropout or 0)
end

-- forward is the dispatcher itself (attn.nn.fused): one call less on a short path.
AdditiveAttention.forward = fused.forward

--- Whether the fused node can run this call (attn.nn.fused): queries and keys 3-D with the
-- last dims of the Linear children W_q, W_k, neither with a bias (the kernel has none),
-- values a tensor. Anything else takes the composed path, whose checks name the problem.
function AdditiveAttention:can_fuse(queries, keys, values)
  local a = rawget(self, "_attrs")
  local qa, ka = rawget(a.W_q, "_attrs"), rawget(a.W_k, "_attrs")
  return fits(queries, qa) and fits(keys, ka) and is_tensor(values) and qa.bias == nil and ka.bias == nil
end

--- The fused path: projections, scores, masked softmax, dropout and the weighted sum as one
-- node (`attn.projected_additive_attention`).
function AdditiveAttention:fused_forward(queries, keys, values, valid_lens)
  local a = rawget(self, "_attrs")
  local o = kernel_options("projected_additive_attention", self, a, field(a, self, "keep_weights"), nil,
    valid_lens, queries)
  local out, weights = attention._projected_additive_attention(queries, keys, values, rawget(a.W_q, "_attrs").weight,
    rawget(a.W_k, "_attrs").weight, rawget(a.w_v, "_attrs").weight, o)
  a.attention_weights = detach(weights)
  return out
end

--- The composed path: the children W_k, W_q, w_v and the functional additive attention,
-- the same numbers as the fused node.
function AdditiveAttention:composed_forward(queries, keys, values, valid_lens)
  return self:attend_projected(queries, self.W_k(keys), values, valid_lens)
end

--- The keys projected by W_k, (B, Nk, num_hiddens). A decoder that attends
-- over the same keys at every step (the Bahdanau decoder) projects them once
-- and calls `attend_projected` per step: the same forward numbers, one
-- projection node instead of one per step.
function AdditiveAttention:project_keys(keys) return self.W_k(keys) end

--- forward with keys already projected by `project_keys`. `seed` (an integer,
-- optional) picks the dropout stream of the weights instead of drawing one (the
-- fused Bahdanau decoder's composed path replays its streams with it).
function AdditiveAttention:attend_projected(queries, projected_keys, values, valid_lens, seed)
  local qh = self.W_q(queries)
  -- w_v.weight is (1, num_hiddens) as in PyTorch; the functional form takes the (h) vector
  local w_v = self.w_v.weight:reshape({ self.w_v.in_features })
  local a = rawget(self, "_attrs")
  local kopts = kernel_options("additive_attention", self, a, field(a, self, "keep_weights"), nil, valid_lens, qh)
  kopts.seed = seed
  local out, weights = attention._additive_attention(qh, projected_keys, values, w_v, kopts)
  keep_weights(self, weights)
  return out
end

-- ---------------------------------------------------------------- MultiHeadAttention

--- `nn.MultiHeadAttention{key_size, query_size, value_size, num_hiddens,
-- num_heads, dropout, bias = false}` (or positional in that order): the book's
-- multi-head attention. Children attention (DotProductAttention), W_q, W_k, W_v
-- (size -> num_hiddens) and W_o (num_hiddens -> num_hiddens). Heads use the
-- batch-major layout (B * num_heads rows, one sample's heads contiguous), and
-- valid_lens are repeat_interleave'd per head.
-- forward(queries (B, Nq, query_size), keys (B, Nk, key_size), values (B, Nk,
-- value_size), valid_lens [, opts]) -> (B, Nq, num_hiddens); afterwards
-- m.attention_weights is (B, num_heads, Nq, Nk). opts go to
-- attn.dot_product_attention (causal, window, scale, mask); a per-sample keep-mask
-- (B, Nq, Nk) is repeated per head. `attention` (a table field) selects another mechanism of
-- attn.nn.efficient: "linear", {"performer", num_features = 64}, {"window", window = r},
-- {"linformer", seq_len = N, k = 32}, {"nystrom", landmarks = 32}, ... (child `efficient`; see
-- nn.EfficientAttention).
--
-- Today's two variants, each one option (with full attention):
--
-- * `rope = true` (or `{base = 10000, interleaved = false}`, or an nn.RotaryEmbedding of the head
--   size, kept as the child `rope`) rotates the projected per-head queries and keys by attn.rope
--   before the scores: token t at position t - 1 (0-based) unless the call's opts give
--   `positions` (1-D (N) or per sample (B, N)); `key_positions` for the keys (default:
--   `positions`).
-- * `num_kv_heads` (dividing num_heads; default num_heads): grouped-query attention. W_k and W_v
--   project to num_kv_heads * head size, and query head h uses key/value head
--   ceil(h / (num_heads / num_kv_heads)) inside the kernel (no copy of K and V).
--
-- Either runs the composed path, as (B, H, N, head size) operands of attn.dot_product_attention.
-- @type MultiHeadAttention
local MultiHeadAttention = Module:extend("MultiHeadAttention")
M.MultiHeadAttention = MultiHeadAttention

-- The RotaryEmbedding child of the `rope` option (true, a table of its options, or one).
local function rotary_child(who, rope, h, heads)
  local dh = h // heads
  if dh % 2 ~= 0 then
    error(string.format("%s: rope needs an even head size, got num_hiddens %d / num_heads %d = %d", who, h, heads, dh),
      4)
  end
  local RotaryEmbedding = require("attn.nn.modern").RotaryEmbedding
  if rope == true then return RotaryEmbedding(dh) end
  if module.is_module(rope) then
    if rope.dim ~= dh then
      error(string.format("%s: rope module of dim %s does not fit the head size %d", who, tostring(rope.dim), dh), 4)
    end
    return rope
  end
  if type(rope) == "table" then return RotaryEmbedding(dh, rope) end
  error(string.format("%s: rope must be true, a table {base, interleaved} or an nn.RotaryEmbedding, got a %s", who,
    type(rope)), 4)
end

function MultiHeadAttention:init(...)
  local who = "MultiHeadAttention"
  local o = read_options(who, { "key_size", "query_size", "value_size", "num_hiddens", "num_heads", "dropout", "bias",
    "attention", "rope", "num_kv_heads" }, ...)
  local h, heads = need_int(who, o, "num_hiddens"), need_int(who, o, "num_heads")
  if h % heads ~= 0 then
    error(string.format("%s: num_hiddens %d is not divisible by num_heads %d", who, h, heads), 3)
  end
  local kv = o.num_kv_heads == nil and heads or need_int(who, o, "num_kv_heads")
  if heads % kv ~= 0 then
    error(string.format("%s: num_kv_heads %d does not divide num_heads %d", who, kv, heads), 3)
  end
  local efficient = o.attention ~= nil and o.attention ~= "full"
  if efficient and (kv ~= heads or (o.rope ~= nil and o.rope ~= false)) then
    error(string.format("%s: rope and num_kv_heads work with full attention, not attention = %s", who,
      tostring(type(o.attention) == "table" and o.attention[1] or o.attention)), 3)
  end
  local bias, dh = o.bias == true, h // heads
  self.num_heads, self.num_kv_heads = heads, kv
  self.attention = DotProductAttention(o.dropout or 0)
  self.W_q = Linear(need_int(who, o, "query_size"), h, { bias = bias })
  self.W_k = Linear(need_int(who, o, "key_size"), dh * kv, { bias = bias })
  self.W_v = Linear(need_int(who, o, "value_size"), dh * kv, { bias = bias })
  self.W_o = Linear(h, h, { bias = bias })
  if o.rope ~= nil and o.rope ~= false then self.rope = rotary_child(who, o.rope, h, heads) end
  if efficient then -- another mechanism (attn.nn.efficient)
    self.efficient = require("attn.nn.efficient").EfficientAttention(o.attention, dh, heads)
  end
end

-- A keep-mask given per sample, (B, Nq, Nk), repeated for the (B*heads) rows of
-- the head layout (sample b's heads are rows (b-1)*heads+1 .. b*heads); masks
-- that broadcast over the batch ((Nq, Nk) or (1, Nq, Nk), any size 1 broadcasting) are
-- kept as they are. The mask is checked against the caller's queries and keys first, so
-- a message names the shapes the caller passed, not the repeated one.
local function per_head_mask(opts, heads, queries, keys)
  local mask = opts.mask
  local dtype = is_tensor(queries) and core.dtype(queries) or nil
  if type(mask) == "table" and not is_tensor(mask) then mask = attn.tensor(mask, dtype) end
  if is_tensor(mask) and is_tensor(queries) and is_tensor(keys) and core.dim(queries) == 3 and core.dim(keys) == 3 then
    local B, Nq, Nk = core.size(queries, 1), core.size(queries, 2), core.size(keys, 2)
    local n, ms = core.dim(mask), core.shape(mask)
    local mask_fits = n >= 1 and n <= 3 and (ms[n] == Nk or ms[n] == 1)
      and (n == 1 or ms[n - 1] == Nq or ms[n - 1] == 1) and (n < 3 or ms[1] == B or ms[1] == 1)
    if not mask_fits then
      error(string.format("MultiHeadAttention: mask %s does not fit queries %s and keys %s: expected (Nq, Nk) = %s " ..
        "or (B, Nq, Nk) = %s (sizes 1 broadcast); the layer repeats a per-sample mask for its %d heads itself",
        shape_str(ms), shape_str(queries), shape_str(keys), shape_str({ Nq, Nk }), shape_str({ B, Nq, Nk }), heads), 4)
    end
  end
  if is_tensor(mask) and mask:dim() == 3 and mask:size(1) > 1 then
    local idx = {}
    for b = 1, mask:size(1) do
      for _ = 1, heads do idx[#idx + 1] = b end
    end
    mask = attn.core.index_select(mask, 1, idx)
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.mask = mask
  return o
end

-- valid_lens must fit the caller's (B) or (B, Nq), checked before the per-head
-- repetition so the message shows the shapes the caller passed.
local function check_lens(lens, queries)
  if lens == nil or not is_tensor(queries) or core.dim(queries) ~= 3 then return end
  local n, B = core.dim(lens), core.size(queries, 1)
  if not ((n == 1 and core.size(lens, 1) == B) or (n == 2 and core.size(lens, 1) == B
      and core.size(lens, 2) == core.size(queries, 2))) then
    local ls, qs = core.shape(lens), core.shape(queries)
    error(string.format("MultiHeadAttention: valid_lens %s does not fit queries %s (expected %s or %s)",
      shape_str(ls), shape_str(qs), shape_str({ qs[1] }), shape_str({ qs[1], qs[2] })), 3)
  end
end

-- The per-head weights (B*H, Nq, Nk) of the last call in both places the book reads them:
-- the attention child (as they are) and the layer, as (B, num_heads, Nq, Nk).
local function keep_head_weights(m, w, heads)
  w = detach(w)
  keep_weights(m.attention, w) -- (detach(w) is w now)
  if w ~= nil then -- detached: a plain view, no node
    w = core.reshape(w, core.size(w, 1) // heads, heads, core.size(w, 2), core.size(w, 3))
  end
  rawget(m, "_attrs").attention_weights = w
end

-- W (h, in) as a view of a contiguous W^T, for the forward's products: the small-product kernel
-- reads a contiguous W^T in place, where W itself it packs on every call (half the product's time
-- at the book's 100 x 100).
local function transposed(W) return core.transpose(core.contiguous(core.transpose(W, 1, 2)), 1, 2) end

-- The parameter tables of one fused call (eval mode): `params` (the node's inputs) and `operands`
-- (the same weights, W as views of cached transposes). Both are kept, with the tensors they were
-- built from and the weights' write versions, while the projections hold the same tensors at the
-- same versions: optimizer steps, load_state_dict and every in-place write bump the version,
-- `to` and assignments make new tensors, so a changed weight is never read stale, and a call
-- that finds them current builds no table.
local function eval_parameters(m, wq, wk, wv, wo, bq, bk, bv, bo)
  local c = rawget(m, "_fused_parameters")
  local vq, vk, vv, vo = core.version(wq), core.version(wk), core.version(wv), core.version(wo)
  if c ~= nil and rawequal(c[1], wq) and rawequal(c[2], wk) and rawequal(c[3], wv) and rawequal(c[4], wo)
      and rawequal(c[5], bq) and rawequal(c[6], bk) and rawequal(c[7], bv) and rawequal(c[8], bo)
      and c[9] == vq and c[10] == vk and c[11] == vv and c[12] == vo then
    return c.params, c.operands
  end
  c = { wq, wk, wv, wo, bq, bk, bv, bo, vq, vk, vv, vo,
    params = { W_q = wq, W_k = wk, W_v = wv, W_o = wo, b_q = bq, b_k = bk, b_v = bv, b_o = bo },
    operands = { W_q = transposed(wq), W_k = transposed(wk), W_v = transposed(wv), W_o = transposed(wo),
      b_q = bq, b_k = bk, b_v = bv, b_o = bo } }
  rawset(m, "_fused_parameters", c)
  return c.params, c.operands
end

function MultiHeadAttention:forward(queries, keys, values, valid_lens, opts)
  valid_lens = valid_lens_tensor(valid_lens, queries)
  check_lens(valid_lens, queries)
  if rawget(self, "_attrs").efficient ~= nil then return self:efficient_forward(queries, keys, values, valid_lens, opts) end
  if opts ~= nil and (opts.positions ~= nil or opts.key_positions ~= nil) and rawget(self, "_attrs").rope == nil then
    error("MultiHeadAttention: positions and key_positions need the rope option", 2)
  end
  if opts ~= nil and opts.mask ~= nil then
    opts = per_head_mask(opts, self.num_heads, queries, keys)
  end
  return fused.forward(self, queries, keys, values, valid_lens, opts)
end

--- Whether the fused node can run this call (attn.nn.fused): queries, keys and values 3-D
-- with the last dims of the Linear children W_q, W_k, W_v, and neither rope nor grouped
-- keys and values (the node has neither). Anything else takes the composed path, whose
-- checks name the problem.
function MultiHeadAttention:can_fuse(queries, keys, values)
  local a = rawget(self, "_attrs")
  return a.rope == nil and a.num_kv_heads == a.num_heads and fits(queries, rawget(a.W_q, "_attrs"))
    and fits(keys, rawget(a.W_k, "_attrs")) and fits(values, rawget(a.W_v, "_attrs"))
end

--- The fused path: the four projections, the heads' attention and the merge as one node
-- (`attn.multi_head_attention`). Takes what forward prepared: lengths as a tensor, a mask
-- repeated per head.
function MultiHeadAttention:fused_forward(queries, keys, values, valid_lens, opts)
  local a = rawget(self, "_attrs")
  local heads = self.num_heads
  local qa, ka, va, oa = rawget(a.W_q, "_attrs"), rawget(a.W_k, "_attrs"), rawget(a.W_v, "_attrs"),
    rawget(a.W_o, "_attrs")
  -- the weights as the composition asks its child for them: the layer's keep_weights rules
  local child = a.attention
  local o = kernel_options("multi_head_attention", child, rawget(child, "_attrs"), field(a, self, "keep_weights"),
    opts, valid_lens, queries)
  local wq, wk, wv, wo = qa.weight, ka.weight, va.weight, oa.weight
  local bq, bk, bv, bo = qa.bias, ka.bias, va.bias, oa.bias
  local params, operands
  if self.training then -- every step changes the weights: nothing to keep between calls
    params = { W_q = wq, W_k = wk, W_v = wv, W_o = wo, b_q = bq, b_k = bk, b_v = bv, b_o = bo }
  else
    params, operands = eval_parameters(self, wq, wk, wv, wo, bq, bk, bv, bo)
  end
  local out, w = attention._multi_head_attention(queries, keys, values, heads, params, o, operands)
  keep_head_weights(self, w, heads)
  return out
end

--- The composed path: the children's projections, `split_heads`, the DotProductAttention
-- child and `merge_heads`, the same numbers as the fused node. Takes what forward prepared.
function MultiHeadAttention:composed_forward(queries, keys, values, valid_lens, opts)
  local heads = self.num_heads
  local a = rawget(self, "_attrs")
  if a.rope ~= nil or a.num_kv_heads ~= heads then
    return self:heads_forward(queries, keys, values, valid_lens, opts)
  end
  local q = attn.split_heads(self.W_q(queries), heads)
  local k = attn.split_heads(self.W_k(keys), heads)
  local v = attn.split_heads(self.W_v(values), heads)
  if valid_lens ~= nil then valid_lens = attn.repeat_interleave(valid_lens, heads, 1) end
  self.attention.keep_weights = self.keep_weights
  local out = self.attention(q, k, v, valid_lens, opts)
  keep_head_weights(self, self.attention.attention_weights, heads)
  return self.W_o(attn.merge_heads(out, heads))
end

--- The composed path with rope or grouped keys and values: the projections as (B, H, N, head
-- size) and (B, num_kv_heads, N, head size) operands (split_heads' rows viewed 4-D), the rope
-- child on queries and keys, the DotProductAttention child (which maps the key/value heads) and
-- `merge_heads`. Takes what forward prepared (a per-sample mask repeated per head).
function MultiHeadAttention:heads_forward(queries, keys, values, valid_lens, opts)
  local a = rawget(self, "_attrs")
  local H, Hkv = a.num_heads, a.num_kv_heads
  local q, k, v = self.W_q(queries), self.W_k(keys), self.W_v(values)
  local B, Nq, Nk = q:size(1), q:size(2), k:size(2)
  local dh = q:size(3) // H
  q = attn.split_heads(q, H):reshape({ B, H, Nq, dh })
  k = attn.split_heads(k, Hkv):reshape({ B, Hkv, Nk, dh })
  v = attn.split_heads(v, Hkv):reshape({ B, Hkv, Nk, v:size(3) // Hkv })
  local positions, key_positions
  if opts ~= nil then
    local o = {}
    for key, val in pairs(opts) do o[key] = val end
    positions, key_positions, o.positions, o.key_positions = o.positions, o.key_positions, nil, nil
    local mask = o.mask -- repeated per head by forward: (B*H, Nq, Nk) rows are (b, h) batch-major
    if is_tensor(mask) and mask:dim() == 3 and mask:size(1) == B * H and B * H > 1 then
      o.mask = mask:reshape({ B, H, Nq, Nk })
    end
    opts = o
  end
  if a.rope ~= nil then
    q = a.rope(q, positions)
    k = a.rope(k, key_positions or positions)
  end
  local child = a.attention
  child.keep_weights = self.keep_weights
  local out = child(q, k, v, valid_lens, opts) -- (B, H, Nq, dv)
  a.attention_weights = rawget(child, "_attrs").attention_weights -- (B, H, Nq, Nk) or nil
  return self.W_o(attn.merge_heads(out:reshape({ B * H, Nq, out:size(4) }), H))
end

--- The path of another mechanism (the `attention` option): the projections, `split_heads`, the
-- EfficientAttention child and `merge_heads`; no attention weights are kept.
function MultiHeadAttention:efficient_forward(queries, keys, values, valid_lens, opts)
  local heads = self.num_heads
  if opts ~= nil and next(opts) ~= nil then
    error("MultiHeadAttention: options go to the attention option's table when it selects another mechanism", 3)
  end
  local q = attn.split_heads(self.W_q(queries), heads)
  local k = attn.split_heads(self.W_k(keys), heads)
  local v = attn.split_heads(self.W_v(values), heads)
  if valid_lens ~= nil then valid_lens = attn.repeat_interleave(valid_lens, heads, 1) end
  rawget(self, "_attrs").attention_weights = nil
  return self.W_o(attn.merge_heads(self.efficient(q, k, v, { valid_lens = valid_lens }), heads))
end

function MultiHeadAttention:extra_repr()
  local a = rawget(self, "_attrs")
  if a.num_kv_heads == a.num_heads then return "num_heads=" .. a.num_heads end
  return string.format("num_heads=%d, num_kv_heads=%d", a.num_heads, a.num_kv_heads)
end

-- ---------------------------------------------------------------- positional encodings

--- `nn.PositionalEncoding{num_hiddens, dropout, max_len = 1000}` (or
-- positional): X (B, T, num_hiddens) -> dropout(X + P[1..T]) with the sinusoidal
-- table P of attn.positional_encoding. P is a plain field, not state (as in the
-- book, whose state dict for this layer is empty), computed in double and stored in the
-- module's dtype: `m:to("float64")` (or a float64 input) makes the float64 table, not an
-- upcast of the float32 one.
-- @type PositionalEncoding
local PositionalEncoding = Module:extend("PositionalEncoding")
M.PositionalEncoding = PositionalEncoding

function PositionalEncoding:init(...)
  local who = "PositionalEncoding"
  local o = read_options(who, { "num_hiddens", "dropout", "max_len" }, ...)
  self.num_hiddens = need_int(who, o, "num_hiddens")
  o.max_len = o.max_len or 1000
  self.max_len = need_int(who, o, "max_len")
  self.dropout = Dropout(o.dropout or 0)
  self.P = attn.positional_encoding(self.max_len, self.num_hiddens, "float32")
end

-- T rows of the table from 0-based position `offset` (default 0) in `dtype`, (T, num_hiddens).
function PositionalEncoding:encoding(T, dtype, offset)
  if self.P:dtype() ~= dtype then self.P = attn.positional_encoding(self.max_len, self.num_hiddens, dtype) end
  local P = self.P
  if P:dim() == 3 then P = P:select(1, 1) end
  return P:narrow(1, (offset or 0) + 1, T)
end

--- to(dtype): Module.to, and the table recomputed in dtype.
function PositionalEncoding:to(dtype)
  Module.to(self, dtype)
  if self.P:dtype() ~= dtype then self.P = attn.positional_encoding(self.max_len, self.num_hiddens, dtype) end
  return self
end

local function check_positions(who, X, d, max_len, offset)
  if not is_tensor(X) then error(who .. ": input must be a tensor (B, T, d), got a " .. type(X), 3) end
  if offset ~= nil and (math.type(offset) ~= "integer" or offset < 0) then
    error(string.format("%s: offset must be a non-negative integer, got %s", who, tostring(offset)), 3)
  end
  local s = X:shape()
  if #s < 2 or s[#s] ~= d or s[#s - 1] + (offset or 0) > max_len then
    error(string.format("%s: input %s must be (..., T, %d) with offset + T <= max_len %d (offset %d)", who,
      shape_str(s), d, max_len, offset or 0), 3)
  end
  return s[#s - 1]
end

--- forward(X [, offset]): the positions are offset, offset + 1, ... (0-based;
-- default 0), for a decoder fed one step at a time.
function PositionalEncoding:forward(X, offset)
  local T = check_positions("PositionalEncoding", X, self.num_hiddens, self.max_len, offset)
  return self.dropout(X + self:encoding(T, X:dtype(), offset))
end

--- `nn.LearnedPositionalEncoding{num_hiddens, max_len, dropout}` (or positional):
-- the chapter's exercise, a learnable position embedding: X (B, T, d) ->
-- dropout(X + embedding.weight[1..T]). Child "embedding" is an Embedding(max_len,
-- num_hiddens) (N(0, 1) init like nn.Embedding; state key "embedding.weight").
-- @type LearnedPositionalEncoding
local LearnedPositionalEncoding = Module:extend("LearnedPositionalEncoding")
M.LearnedPositionalEncoding = LearnedPositionalEncoding

function LearnedPositionalEncoding:init(...)
  local who = "LearnedPositionalEncoding"
  local o = read_options(who, { "num_hiddens", "max_len", "dropout" }, ...)
  self.num_hiddens = need_int(who, o, "num_hiddens")
  o.max_len = o.max_len or 1000
  self.max_len = need_int(who, o, "max_len")
  self.embedding = Embedding(self.max_len, self.num_hiddens)
  self.dropout = Dropout(o.dropout or 0)
end

function LearnedPositionalEncoding:forward(X, offset)
  local T = check_positions("LearnedPositionalEncoding", X, self.num_hiddens, self.max_len, offset)
  local positions = {}
  for t = 1, T do positions[t] = t + (offset or 0) end
  return self.dropout(X + self.embedding(positions))
end

return M
