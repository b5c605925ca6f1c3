-- Heads as a dimension, grouped-query attention, the additive bias and ALiBi in the fused
-- kernels (src/attention/attn_attention.h "Heads"): against naive loops, against attention over
-- explicitly repeated keys and values and explicitly expanded biases (composed from matmul and
-- softmax, values and gradients), on every kernel path (blocked reference, short rows with each
-- instruction set, flash with each instruction set, one tile and several), float32 and float64,
-- 1 and 2 threads.
local attn = require "attn"
local core = attn.core
local helper = require "helper"

local with = helper.with

-- The paper's code (Press et al., github.com/ofirpress/attention_with_linear_biases), written
-- out:
--   def get_slopes(n):
--       def get_slopes_power_of_2(n):
--           start = (2**(-2**-(math.log2(n)-3)))
--           ratio = start
--           return [start*ratio**i for i in range(n)]
--       if math.log2(n).is_integer():
--           return get_slopes_power_of_2(n)
--       else:
--           closest_power_of_2 = 2**math.floor(math.log2(n))
--           return get_slopes_power_of_2(closest_power_of_2) + \
--                  get_slopes(2*closest_power_of_2)[0::2][:n-closest_power_of_2]
local function get_slopes(n)
  local function pow2(m)
    local start = 2 ^ (-(2 ^ -(math.log(m, 2) - 3)))
    local t = {}
    for i = 0, m - 1 do t[#t + 1] = start * start ^ i end
    return t
  end
  local l = math.log(n, 2)
  if l == math.floor(l) then return pow2(n) end
  local c = 2 ^ math.floor(l)
  local out = pow2(c)
  local more = get_slopes(2 * c)
  for i = 1, #more, 2 do
    if #out < n then out[#out + 1] = more[i] end
  end
  return out
end

-- softmax(Q K^T * scale + bias + ALiBi, causal) V in plain loops (float64 tables): Q (B, H, Nq, d),
-- K, V (B, Hkv, Nk, .) as nested tables, bias(b, h, i, j) a function or nil, slopes a table or nil.
local function naive(Q, K, V, scale, bias, slopes, causal)
  local out = {}
  local H, Hkv = #Q[1], #K[1]
  for b = 1, #Q do
    out[b] = {}
    for h = 1, H do
      local kh = math.ceil(h / (H // Hkv))
      out[b][h] = {}
      for i = 1, #Q[b][h] do
        local s, m = {}, -math.huge
        for j = 1, #K[b][kh] do
          if not causal or j <= i then
            local x = 0
            for c = 1, #Q[b][h][i] do x = x + Q[b][h][i][c] * K[b][kh][j][c] end
            x = x * scale
            if bias then x = x + bias(b, h, i, j) end
            if slopes then x = x - slopes[h] * math.abs(i - j) end
            s[j] = x
            m = math.max(m, x)
          end
        end
        local z, row = 0, {}
        for _, x in pairs(s) do z = z + math.exp(x - m) end
        for c = 1, #V[b][kh][1] do row[c] = 0 end
        for j, x in pairs(s) do
          local p = math.exp(x - m) / z
          for c = 1, #row do row[c] = row[c] + p * V[b][kh][j][c] end
        end
        out[b][h][i] = row
      end
    end
  end
  return attn.tensor(out, "float64")
end

-- The composed reference: K and V repeated over the groups, scores + the explicit (B, H, Nq, Nk)
-- bias, causal as -inf, softmax, times V; values and the gradients of Q, K, V (K's and V's summed
-- back over each group) for the output gradient g.
local function composed(Q, K, V, o, g)
  local B, H, Nq, d = Q:size(1), Q:size(2), Q:size(3), Q:size(4)
  local Hkv, Nk, dt = K:size(2), K:size(3), Q:dtype()
  local grp = H // Hkv
  local function leaf(t) return t:to("float64"):clone():detach():requires_grad_() end
  local q, k0, v0 = leaf(Q), leaf(K), leaf(V)
  local k, v = k0:repeat_interleave(grp, 2), v0:repeat_interleave(grp, 2)
  local s = attn.matmul(q, k:transpose(3, 4)) * (1 / math.sqrt(d))
  if o.bias then s = s + o.bias:to("float64") end
  local i = attn.arange(0, Nq, "float64"):reshape({ Nq, 1 })
  local j = attn.arange(0, Nk, "float64"):reshape({ 1, Nk })
  if o.alibi then s = s - o.alibi:to("float64"):reshape({ H, 1, 1 }) * (i - j):abs() end
  if o.causal then s = s:masked_fill(attn.gt(j, i):expand({ B, H, Nq, Nk }), -math.huge) end
  local w = attn.softmax(s, 4)
  local out = attn.matmul(w, v)
  if g then
    local _ = (out * g:to("float64")):sum():backward()
  end
  local function back(t) return t and t:to(dt) end
  return out:detach():to(dt), w:detach():to(dt), back(q.grad), back(k0.grad), back(v0.grad)
end

-- Forward and backward through the kernel API (core: the kernel option).
local function run(Q, K, V, o, g)
  local out, w, _, lse = core.sdpa_forward(Q, K, V, o)
  local dq, dk, dv = core.sdpa_backward(Q, K, V, o, g, nil, nil, nil, out, lse)
  return out, w, dq, dk, dv, lse
end

-- run gives the same bits on 1 and 2 threads.
local function assert_same_bits_on_threads(Q, K, V, o, g, what)
  local before, results = attn.get_num_threads(), {}
  for n = 1, 2 do
    attn.set_num_threads(n)
    results[n] = { run(Q, K, V, o, g) }
  end
  attn.set_num_threads(before)
  for n = 1, 5 do assert.are.same(results[1][n]:totable(), results[2][n]:totable(), what) end
end

-- n tensors of one shape and dtype, N(0, 1), drawn in order.
local function same_shape(n, shape, dt)
  local t = {}
  for i = 1, n do t[i] = attn.randn(shape, dt) end
  return table.unpack(t)
end

local function assert_all(got, want, tol, what)
  local names = { "out", "weights", "dq", "dk", "dv" }
  for n = 1, 5 do
    local ok, err = pcall(helper.assert_close, got[n], want[n], { atol = tol, rtol = tol })
    assert(ok, what .. " " .. names[n] .. ": " .. tostring(err))
  end
end

describe("attention with heads as a dimension", function()
  local saved_isa
  before_each(function()
    attn.manual_seed(22)
    saved_isa = core.isa()
  end)
  after_each(function() core.isa(saved_isa) end)

  it("alibi_slopes equals the paper's get_slopes for 8, 12, 6 and 1 heads", function()
    for _, n in ipairs { 8, 12, 6, 1 } do
      local want = get_slopes(n)
      local got = attn.alibi_slopes(n)
      assert.are.equal(n, got:size(1))
      local t = got:totable()
      for h = 1, n do assert.are.equal(want[h], t[h], string.format("n = %d, head %d", n, h)) end
    end
    -- the paper's numbers by hand: 8 heads are 1/2 .. 1/256; 6 heads are 4's and 8's odd ones
    assert.are.equal(2 ^ -8, attn.alibi_slopes(8):totable()[8])
    local six = attn.alibi_slopes(6)
    assert.are.same({ 2 ^ -2, 2 ^ -4, 2 ^ -6, 2 ^ -8, 2 ^ -1, 2 ^ -3 }, six:totable())
  end)

  it("alibi_slopes refuses a head count it could not form before looping over it", function()
    -- found by the API fuzzer: 2^31 heads looped for minutes
    assert.has_error(function() attn.alibi_slopes(1 << 31) end, "alibi_slopes: num_heads 2147483648 is more than 1048576")
    assert.has_error(function() attn.alibi_slopes(1 << 62) end)
    assert.are.equal(1 << 20, attn.alibi_slopes(1 << 20):size(1))
  end)

  it("ALiBi attention equals softmax(QK^T/sqrt(d) + bias)V in naive loops, causal and not", function()
    local B, H, N, d = 2, 3, 7, 4
    local Q, K, V = attn.randn({ B, H, N, d }, "float64"), attn.randn({ B, H, N, d }, "float64"),
      attn.randn({ B, H, N, 5 }, "float64")
    local slopes = attn.alibi_slopes(H):totable()
    for _, causal in ipairs { false, true } do
      local want = naive(Q:totable(), K:totable(), V:totable(), 1 / math.sqrt(d), nil, slopes, causal)
      for _, kernel in ipairs { "auto", "reference" } do
        local out = core.sdpa_forward(Q, K, V, { alibi = attn.alibi_slopes(H), causal = causal, kernel = kernel })
        helper.assert_close(out, want, { atol = 1e-13, rtol = 0 })
      end
      helper.assert_close(attn.dot_product_attention(Q, K, V, { alibi = true, causal = causal }), want,
        { atol = 1e-13, rtol = 0 })
    end
    -- with a bias and grouped keys too (query head h reads key/value head ceil(h / 2))
    local K2, V2 = attn.randn({ B, 1, N, d }, "float64"), attn.randn({ B, 1, N, 3 }, "float64")
    local Q2 = attn.randn({ B, 2, N, d }, "float64")
    local bias = attn.randn({ B, 1, N, N }, "float64")
    local bt = bias:totable()
    local want = naive(Q2:totable(), K2:totable(), V2:totable(), 1 / math.sqrt(d),
      function(b, _, i, j) return bt[b][1][i][j] end, attn.alibi_slopes(2):totable(), true)
    helper.assert_close(attn.dot_product_attention(Q2, K2, V2, { bias = bias, alibi = true, causal = true }), want,
      { atol = 1e-13, rtol = 0 })
  end)

  it("every kernel path equals the composed form: grouped K/V, bias, ALiBi (values and gradients)", function()
    local H, Hkv, d = 4, 2, 8
    for _, dt in ipairs { "float64", "float32" } do
      local tol = dt == "float64" and 1e-12 or 1e-5
      for _, N in ipairs { 9, 150 } do -- short rows; several flash tiles of 64
        local B = N <= 16 and 2 or 1
        local Q, K, V = attn.randn({ B, H, N, d }, dt), attn.randn({ B, Hkv, N, d }, dt), attn.randn({ B, Hkv, N, 6 }, dt)
        local bias = attn.randn({ N, N }, dt)
        local g = attn.randn({ B, H, N, 6 }, dt)
        local cases = { { bias = bias }, { bias = bias, alibi = attn.alibi_slopes(H, dt), causal = true } }
        if N <= 16 then table.insert(cases, 1, { causal = true, alibi = attn.alibi_slopes(H) }) end
        for _, o in ipairs(cases) do
          local want = { composed(Q, K, V, o, g) }
          local kernels = { "auto", "reference", "tiny" }
          if dt == "float32" then
            for _, k in ipairs(helper.flash_kernels()) do kernels[#kernels + 1] = k end
          end
          for _, kernel in ipairs(kernels) do
            local isas = kernel == "tiny" and N <= 16 and helper.isa_paths() or { saved_isa }
            for _, isa in ipairs(isas) do
              core.isa(isa)
              local got = { run(Q, K, V, with(o, { kernel = kernel }), g) }
              assert_all(got, want, tol, string.format("%s N=%d %s %s", dt, N, kernel, isa))
            end
            core.isa(saved_isa)
          end
        end
      end
    end
  end)

  it("grouped-query attention with Hkv = H is ordinary attention, and (B, H, N, d) is the (B*H, N, d) call", function()
    local B, H, N, d = 2, 3, 70, 8
    for _, dt in ipairs { "float64", "float32" } do
      local Q, K, V, g = same_shape(4, { B, H, N, d }, dt)
      local lens = attn.tensor({ 50, 70 }, "int64")
      local o = { causal = true, dropout = 0.25, seed = 5, valid_lens = lens, training = true }
      local o3 = with(o, { valid_lens = lens:repeat_interleave(H, 1) })
      local got = { run(Q, K, V, o, g) }
      local flat = function(t) return t:reshape({ B * H, t:size(3), t:size(4) }) end
      local want = { run(flat(Q), flat(K), flat(V), o3, flat(g)) }
      for n = 1, 5 do assert.are.same(flat(got[n]):totable(), want[n]:totable()) end
      -- the public function: differentiable, the same numbers
      local q, k, v = Q:clone():requires_grad_(), K:clone():requires_grad_(), V:clone():requires_grad_()
      local po = { causal = true, valid_lens = lens }
      local out = attn.dot_product_attention(q, k, v, po)
      local _ = (out * g):sum():backward()
      local ref = { run(Q, K, V, po, g) }
      assert.are.same(ref[1]:totable(), out:totable())
      assert.are.same(ref[3]:totable(), q.grad:totable())
      assert.are.same(ref[4]:totable(), k.grad:totable())
    end
  end)

  it("a bias broadcast over each dim equals the explicitly expanded bias", function()
    local B, H, N, d = 2, 3, 70, 8
    for _, dt in ipairs { "float64", "float32" } do
      local Q, K, V, g = same_shape(4, { B, H, N, d }, dt)
      for _, shape in ipairs { { N, N }, { 1, N }, { H, 1, N }, { B, 1, 1, N }, { B, H, N, N }, { B, 1, N, 1 } } do
        local bias = attn.randn(shape, dt)
        local full = bias:expand({ B, H, N, N }):contiguous()
        for _, kernel in ipairs { "auto", "reference" } do
          local got = { run(Q, K, V, { bias = bias, kernel = kernel }, g) }
          local want = { run(Q, K, V, { bias = full, kernel = kernel }, g) }
          for n = 1, 5 do assert.are.same(want[n]:totable(), got[n]:totable()) end
        end
      end
    end
  end)

  it("gives -inf bias entries weight 0, and a bias that requires grad its gradient", function()
    local B, H, N, d = 1, 2, 6, 4
    local Q, K, V = attn.randn({ B, H, N, d }, "float64"), attn.randn({ B, H, N, d }, "float64"),
      attn.randn({ B, H, N, d }, "float64")
    local rows = {}
    for i = 1, N do
      rows[i] = {}
      for j = 1, N do rows[i][j] = (i == 1 and j == 3) and -math.huge or 0.5 * (i - j) end
    end
    local bias = attn.tensor(rows, "float64")
    local _, w = attn.dot_product_attention(Q, K, V, { bias = bias })
    local wt = w:totable()
    assert.are.equal(0, wt[1][2][1][3])
    assert.is_true(wt[1][2][2][3] > 0)
    -- the composed path: finite differences
    helper.gradcheck(function(b) return attn.dot_product_attention(Q, K, V, { bias = b, alibi = true, causal = true }) end,
      { helper.param({ H, N, N }) })
    helper.gradcheck(function(q, b) return attn.dot_product_attention(q, K, V, { bias = b, valid_lens = { 4 } }) end,
      { helper.param({ B, H, N, d }), helper.param({ 1, N }) })
  end)

  it("gives the same bits on 1 and 2 threads", function()
    local B, H, Hkv, N, d = 2, 4, 1, 140, 16
    for _, dt in ipairs { "float32", "float64" } do
      local Q, K, V = attn.randn({ B, H, N, d }, dt), attn.randn({ B, Hkv, N, d }, dt), attn.randn({ B, Hkv, N, d }, dt)
      local g = attn.randn({ B, H, N, d }, dt)
      local o = { bias = attn.randn({ B, 1, N, N }, dt), alibi = attn.alibi_slopes(H), causal = true }
      assert_same_bits_on_threads(Q, K, V, o, g, dt)
    end
  end)

  it("names the values and shapes of bad input", function()
    local Q, K = attn.randn({ 2, 4, 5, 8 }), attn.randn({ 2, 3, 5, 8 })
    local ok, err = pcall(attn.dot_product_attention, Q, K, K)
    assert.is_false(ok)
    assert.is_truthy(err:find("key/value heads Hkv = 3 must divide query heads H = 4", 1, true), err)
    assert.is_truthy(err:find("[2x4x5x8]", 1, true), err)
    K = attn.randn({ 2, 2, 5, 8 })
    ok, err = pcall(attn.dot_product_attention, Q, K, K, { bias = attn.randn({ 3, 5, 5 }) })
    assert.is_false(ok)
    assert.is_truthy(err:find("bias [3x5x5] does not broadcast to (B, H, Nq, Nk) = [2x4x5x5]", 1, true), err)
    ok, err = pcall(attn.dot_product_attention, Q, K, K, { alibi = attn.alibi_slopes(3) })
    assert.is_false(ok)
    assert.is_truthy(err:find("alibi slopes [3] must hold one slope per head, H = 4", 1, true), err)
    ok, err = pcall(attn.dot_product_attention, Q, K, K, { mask = attn.ones({ 4, 5, 4 }) })
    assert.is_false(ok)
    assert.is_truthy(err:find("mask [4x5x4] does not broadcast to (B, H, Nq, Nk) = [2x4x5x5]", 1, true), err)
  end)
end)

-- ---- heads, bias and ALiBi together with windows, sparse patterns, global tokens and lengths ----

local keeps = helper.pattern_keeps -- the keep rule, the same for every head

-- Output and weights of o in plain loops (float64): for query i of head h only the keys the rule
-- keeps take part; their score is q.k * scale + bias + ALiBi, replaced by d2l's -1e6 past the
-- sample's valid length (o.valid_lens: a table of B lengths); K and V head ceil(h / (H / Hkv)).
local function naive_all(Q, K, V, o)
  local B, H, Nq, d = Q:size(1), Q:size(2), Q:size(3), Q:size(4)
  local Hkv, Nk, dv = K:size(2), K:size(3), V:size(4)
  local q, k, v = Q:to("float64"):totable(), K:to("float64"):totable(), V:to("float64"):totable()
  local bias = o.bias and o.bias:to("float64"):expand({ B, H, Nq, Nk }):contiguous():totable()
  local slopes = o.alibi and o.alibi:to("float64"):totable()
  local scale = 1 / math.sqrt(d)
  local out, wts = {}, {}
  for b = 1, B do
    out[b], wts[b] = {}, {}
    for h = 1, H do
      local kh = math.ceil(h / (H // Hkv))
      out[b][h], wts[b][h] = {}, {}
      for i = 1, Nq do
        local s, m = {}, -math.huge
        for j = 1, Nk do
          if keeps(o, i - 1, j - 1) then
            local x = 0
            for c = 1, d do x = x + q[b][h][i][c] * k[b][kh][j][c] end
            x = x * scale
            if bias then x = x + bias[b][h][i][j] end
            if slopes then x = x - slopes[h] * math.abs(i - j) end
            if o.valid_lens and j > o.valid_lens[b] then x = -1e6 end
            s[j] = x
            m = math.max(m, x)
          end
        end
        local z = 0
        for _, x in pairs(s) do z = z + math.exp(x - m) end
        local row, wrow = {}, {}
        for c = 1, dv do row[c] = 0 end
        for j = 1, Nk do
          wrow[j] = s[j] and math.exp(s[j] - m) / z or 0
          for c = 1, dv do row[c] = row[c] + wrow[j] * v[b][kh][j][c] end
        end
        out[b][h][i], wts[b][h][i] = row, wrow
      end
    end
  end
  return attn.tensor(out, "float64"), attn.tensor(wts, "float64")
end

-- The gradients of Q, K, V for the output gradient g, composed (float64 autograd): K and V
-- repeated over the groups, the scores filled (-1e6 past the lengths) and the keys the rule
-- removes set to -inf by explicit masks built from `keeps`, softmax, times V.
local function composed_grads(Q, K, V, o, g)
  local B, H, Nq, d = Q:size(1), Q:size(2), Q:size(3), Q:size(4)
  local Hkv, Nk = K:size(2), K:size(3)
  local function leaf(t) return t:to("float64"):clone():detach():requires_grad_() end
  local q, k0, v0 = leaf(Q), leaf(K), leaf(V)
  local k, v = k0:repeat_interleave(H // Hkv, 2), v0:repeat_interleave(H // Hkv, 2)
  local s = attn.matmul(q, k:transpose(3, 4)) * (1 / math.sqrt(d))
  if o.bias then s = s + o.bias:to("float64") end
  if o.alibi then
    local i = attn.arange(0, Nq, "float64"):reshape({ Nq, 1 })
    local j = attn.arange(0, Nk, "float64"):reshape({ 1, Nk })
    s = s - o.alibi:to("float64"):reshape({ H, 1, 1 }) * (i - j):abs()
  end
  local fill, removed = {}, {}
  for b = 1, B do
    fill[b], removed[b] = {}, {}
    for i = 1, Nq do
      fill[b][i], removed[b][i] = {}, {}
      for j = 1, Nk do
        fill[b][i][j] = o.valid_lens and j > o.valid_lens[b] and 1 or 0
        removed[b][i][j] = keeps(o, i - 1, j - 1) and 0 or 1
      end
    end
  end
  local shape = { B, H, Nq, Nk }
  s = s:masked_fill(attn.tensor(fill, "float64"):reshape({ B, 1, Nq, Nk }):expand(shape), -1e6)
  s = s:masked_fill(attn.tensor(removed, "float64"):reshape({ B, 1, Nq, Nk }):expand(shape), -math.huge)
  local out = attn.matmul(attn.softmax(s, 4), v)
  local _ = (out * g:to("float64")):sum():backward()
  return q.grad, k0.grad, v0.grad
end

-- o's keep rule as an explicit (Nq, Nk) keep-mask in place of the pattern options.
local function as_mask(o, Nq, Nk)
  local m = {}
  for i = 1, Nq do
    m[i] = {}
    for j = 1, Nk do m[i][j] = keeps(o, i - 1, j - 1) and 1 or 0 end
  end
  local e = with(o, { mask = attn.tensor(m, "float64") })
  e.window, e.pattern, e.stride, e.summary, e.global, e.causal = nil, nil, nil, nil, nil, nil
  return e
end

describe("heads, bias and ALiBi with windows, sparse patterns and global tokens", function()
  local B, H, N, d, dv = 2, 4, 150, 8, 6 -- 150: three query blocks and two key tiles of flash
  -- name, key/value heads, options (bias: its shape, alibi: slopes)
  local cases = {
    { "GQA + window + ALiBi, causal, valid_lens", 2,
      { window = 20, alibi = true, causal = true, valid_lens = { 150, 97 } } },
    { "bias (B, 1, N, N) + global tokens + window", 1,
      { bias = { B, 1, N, N }, window = 10, global = { 1, 77, 150 } } },
    { "4-D + strided pattern + bias (N, N) + ALiBi, causal", 4,
      { pattern = "strided", stride = 12, bias = { N, N }, alibi = true, causal = true } },
    { "GQA + fixed pattern + global + ALiBi + valid_lens", 2,
      { pattern = "fixed", stride = 16, summary = 2, global = { 40 }, alibi = true, valid_lens = { 120, 150 } } },
  }
  local function make(c, dt)
    local o = with(c[3], {})
    if o.bias then o.bias = attn.randn(o.bias, dt) end
    if o.alibi then o.alibi = attn.alibi_slopes(H, dt) end
    local Q, K, V = attn.randn({ B, H, N, d }, dt), attn.randn({ B, c[2], N, d }, dt), attn.randn({ B, c[2], N, dv }, dt)
    return Q, K, V, o, attn.randn({ B, H, N, dv }, dt)
  end
  before_each(function() attn.manual_seed(2221) end)

  for _, c in ipairs(cases) do
    it(c[1] .. ": every path equals naive loops (values, weights) and the composed gradients", function()
      for _, dt in ipairs { "float64", "float32" } do
        local Q, K, V, o, g = make(c, dt)
        local want_out, want_w = naive_all(Q, K, V, o)
        local want_dq, want_dk, want_dv = composed_grads(Q, K, V, o, g)
        local want = { want_out, want_w, want_dq, want_dk, want_dv }
        local tol = dt == "float64" and 1e-11 or 2e-5
        local kernels = { "auto", "reference" }
        if dt == "float32" then
          for _, k in ipairs(helper.flash_kernels()) do kernels[#kernels + 1] = k end
        end
        for _, kernel in ipairs(kernels) do
          local got = { run(Q, K, V, with(o, { kernel = kernel }), g) }
          for n = 1, 5 do got[n] = got[n]:to("float64") end
          assert_all(got, want, tol, string.format("%s %s", dt, kernel))
        end
        -- the public function (alibi = true, lengths as a table): the same output
        local po = with(o, { alibi = c[3].alibi })
        helper.assert_close(attn.dot_product_attention(Q, K, V, po):to("float64"), want_out,
          { atol = tol, rtol = tol })
      end
    end)
  end

  it("with dropout, the rule equals its explicit keep-mask (same stream) on every path", function()
    for _, c in ipairs(cases) do
      for _, dt in ipairs { "float64", "float32" } do
        local Q, K, V, o, g = make(c, dt)
        o = with(o, { dropout = 0.3, training = true, seed = 77 })
        local kernels = { "reference" }
        if dt == "float32" then
          for _, k in ipairs(helper.flash_kernels()) do kernels[#kernels + 1] = k end
        end
        local tol = dt == "float64" and 1e-12 or 1e-5
        for _, kernel in ipairs(kernels) do
          local want = { run(Q, K, V, with(as_mask(o, N, N), { kernel = kernel }), g) }
          local got = { run(Q, K, V, with(o, { kernel = kernel }), g) }
          assert_all(got, want, tol, string.format("%s %s %s", c[1], dt, kernel))
        end
      end
    end
  end)

  it("gives the same bits on 1 and 2 threads (all of it together, with dropout)", function()
    for _, c in ipairs(cases) do
      for _, dt in ipairs { "float32", "float64" } do
        local Q, K, V, o, g = make(c, dt)
        assert_same_bits_on_threads(Q, K, V, with(o, { dropout = 0.2, training = true, seed = 3 }), g, c[1] .. " " .. dt)
      end
    end
  end)

  it("keeps the flash work banded with heads, grouped K/V, a bias and ALiBi", function()
    local n, Hq = 2048, 4
    local Q, K, V = attn.randn { 1, Hq, n, 8 }, attn.randn { 1, 2, n, 8 }, attn.randn { 1, 2, n, 8 }
    local function tiles(o)
      local t0 = core.flash_tiles()
      core.sdpa_forward(Q, K, V, with(o, { need_weights = false, kernel = "flash" }))
      return core.flash_tiles() - t0
    end
    local blocks, ktiles = Hq * n // 64, n // 128
    local extra = { bias = attn.randn { n, n }, alibi = attn.alibi_slopes(Hq) }
    assert.equal(blocks * ktiles, tiles(extra))
    assert.is_true(tiles(with(extra, { window = 32, causal = true })) <= 2 * blocks)
    assert.is_true(tiles(with(extra, { window = 32, global = { 1, n } })) <= 4 * blocks + 2 * Hq * ktiles)
  end)
end)
