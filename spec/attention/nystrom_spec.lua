-- attn.nystrom_attention against Nystromformer's formula written as plain loops (segment-mean
-- landmarks, the three softmaxes, the iterative pseudo-inverse; float64, 1e-10), with masks and
-- the convolution skip; softmax attention at m = N once the iteration has converged; the
-- iterative pseudo-inverse against the SVD's; finite differences; thread-count independence and
-- bad input.
local attn = require "attn"
local helper = require "helper"

local tight = { atol = 1e-10, rtol = 0 }

local function zeros(r, c)
  local z = {}
  for i = 1, r do
    z[i] = {}
    for j = 1, c do z[i][j] = 0 end
  end
  return z
end

local function transpose(a)
  local t = zeros(#a[1], #a)
  for i = 1, #a do
    for j = 1, #a[1] do t[j][i] = a[i][j] end
  end
  return t
end

local function softmax_rows(s, keep)
  for _, row in ipairs(s) do
    local mx = -math.huge
    for j, x in ipairs(row) do
      if keep == nil or j <= keep then mx = math.max(mx, x) end
    end
    local sum = 0
    for j, x in ipairs(row) do
      row[j] = (keep == nil or j <= keep) and math.exp(x - mx) or 0
      sum = sum + row[j]
    end
    for j = 1, #row do row[j] = row[j] / sum end
  end
  return s
end

-- c I - X for square X.
local function shift(c, X)
  local r = zeros(#X, #X)
  for i = 1, #X do
    for j = 1, #X do r[i][j] = (i == j and c or 0) - X[i][j] end
  end
  return r
end

local mm = helper.naive_matmul

-- Razavi et al.'s iteration on plain tables; `norm` is the divisor of Z_0 = A^T / norm.
local function pinv_loops(A, iters, norm)
  local Z = transpose(A)
  for i = 1, #Z do
    for j = 1, #Z do Z[i][j] = Z[i][j] / norm end
  end
  for _ = 1, iters do
    local AZ = mm(A, Z)
    local P = mm(Z, shift(13, mm(AZ, shift(15, mm(AZ, shift(7, AZ))))))
    for i = 1, #P do
      for j = 1, #P do P[i][j] = P[i][j] / 4 end
    end
    Z = P
  end
  return Z
end

local function max_colsum(A)
  local best = -math.huge
  for j = 1, #A do
    local s = 0
    for i = 1, #A do s = s + A[i][j] end
    best = math.max(best, s)
  end
  return best
end

-- Nystromformer on nested tables q, k (items, N, d), v (items, N, dv): m landmarks, `iters` steps,
-- Z_0's divisor per item or over the batch, lengths per item (or nil), conv weights w[h][t] for
-- item i's head h = (i - 1) % heads + 1 (or nil).
local function formula(q, k, v, m, iters, init, lens, w, heads)
  local items, n, d = #q, #q[1], #q[1][1]
  local L = n // m
  local A, parts = {}, {}
  for b = 1, items do
    local len = lens and lens[b] or n
    local qs, ks = zeros(n, d), zeros(n, d)
    for i = 1, n do
      for c = 1, d do
        if i <= len then
          qs[i][c] = q[b][i][c] * d ^ -0.25
          ks[i][c] = k[b][i][c] * d ^ -0.25
        end
      end
    end
    local ql, kl = zeros(m, d), zeros(m, d)
    for s = 1, m do
      for i = (s - 1) * L + 1, s * L do
        for c = 1, d do
          ql[s][c] = ql[s][c] + qs[i][c] / L
          kl[s][c] = kl[s][c] + ks[i][c] / L
        end
      end
    end
    A[b] = softmax_rows(mm(ql, transpose(kl)))
    parts[b] = { F = softmax_rows(mm(qs, transpose(kl))), BV = mm(softmax_rows(mm(ql, transpose(ks)), len), v[b]) }
  end
  local batch_norm = -math.huge
  for b = 1, items do batch_norm = math.max(batch_norm, max_colsum(A[b])) end
  local out = {}
  for b = 1, items do
    local norm = init == "batch" and batch_norm or max_colsum(A[b])
    out[b] = mm(mm(parts[b].F, pinv_loops(A[b], iters, norm)), parts[b].BV)
    if w then
      local h, len, ks = (b - 1) % heads + 1, lens and lens[b] or n, #w[1]
      for i = 1, n do
        for e = 1, #v[b][1] do
          for t = 1, ks do
            local j = i + t - 1 - ks // 2
            if j >= 1 and j <= len then out[b][i][e] = out[b][i][e] + w[h][t] * v[b][j][e] end
          end
        end
      end
    end
  end
  return attn.tensor(out, "float64")
end

local function randn(...) return attn.randn({ ... }, "float64") end

describe("attn.nystrom_attention", function()
  it("equals the formula in loops (float64, 1e-10): iterations, both initialisations, (B, H, N, d)", function()
    attn.manual_seed(1)
    local q, k, v = randn(3, 12, 4), randn(3, 12, 4), randn(3, 12, 2)
    local qt, kt, vt = q:totable(), k:totable(), v:totable()
    helper.assert_close(attn.nystrom_attention(q, k, v, { landmarks = 4 }), formula(qt, kt, vt, 4, 6, "item"), tight)
    helper.assert_close(attn.nystrom_attention(q, k, v, { landmarks = 3, pinv_iters = 2 }),
      formula(qt, kt, vt, 3, 2, "item"), tight)
    local batch = attn.nystrom_attention(q, k, v, { landmarks = 6, pinv_init = "batch" })
    helper.assert_close(batch, formula(qt, kt, vt, 6, 6, "batch"), tight)
    -- the two initialisations differ when the items' column sums do (6 iterations do not converge)
    assert.is_true((batch - attn.nystrom_attention(q, k, v, { landmarks = 6 })):abs():max():item() > 1e-8)
    local q4, k4, v4 = q:reshape(1, 3, 12, 4), k:reshape(1, 3, 12, 4), v:reshape(1, 3, 12, 2)
    local out4 = attn.nystrom_attention(q4, k4, v4, { landmarks = 4 })
    assert.are.same({ 1, 3, 12, 2 }, out4:shape())
    helper.assert_close(out4:reshape(3, 12, 2), formula(qt, kt, vt, 4, 6, "item"), tight)
  end)

  it("masks by valid_lens as the reference code and adds the depthwise convolution of the values", function()
    attn.manual_seed(2)
    local q, k, v = randn(2, 2, 8, 3), randn(2, 2, 8, 3), randn(2, 2, 8, 2)
    local w = randn(2, 1, 3, 1)
    local wt = w:reshape(2, 3):totable()
    local flat = function(x) return x:reshape(4, 8, x:size(4)):totable() end
    local out = attn.nystrom_attention(q, k, v, { landmarks = 4, valid_lens = attn.tensor({ 5, 8 }), conv = w })
    helper.assert_close(out:reshape(4, 8, 2), formula(flat(q), flat(k), flat(v), 4, 6, "item", { 5, 5, 8, 8 }, wt, 2),
      tight)
    -- masked positions do not reach the valid ones: change them, the valid outputs stay
    local q2, k2, v2 = q:clone(), k:clone(), v:clone()
    for _, x in ipairs { q2, k2, v2 } do x:narrow(1, 1, 1):narrow(3, 6, 3):fill_(7) end
    local out2 = attn.nystrom_attention(q2, k2, v2, { landmarks = 4, valid_lens = { 5, 8 }, conv = w })
    helper.assert_close(out2:narrow(1, 1, 1):narrow(3, 1, 5), out:narrow(1, 1, 1):narrow(3, 1, 5), tight)
  end)

  it("is softmax attention at m = N once the pseudo-inverse has converged", function()
    attn.manual_seed(3)
    local q, k, v = randn(2, 8, 4), randn(2, 8, 4), randn(2, 8, 3)
    local exact = attn.dot_product_attention(q, k, v)
    helper.assert_close(attn.nystrom_attention(q, k, v, { landmarks = 8, pinv_iters = 40 }), exact, tight)
    -- 6 iterations (the default) are not there yet on these inputs: the identity is the iteration's
    local err = (attn.nystrom_attention(q, k, v, { landmarks = 8 }) - exact):abs():max():item()
    assert.is_true(err > 1e-6, "error after 6 iterations " .. err)
  end)

  it("costs nothing of size N x N: its peak memory grows linearly in N", function()
    local peaks = {}
    for i, n in ipairs { 2048, 4096 } do
      local q, k, v = attn.randn({ 1, n, 16 }), attn.randn({ 1, n, 16 }), attn.randn({ 1, n, 16 })
      collectgarbage()
      local live = attn.memory()
      attn.core.peak_memory(true)
      local _ = attn.nystrom_attention(q, k, v, { landmarks = 16 })
      peaks[i] = attn.core.peak_memory() - live
    end
    -- an N x N float32 score matrix alone would be 16 MiB at N 2048
    assert.is_true(peaks[1] < 2 * 2 ^ 20 and peaks[2] < 2.2 * peaks[1], string.format("peaks %d, %d", peaks[1], peaks[2]))
  end)
end)

describe("attn.nystrom_pinv", function()
  it("converges to the SVD's pseudo-inverse, of an invertible and of a singular row-stochastic matrix", function()
    attn.manual_seed(4)
    local A = randn(1, 5, 5):softmax(-1)
    local rows = A:totable()[1]
    rows[2] = rows[4] -- rank 4: the iteration must find the Moore-Penrose inverse, not an inverse
    for i, M in ipairs { A:select(1, 1), attn.tensor(rows, "float64") } do
      local U, S, Vt = attn.linalg.svd(M)
      local s = S:totable()
      for j = 1, #s do s[j] = s[j] > 1e-12 * s[1] and 1 / s[j] or 0 end
      local pinv = (Vt:transpose(1, 2) * attn.tensor({ s }, "float64")):matmul(U:transpose(1, 2)) -- V S^+ U^T
      local err = {}
      for t = 1, 40 do err[t] = (attn.nystrom_pinv(M:unsqueeze(1), t):squeeze(1) - pinv):abs():max():item() end
      local best = math.min(table.unpack(err))
      assert.is_true(best < 1e-11, "best error " .. best)
      if i == 2 then
        -- singular: once converged, rounding in the null space grows (about x3 a step); the
        -- paper's fixed few steps never get there
        assert.is_true(err[40] > 1e3 * best, string.format("error %g after 40 steps, best %g", err[40], best))
      else
        assert.is_true(err[40] < 1e-11, "error after 40 steps " .. err[40])
      end
    end
    local inv = attn.linalg.inv(A:select(1, 1))
    helper.assert_close(attn.nystrom_pinv(A, 60):squeeze(1), inv, { atol = 1e-9, rtol = 0 })
    -- and each step is the loops' (3 steps, not converged)
    helper.assert_close(attn.nystrom_pinv(A, 3):squeeze(1), pinv_loops(A:totable()[1], 3, max_colsum(A:totable()[1])),
      tight)
  end)
end)

describe("attn.nystrom_attention gradients and threads", function()
  it("passes finite differences in Q, K, V and the convolution, masked and not", function()
    attn.manual_seed(5)
    local p = { helper.param({ 2, 6, 3 }), helper.param({ 2, 6, 3 }), helper.param({ 2, 6, 2 }), helper.param({ 1, 1, 3, 1 }) }
    helper.gradcheck(function(a, b, c, w) return attn.nystrom_attention(a, b, c, { landmarks = 3, conv = w }) end, p)
    helper.gradcheck(function(a, b, c)
      return attn.nystrom_attention(a, b, c, { landmarks = 2, valid_lens = { 4, 6 }, pinv_init = "batch" })
    end, { p[1], p[2], p[3] })
  end)

  it("gives the same bits on 1 and 2 threads, forward and backward", function()
    local ins = { attn.randn({ 4, 256, 16 }), attn.randn({ 4, 256, 16 }), attn.randn({ 4, 256, 16 }) }
    local g = attn.randn({ 4, 256, 16 })
    helper.assert_same_bits_on_threads(function()
      local leaves = {}
      for i, x in ipairs(ins) do leaves[i] = x:clone():requires_grad_() end
      local out = attn.nystrom_attention(leaves[1], leaves[2], leaves[3], { landmarks = 16 })
      out:backward(g)
      return { out, leaves[1].grad, leaves[2].grad, leaves[3].grad }
    end)
  end)
end)

describe("attn.nystrom_attention bad input", function()
  it("names the values and shapes", function()
    local q = attn.randn({ 2, 6, 4 })
    assert.has_error(function() attn.nystrom_attention(q, q, q, { landmarks = 4 }) end,
      "nystrom_attention: sequence length N = 6 is not divisible by landmarks m = 4")
    assert.has_error(function() attn.nystrom_attention(q, q, q, { landmarks = 0 }) end,
      "nystrom_attention: landmarks must be an integer in 1..N = 6, got 0")
    assert.has_error(function() attn.nystrom_attention(q, q, q, { landmarks = 7 }) end,
      "nystrom_attention: landmarks must be an integer in 1..N = 6, got 7")
    assert.has_error(function() attn.nystrom_attention(q, q, q) end,
      "nystrom_attention: landmarks must be an integer in 1..N = 6, got nil")
    assert.has_error(function() attn.nystrom_attention(q, attn.randn({ 2, 4, 4 }), q, { landmarks = 2 }) end,
      "nystrom_attention: queries [2x6x4], keys [2x4x4] and values [2x6x4] must be (B, N, d), (B, N, d) and "
      .. "(B, N, dv): one sequence of N positions")
    assert.has_error(function() attn.nystrom_attention(q, q, q, { landmarks = 2, pinv_iters = 0 }) end,
      "nystrom_attention: pinv_iters must be a positive integer, got 0")
    assert.has_error(function() attn.nystrom_attention(q, q, q, { landmarks = 2, pinv_init = "original" }) end,
      "nystrom_attention: pinv_init must be \"item\" or \"batch\", got original")
    assert.has_error(function() attn.nystrom_attention(q, q, q, { landmarks = 2, conv = attn.randn({ 1, 1, 2, 1 }) }) end,
      "nystrom_attention: conv [1x1x2x1] must be (H, 1, ks, 1) with H = 1 heads and ks odd")
    assert.has_error(function() attn.nystrom_attention(q, q, q, { landmarks = 2, valid_lens = attn.ones({ 2, 6 }) }) end,
      "nystrom_attention: valid_lens [2x6] must be (B), one length per sequence (per-query lengths would make "
      .. "landmarks mix masked and unmasked queries)")
    assert.has_error(function() attn.nystrom_attention(q, q, q, { landmarks = 2, valid_lens = { 3 } }) end,
      "nystrom_attention: valid_lens has 1 entries for a batch of 2")
    assert.has_error(function() attn.nystrom_attention(q, q, q, { landmarks = 2, causal = true }) end)
  end)
end)
