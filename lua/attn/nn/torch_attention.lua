--- PyTorch's `nn.MultiheadAttention`, with its constructor, forward, mask
-- semantics and state-dict keys, so a state dict saved from PyTorch loads
-- unchanged and a forward gives PyTorch's numbers (checked against PyTorch
-- 1.13 fixtures, spec/fixtures/torch/).
--
-- **Layout.** `batch_first = false` (PyTorch's default) takes (L, N, E)
-- queries and (S, N, kdim), (S, N, vdim) keys and values; `batch_first = true`
-- takes (N, L, E). Unbatched (L, E), (S, kdim), (S, vdim) inputs work as in
-- PyTorch (masks then (S) and (L, S) or (H, L, S)).
--
-- **Masks.** attn has no bool dtype, so, as PyTorch reads a mask by its dtype:
--
-- * an **int64** tensor is a *boolean* mask: 1 (PyTorch's True) = not allowed,
--   0 = allowed; any other value raises. (PyTorch's polarity: the engine's
--   keep-masks of attn.dot_product_attention are the other way round.)
-- * a **float** tensor is *additive*: added to the scaled scores, as PyTorch
--   adds a float mask (so a float 0/1 mask adds 1, it does not mask).
--   Its -inf entries remove their keys exactly as a boolean 1 does.
-- * anything else (a Lua table, a string) raises naming the argument.
--
-- `key_padding_mask` is (N, S) (unbatched: (S)); `attn_mask` is (L, S) or
-- (N*num_heads, L, S) (row b*num_heads + h: head h of sample b). Both may be
-- given, of either kind: removals combine (a key removed by either is removed),
-- additive parts add. Masks are constants (they get no gradient).
--
-- **Fully masked rows.** A query whose keys are all removed (by boolean 1s
-- or -inf) gets zero weights, a zero attention result (its output is then
-- out_proj.bias) and zero gradients, as the engine's keep-masks define it and
-- as PyTorch >= 2.5's scaled_dot_product_attention gives; PyTorch 1.13 (and
-- 2.x with need_weights = true) gives NaN there instead. Every other row has
-- PyTorch's numbers.
--
-- **is_causal** follows PyTorch 2.x: a hint that `attn_mask` is the causal
-- mask, which must then be given (PyTorch raises without it; 1.13 has no
-- is_causal). attn checks the hint instead of trusting it: a 2-D attn_mask
-- that is not exactly the causal pattern (1 or -inf strictly above the
-- diagonal, 0 elsewhere) raises. A causal attn_mask runs as the kernels'
-- `causal` option (no mask tensor is read), with or without the hint.
--
-- **Kernels.** Every mask runs on the fused multi-head kernel (attn.attention
-- `_multi_head_attention`, C `mha_forward`). Removal parts (boolean 1s, float
-- -inf) are keep-masks: attn_mask as the caller passed it ((L, S) or
-- (N*H, L, S)), key_padding_mask as (N*H, 1, S); only both together with a
-- 2-D attn_mask build one (N*H, L, S) mask. Finite additive parts are the
-- kernel's `bias`, read through its strides with no copy per head: an (L, S)
-- attn_mask broadcasts over samples and heads, key_padding_mask as
-- (N, 1, 1, S); only both together are summed, into (N, 1, L, S) (or
-- (N, H, L, S) for a per-head attn_mask, which the caller passed whole).
--
-- **Weights.** need_weights (default true) returns the softmax weights
-- averaged over the heads, (N, L, S), or per head, (N, H, L, S), with
-- `average_attn_weights = false`; nil with need_weights = false. They are the
-- weights before dropout (PyTorch returns them after dropout in training; in
-- eval mode, or with dropout 0, the two are the same). They are
-- differentiable.
--
-- Not built: `add_bias_kv` and `add_zero_attn` (raise when true).
-- @module attn.nn.torch_attention
local attn = require "attn"
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local check = require "attn.check"
local attention = require "attn.attention"
local autograd = require "attn.autograd"
local init = require "attn.nn.init"

local core = attn.core
local Module = module.Module
local Linear = linear.Linear
local shape_str = core.shape_str
local is_tensor = attn.is_tensor

local M = {}

local WHO = "MultiheadAttention"

-- ---------------------------------------------------------------- masks

-- A mask argument read by its dtype: removal (0/1 in `dtype`, 1 = removed) and additive
-- (finite entries, in `dtype`) parts, either nil. Raises naming the argument otherwise.
local function mask_parts(name, m, dtype)
  if not is_tensor(m) then
    error(string.format("%s: %s must be a tensor (int64 0/1: boolean, 1 = masked; float: added to the scores), " ..
      "got a %s", WHO, name, type(m)), 4)
  end
  if core.numel(m) == 0 then return nil, nil end
  if core.dtype(m) == "int64" then
    if core.min(m):item() < 0 or core.max(m):item() > 1 then
      error(string.format("%s: %s %s is int64, a boolean mask, and must hold only 0 and 1 (1 = masked), got values " ..
        "in [%d, %d]", WHO, name, shape_str(m), core.min(m):item(), core.max(m):item()), 4)
    end
    return core.to(m, dtype), nil
  end
  m = core.to(m, dtype) -- (a float mask of the other float dtype: converted, no gradient)
  local removed = core.eq(m, -math.huge)
  local any_removed = core.sum(removed):item() > 0
  local add = any_removed and core.masked_fill(m, removed, 0) or m
  if core.sum(core.ne(add, 0)):item() == 0 then add = nil end -- (NaN ~= 0: a NaN is kept, and reaches the output)
  return any_removed and removed or nil, add
end

-- (L, S) with 1 strictly above the diagonal: PyTorch's causal pattern (query i sees keys j <= i).
local function causal_pattern(L, S, dtype)
  return core.gt(core.reshape(attn.arange(0, S, dtype), 1, S), core.reshape(attn.arange(0, L, dtype), L, 1))
end

local function same_values(a, b) return core.sum(core.ne(a, b)):item() == 0 end

-- The kernel's masks for removal parts r_attn ((L, S) or (N*H, L, S)) and r_kpm ((N, S)): a keep-mask
-- (1 = attend) broadcastable to (N*H, L, S), or nil, and the causal flag.
local function keep_masks(r_attn, r_kpm, is_causal, N, H, L, S, dtype)
  local causal = false
  if r_attn ~= nil and core.dim(r_attn) == 2 and same_values(r_attn, causal_pattern(L, S, dtype)) then
    r_attn, causal = nil, true
  end
  if is_causal and not causal then
    error(string.format("%s: is_causal is set but attn_mask is not the causal mask (%s with 1 or -inf exactly " ..
      "where key > query, 0 elsewhere; see nn.Transformer.generate_square_subsequent_mask)", WHO,
      shape_str({ L, S })), 4)
  end
  local removed = r_attn
  if r_kpm ~= nil then
    -- per head, as the kernel's (N*H) rows are batch-major: (N*H, 1, S)
    local per_head = core.repeat_rows(core.reshape(r_kpm, N, 1, S), H)
    removed = removed and core.maximum(removed, per_head) or per_head
  end
  return removed and core.sub(1, removed) or nil, causal
end

-- The kernel's additive bias for the additive parts a_attn ((L, S) or (N*H, L, S)) and a_kpm
-- ((N, S)), or nil: each as the caller passed it, broadcast by its strides over the (N*H) rows
-- (the kernel's `heads`): (L, S) over samples and heads, key_padding_mask as (N, 1, 1, S). Only
-- both together are summed, into (N, 1, L, S) (or (N, H, L, S) for a per-head attn_mask).
local function additive_bias(a_attn, a_kpm, N, H, L, S)
  local kpm = a_kpm and core.reshape(a_kpm, N, 1, 1, S)
  if a_attn == nil then return kpm end
  if kpm == nil then return a_attn end
  if core.dim(a_attn) == 3 then return core.add(core.reshape(a_attn, N, H, L, S), kpm) end
  return core.add(core.reshape(a_attn, 1, 1, L, S), kpm)
end

-- ---------------------------------------------------------------- MultiheadAttention

--- `nn.MultiheadAttention(embed_dim, num_heads [, {dropout = 0, bias = true,
-- kdim = embed_dim, vdim = embed_dim, batch_first = false, dtype = "float32"}])`:
-- PyTorch's multi-head attention. Parameters `in_proj_weight` (3E, E) (or
-- `q_proj_weight` (E, E), `k_proj_weight` (E, kdim), `v_proj_weight` (E, vdim)
-- when kdim or vdim differ from E), `in_proj_bias` (3E), and the child
-- `out_proj` (a Linear E -> E): keys `in_proj_weight`, `in_proj_bias`,
-- `out_proj.weight`, `out_proj.bias`. PyTorch's initialisation: xavier_uniform_
-- on the projection weights, zero biases, out_proj.weight as Linear's.
-- The query, key and value projections are row views of in_proj_weight, so
-- their gradients reach that one leaf.
--
-- forward(query, key, value [, {key_padding_mask, need_weights = true,
-- attn_mask, average_attn_weights = true, is_causal = false}]) ->
-- attn_output (L, N, E) (batch_first: (N, L, E); unbatched: (L, E)),
-- attn_output_weights (N, L, S), (N, H, L, S) or nil (unbatched: no N).
-- See the module comment for the masks.
-- @type MultiheadAttention
local MultiheadAttention = Module:extend("MultiheadAttention")
M.MultiheadAttention = MultiheadAttention

local mha_options = { dropout = true, bias = true, add_bias_kv = true, add_zero_attn = true, kdim = true,
  vdim = true, batch_first = true, dtype = true }

function MultiheadAttention:init(embed_dim, num_heads, opts)
  check.positive_int(WHO, "embed_dim", embed_dim, 4)
  check.positive_int(WHO, "num_heads", num_heads, 4)
  opts = check.options(WHO, opts, mha_options, 4)
  if opts.add_bias_kv or opts.add_zero_attn then
    error(WHO .. ": add_bias_kv and add_zero_attn are not supported", 3)
  end
  if embed_dim % num_heads ~= 0 then
    error(string.format("%s: embed_dim %d must be divisible by num_heads %d", WHO, embed_dim, num_heads), 3)
  end
  local p = opts.dropout or 0
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    error(string.format("%s: dropout must be a probability in [0, 1], got %s", WHO, tostring(p)), 3)
  end
  local kdim = check.positive_int(WHO, "kdim", opts.kdim or embed_dim, 4)
  local vdim = check.positive_int(WHO, "vdim", opts.vdim or embed_dim, 4)
  local dtype = opts.dtype or "float32"
  self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
  self.kdim, self.vdim = kdim, vdim
  self.dropout = p
  self.batch_first = opts.batch_first == true
  self._qkv_same_embed_dim = kdim == embed_dim and vdim == embed_dim
  -- PyTorch's registration order: the projection weights, in_proj_bias, out_proj
  if self._qkv_same_embed_dim then
    self:register_parameter("in_proj_weight", init.xavier_uniform_(attn.empty({ 3 * embed_dim, embed_dim }, dtype)))
  else
    self:register_parameter("q_proj_weight", init.xavier_uniform_(attn.empty({ embed_dim, embed_dim }, dtype)))
    self:register_parameter("k_proj_weight", init.xavier_uniform_(attn.empty({ embed_dim, kdim }, dtype)))
    self:register_parameter("v_proj_weight", init.xavier_uniform_(attn.empty({ embed_dim, vdim }, dtype)))
  end
  local bias = opts.bias ~= false
  self:register_parameter("in_proj_bias", bias and attn.zeros({ 3 * embed_dim }, dtype) or nil)
  self.out_proj = Linear(embed_dim, embed_dim, { bias = bias, dtype = dtype })
  if bias then init.zeros_(self.out_proj.bias) end
end

-- The three row blocks of a packed (3E, ...) leaf as views, recorded as one node: three narrow
-- nodes would each build a zero tensor of the leaf's shape in backward and accumulate it into the
-- leaf; this backward writes the blocks' gradients into one (the same values).
local function row_thirds(t, E)
  local a, b, c = core.narrow(t, 1, 1, E), core.narrow(t, 1, E + 1, E), core.narrow(t, 1, 2 * E + 1, E)
  if autograd.wants(t) then
    autograd.record_wanted("narrow", { a, b, c }, { t }, function(ga, gb, gc)
      local g = core.full(core.shape(t), 0, core.dtype(t))
      if ga ~= nil then core.copy_(core.narrow(g, 1, 1, E), ga) end
      if gb ~= nil then core.copy_(core.narrow(g, 1, E + 1, E), gb) end
      if gc ~= nil then core.copy_(core.narrow(g, 1, 2 * E + 1, E), gc) end
      return g
    end)
  end
  return a, b, c
end

-- W_q, W_k, W_v and their biases for one call: row views of the packed leaves (differentiable,
-- so the gradients reach in_proj_weight and in_proj_bias) or the separate weights.
local function projections(m)
  local E = m.embed_dim
  local b = m.in_proj_bias
  local bq, bk, bv
  if b ~= nil then bq, bk, bv = row_thirds(b, E) end
  if m._qkv_same_embed_dim then
    local wq, wk, wv = row_thirds(m.in_proj_weight, E)
    return wq, wk, wv, bq, bk, bv
  end
  return m.q_proj_weight, m.k_proj_weight, m.v_proj_weight, bq, bk, bv
end

-- The inputs as 3-D batch-first tensors, checked against the layer's sizes: q (N, L, E), k, v,
-- and whether the call is batched.
local function batch_first_inputs(m, query, key, value)
  check.tensor(WHO, "query", query, nil, nil, 4)
  check.tensor(WHO, "key", key, nil, nil, 4)
  check.tensor(WHO, "value", value, nil, nil, 4)
  local nd = core.dim(query)
  local layout = nd == 2 and "unbatched (L, E)" or m.batch_first and "(N, L, E)" or "(L, N, E)"
  local function bad(what)
    error(string.format("%s: %s; got query %s, key %s, value %s (layout %s, embed_dim %d, kdim %d, vdim %d)", WHO,
      what, shape_str(query), shape_str(key), shape_str(value), layout, m.embed_dim, m.kdim, m.vdim), 5)
  end
  if nd ~= 2 and nd ~= 3 then bad("query must be 2-D (unbatched) or 3-D") end
  if core.dim(key) ~= nd or core.dim(value) ~= nd then bad("key and value must have query's number of dims") end
  if core.size(query, nd) ~= m.embed_dim or core.size(key, nd) ~= m.kdim or core.size(value, nd) ~= m.vdim then
    bad("the last dims must be embed_dim, kdim and vdim")
  end
  local function bf(x)
    if nd == 2 then return x:unsqueeze(1) end
    return m.batch_first and x or x:transpose(1, 2)
  end
  local q = bf(query)
  -- self-attention keeps one tensor for q, k and v (the fused backward sums their gradients in place)
  local k = rawequal(key, query) and q or bf(key)
  local v = rawequal(value, query) and q or rawequal(value, key) and k or bf(value)
  if core.size(k, 1) ~= core.size(q, 1) or core.size(v, 1) ~= core.size(q, 1) then
    bad("query, key and value must have one batch size")
  end
  if core.size(k, 2) ~= core.size(v, 2) then bad("key and value must have one sequence length") end
  return q, k, v, nd == 3
end

-- Checks a mask's shape against the expected ones (tables of sizes), naming the argument.
local function check_mask_shape(name, m, expected, level)
  local s = core.shape(m)
  for _, e in ipairs(expected) do
    if #s == #e then
      local ok = true
      for i = 1, #e do ok = ok and s[i] == e[i] end
      if ok then return end
    end
  end
  local names = {}
  for i, e in ipairs(expected) do names[i] = shape_str(e) end
  error(string.format("%s: %s is %s, expected %s", WHO, name, shape_str(s), table.concat(names, " or ")), level)
end

local forward_options = { key_padding_mask = true, need_weights = true, attn_mask = true,
  average_attn_weights = true, is_causal = true }

function MultiheadAttention:forward(query, key, value, opts)
  if is_tensor(opts) then
    error(WHO .. ": forward's fourth argument is the options table; pass masks as {key_padding_mask = ..., " ..
      "attn_mask = ...}", 3)
  end
  opts = check.options(WHO, opts, forward_options, 4)
  local q, k, v, batched = batch_first_inputs(self, query, key, value)
  local N, L, S, H = core.size(q, 1), core.size(q, 2), core.size(k, 2), self.num_heads
  local dtype = core.dtype(q)
  local need_weights = opts.need_weights ~= false
  local kpm, am = opts.key_padding_mask, opts.attn_mask
  local r_kpm, a_kpm, r_attn, a_attn
  if kpm ~= nil then
    if is_tensor(kpm) then check_mask_shape("key_padding_mask", kpm, { batched and { N, S } or { S } }, 4) end
    r_kpm, a_kpm = mask_parts("key_padding_mask", kpm, dtype)
    if not batched then
      r_kpm = r_kpm and core.reshape(r_kpm, 1, S)
      a_kpm = a_kpm and core.reshape(a_kpm, 1, S)
    end
  end
  if am ~= nil then
    if is_tensor(am) then check_mask_shape("attn_mask", am, { { L, S }, { N * H, L, S } }, 4) end
    r_attn, a_attn = mask_parts("attn_mask", am, dtype)
  elseif opts.is_causal then
    error(WHO .. ": is_causal is a hint that attn_mask is the causal mask and needs attn_mask (as PyTorch); " ..
      "see nn.Transformer.generate_square_subsequent_mask", 3)
  end
  if opts.is_causal and am ~= nil and core.dim(am) ~= 2 then
    error(string.format("%s: is_causal needs a 2-D attn_mask (L, S), got %s", WHO, shape_str(am)), 3)
  end
  local keep, causal = keep_masks(r_attn, r_kpm, opts.is_causal == true, N, H, L, S, dtype)
  local kopts = { name = WHO, mask = keep, causal = causal, dropout = self.dropout, training = self.training,
    need_weights = need_weights }
  local Wq, Wk, Wv, bq, bk, bv = projections(self)
  local out_proj = self.out_proj
  kopts.bias = additive_bias(a_attn, a_kpm, N, H, L, S)
  local out, w = attention._multi_head_attention(q, k, v, H, { W_q = Wq, W_k = Wk, W_v = Wv, W_o = out_proj.weight,
    b_q = bq, b_k = bk, b_v = bv, b_o = out_proj.bias }, kopts)
  if batched and not self.batch_first then
    out = out:transpose(1, 2)
  elseif not batched then
    out = out:squeeze(1)
  end
  if w == nil then return out, nil end
  w = w:reshape({ N, H, L, S })
  if opts.average_attn_weights ~= false then w = w:sum(2) / H end -- PyTorch's sum(dim=1) / num_heads
  if not batched then w = w:squeeze(1) end
  return out, w
end

function MultiheadAttention:extra_repr()
  return string.format("embed_dim=%d, num_heads=%d, dropout=%g, batch_first=%s", self.embed_dim, self.num_heads,
    self.dropout, tostring(self.batch_first))
end

return M
