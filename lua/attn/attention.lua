--- Attention functions of d2l's attention chapter, differentiable.
--
-- The facade copies these into `attn`: `attn.masked_softmax`, `attn.dot_product_attention`, ...
-- Shapes are batch-first: B samples (for multi-head attention B*heads, batch-major), Nq queries,
-- Nk keys/values, d query/key width, dv value width. Kernels are in C (src/attn_attention.h);
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
--   sees keys j <= i) and `window` (query i sees keys with |i - j| <= window) *remove* keys by
--   selection. A query whose keys are all removed gets zero weights, zero output and zero
--   gradients, never NaN. Removed keys are never read: a NaN stored in a masked-out key or value
--   does not reach the output or the gradients.
-- * Every other row is the ordinary softmax of its kept scores: all -inf (or a NaN) gives NaN,
--   as `attn.softmax` does, and a NaN value of an unmasked key reaches the output even when its
--   weight underflows to 0. Only masked keys are ever left out (src/attn_attention.h).
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
  training = true, need_weights = true,
}

-- The options table for the C kernels. Only the keys are checked here (a Lua concern); the
-- binding converts the values (types) and the C core checks shapes, ranges and dtypes
-- (src/lattention.c, src/attn_attention.c), so a C caller gets the same checks.
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
  }
end

local function rg(t) return is_tensor(t) and t._rg == true end

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

--- Scaled dot-product attention: softmax(Q K^T * scale, masked) V.
-- @tparam Tensor Q (B, Nq, d)
-- @tparam Tensor K (B, Nk, d)
-- @tparam Tensor V (B, Nk, dv)
-- @tparam[opt] table opts `valid_lens` (1-D or 2-D, d2l semantics), `mask` (keep-mask broadcastable
--   to (B, Nq, Nk)), `causal` (boolean), `window` (integer r >= 0), `scale` (default 1/sqrt(d)),
--   `dropout` (probability, applied to the weights) with `training` (default false: no dropout),
--   `need_weights` (default true; false skips the (Nq x Nk) weights, which come back nil)
-- @treturn Tensor output (B, Nq, dv)
-- @treturn ?Tensor weights (B, Nq, Nk), the softmax before dropout
function M.dot_product_attention(Q, K, V, opts)
  local fn = "dot_product_attention"
  check_tensor(fn, "queries", Q, nil, "(B, Nq, d)") -- (shapes: the C core)
  check_tensor(fn, "keys", K, nil, "(B, Nk, d)")
  check_tensor(fn, "values", V, nil, "(B, Nk, dv)")
  local kopts = kernel_options(fn, opts)
  local out, weights, seed, lse = core.sdpa_forward(Q, K, V, kopts)
  kopts.seed = seed
  if wants(Q, K, V) then
    record(fn, weights and { out, weights } or out, { Q, K, V }, function(g_out, g_w)
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
    record(fn, weights and { out, weights } or out, { scores, V }, function(g_out, g_w)
      if g_out == nil and g_w == nil then return nil end
      return core.scores_attention_backward(scores, V, kopts, g_out, g_w, weights, { scores = rg(scores), v = rg(V) })
    end)
  end
  return out, weights
end

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
  local fn = "additive_attention"
  check_tensor(fn, "values", V, nil, "(B, Nk, dv)")
  local kopts = kernel_options(fn, opts)
  local scores = M.additive_scores(Qh, Kh, w_v)
  return attend_scores(fn, scores, V, kopts)
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
  local Y = core.split_heads(X, num_heads) -- one strided copy (src/attn_heads.c; it checks the width)
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

--- Repeats each sample's valid lengths num_heads times along the first dim, matching the
-- batch-major head layout of `split_heads` (d2l's `torch.repeat_interleave(valid_lens, H, dim=0)`).
-- @tparam ?Tensor|table valid_lens (B) or (B, Q), or nil
-- @tparam integer num_heads H
-- @treturn ?Tensor|table (B*H) or (B*H, Q), of the same kind as the input (nil for nil)
function M.repeat_interleave(valid_lens, num_heads)
  local fn = "repeat_interleave"
  check_count(fn, "num_heads", num_heads)
  if valid_lens == nil then return nil end
  -- sized before building anything: the result has (B * num_heads) entries
  local rows = is_tensor(valid_lens) and (core.dim(valid_lens) > 0 and core.size(valid_lens, 1) or 0)
    or (type(valid_lens) == "table" and #valid_lens or 0)
  if rows > 0 and num_heads > core.max_request() // 16 // rows then
    error(string.format("%s: %d rows x num_heads = %d entries are more than memory can hold", fn, rows, num_heads), 2)
  end
  if is_tensor(valid_lens) then
    local n = core.dim(valid_lens) > 0 and core.size(valid_lens, 1) or 0
    if core.dim(valid_lens) < 1 or core.dim(valid_lens) > 2 then
      error(string.format("%s: valid_lens must be 1-D (B) or 2-D (B, Q), got %s", fn, shape_str(valid_lens)), 2)
    end
    local idx = {}
    for b = 1, n do
      for _ = 1, num_heads do idx[#idx + 1] = b end
    end
    return core.index_select(valid_lens, 1, idx)
  end
  if type(valid_lens) ~= "table" then
    error(string.format("%s: valid_lens must be a tensor or a table, got a %s", fn, type(valid_lens)), 2)
  end
  local out = {}
  for b, row in ipairs(valid_lens) do
    if type(row) ~= "number" and type(row) ~= "table" then
      error(string.format("%s: valid_lens entry %d is a %s, not a number or a row", fn, b, type(row)), 2)
    end
    for _ = 1, num_heads do
      if type(row) == "table" then
        out[#out + 1] = table.move(row, 1, #row, 1, {})
      else
        out[#out + 1] = row
      end
    end
  end
  return out
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
