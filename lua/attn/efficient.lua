--- Attention in less than O(n^2): linear attention and Performer (FAVOR+), differentiable.
--
-- The facade copies these into `attn`: `attn.linear_attention`, `attn.performer_attention`,
-- `attn.performer_features`. Queries, keys and values are (B, N, d) or (B, H, N, d) (heads as
-- a batch dim); values may have their own width dv.
--
-- **Linear attention** (Katharopoulos et al. 2020, arXiv:2006.16236): with phi(x) = elu(x) + 1,
--
--     out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)
--
-- over every key, or over j <= i when `causal`. The C kernel (src/attention/attn_linear.h) costs
-- O(N d dv) time and O(d dv) memory per (batch, head) item in forward and backward: no N x N
-- matrix and no per-position state (the causal backward rebuilds the running sums in a reverse
-- sweep). `kernel = "reference"` runs the O(N^2) composition (explicit scores, a lower-triangular
-- mask when causal) that the specs compare against.
--
-- **Performer** (Choromanski et al. 2021, arXiv:2009.14794), positive random features: with
-- x' = x d^(-1/4) and W (m, d), phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m), then the formula above
-- on phi(q), phi(k) (eps defaults to 0 here). Stabilised as the paper's code does: before the
-- exp, each query row subtracts its own largest exponent and the keys of one (batch, head) item
-- subtract their largest exponent over all positions and features (held constant for the
-- gradient). That scales phi(q_i) by a_i > 0 and every phi(k_j) of the item by one b > 0, which
-- multiplies numerator and denominator of out_i by a_i b: the result is unchanged up to rounding
-- when eps = 0 (with eps > 0, eps acts on the stabilised features), and the constant's gradient
-- is exactly 0, so treating it as constant loses nothing (spec/attention/linear_spec.lua checks
-- both). Features are made by composed tensor ops (O(N m) memory), the last step by the
-- linear-attention kernel with the identity feature map.
--
-- **Nystromformer** (Xiong et al. 2021, arXiv:2102.03902, as its reference code mlpen/Nystromformer
-- `attention_nystrom.py`): queries and keys scaled by d^(-1/4) each, the sequence of N positions cut
-- into m equal segments (N must be divisible by m; the reference code reshapes and has no padding)
-- whose means are the landmarks Q~, K~ (m, d); then three softmax kernels
--
--     F = softmax(Q K~^T / sqrt(d)) (N, m),  A = softmax(Q~ K~^T / sqrt(d)) (m, m),
--     B = softmax(Q~ K^T / sqrt(d)) (m, N),   out = (F A^+) (B V)
--
-- with A^+ by the iterative Moore-Penrose method of Razavi et al. 2014 the paper uses:
-- Z_0 = A^T / max_j sum_i A_ij, Z_{t+1} = Z_t/4 (13 I - A Z_t (15 I - A Z_t (7 I - A Z_t))).
-- The paper writes Z_0 = A^T / (||A||_1 ||A||_inf); A is row-stochastic, so ||A||_inf = 1 and its
-- ||A||_1 (largest column sum) is what the code divides by. The maximum is per (batch, head) item
-- (the code's option other than "original", and the paper's formula); `pinv_init = "batch"` takes
-- it over the whole batch and every head as the code's default "original" does (one item's output
-- then depends on the others). Composed from tensor ops, so differentiable by autograd; cost
-- O(N m (d + dv) + iters m^3) per item and nothing N x N. The reference code switches to plain
-- softmax attention when m = N; this always computes the formula, which at m = N (landmarks = the
-- tokens, F = A = B) equals softmax attention as far as the iteration has converged.
-- @module attn.efficient
local core = require "attn.core"
local autograd = require "attn.autograd"
local check = require "attn.check"
require "attn.tensor"

local M = {}

local shape_str = core.shape_str
local wants, record_wanted = autograd.wants, autograd.record_wanted

-- (B, N, d) as is, (B, H, N, d) as (B*H, N, d); returns the 3-D tensor and the lead sizes to
-- restore (nil for 3-D).
local function flat(fn, name, x)
  check.tensor(fn, name, x, nil, "(B, N, d) or (B, H, N, d)", 4)
  local s = core.shape(x)
  if #s == 3 then return x, nil end
  if #s ~= 4 then error(string.format("%s: %s must be (B, N, d) or (B, H, N, d), got %s", fn, name, shape_str(s)), 4) end
  return x:reshape(s[1] * s[2], s[3], s[4]), { s[1], s[2] }
end

local function unflat(out, lead)
  if lead == nil then return out end
  return out:reshape(lead[1], lead[2], out:size(2), out:size(3))
end

-- The three operands as 3-D tensors of matching rank.
local function operands(fn, q, k, v)
  local q3, lq = flat(fn, "queries", q)
  local k3, lk = flat(fn, "keys", k)
  local v3, lv = flat(fn, "values", v)
  if (lq == nil) ~= (lk == nil) or (lq == nil) ~= (lv == nil) then
    error(string.format("%s: queries %s, keys %s and values %s must all be 3-D or all 4-D", fn, shape_str(q),
      shape_str(k), shape_str(v)), 3)
  end
  return q3, k3, v3, lq
end

-- The kernel as one autograd node; feature "elu1" or "identity".
local function kernel(fn, q, k, v, causal, eps, feature)
  local out = core.linear_attention_forward(q, k, v, causal, eps, feature)
  if wants(q, k, v) then
    record_wanted(fn, out, { q, k, v }, function(g)
      if g == nil then return nil end
      return core.linear_attention_backward(q, k, v, out, g, causal, eps, feature)
    end)
  end
  return out
end

-- elu(x) + 1 composed (exp of min(x, 0), so the unused branch is never inf).
local function elu1(x) return core.methods.where(x:gt(0), x + 1, x:clamp(nil, 0):exp()) end

-- The O(N^2) composition of the same formula on features a = phi(q), c = phi(k).
local function reference(a, c, v, causal, eps)
  local scores = a:matmul(c:transpose(2, 3))
  if causal then
    local n = scores:size(2)
    scores = scores * require("attn").ones({ n, n }, scores:dtype()):tril()
  end
  return scores:matmul(v) / (scores:sum(3, true) + eps)
end

local linear_options = { causal = true, eps = true, kernel = true }

local function read_common(fn, opts, allowed, default_eps)
  opts = check.options(fn, opts, allowed, 4)
  local eps = opts.eps
  if eps == nil then eps = default_eps end
  if type(eps) ~= "number" or eps ~= eps or eps < 0 or eps == math.huge then
    error(string.format("%s: eps must be a finite number >= 0, got %s", fn, tostring(eps)), 4)
  end
  if opts.kernel ~= nil and opts.kernel ~= "reference" and opts.kernel ~= "auto" then
    error(string.format("%s: kernel must be \"auto\" or \"reference\", got %s", fn, tostring(opts.kernel)), 4)
  end
  return opts, opts.causal == true, eps
end

--- Linear attention, phi = elu + 1.
-- @tparam Tensor Q (B, N, d) or (B, H, N, d)
-- @tparam Tensor K (B, M, d) or (B, H, M, d) (M = N when causal)
-- @tparam Tensor V (B, M, dv) or (B, H, M, dv)
-- @tparam[opt] table opts `causal` (default false), `eps` (added to each denominator, default
--   1e-6 as fast-transformers), `kernel` ("auto", default: the C kernel; "reference": the O(N^2)
--   composition)
-- @treturn Tensor (B, N, dv) or (B, H, N, dv)
-- @usage local out = attn.linear_attention(q, k, v, { causal = true })
function M.linear_attention(Q, K, V, opts)
  local fn = "linear_attention"
  local o, causal, eps = read_common(fn, opts, linear_options, 1e-6)
  local q, k, v, lead = operands(fn, Q, K, V)
  if o.kernel == "reference" then return unflat(reference(elu1(q), elu1(k), v, causal, eps), lead) end
  return unflat(kernel(fn, q, k, v, causal, eps, "elu1"), lead)
end

--- Draws Performer's feature matrix W (m, d): blocks of d orthogonal rows (the Q of the QR of a
-- d x d Gaussian matrix, transposed; the last block cut to what is left), each row scaled by the
-- norm of its own Gaussian d-vector (chi-distributed, so row norms match unstructured Gaussian
-- rows), as the paper's `gaussian_orthogonal_random_matrix` with scaling 0.
-- Draws from attn's generator; with `seed` from that seed, leaving the generator as it was.
-- @tparam integer m number of features
-- @tparam integer d width of queries and keys
-- @tparam[opt] table opts `seed` (integer), `dtype` (default "float32")
-- @treturn Tensor W (m, d)
-- @usage local W = attn.performer_features(64, 16, { seed = 1 })
function M.performer_features(m, d, opts)
  local fn = "performer_features"
  check.positive_int(fn, "m", m)
  check.positive_int(fn, "d", d)
  opts = check.options(fn, opts, { seed = true, dtype = true })
  local saved
  if opts.seed ~= nil then
    saved = core.rng_state()
    core.manual_seed(opts.seed)
  end
  local linalg = require "attn.linalg"
  local rows = {}
  while #rows < m do
    local q = linalg.qr(core.randn({ d, d }, "float64")):totable() -- columns orthonormal
    for c = 1, d do
      if #rows == m then break end
      local r = {}
      for i = 1, d do r[i] = q[i][c] end
      rows[#rows + 1] = r
    end
  end
  local norms = core.randn({ m, d }, "float64"):totable()
  if saved then core.rng_state(saved) end
  for i = 1, m do
    local s = 0
    for j = 1, d do s = s + norms[i][j] ^ 2 end
    s = math.sqrt(s)
    for j = 1, d do rows[i][j] = rows[i][j] * s end
  end
  return core.tensor(rows, opts.dtype or "float32")
end

-- W must be (m, d) for queries of width d, finite.
local function check_features(fn, W, q)
  check.tensor(fn, "features", W, nil, "(m, d)", 4)
  local d = q:size(3)
  if W:dim() ~= 2 or W:size(2) ~= d or W:size(1) < 1 then
    error(string.format("%s: features %s must be (m, d) with d = %d, the width of queries %s", fn, shape_str(W), d,
      shape_str(q)), 4)
  end
  local bad = core.sum(core.ne(core.mul(W, 0), 0)):item() -- NaN and +-inf give NaN when multiplied by 0
  if bad > 0 then
    error(string.format("%s: features %s hold %d non-finite value(s) (NaN or inf)", fn, shape_str(W), bad), 4)
  end
end

-- Performer's features of x (B, N, d): exp(x' W^T - |x'|^2/2 - max) / sqrt(m), the max per row
-- (queries) or per item over all rows and features (keys), held constant.
local function favor(x, W, per_row)
  local d, m = x:size(3), W:size(1)
  local xs = x * (d ^ -0.25)
  local expo = xs:matmul(W:transpose(1, 2)) - (xs * xs):sum(3, true) * 0.5
  local stab = core.max(expo, 3, true)
  if not per_row then stab = core.max(stab, 2, true) end
  return (expo - stab):exp() * (m ^ -0.5)
end
M._favor = favor

--- Performer FAVOR+ attention: positive random features of q and k (see the module comment),
-- then linear attention on them.
-- @tparam Tensor Q (B, N, d) or (B, H, N, d)
-- @tparam Tensor K (B, M, d) or (B, H, M, d)
-- @tparam Tensor V (B, M, dv) or (B, H, M, dv)
-- @tparam table opts `features` (W (m, d), required: attn.performer_features draws one),
--   `causal` (default false), `eps` (default 0), `kernel` ("reference": the O(N^2) composition)
-- @treturn Tensor (B, N, dv) or (B, H, N, dv)
-- @usage local out = attn.performer_attention(q, k, v, { features = attn.performer_features(64, 16) })
function M.performer_attention(Q, K, V, opts)
  local fn = "performer_attention"
  local o, causal, eps = read_common(fn, opts, { causal = true, eps = true, kernel = true, features = true }, 0)
  local q, k, v, lead = operands(fn, Q, K, V)
  local W = o.features
  check_features(fn, W, q)
  local a, c = favor(q, W, true), favor(k, W, false)
  if o.kernel == "reference" then return unflat(reference(a, c, v, causal, eps), lead) end
  return unflat(kernel(fn, a, c, v, causal, eps, "identity"), lead)
end

-- ---------------------------------------------------------------- Nystromformer

--- The iterative Moore-Penrose pseudo-inverse of Nystromformer (Razavi et al. 2014) of each
-- (m, m) matrix of A (B, m, m) whose rows sum to 1 (softmax rows): Z_0 = A^T / c with c the
-- largest column sum of the item (`init` "item") or of the whole batch ("batch"), then `iters`
-- steps Z <- Z/4 (13 I - A Z (15 I - A Z (7 I - A Z))). Differentiable, c included (as the
-- reference code's torch.max).
-- @tparam Tensor A (B, m, m)
-- @tparam[opt=6] integer iters
-- @tparam[opt="item"] string init "item" or "batch"
-- @treturn Tensor (B, m, m)
-- @usage local Z = attn.nystrom_pinv(A, 6)
function M.nystrom_pinv(A, iters, init)
  local fn = "nystrom_pinv"
  check.tensor(fn, "A", A, 3, "(B, m, m)")
  if A:size(2) ~= A:size(3) then error(string.format("%s: A %s must be (B, m, m)", fn, shape_str(A)), 2) end
  iters = check.positive_int(fn, "iters", iters or 6)
  init = init or "item"
  local colsum = A:sum(2, true) -- (B, 1, m)
  local c
  if init == "item" then
    c = (colsum:max(3, true)) -- (B, 1, 1)
  elseif init == "batch" then
    c = colsum:max() -- one number
  else
    error(string.format("%s: pinv_init must be \"item\" or \"batch\", got %s", fn, tostring(init)), 2)
  end
  local m = A:size(2)
  local I = core.eye(m, m, A:dtype())
  local Z = A:transpose(2, 3) / c
  for _ = 1, iters do
    local AZ = A:matmul(Z)
    Z = (Z * 0.25):matmul(I * 13 - AZ:matmul(I * 15 - AZ:matmul(I * 7 - AZ)))
  end
  return Z
end

-- valid_lens for n flat items of `heads` heads each: (B) as a table of n lengths (each repeated
-- per head), or nil.
local function item_lens(fn, lens, items, heads)
  if lens == nil then return nil end
  local t = lens
  if getmetatable(lens) == core.metatable then
    if lens:dim() ~= 1 then
      error(string.format("%s: valid_lens %s must be (B), one length per sequence (per-query lengths would make "
        .. "landmarks mix masked and unmasked queries)", fn, shape_str(lens)), 4)
    end
    t = lens:totable()
  elseif type(lens) ~= "table" then
    error(string.format("%s: valid_lens must be a tensor or table (B), got a %s", fn, type(lens)), 4)
  end
  if #t * heads ~= items then
    error(string.format("%s: valid_lens has %d entries for a batch of %d", fn, #t, items // heads), 4)
  end
  local out = {}
  for b = 1, #t do
    local n = t[b]
    if type(n) ~= "number" or n < 0 or n ~= math.floor(n) then
      error(string.format("%s: valid_lens[%d] must be an integer >= 0, got %s", fn, b, tostring(n)), 4)
    end
    for _ = 1, heads do out[#out + 1] = math.tointeger(n) end
  end
  return out
end

local nystrom_options = { landmarks = true, pinv_iters = true, pinv_init = true, conv = true, valid_lens = true }

--- Nystromformer attention (see the module comment): landmarks by segment means, three softmax
-- kernels, the iterative pseudo-inverse, out = (F A^+) (B V), plus an optional depthwise
-- convolution of the values along the sequence (the reference code's `conv_kernel_size` skip).
-- @tparam Tensor Q (B, N, d) or (B, H, N, d)
-- @tparam Tensor K (B, N, d) or (B, H, N, d) (as many positions as Q: one sequence)
-- @tparam Tensor V (B, N, dv) or (B, H, N, dv)
-- @tparam table opts `landmarks` (m, required, 1 <= m <= N, N divisible by m), `pinv_iters`
--   (default 6), `pinv_init` ("item", default, or "batch": see the module comment), `conv`
--   (weight (H, 1, ks, 1), ks odd, H = 1 for 3-D inputs: adds conv2d(V, weight, padding
--   (ks // 2, 0), groups H), PyTorch's Conv2d layout as the reference code), `valid_lens` ((B)
--   lengths, shared by the heads: as the reference code's mask, queries and keys past the length
--   are zeroed before the landmarks, those keys get weight 0 in B, and those values are zeroed
--   for the convolution; the outputs at those positions are not meaningful)
-- @treturn Tensor (B, N, dv) or (B, H, N, dv)
-- @usage local out = attn.nystrom_attention(q, k, v, { landmarks = 8 })
function M.nystrom_attention(Q, K, V, opts)
  local fn = "nystrom_attention"
  local o = check.options(fn, opts, nystrom_options)
  local q, k, v, lead = operands(fn, Q, K, V)
  local items, n, d = q:size(1), q:size(2), q:size(3)
  if k:size(1) ~= items or k:size(2) ~= n or k:size(3) ~= d or v:size(1) ~= items or v:size(2) ~= n then
    error(string.format("%s: queries %s, keys %s and values %s must be (B, N, d), (B, N, d) and (B, N, dv): "
      .. "one sequence of N positions", fn, shape_str(Q), shape_str(K), shape_str(V)), 2)
  end
  local m = o.landmarks
  if math.type(m) ~= "integer" or m < 1 or m > n then
    error(string.format("%s: landmarks must be an integer in 1..N = %d, got %s", fn, n, tostring(m)), 2)
  end
  if n % m ~= 0 then
    error(string.format("%s: sequence length N = %d is not divisible by landmarks m = %d", fn, n, m), 2)
  end
  local iters = check.positive_int(fn, "pinv_iters", o.pinv_iters or 6)
  if o.pinv_init ~= nil and o.pinv_init ~= "item" and o.pinv_init ~= "batch" then
    error(string.format("%s: pinv_init must be \"item\" or \"batch\", got %s", fn, tostring(o.pinv_init)), 2)
  end
  local heads = lead and lead[2] or 1
  local lens = item_lens(fn, o.valid_lens, items, heads)
  local w = o.conv
  if w ~= nil then
    check.tensor(fn, "conv", w, nil, "(H, 1, ks, 1)", 3)
    if w:dim() ~= 4 or w:size(1) ~= heads or w:size(2) ~= 1 or w:size(4) ~= 1 or w:size(3) % 2 == 0 then
      error(string.format("%s: conv %s must be (H, 1, ks, 1) with H = %d heads and ks odd", fn, shape_str(w), heads), 2)
    end
  end
  local attention = require "attn.attention"
  local scale = d ^ -0.25 -- on Q and on K, as the reference code
  local qs, ks = q * scale, k * scale
  if lens then qs, ks = attention.sequence_mask(qs, lens), attention.sequence_mask(ks, lens) end
  local ql = qs:reshape(items, m, n // m, d):mean(3) -- (items, m, d)
  local kl = ks:reshape(items, m, n // m, d):mean(3)
  local F = qs:matmul(kl:transpose(2, 3)):softmax(-1) -- (items, N, m)
  local A = ql:matmul(kl:transpose(2, 3)):softmax(-1) -- (items, m, m)
  local Bs = ql:matmul(ks:transpose(2, 3)) -- (items, m, N)
  Bs = lens and attention.masked_softmax(Bs, lens) or Bs:softmax(-1)
  local out = F:matmul(M.nystrom_pinv(A, iters, o.pinv_init)):matmul(Bs:matmul(v))
  if w ~= nil then
    local vm = lens and attention.sequence_mask(v, lens) or v
    local ksz = w:size(3)
    local v4 = vm:reshape(items // heads, heads, n, v:size(3))
    local conv = require("attn.nn.conv").conv2d(v4, w, nil, { padding = { ksz // 2, 0 }, groups = heads })
    out = out + conv:reshape(items, n, v:size(3))
  end
  return unflat(out, lead)
end

return M
