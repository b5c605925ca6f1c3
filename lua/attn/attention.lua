--- Attention functions of d2l's attention chapter, differentiable.
--
-- The facade copies these into `attn`: `attn.masked_softmax`, `attn.dot_product_attention`, ...
-- Shapes are batch-first: B samples (for multi-head attention B*heads, batch-major), Nq queries,
-- Nk keys/values, d query/key width, dv value width. `dot_product_attention` also takes heads
-- as a dimension, (B, H, N, d), with grouped-query keys and values, an additive `bias` and ALiBi
-- (see it and `alibi_slopes`). Kernels are in C (src/attention/attn_attention.h);
-- every tensor input gets a gradient through attn.autograd.
--
-- **Two masking conventions** (never an unlabeled boolean mask):
--
-- * `valid_lens` follows the book exactly. 1-D (B): one length for every query of a sample;
--   2-D (B, Nq): one length per query. Keys past the length get the score -1e6 before the
--   softmax, as d2l's `masked_softmax` does, so with ordinary scores their weight is exactly 0,
--   and a row with valid length 0 comes out *uniform over all keys* (padding included), never
--   NaN. Lengths may be Lua tables, int64 tensors or float tensors holding integers >= 0; a
--   length past Nk means all keys (as PyTorch's masking gives for the book's predict_seq2seq,
--   which passes untruncated source lengths). Anything else (a negative length, a fraction)
--   raises an error naming valid_lens and the shapes.
-- * Keep-masks: `mask` (1 attend, 0 ignore, broadcastable to (B, Nq, Nk)), `causal` (query i
--   sees keys j <= i) and `window` (query i sees keys with |i - j| <= window; 0: its own key
--   only; >= Nk: every key, as without one) *remove* keys by selection, and so do the sparse
--   patterns below. A query whose keys are all removed gets zero weights, zero output and zero
--   gradients, never NaN. Removed keys are never read: a NaN stored in a masked-out key or value
--   does not reach the output or the gradients.
-- * Every other row is the ordinary softmax of its kept scores: all -inf (or a NaN) gives NaN,
--   as `attn.softmax` does, and a NaN value of an unmasked key reaches the output even when its
--   weight underflows to 0. Only masked keys are ever left out (src/attention/attn_attention.h).
--
-- **Sparse patterns** (0-based query i, key j; s = `stride`, c = `summary`, default 1): query i
-- keeps key j when `(not causal or j <= i) and (local(i, j) or global(i) or global(j))`, where
--
-- * local: every key; with `window = r`: |i - j| <= r; with `pattern = "strided"` (Child et al.
--   2019): |i - j| < s or (i - j) mod s == 0; with `pattern = "fixed"`: floor(i / s) ==
--   floor(j / s) (same block) or j mod s >= s - c (the block's last c "summary" columns). The
--   paper's patterns are these with `causal = true`; a window and a pattern exclude each other.
-- * global: `global = {positions}` (1-based, distinct, within Nq and Nk; Longformer's global
--   tokens): those queries see every key and every query sees those keys.
--
-- The cost follows the pattern: the float32 kernels visit only the key tiles some query of a
-- block keeps, so window r plus g global tokens costs O(N (r + g)) per head, not O(N^2) (the
-- weights, when asked for, are still a (Nq, Nk) output).
--
-- When both are given, the keep-masks remove keys first and valid_lens fills among the rest.
-- Dropout acts on the weights (before they multiply the values) only when `training = true`;
-- the returned weights are the softmax before dropout (d2l's `attention_weights`).
-- Asking for the weights does not change the output: the same code path writes them out.
-- @module attn.attention
local core = require "attn.core"
local autograd = require "attn.autograd"
local Tensor = require "attn.tensor"
local check = require "attn.check"

local record, is_tensor, wants = autograd.record, autograd.is_tensor, autograd.wants

local M = {}

local shape_str = core.shape_str -- "[2x3]" from a tensor or a table of sizes

local check_tensor, check_count = check.tensor, check.positive_int

local attention_options = {
  valid_lens = true, mask = true, causal = true, window = true, scale = true, dropout = true,
  training = true, need_weights = true, bias = true, alibi = true, pattern = true, stride = true,
  summary = true, global = true,
}

-- The options table for the C kernels. Only the keys are checked here (a Lua concern); the
-- binding converts the values (types) and the C core checks shapes, ranges and dtypes
-- (src/bind/lattention.c, src/attention/attn_attention.c), so a C caller gets the same checks.
local function kernel_options(fn, opts)
  opts = check.options(fn, opts, attention_options, 4)
  local training = opts.training -- dropout acts only when training (the binding checks the type)
  if training == nil then training = false end
  return {
    name = fn,
    valid_lens = opts.valid_lens,
    mask = opts.mask,
    causal = opts.causal,
    window = opts.window,
    scale = opts.scale,
    dropout = opts.dropout,
    training = training,
    need_weights = opts.need_weights,
    bias = opts.bias,
    alibi = opts.alibi,
    pattern = opts.pattern,
    stride = opts.stride,
    summary = opts.summary,
    global = opts.global,
  }
end

local function rg(t) return is_tensor(t) and t._rg == true end

-- The outputs a node records: the weights too, unless the caller keeps them detached anyway (the
-- layers of attn.nn: their options come from _layer_options), which spares the node an output.
local function recorded(out, weights, kopts)
  if weights ~= nil and not kopts.detached_weights then return { out, weights } end
  return out
end

--- d2l's `sequence_mask`: entries of sample b at time steps past `valid_len[b]` become `value`.
-- @tparam Tensor X (B, T, ...); for 3-D X whole feature rows are set
-- @tparam Tensor|table valid_len (B), integers >= 0 (int64 or float; past T means all of T)
-- @tparam[opt=0] number value
-- @treturn Tensor a new tensor of X's shape (gradient 0 at the masked entries)
-- @usage attn.sequence_mask(attn.tensor{{1, 2, 3}, {4, 5, 6}}, {1, 2}) --> {{1, 0, 0}, {4, 5, 0}}
function M.sequence_mask(X, valid_len, value)
  check_tensor("sequence_mask", "X", X, nil, "(B, T, ...)")
  local out = core.sequence_mask(X, valid_len, value or 0)
  return record("sequence_mask", out, { X }, function(g)
    if g == nil then return nil end
    return core.sequence_mask(g, valid_len, 0)
  end)
end

--- d2l's `masked_softmax` over the last dim.
-- Entries past the valid length are set to -1e6 before the softmax (the book's semantics), so a
-- valid length of 0 gives a uniform row over all K positions.
-- @tparam Tensor X (B, Q, K)
-- @tparam[opt] Tensor|table valid_lens nil, (B) or (B, Q); integers >= 0 (past K: all of K)
-- @treturn Tensor (B, Q, K)
-- @usage attn.masked_softmax(attn.rand{2, 2, 4}, {2, 3}) -- zeros past positions 2 and 3
function M.masked_softmax(X, valid_lens)
  check_tensor("masked_softmax", "X", X, nil, "(B, Q, K)")
  local Y = core.masked_softmax_forward(X, valid_lens)
  return record("masked_softmax", Y, { X }, function(g)
    if g == nil then return nil end
    return core.masked_softmax_backward(Y, g, valid_lens)
  end)
end

-- alibi_slopes refuses more heads than this (no model has them; the slopes are a Lua loop)
local MAX_ALIBI_HEADS = 1 << 20

--- ALiBi's head slopes (Press et al. 2022, the paper's code `get_slopes`): for n a power of two,
-- 2^(-8i/n), i = 1..n; otherwise the slopes of the closest lower power of two p, followed by the
-- slopes of 2p at its odd positions 1, 3, 5, ... (n - p of them).
-- @tparam integer num_heads n >= 1
-- @tparam[opt="float64"] string dtype
-- @treturn Tensor (n)
-- @usage attn.alibi_slopes(8) --> 1/2, 1/4, ..., 1/256
function M.alibi_slopes(num_heads, dtype)
  check_count("alibi_slopes", "num_heads", num_heads)
  -- the slopes are formed in a Lua loop: refuse what could not be allocated, and head counts no
  -- model has, before looping (a count near 2^31 would run for minutes)
  core.check_size("alibi_slopes", "slopes", { num_heads }, dtype or "float64")
  if num_heads > MAX_ALIBI_HEADS then
    error(string.format("alibi_slopes: num_heads %d is more than %d", num_heads, MAX_ALIBI_HEADS), 2)
  end
  local function pow2_slopes(n) -- as the paper's code forms them: start * start^(i - 1), bit for bit
    local start = 2 ^ (-(2 ^ -(math.log(n, 2) - 3)))
    local t = {}
    for i = 1, n do t[i] = start * start ^ (i - 1) end
    return t
  end
  local p = 1
  while p * 2 <= num_heads do p = p * 2 end
  local slopes = pow2_slopes(p)
  if p < num_heads then
    local extra = pow2_slopes(2 * p)
    for i = 1, num_heads - p do slopes[p + i] = extra[2 * i - 1] end
  end
  return core.tensor(slopes, dtype or "float64")
end

--- Scaled dot-product attention: softmax(Q K^T * scale + bias, masked) V.
-- **Heads as a dimension.** Q (B, H, Nq, d), K (B, Hkv, Nk, d), V (B, Hkv, Nk, dv) give output
-- (B, H, Nq, dv) and weights (B, H, Nq, Nk), the (B*H, N, .) call's numbers (row b*H + h).
-- Hkv must divide H: **grouped-query attention** (Hkv = 1: multi-query), query head h (1-based)
-- uses key/value head ceil(h / (H / Hkv)) (consecutive groups, as Llama's repeat_kv); K and V
-- are never copied, and their gradients sum each group's query heads in a fixed order.
-- `valid_lens` (B) or (B, Nq) apply to every head; a `mask` and a `bias` broadcast to
-- (B, H, Nq, Nk) (NumPy's rules: a 3-D one is (H, Nq, Nk)).
--
-- **Additive bias** (PyTorch's float attn_mask): `bias`, broadcastable to (B, [H,] Nq, Nk), is
-- added to the scaled scores before the softmax and before d2l's valid-length fill and the
-- keep-masks (which still remove keys); it is read through its strides, so a broadcast dim costs
-- no copy. A -inf entry gives its key weight 0 (a row of -inf only is NaN, as in PyTorch). A
-- bias that requires grad runs a composed path (scores = Q K^T * scale + bias as autograd ops,
-- then the masked-softmax kernel), which gives it its gradient; otherwise the fused kernels run.
--
-- **ALiBi** (Press et al. 2022): `alibi = true` (slopes `alibi_slopes(H)`) or a slopes tensor (H)
-- adds -slope_h * |i - j| to head h's scaled scores (under `causal` the kept keys have j <= i:
-- -slope_h * (i - j)), computed inside the kernels (no (Nq, Nk) tensor). 3-D calls have one head.
--
-- The short-row kernels (Nk <= 16) take no bias or ALiBi: those calls run the blocked path.
--
-- All of these combine with each other and with `window`, the sparse patterns and `global`
-- (one keep rule, the same for every head: it decides which keys exist, the bias and ALiBi are
-- added to the kept scores, and the flash kernels skip the tiles the rule removes).
-- @tparam Tensor Q (B, Nq, d) or (B, H, Nq, d)
-- @tparam Tensor K (B, Nk, d) or (B, Hkv, Nk, d)
-- @tparam Tensor V (B, Nk, dv) or (B, Hkv, Nk, dv)
-- @tparam[opt] table opts `valid_lens` (1-D or 2-D, d2l semantics), `mask` (keep-mask broadcastable
--   to (B, [H,] Nq, Nk)), `causal` (boolean), `window` (integer r >= 0), `scale` (default 1/sqrt(d)),
--   `bias` (tensor broadcastable to (B, [H,] Nq, Nk)), `alibi` (true or slopes (H)),
--   `dropout` (probability, applied to the weights) with `training` (default false: no dropout),
--   `need_weights` (default true; false skips the (Nq x Nk) weights, which come back nil),
--   `pattern` ("strided" or "fixed") with `stride` (integer >= 1) and `summary` (fixed: 1..stride,
--   default 1), `global` (table of distinct 1-based positions); see "Sparse patterns" above
-- @treturn Tensor output (B, [H,] Nq, dv)
-- @treturn ?Tensor weights (B, [H,] Nq, Nk), the softmax before dropout
function M.dot_product_attention(Q, K, V, opts)
  return M._dot_product_attention(Q, K, V, kernel_options("dot_product_attention", opts))
end

-- kopts.alibi = true as the slopes of Q's heads, and a bias of the other float dtype converted
-- (no gradient through a conversion: a bias that requires grad must have Q's dtype).
local function score_options(fn, Q, kopts)
  if kopts.alibi == true then
    kopts.alibi = M.alibi_slopes(core.dim(Q) == 4 and core.size(Q, 2) or 1)
  elseif kopts.alibi == false then
    kopts.alibi = nil
  end
  local bias = kopts.bias
  if is_tensor(bias) and core.dtype(bias) ~= core.dtype(Q) then
    if rg(bias) then
      error(string.format("%s: bias %s is %s and requires grad; give it the queries' dtype %s", fn, shape_str(bias),
        core.dtype(bias), core.dtype(Q)), 4)
    end
    kopts.bias = core.to(bias, core.dtype(Q))
  end
end

-- The composed form of a call whose bias requires grad: scores = Q K^T * scale + bias (+ ALiBi)
-- as autograd ops (K and V repeated over the groups), then the masked-softmax kernel over the
-- (B*H) rows with the same masks, dropout stream and options.
local function composed_bias_attention(Q, K, V, kopts)
  local nd = core.dim(Q)
  local Nq, Nk, d = core.size(Q, nd - 1), core.size(K, nd - 1), core.size(Q, nd)
  local H = nd == 4 and core.size(Q, 2) or 1
  if nd == 4 and core.size(K, 2) ~= H then
    local g = H // core.size(K, 2)
    if g * core.size(K, 2) ~= H then core.sdpa_forward(Q, K, V, kopts) end -- (the kernel's error)
    K, V = Tensor.repeat_interleave(K, g, 2), Tensor.repeat_interleave(V, g, 2)
  end
  local scale = kopts.scale or 1 / math.sqrt(d)
  local scores = Tensor.matmul(Q, Tensor.transpose(K, nd - 1, nd)) * scale + kopts.bias
  if kopts.alibi ~= nil then
    local i = core.reshape(core.arange(0, Nq, 1, core.dtype(Q)), Nq, 1)
    local dist = core.abs(core.sub(i, core.reshape(core.arange(0, Nk, 1, core.dtype(Q)), 1, Nk)))
    local slopes = core.reshape(core.to(kopts.alibi, core.dtype(Q)), -1, 1, 1)
    scores = scores + core.mul(core.neg(slopes), dist)
  end
  local sopts = {}
  for k, v in pairs(kopts) do sopts[k] = v end
  sopts.bias, sopts.alibi, sopts.name = nil, nil, "dot_product_attention"
  sopts.scale = 1
  if nd == 4 then
    sopts.heads = H
    if sopts.valid_lens ~= nil then
      local vl = is_tensor(sopts.valid_lens) and sopts.valid_lens or core.tensor(sopts.valid_lens, "float64")
      sopts.valid_lens = Tensor.repeat_interleave(vl, H, 1)
    end
    local m = sopts.mask
    if is_tensor(m) and core.dim(m) < 4 then
      local shape = core.shape(m)
      while #shape < 4 do table.insert(shape, 1, 1) end
      sopts.mask = core.reshape(m, table.unpack(shape))
    end
  end
  local B = core.size(Q, 1) * H
  local out, w = M._attend_scores("dot_product_attention", Tensor.reshape(scores, { B, Nq, Nk }),
    Tensor.reshape(V, { B, Nk, core.size(V, nd) }), sopts)
  kopts.seed = sopts.seed
  if nd == 4 then
    out = Tensor.reshape(out, { core.size(Q, 1), H, Nq, core.size(V, nd) })
    if w ~= nil then w = Tensor.reshape(w, { core.size(Q, 1), H, Nq, Nk }) end
  end
  return out, w
end

-- Kernel options for one call of a layer of attn.nn (fn: the function it runs), which sets the
-- lengths, dropout and weights itself over the caller's opts (keys checked as for the
-- functions): a fresh table, which the underscored forms of the functions use in place.
function M._layer_options(fn, opts, valid_lens, dropout, training, need_weights)
  -- one constructor (no rehash while it fills): detached_weights is read by `recorded`, the
  -- binding reads only the kernel's keys
  local o = { name = fn, valid_lens = valid_lens, dropout = dropout, training = training == true,
    need_weights = need_weights, detached_weights = true }
  if opts ~= nil then
    check.options(fn, opts, attention_options)
    for k, v in pairs(opts) do
      if o[k] == nil then o[k] = v end -- the layer's own settings win, as before
    end
  end
  return o
end

-- dot_product_attention on kernel options (kernel_options or _layer_options): the seed of the
-- call is stored in them for the backward.
function M._dot_product_attention(Q, K, V, kopts)
  local fn = "dot_product_attention"
  check_tensor(fn, "queries", Q, nil, "(B, Nq, d)") -- (shapes: the C core)
  check_tensor(fn, "keys", K, nil, "(B, Nk, d)")
  check_tensor(fn, "values", V, nil, "(B, Nk, dv)")
  if kopts.bias ~= nil or kopts.alibi ~= nil then
    score_options(fn, Q, kopts)
    if rg(kopts.bias) then return composed_bias_attention(Q, K, V, kopts) end
  end
  local out, weights, seed, lse = core.sdpa_forward(Q, K, V, kopts)
  kopts.seed = seed
  if wants(Q, K, V) then
    record(fn, recorded(out, weights, kopts), { Q, K, V }, function(g_out, g_w)
      if g_out == nil and g_w == nil then return nil end
      return core.sdpa_backward(Q, K, V, kopts, g_out, g_w, weights, { q = rg(Q), k = rg(K), v = rg(V) }, out, lse)
    end)
  end
  return out, weights
end

--- Additive attention scores: scores[b,i,j] = w_v . tanh(Qh[b,i] + Kh[b,j]).
-- Computed without the (B, Nq, Nk, h) tensor the book builds.
-- @tparam Tensor Qh projected queries (B, Nq, h)
-- @tparam Tensor Kh projected keys (B, Nk, h)
-- @tparam Tensor w_v (h)
-- @treturn Tensor scores (B, Nq, Nk)
function M.additive_scores(Qh, Kh, w_v)
  local fn = "additive_scores"
  check_tensor(fn, "Qh", Qh, nil, "(B, Nq, h)") -- (shapes: the C core)
  check_tensor(fn, "Kh", Kh, nil, "(B, Nk, h)")
  check_tensor(fn, "w_v", w_v, nil, "(h)")
  local scores = core.additive_scores_forward(Qh, Kh, w_v)
  return record(fn, scores, { Qh, Kh, w_v }, function(g)
    if g == nil then return nil end
    return core.additive_scores_backward(Qh, Kh, w_v, g, { qh = rg(Qh), kh = rg(Kh), w_v = rg(w_v) })
  end)
end

-- Masked softmax, dropout and weighted sum over given scores (differentiable in scores and V).
local function attend_scores(fn, scores, V, kopts)
  local out, weights, seed = core.scores_attention_forward(scores, V, kopts)
  kopts.seed = seed
  if wants(scores, V) then
    record(fn, recorded(out, weights, kopts), { scores, V }, function(g_out, g_w)
      if g_out == nil and g_w == nil then return nil end
      return core.scores_attention_backward(scores, V, kopts, g_out, g_w, weights, { scores = rg(scores), v = rg(V) })
    end)
  end
  return out, weights
end
-- (attn.nn.torch_attention's composed MultiheadAttention attends over its own scores with it)
M._attend_scores = attend_scores

--- Additive (Bahdanau) attention on projected queries and keys.
-- Composes `additive_scores` with the masked softmax (valid_lens with d2l semantics; the keep-mask
-- options of `dot_product_attention` work too), dropout and the weighted sum.
-- @tparam Tensor Qh (B, Nq, h) = queries W_q
-- @tparam Tensor Kh (B, Nk, h) = keys W_k
-- @tparam Tensor V (B, Nk, dv)
-- @tparam Tensor w_v (h)
-- @tparam[opt] table opts as for `dot_product_attention` (scale defaults to 1)
-- @treturn Tensor output (B, Nq, dv)
-- @treturn ?Tensor weights (B, Nq, Nk)
function M.additive_attention(Qh, Kh, V, w_v, opts)
  return M._additive_attention(Qh, Kh, V, w_v, kernel_options("additive_attention", opts))
end

-- additive_attention on kernel options (see _dot_product_attention).
function M._additive_attention(Qh, Kh, V, w_v, kopts)
  local fn = "additive_attention"
  check_tensor(fn, "values", V, nil, "(B, Nk, dv)")
  local scores = M.additive_scores(Qh, Kh, w_v)
  return attend_scores(fn, scores, V, kopts)
end

-- Gradients of a projection y = x W^T + b (the fused layers' forwards run in C) from dy
-- (rows, out): dx as rows (rows, in; `shaped` gives it x's shape), dW, db (nil without a bias).
-- With `into` (rows, in), x's
-- gradient from another projection of the same x, dy W is added into it in place (one product
-- with beta = 1 instead of a new tensor and an autograd sum) and dx comes back nil.
local function project_backward(dy, x, W, b, into)
  local x2 = core.reshape(x, -1, core.size(W, 2))
  local dx
  if into then
    core.gemm_(into, dy, W, 1, 1)
  else
    dx = core.matmul(dy, W)
  end
  return dx, core.matmul(core.transpose(dy, 1, 2), x2), b and core.sum(dy, 1) or nil
end

-- dx (nil passes through) in the shape of x.
local function shaped(dx, x) return dx and core.reshape(dx, core.shape(x)) end

--- Additive attention with its projections as one autograd node: d2l's `AdditiveAttention`
-- forward, `additive_attention(queries W_q^T, keys W_k^T, values, w_v, opts)`, without the four
-- intermediate nodes (two projections, the scores, the attention). The numbers are those of the
-- composed form; `nn.AdditiveAttention` runs it (its `fused = false` runs the composed one).
-- @tparam Tensor queries (B, Nq, query_size)
-- @tparam Tensor keys (B, Nk, key_size)
-- @tparam Tensor values (B, Nk, dv)
-- @tparam Tensor W_q (h, query_size)
-- @tparam Tensor W_k (h, key_size)
-- @tparam Tensor w_v (1, h) as `nn.Linear(h, 1).weight`, or (h)
-- @tparam[opt] table opts as for `additive_attention`
-- @treturn Tensor output (B, Nq, dv)
-- @treturn ?Tensor weights (B, Nq, Nk)
function M.projected_additive_attention(queries, keys, values, W_q, W_k, w_v, opts)
  local fn = "projected_additive_attention"
  check_tensor(fn, "queries", queries, nil, "(B, Nq, query_size)") -- (shapes: the C core)
  check_tensor(fn, "keys", keys, nil, "(B, Nk, key_size)")
  check_tensor(fn, "values", values, nil, "(B, Nk, dv)")
  check_tensor(fn, "W_q", W_q, nil, "(h, query_size)")
  check_tensor(fn, "W_k", W_k, nil, "(h, key_size)")
  check_tensor(fn, "w_v", w_v, nil, "(1, h) or (h)")
  return M._projected_additive_attention(queries, keys, values, W_q, W_k, w_v, kernel_options(fn, opts))
end

-- projected_additive_attention on kernel options (see _dot_product_attention) and operands the
-- caller has checked to be tensors (the public form, or nn.AdditiveAttention, whose weights are
-- its own): at the book's size the checks would cost a tenth of the call.
function M._projected_additive_attention(queries, keys, values, W_q, W_k, w_v, kopts)
  local fn = "projected_additive_attention"
  local out, weights, seed, saved = core.additive_layer_forward(queries, keys, values, W_q, W_k, w_v, kopts)
  kopts.seed = seed
  record(fn, recorded(out, weights, kopts), { queries, keys, values, W_q, W_k, w_v }, function(g_out, g_w)
    if g_out == nil and g_w == nil then return nil end
    core.additive_layer_saved(saved, queries, keys, W_q) -- the parts' shapes, from the C layout
    local h = core.size(W_q, 1)
    local ds, dv = core.scores_attention_backward(saved.scores, values, kopts, g_out, g_w, weights, { scores = true,
      v = rg(values) })
    local dqh, dkh, dwv = core.additive_scores_backward(saved.qh, saved.kh, core.reshape(w_v, h), ds)
    local dq, dWq = project_backward(core.reshape(dqh, -1, h), queries, W_q)
    local dk, dWk = project_backward(core.reshape(dkh, -1, h), keys, W_k)
    return shaped(dq, queries), shaped(dk, keys), dv, dWq, dWk, core.reshape(dwv, core.shape(w_v))
  end)
  return out, weights
end

--- Bilinear scores q^T W k for queries and keys of different widths.
-- @tparam Tensor Q (B, Nq, dq)
-- @tparam Tensor W (dq, dk)
-- @tparam Tensor K (B, Nk, dk)
-- @treturn Tensor scores (B, Nq, Nk)
function M.bilinear_scores(Q, W, K)
  local fn = "bilinear_scores"
  check_tensor(fn, "Q", Q, 3, "(B, Nq, dq)")
  check_tensor(fn, "W", W, 2, "(dq, dk)")
  check_tensor(fn, "K", K, 3, "(B, Nk, dk)")
  local q, w, k = core.shape(Q), core.shape(W), core.shape(K)
  if q[3] ~= w[1] or k[3] ~= w[2] or q[1] ~= k[1] then
    error(string.format("%s: expected Q (B, Nq, dq), W (dq, dk), K (B, Nk, dk), got Q %s, W %s, K %s", fn,
      shape_str(Q), shape_str(W), shape_str(K)), 2)
  end
  return Tensor.matmul(Tensor.matmul(Q, W), Tensor.transpose(K, 2, 3))
end

--- d2l's `transpose_qkv`: (B, N, H*dh) -> (B*H, N, dh), batch-major (row b*H + h holds head h
-- of sample b). Differentiable, as one node (its gradient is merge_heads of the gradient).
-- @tparam Tensor X (B, N, H*dh)
-- @tparam integer num_heads H
-- @treturn Tensor (B*H, N, dh)
function M.split_heads(X, num_heads)
  local fn = "split_heads"
  check_tensor(fn, "X", X, 3, "(B, N, H*dh)")
  check_count(fn, "num_heads", num_heads)
  local Y = core.split_heads(X, num_heads) -- one strided copy (src/attention/attn_heads.c; it checks the width)
  if not wants(X) then return Y end
  -- one node: the gradient is the inverse move
  return record(fn, Y, { X }, function(g) return core.merge_heads(g, num_heads) end)
end

--- d2l's `transpose_output`: (B*H, N, dh) -> (B, N, H*dh), the inverse of `split_heads`.
-- @tparam Tensor X (B*H, N, dh)
-- @tparam integer num_heads H
-- @treturn Tensor (B, N, H*dh)
function M.merge_heads(X, num_heads)
  local fn = "merge_heads"
  check_tensor(fn, "X", X, 3, "(B*H, N, dh)")
  check_count(fn, "num_heads", num_heads)
  local Y = core.merge_heads(X, num_heads)
  if not wants(X) then return Y end
  return record(fn, Y, { X }, function(g) return core.split_heads(g, num_heads) end)
end

local mha_params = { W_q = true, W_k = true, W_v = true, W_o = true, b_q = true, b_k = true, b_v = true, b_o = true }

--- Multi-head attention (d2l 11.5) as one autograd node: the four projections, the head split,
-- scaled dot-product attention per head, the merge and the output projection. The numbers are
-- those of the book's composition (`split_heads` of each projection, `dot_product_attention`
-- with `repeat_interleave`d lengths, `merge_heads`, W_o); `nn.MultiHeadAttention` runs it (its
-- `fused = false` runs the composition). Heads use the batch-major layout of `split_heads`.
-- @tparam Tensor queries (B, Nq, query_size)
-- @tparam Tensor keys (B, Nk, key_size)
-- @tparam Tensor values (B, Nk, value_size)
-- @tparam integer num_heads H, dividing h
-- @tparam table params `W_q` (h, query_size), `W_k` (h, key_size), `W_v` (h, value_size),
--   `W_o` (h, h) and optional biases `b_q`, `b_k`, `b_v`, `b_o` (h), as `nn.Linear` holds them
-- @tparam[opt] table opts as for `dot_product_attention`, per sample: `valid_lens` (B) or
--   (B, Nq) are repeated for the heads here; a `mask` must broadcast to (B*H, Nq, Nk)
-- @treturn Tensor output (B, Nq, h)
-- @treturn ?Tensor weights (B*H, Nq, Nk)
function M.multi_head_attention(queries, keys, values, num_heads, params, opts)
  local fn = "multi_head_attention"
  check_tensor(fn, "queries", queries, nil, "(B, Nq, query_size)") -- (shapes and parameters: the C core)
  check_tensor(fn, "keys", keys, nil, "(B, Nk, key_size)")
  check_tensor(fn, "values", values, nil, "(B, Nk, value_size)")
  check_count(fn, "num_heads", num_heads)
  return M._multi_head_attention(queries, keys, values, num_heads, check.options(fn, params, mha_params),
    kernel_options(fn, opts))
end

-- multi_head_attention on kernel options (see _dot_product_attention) and checked operands (see
-- _projected_additive_attention; nn.MultiHeadAttention checked num_heads when it was built).
-- `operands`, when given, holds the same weights in another layout for the forward's products
-- (nn.MultiHeadAttention's cached transposes); the node and its gradients are on `params` (keys
-- as the public form takes).
function M._multi_head_attention(queries, keys, values, num_heads, params, kopts, operands)
  local fn = "multi_head_attention"
  local Wq, Wk, Wv, Wo = params.W_q, params.W_k, params.W_v, params.W_o
  local bq, bk, bv, bo = params.b_q, params.b_k, params.b_v, params.b_o
  local out, weights, seed, saved = core.mha_forward(queries, keys, values, num_heads, operands or params, kopts)
  kopts.seed = seed
  -- (record returns at once when nothing requires grad: the closure is all that was built)
  -- without biases the node has the seven tensor inputs only (the gradients past them are nil)
  local inputs = (bq or bk or bv or bo) and
    { queries, keys, values, Wq, Wk, Wv, Wo, bq or false, bk or false, bv or false, bo or false }
    or { queries, keys, values, Wq, Wk, Wv, Wo }
  record(fn, recorded(out, weights, kopts), inputs, function(g_out, g_w)
    if g_out == nil and g_w == nil then return nil end
    core.mha_saved(saved, queries, keys, num_heads, Wq) -- the parts' shapes, from the C layout
    local h = core.size(Wq, 1)
    local dWo, dbo, dctx
    if g_out ~= nil then
      local g2 = core.reshape(g_out, -1, h)
      dWo, dbo = core.matmul(core.transpose(g2, 1, 2), saved.merged), bo and core.sum(g2, 1) or nil
      dctx = core.split_heads(core.reshape(core.matmul(g2, Wo), core.shape(g_out)), num_heads)
    end
    -- the kernel's options per head: the forward repeated the lengths in C
    local hopts = {}
    for k, v in pairs(kopts) do hopts[k] = v end
    hopts.valid_lens = Tensor.repeat_interleave(kopts.valid_lens, num_heads, 1)
    hopts.heads = num_heads -- (the forward's rows: a 4-D bias or mask and ALiBi per head)
    -- the flash backward rebuilds the weights from lse when the flash forward ran (saved.flash)
    local dqh, dkh, dvh = core.sdpa_backward(saved.qh, saved.kh, saved.vh, hopts, dctx, g_w, weights, nil, saved.ctx,
      saved.flash and saved.lse or nil)
    local function heads_back(dheads, x, W, b, into)
      return project_backward(core.reshape(core.merge_heads(dheads, num_heads), -1, h), x, W, b, into)
    end
    -- an input given twice or three times (self-attention: queries = keys = values; keys =
    -- values) gets its gradients summed here, in the first one's tensor; the repeats return nil
    local dq, dWq, dbq = heads_back(dqh, queries, Wq, bq)
    local dk_into = rawequal(keys, queries) and dq or nil
    local dk, dWk, dbk = heads_back(dkh, keys, Wk, bk, dk_into)
    local dv_into = rawequal(values, queries) and dq or rawequal(values, keys) and (dk or dk_into) or nil
    local dv, dWv, dbv = heads_back(dvh, values, Wv, bv, dv_into)
    return shaped(dq, queries), shaped(dk, keys), shaped(dv, values), dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo
  end)
  return out, weights
end

--- The sinusoidal positional encoding table of the Transformer.
-- P[pos, 2j] = sin(pos / 10000^(2j/d)), P[pos, 2j+1] = cos(pos / 10000^(2j/d)), with 0-based pos
-- and j as in the formula (row pos+1, column 2j+1 in Lua's 1-based indexing). For odd d the last
-- column is a sine. Computed in double precision.
-- @tparam integer max_len rows
-- @tparam integer d columns
-- @tparam[opt="float32"] string dtype
-- @treturn Tensor (max_len, d)
function M.positional_encoding(max_len, d, dtype)
  return core.positional_encoding(max_len, d, dtype) -- (sizes checked by the binding, which allocates)
end

return M
