--- Efficient attention layers: one module per mechanism behind one option.
--
-- `nn.EfficientAttention(spec, head_dim)` attends over heads already split, (B*H, N, dh), by the
-- mechanism `spec` names: a string, or a table whose first entry is the name and whose fields are
-- its parameters:
--
-- * `"full"`: attn.dot_product_attention (softmax over every key), O(N^2 d);
-- * `{"window", window = r}`: softmax over keys with |i - j| <= r, attn.dot_product_attention's
--   `window` option;
-- * `"linear"`: attn.linear_attention (phi = elu + 1), O(N d^2);
-- * `{"performer", num_features = m (default 64)}`: attn.performer_attention with a buffer
--   `features` (m, dh) drawn by attn.performer_features; `redraw_features()` draws a new one;
-- * `{"linformer", seq_len = N, k = 32, share_kv = false}`: Linformer (Wang et al. 2020,
--   arXiv:2006.04768): keys and values projected along the sequence by learned (k, N) matrices
--   E and F (F = E when share_kv), shared by the heads, then softmax attention over the k rows:
--   softmax(Q (E K)^T / sqrt(dh)) (F V), O(N k d). Inputs must have exactly seq_len positions.
-- * `{"nystrom", landmarks = m (default 32), pinv_iters = 6, pinv_init = "item",
--   conv_kernel_size = nil}`: attn.nystrom_attention (Nystromformer, Xiong et al. 2021), O(N m d);
--   N must be divisible by m. With `conv_kernel_size` ks (odd) a parameter `conv` (heads, 1, ks, 1)
--   adds the reference code's depthwise convolution of the values (initialised as PyTorch's
--   Conv2d: U(-1/sqrt(ks), 1/sqrt(ks))); it needs the number of heads, the third argument.
--
-- Every spec may also set `causal = true` (not Linformer, whose projection mixes positions, nor
-- Nystromformer, whose landmarks do).
-- `nn.MultiHeadAttention{..., attention = spec}` and the book's TransformerEncoderBlock
-- (`{attention = spec}`, its last argument) select a mechanism by this one option;
-- `nn.PerformerAttention` and `nn.LinformerAttention` are self-attention layers with their own
-- projections.
-- @module attn.nn.efficient
local attn = require "attn"
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local check = require "attn.check"

local Module, Linear = module.Module, linear.Linear
local shape_str = attn.core.shape_str

local M = {}

local kinds = { full = true, window = true, linear = true, performer = true, linformer = true, nystrom = true }
local params_of = { full = {}, window = { window = true }, linear = {}, performer = { num_features = true },
  linformer = { seq_len = true, k = true, share_kv = true },
  nystrom = { landmarks = true, pinv_iters = true, pinv_init = true, conv_kernel_size = true } }

--- Reads a mechanism spec (see the module comment) into {kind, causal, parameters...}.
-- @tparam string who the function named in errors
-- @param spec a name or a table {name, parameters...}
-- @treturn table
function M.read_spec(who, spec)
  local kind, o = spec, {}
  if type(spec) == "table" then kind, o = spec[1], spec end
  if not kinds[kind] then
    error(string.format("%s: attention must be one of full, window, linear, performer, linformer, nystrom, got %s", who,
      tostring(kind)), 4)
  end
  local allowed = { causal = true }
  for k in pairs(params_of[kind]) do allowed[k] = true end
  for k in pairs(o) do
    if k ~= 1 and not allowed[k] then
      error(string.format("%s: attention '%s' takes no option '%s'", who, kind, tostring(k)), 4)
    end
  end
  local r = { kind = kind, causal = o.causal == true }
  if kind == "window" then r.window = check.positive_int(who, "window", o.window, 5) end
  if kind == "performer" then r.num_features = check.positive_int(who, "num_features", o.num_features or 64, 5) end
  if kind == "linformer" then
    if r.causal then error(who .. ": linformer attention cannot be causal (its projection mixes positions)", 4) end
    r.seq_len = check.positive_int(who, "seq_len", o.seq_len, 5)
    r.k = check.positive_int(who, "k", o.k or 32, 5)
    r.share_kv = o.share_kv == true
  end
  if kind == "nystrom" then
    if r.causal then error(who .. ": nystrom attention cannot be causal (its landmarks mix positions)", 4) end
    r.landmarks = check.positive_int(who, "landmarks", o.landmarks or 32, 5)
    r.pinv_iters = check.positive_int(who, "pinv_iters", o.pinv_iters or 6, 5)
    r.pinv_init = o.pinv_init
    if o.conv_kernel_size ~= nil then
      r.conv_kernel_size = check.positive_int(who, "conv_kernel_size", o.conv_kernel_size, 5)
      if r.conv_kernel_size % 2 == 0 then
        error(string.format("%s: conv_kernel_size must be odd, got %d", who, r.conv_kernel_size), 4)
      end
    end
  end
  return r
end

--- `nn.EfficientAttention(spec, head_dim [, heads])`: the mechanism `spec` over split heads
-- (`heads`, default 1, sizes Nystromformer's convolution; nn.MultiHeadAttention passes its own).
-- forward(q (B*H, N, dh), k (B*H, M, dh), v (B*H, M, dv) [, opts]) -> (B*H, N, dv); opts may
-- carry `valid_lens` for "full" and "window" (d2l semantics) and, one length per item (B*H),
-- for "nystrom" (its reference code's mask); the other mechanisms refuse them.
-- @type EfficientAttention
local EfficientAttention = Module:extend("EfficientAttention")
M.EfficientAttention = EfficientAttention

function EfficientAttention:init(spec, head_dim, heads)
  local who = "EfficientAttention"
  local s = M.read_spec(who, spec)
  self.kind, self.causal, self.window = s.kind, s.causal, s.window
  self.head_dim = check.positive_int(who, "head_dim", head_dim, 4)
  self.heads = check.positive_int(who, "heads", heads or 1, 4)
  if s.kind == "performer" then
    self.num_features = s.num_features
    self:register_buffer("features", attn.performer_features(s.num_features, head_dim))
  elseif s.kind == "linformer" then
    self.seq_len, self.k, self.share_kv = s.seq_len, s.k, s.share_kv
    local bound = 1 / math.sqrt(s.k) -- as lucidrains/linformer's init
    self.E = (attn.rand({ s.k, s.seq_len }) * (2 * bound) - bound):requires_grad_()
    if not s.share_kv then self.F = (attn.rand({ s.k, s.seq_len }) * (2 * bound) - bound):requires_grad_() end
  elseif s.kind == "nystrom" then
    self.landmarks, self.pinv_iters, self.pinv_init = s.landmarks, s.pinv_iters, s.pinv_init
    local ks = s.conv_kernel_size
    if ks then
      local bound = 1 / math.sqrt(ks) -- PyTorch's Conv2d init: fan_in = (in / groups) * ks * 1 = ks
      self.conv = (attn.rand({ self.heads, 1, ks, 1 }) * (2 * bound) - bound):requires_grad_()
    end
  end
end

-- Nystromformer over items (B*H, N, dh): as they are, or as (B, H, N, dh) when the convolution
-- needs the heads (lengths then one per sample: every H-th of the repeated ones).
function EfficientAttention:nystrom(q, k, v, lens)
  local o = { landmarks = self.landmarks, pinv_iters = self.pinv_iters, pinv_init = self.pinv_init }
  local conv = self.conv
  if conv == nil then
    o.valid_lens = lens
    return attn.nystrom_attention(q, k, v, o)
  end
  local h, n = self.heads, q:size(2)
  if q:size(1) % h ~= 0 then
    error(string.format("EfficientAttention: nystrom's convolution needs (B*H, N, dh) items with H = %d heads, got %s",
      h, shape_str(q)), 4)
  end
  local function split(x) return x:reshape(x:size(1) // h, h, n, x:size(3)) end
  if lens ~= nil then
    local t, per = type(lens) == "table" and lens or lens:totable(), {}
    for i = 1, #t, h do per[#per + 1] = t[i] end
    o.valid_lens = per
  end
  o.conv = conv
  local out = attn.nystrom_attention(split(q), split(k), split(v), o)
  return out:reshape(q:size(1), n, out:size(4))
end

--- Draws new Performer features (m, dh) from attn's generator (a no-op for other mechanisms).
function EfficientAttention:redraw_features()
  if self.kind ~= "performer" then return self end
  self.features = attn.performer_features(self.num_features, self.head_dim, { dtype = self.features:dtype() })
  return self
end

function EfficientAttention:forward(q, k, v, opts)
  local kind, lens = self.kind, opts and opts.valid_lens
  if kind == "full" or kind == "window" then
    local o = { causal = self.causal, window = self.window, valid_lens = lens, need_weights = false }
    return (attn.dot_product_attention(q, k, v, o))
  end
  if kind == "nystrom" then return self:nystrom(q, k, v, lens) end
  if lens ~= nil then error(string.format("EfficientAttention: '%s' attention takes no valid_lens", kind), 3) end
  if kind == "linear" then return attn.linear_attention(q, k, v, { causal = self.causal }) end
  if kind == "performer" then
    return attn.performer_attention(q, k, v, { causal = self.causal, features = self.features })
  end
  local n = k:size(2)
  if n ~= self.seq_len or q:size(2) ~= self.seq_len then
    error(string.format("EfficientAttention: linformer's length %d (heads: queries %s, keys %s) does not match its "
      .. "seq_len %d", n, shape_str(q), shape_str(k), self.seq_len), 3)
  end
  local F = self.share_kv and self.E or self.F
  return (attn.dot_product_attention(q, self.E:matmul(k), F:matmul(v), { need_weights = false }))
end

function EfficientAttention:extra_repr() return self.kind .. (self.causal and ", causal" or "") end

-- ---------------------------------------------------------------- self-attention layers

local SelfAttention = Module:extend("EfficientSelfAttention")

function SelfAttention:setup(who, o, spec)
  local dim, heads = check.positive_int(who, "dim", o.dim, 5), check.positive_int(who, "heads", o.heads, 5)
  if dim % heads ~= 0 then error(string.format("%s: dim %d is not divisible by heads %d", who, dim, heads), 4) end
  self.heads = heads
  self.W_q = Linear(dim, dim, { bias = false })
  self.W_k = Linear(dim, dim, { bias = false })
  self.W_v = Linear(dim, dim, { bias = false })
  self.W_o = Linear(dim, dim)
  self.attention = EfficientAttention(spec, dim // heads)
end

--- forward(x (B, N, dim)) -> (B, N, dim).
function SelfAttention:forward(x)
  local h = self.heads
  local out = self.attention(attn.split_heads(self.W_q(x), h), attn.split_heads(self.W_k(x), h),
    attn.split_heads(self.W_v(x), h))
  return self.W_o(attn.merge_heads(out, h))
end

--- `nn.PerformerAttention{dim, heads, num_features = 64, causal = false}`: multi-head
-- self-attention by Performer's FAVOR+ (children W_q, W_k, W_v, W_o and attention, whose buffer
-- `features` is (num_features, dim / heads)). forward(x (B, N, dim)) -> (B, N, dim).
-- @type PerformerAttention
local PerformerAttention = SelfAttention:extend("PerformerAttention")
M.PerformerAttention = PerformerAttention

function PerformerAttention:init(opts)
  local who = "PerformerAttention"
  local o = check.options(who, opts, { dim = true, heads = true, num_features = true, causal = true }, 4)
  self:setup(who, o, { "performer", num_features = o.num_features, causal = o.causal })
end

--- Draws new random features (Performer's periodic redraw during training).
function PerformerAttention:redraw_features()
  self.attention:redraw_features()
  return self
end

--- `nn.LinformerAttention{dim, heads, seq_len, k = 32, share_kv = false}`: multi-head
-- self-attention with keys and values projected along the sequence (children W_q, W_k, W_v,
-- W_o and attention with parameters E and, unless share_kv, F, each (k, seq_len)).
-- forward(x (B, seq_len, dim)) -> (B, seq_len, dim); another length raises naming both.
-- @type LinformerAttention
local LinformerAttention = SelfAttention:extend("LinformerAttention")
M.LinformerAttention = LinformerAttention

function LinformerAttention:forward(x)
  local n = attn.is_tensor(x) and x:dim() == 3 and x:size(2) or nil
  if n ~= self.attention.seq_len then
    error(string.format("LinformerAttention: input %s must be (B, seq_len, dim) with seq_len %d, got length %s",
      shape_str(x), self.attention.seq_len, tostring(n)), 2)
  end
  return SelfAttention.forward(self, x)
end

function LinformerAttention:init(opts)
  local who = "LinformerAttention"
  local o = check.options(who, opts, { dim = true, heads = true, seq_len = true, k = true, share_kv = true }, 4)
  self:setup(who, o, { "linformer", seq_len = o.seq_len, k = o.k, share_kv = o.share_kv })
end

return M
