-- The saved-for-backward contract of the fused ops (src/core/attn_saved.h): each forward hands back a
-- table of named views of one buffer, with the shapes its C layout function documents; the
-- parts hold what the names say (checked against naive loops and the forward's own outputs);
-- a backward given a part of another shape raises naming the part and both shapes.
local attn = require "attn"
local helper = require "helper"
local core = attn.core
local linear = require "attn.nn.linear"

-- Entry (indices 1-based) of a tensor as a Lua number.
local function at(t, ...) return t[{ ... }] end

-- The shapes of the table's parts (its tensor fields but the flat buffer and what rides along in
-- another dtype: flash's lse, the loss's index), by name; each part is a view of saved.buffer.
local function shapes(saved)
  local out, n = {}, 0
  for k, v in pairs(saved) do
    if attn.is_tensor(v) and k ~= "buffer" and k ~= "lse" and k ~= "index" then
      out[k], n = v:shape(), n + v:numel()
    end
  end
  assert.are.equal(saved.buffer:numel(), n) -- the parts tile the buffer
  return out
end

-- A shallow copy of saved with part `name` replaced.
local function with_part(saved, name, t)
  local copy = {}
  for k, v in pairs(saved) do copy[k] = v end
  copy[name] = t
  return copy
end

-- tanh in double (Lua 5.4's math has none without the compatibility build)
local function tanh(x)
  local e = math.exp(-2 * math.abs(x))
  local t = (1 - e) / (1 + e)
  return x < 0 and -t or t
end

local function raises(pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok)
  assert.matches(pattern, tostring(err), 1, true)
end

describe("saved buffers of the fused ops", function()
  it("additive attention: qh, kh, scores with the documented shapes and values", function()
    local B, Nq, Nk, q, k, dv, h = 2, 3, 4, 5, 6, 3, 7
    local Q, K, V = attn.randn({ B, Nq, q }, "float64"), attn.randn({ B, Nk, k }, "float64"),
        attn.randn({ B, Nk, dv }, "float64")
    local Wq, Wk, wv = attn.randn({ h, q }, "float64"), attn.randn({ h, k }, "float64"), attn.randn({ 1, h }, "float64")
    local _, _, _, saved = core.additive_layer_forward(Q, K, V, Wq, Wk, wv, {})
    assert.are.same({ qh = { B, Nq, h }, kh = { B, Nk, h }, scores = { B, Nq, Nk } }, shapes(saved))
    -- by loops: qh = Q Wq^T, scores = w_v . tanh(qh_i + kh_j)
    for b = 1, B do
      for i = 1, Nq do
        for c = 1, h do
          local s = 0
          for d = 1, q do s = s + at(Q, b, i, d) * at(Wq, c, d) end
          assert.is_true(math.abs(at(saved.qh, b, i, c) - s) < 1e-12)
        end
        for j = 1, Nk do
          local s = 0
          for c = 1, h do s = s + at(wv, 1, c) * tanh(at(saved.qh, b, i, c) + at(saved.kh, b, j, c)) end
          assert.is_true(math.abs(at(saved.scores, b, i, j) - s) < 1e-12)
        end
      end
    end
    assert.are.equal(saved, core.additive_layer_saved(saved, Q, K, Wq))
    raises("projected_additive_attention backward: saved part kh is [2x4x6], expected [2x4x7] from the operands",
      core.additive_layer_saved, with_part(saved, "kh", attn.zeros({ B, Nk, 6 }, "float64")), Q, K, Wq)
    raises("projected_additive_attention backward: saved part kh is [2x4x7], expected [2x5x7]",
      core.additive_layer_saved, saved, Q, attn.zeros({ B, 5, k }, "float64"), Wq)
    raises("projected_additive_attention backward: saved part qh is not the forward's", core.additive_layer_saved,
      with_part(saved, "qh", saved.qh:clone()), Q, K, Wq)
    raises("projected_additive_attention backward: saved must be the forward's table of parts, got a userdata",
      core.additive_layer_saved, saved.qh, Q, K, Wq)
  end)

  it("multi-head attention: qh, kh, vh, ctx, merged, and which path ran", function()
    local B, Nq, Nk, q, k, v, h, H = 2, 3, 4, 5, 6, 3, 8, 2
    local dh = h // H
    local Q, K, V = attn.randn({ B, Nq, q }, "float64"), attn.randn({ B, Nk, k }, "float64"),
        attn.randn({ B, Nk, v }, "float64")
    local p = { W_q = attn.randn({ h, q }, "float64"), W_k = attn.randn({ h, k }, "float64"),
      W_v = attn.randn({ h, v }, "float64"), W_o = attn.randn({ h, h }, "float64"), b_q = attn.randn({ h }, "float64") }
    local _, _, _, saved = core.mha_forward(Q, K, V, H, p, {})
    assert.are.same({ qh = { B * H, Nq, dh }, kh = { B * H, Nk, dh }, vh = { B * H, Nk, dh }, ctx = { B * H, Nq, dh },
      merged = { B * Nq, h } }, shapes(saved))
    assert.is_false(saved.flash) -- float64: the reference path, and no lse
    assert.is_nil(saved.lse)
    -- qh row b*H + j holds head j of sample b: (Q W_q^T + b_q) columns j*dh+1 .. (j+1)*dh; merged
    -- is ctx's heads side by side
    for b = 1, B do
      for j = 1, H do
        for i = 1, Nq do
          for c = 1, dh do
            local s = at(p.b_q, (j - 1) * dh + c)
            for d = 1, q do s = s + at(Q, b, i, d) * at(p.W_q, (j - 1) * dh + c, d) end
            assert.is_true(math.abs(at(saved.qh, (b - 1) * H + j, i, c) - s) < 1e-12)
            assert.are.equal(at(saved.ctx, (b - 1) * H + j, i, c), at(saved.merged, (b - 1) * Nq + i, (j - 1) * dh + c))
          end
        end
      end
    end
    assert.are.equal(saved, core.mha_saved(saved, Q, K, H, p.W_q))
    raises("multi_head_attention backward: saved part vh is [4x4x2], expected [4x4x4] from the operands",
      core.mha_saved, with_part(saved, "vh", attn.zeros({ B * H, Nk, 2 }, "float64")), Q, K, H, p.W_q)
    raises("multi_head_attention backward: saved part qh is [4x3x4], expected [8x3x2]", core.mha_saved, saved, Q, K,
      4, p.W_q)
    -- float32 over one flash tile: the flash kernel ran, and its row statistics ride along
    local Q32, K32 = attn.randn({ 1, 64, 8 }), attn.randn({ 1, 64, 8 })
    local p32 = { W_q = attn.randn({ 8, 8 }), W_k = attn.randn({ 8, 8 }), W_v = attn.randn({ 8, 8 }),
      W_o = attn.randn({ 8, 8 }) }
    local _, _, _, s32 = core.mha_forward(Q32, K32, K32, 2, p32, {})
    assert.is_true(s32.flash)
    assert.are.same({ 2, 64 }, s32.lse:shape())
    local _, _, _, sref = core.mha_forward(Q32, K32, K32, 2, p32, { kernel = "reference" })
    assert.is_false(sref.flash)
    assert.is_nil(sref.lse)
  end)

  it("GRU: hs, rz, n, ghn per layer with the documented shapes and states", function()
    local T, B, I, H, L = 4, 3, 5, 6, 2
    local x, h0 = attn.randn({ T, B, I }, "float64"), attn.randn({ L, B, H }, "float64")
    local params = {}
    for l = 1, L do
      params[#params + 1] = attn.randn({ 3 * H, l == 1 and I or H }, "float64")
      params[#params + 1] = attn.randn({ 3 * H, H }, "float64")
      params[#params + 1] = attn.randn({ 3 * H }, "float64")
      params[#params + 1] = false
    end
    local out, hn, saved, seed = core.gru_forward(x, h0, params, 0)
    assert.are.same({ hs = { L, T + 1, B, H }, rz = { L, T, B, 2 * H }, n = { L, T, B, H }, ghn = { L, T, B, H } },
      shapes(saved))
    -- hs[k] runs from h0[k] to hn[k]; the top layer's states are the output; r, z are sigmoids
    for l = 1, L do
      helper.assert_identical(saved.hs[l][1], h0[l])
      helper.assert_identical(saved.hs[l][T + 1], hn[l])
    end
    for t = 1, T do helper.assert_identical(saved.hs[L][t + 1], out[t]) end
    assert.is_true(saved.rz:min():item() > 0 and saved.rz:max():item() < 1)
    local dout = attn.ones({ T, B, H }, "float64")
    local dx = core.gru_backward(x, h0, params, 0, seed, saved, dout)
    assert.are.same({ T, B, I }, dx:shape())
    raises("gru backward: saved part rz is [2x4x3x6], expected [2x4x3x12] from the operands", core.gru_backward, x,
      h0, params, 0, seed, with_part(saved, "rz", attn.zeros({ L, T, B, H }, "float64")), dout)
    raises("gru backward: saved part hs is [2x5x3x6], expected [2x4x3x6]", core.gru_backward, x:narrow(1, 1, 3), h0,
      params, 0, seed, saved)
    raises("gru backward: saved part ghn must be a tensor, got a nil", core.gru_backward, x, h0, params, 0, seed,
      with_part(saved, "ghn", nil), dout)
  end)

  it("LSTM: hs, cs, gates, tc per layer with the documented shapes, states and cells", function()
    local T, B, I, H, L = 4, 3, 5, 6, 2
    local x, h0, c0 = attn.randn({ T, B, I }, "float64"), attn.randn({ L, B, H }, "float64"),
        attn.randn({ L, B, H }, "float64")
    local params = {}
    for l = 1, L do
      params[#params + 1] = attn.randn({ 4 * H, l == 1 and I or H }, "float64")
      params[#params + 1] = attn.randn({ 4 * H, H }, "float64")
      params[#params + 1] = false
      params[#params + 1] = attn.randn({ 4 * H }, "float64")
    end
    local out, hn, cn, saved, seed = core.lstm_forward(x, h0, c0, params, 0)
    assert.are.same({ hs = { L, T + 1, B, H }, cs = { L, T + 1, B, H }, gates = { L, T, B, 4 * H },
      tc = { L, T, B, H } }, shapes(saved))
    -- hs[k] runs from h0[k] to hn[k], cs[k] from c0[k] to cn[k]; tc = tanh(c); h = o * tc
    for l = 1, L do
      helper.assert_identical(saved.hs[l][1], h0[l])
      helper.assert_identical(saved.hs[l][T + 1], hn[l])
      helper.assert_identical(saved.cs[l][1], c0[l])
      helper.assert_identical(saved.cs[l][T + 1], cn[l])
    end
    for t = 1, T do helper.assert_identical(saved.hs[L][t + 1], out[t]) end
    local c, o = at(saved.cs, 2, 3, 1, 4), at(saved.gates, 2, 2, 1, 3 * H + 4)
    assert.is_true(math.abs(at(saved.tc, 2, 2, 1, 4) - tanh(c)) < 1e-15)
    assert.is_true(math.abs(at(saved.hs, 2, 3, 1, 4) - o * at(saved.tc, 2, 2, 1, 4)) < 1e-15)
    local dout = attn.ones({ T, B, H }, "float64")
    local dx = core.lstm_backward(x, h0, c0, params, 0, seed, saved, dout)
    assert.are.same({ T, B, I }, dx:shape())
    raises("lstm backward: saved part gates is [2x4x3x6], expected [2x4x3x24] from the operands", core.lstm_backward,
      x, h0, c0, params, 0, seed, with_part(saved, "gates", attn.zeros({ L, T, B, H }, "float64")), dout)
    raises("lstm backward: saved part tc must be a tensor, got a nil", core.lstm_backward, x, h0, c0, params, 0, seed,
      with_part(saved, "tc", nil), dout)
  end)

  it("Bahdanau decoder: the attention's and the GRU's parts with the documented shapes", function()
    local B, Nk, dv, e, H, ha, T, L = 2, 5, 4, 3, 6, 7, 4, 2
    local W_k, values, emb = attn.randn({ ha, dv }, "float64"), attn.randn({ B, Nk, dv }, "float64"),
        attn.randn({ T, B, e }, "float64")
    local h0, W_q, w_v = attn.randn({ L, B, H }, "float64"), attn.randn({ ha, H }, "float64"),
        attn.randn({ 1, ha }, "float64")
    local params = {}
    for l = 1, L do
      params[#params + 1] = attn.randn({ 3 * H, l == 1 and dv + e or H }, "float64")
      params[#params + 1] = attn.randn({ 3 * H, H }, "float64")
      params[#params + 1] = false
      params[#params + 1] = attn.randn({ 3 * H }, "float64")
    end
    local out, hn, weights, saved, seed = core.decoder_forward(W_k, values, nil, emb, h0, W_q, w_v, params, 0, 0)
    assert.are.same({ kh = { B, Nk, ha }, qh = { T, B, ha }, scores = { T, B, Nk }, weights = { T, B, Nk },
      ctx = { T, B, dv }, hs = { L, T + 1, B, H }, rz = { L, T, B, 2 * H }, n = { L, T, B, H }, ghn = { L, T, B, H } },
      shapes(saved))
    for b = 1, B do
      for t = 1, T do
        helper.assert_identical(saved.weights[t][b], weights[b][t]) -- time-major here, batch-major out
        helper.assert_identical(saved.hs[L][t + 1][b], out[b][t])
      end
    end
    for l = 1, L do helper.assert_identical(saved.hs[l][T + 1], hn[l]) end
    -- kh = values W_k^T, by loops
    for c = 1, ha do
      local s = 0
      for d = 1, dv do s = s + at(values, 2, 3, d) * at(W_k, c, d) end
      assert.is_true(math.abs(at(saved.kh, 2, 3, c) - s) < 1e-12)
    end
    local function back(s, ...)
      return core.decoder_backward(W_k, values, nil, emb, h0, W_q, w_v, params, 0, 0, seed, s, ...)
    end
    assert.are.same({ ha, dv }, (back(saved, attn.ones({ B, T, H }, "float64"))):shape())
    raises("attention_decoder backward: saved part ctx is [4x2x3], expected [4x2x4] from the operands", back,
      with_part(saved, "ctx", attn.zeros({ T, B, 3 }, "float64")))
    raises("attention_decoder backward: saved part kh is not the forward's", back,
      with_part(saved, "kh", saved.kh:clone()))
    raises("attention_decoder backward: saved part qh is not the forward's", back,
      with_part(saved, "qh", saved.qh:to("float32")))
  end)

  it("LayerNorm and AddNorm: mean and rstd per row, float64 for a float32 input", function()
    local rows, n, eps = 6, 5, 1e-5
    local x, w, b = attn.randn({ 2, 3, n }), attn.randn({ n }), attn.randn({ n })
    local y, saved = core.layer_norm_forward(x, n, w, b, eps)
    assert.are.same({ mean = { rows }, rstd = { rows } }, shapes(saved))
    assert.are.equal("float64", saved.buffer:dtype())
    assert.are.equal("float64", saved.mean:dtype())
    -- by loops in double over the float32 entries: the mean, 1 / sqrt(biased variance + eps), y
    local x2, y2 = x:reshape({ rows, n }), y:reshape({ rows, n })
    for r = 1, rows do
      local mu, var = 0, 0
      for j = 1, n do mu = mu + at(x2, r, j) end
      mu = mu / n
      for j = 1, n do var = var + (at(x2, r, j) - mu) ^ 2 end
      local rs = 1 / math.sqrt(var / n + eps)
      assert.is_true(math.abs(at(saved.mean, r) - mu) < 1e-14)
      assert.is_true(math.abs(at(saved.rstd, r) - rs) < 1e-12 * rs)
      for j = 1, n do
        local want = (at(x2, r, j) - at(saved.mean, r)) * at(saved.rstd, r) * at(w, j) + at(b, j)
        assert.is_true(math.abs(at(y2, r, j) - want) < 1e-5 * (1 + math.abs(want)))
      end
    end
    local dout = attn.randn({ 2, 3, n })
    local dx = core.layer_norm_backward(x, n, w, saved, dout, false)
    assert.are.same({ 2, 3, n }, dx:shape())
    raises("layer_norm backward: saved part mean is [7], expected [6] from the operands", core.layer_norm_backward, x,
      n, w, with_part(saved, "mean", attn.zeros({ rows + 1 }, "float64")), dout, false)
    raises("layer_norm backward: saved part mean is [6], expected [4] from the operands", core.layer_norm_backward,
      attn.randn({ 4, n }), n, w, saved, attn.randn({ 4, n }), false)
    raises("layer_norm backward: saved part rstd is not the forward's (a contiguous float64 block of saved.buffer)",
      core.layer_norm_backward, x, n, w, with_part(saved, "rstd", saved.rstd:clone()), dout, false)
    raises("layer_norm backward: saved part rstd must be a tensor, got a nil", core.layer_norm_backward, x, n, w,
      with_part(saved, "rstd", nil), dout, false)
    -- AddNorm's node saves the same parts for the sum: its numbers are layer_norm's of dropout(y) + x
    local a, c = attn.randn({ 4, n }, "float64"), attn.randn({ 4, n }, "float64")
    local z = linear.add_layer_norm(a, c, 0, false, n, nil, nil, eps)
    local z_ref, s_ref = core.layer_norm_forward(a + c, n, nil, nil, eps)
    helper.assert_identical(z_ref, z)
    assert.are.same({ mean = { 4 }, rstd = { 4 } }, shapes(s_ref))
  end)

  it("softmax cross-entropy: stats (R, 2) per row, the ids riding along", function()
    local B, T, C = 2, 3, 5
    local x = attn.randn({ B, T, C }, "float64")
    local labels = attn.tensor({ { 1, 5, 2 }, { 3, 3, 4 } }, "int64")
    local loss, saved, count = core.softmax_ce_forward(x, labels, nil, nil, "ce")
    assert.are.same({ stats = { B * T, 2 } }, shapes(saved))
    assert.are.equal(B * T, count)
    assert.are.equal("int64", saved.index:dtype())
    helper.assert_identical(labels - 1, saved.index) -- 0-based ids in labels' shape
    -- by loops: m the row max, s = log sum exp(x - m), loss = s - (x[y] - m)
    for b = 1, B do
      for t = 1, T do
        local r, m, sum = (b - 1) * T + t, -math.huge, 0
        for c = 1, C do m = math.max(m, at(x, b, t, c)) end
        for c = 1, C do sum = sum + math.exp(at(x, b, t, c) - m) end
        assert.are.equal(m, at(saved.stats, r, 1))
        assert.is_true(math.abs(at(saved.stats, r, 2) - math.log(sum)) < 1e-12)
        local want = math.log(sum) - (at(x, b, t, at(labels, b, t)) - m)
        assert.is_true(math.abs(at(loss, b, t) - want) < 1e-12)
      end
    end
    local dloss = attn.ones({ B, T }, "float64")
    assert.are.same({ B, T, C }, core.softmax_ce_backward(x, nil, nil, saved, dloss):shape())
    raises("softmax_ce_backward: saved part stats is [7x2], expected [6x2] from the operands",
      core.softmax_ce_backward, x, nil, nil, with_part(saved, "stats", attn.zeros({ 7, 2 }, "float64")), dloss)
    raises("softmax_ce_backward: saved part stats is [6x2], expected [4x2] from the operands",
      core.softmax_ce_backward, attn.randn({ 4, C }, "float64"), nil, nil, saved, attn.ones({ 4 }, "float64"))
    raises("softmax_ce_backward: saved part stats is not the forward's", core.softmax_ce_backward, x, nil, nil,
      with_part(saved, "stats", saved.stats:clone()), dloss)
    raises("softmax_ce_backward: saved index must be a tensor, got a nil", core.softmax_ce_backward, x, nil, nil,
      with_part(saved, "index", nil), dloss)
  end)

  describe("the lazy table (views made on first read)", function()
    local B, Nq, Nk, q, k, dv, h = 2, 3, 4, 5, 6, 3, 7
    local function operands()
      attn.manual_seed(7)
      return attn.randn({ B, Nq, q }, "float64"), attn.randn({ B, Nk, k }, "float64"),
          attn.randn({ B, Nk, dv }, "float64"), attn.randn({ h, q }, "float64"), attn.randn({ h, k }, "float64"),
          attn.randn({ 1, h }, "float64")
    end
    -- qh by loops: Q W_q^T
    local function qh_by_loops(Q, Wq)
      local out = attn.zeros({ B, Nq, h }, "float64")
      for b = 1, B do
        for i = 1, Nq do
          for c = 1, h do
            local s = 0
            for d = 1, q do s = s + at(Q, b, i, d) * at(Wq, c, d) end
            out[{ b, i, c }] = s
          end
        end
      end
      return out
    end

    it("holds no part until one is read; pairs lists the parts and buffer only", function()
      local Q, K, V, Wq, Wk, wv = operands()
      local _, _, _, saved = core.additive_layer_forward(Q, K, V, Wq, Wk, wv, {})
      assert.is_nil(rawget(saved, "qh"))
      assert.is_nil(rawget(saved, "kh"))
      -- the backward's check of unread parts makes none either
      assert.are.equal(saved, core.additive_layer_saved(saved, Q, K, Wq))
      assert.is_nil(rawget(saved, "scores"))
      local qh = saved.qh
      assert.are.equal(qh, rawget(saved, "qh")) -- stored: a second read is the same view
      assert.are.equal(qh, saved.qh)
      assert.is_nil(rawget(saved, "kh"))
      helper.assert_close(qh, qh_by_loops(Q, Wq), { atol = 1e-12, rtol = 0 })
      assert.is_nil(saved.nothing)
      assert.is_nil(saved[1])
      local keys = {}
      for key, v in pairs(saved) do
        assert.are.equal("string", type(key)) -- (the state's field is left out)
        assert.is_true(attn.is_tensor(v))
        keys[#keys + 1] = key
      end
      table.sort(keys)
      assert.are.same({ "buffer", "kh", "qh", "scores" }, keys)
    end)

    it("a backward over parts nobody read before it gives the composed path's gradients", function()
      local function grads(composed)
        local Q, K, V, Wq, Wk, wv = operands()
        for _, t in ipairs({ Q, K, V, Wq, Wk, wv }) do t:requires_grad_() end
        local opts = { valid_lens = { 2, 4 } }
        local out
        if composed then -- the projections as matmuls, then the functional additive attention
          out = attn.additive_attention(Q:matmul(Wq:t()), K:matmul(Wk:t()), V, wv:reshape({ h }), opts)
        else
          out = attn.projected_additive_attention(Q, K, V, Wq, Wk, wv, opts)
        end
        out:sum():backward()
        return { Q.grad, K.grad, V.grad, Wq.grad, Wk.grad, wv.grad }
      end
      local fused_grads, composed = grads(false), grads(true)
      for i = 1, #fused_grads do helper.assert_close(fused_grads[i], composed[i], { atol = 1e-10, rtol = 1e-10 }) end
      -- the GRU's C backward reads the buffer through unread parts: the same dx as after pairs
      local T, Bg, I, H = 3, 2, 4, 5
      local x, h0 = attn.randn({ T, Bg, I }, "float64"), attn.randn({ 1, Bg, H }, "float64")
      local params = { attn.randn({ 3 * H, I }, "float64"), attn.randn({ 3 * H, H }, "float64"),
        attn.randn({ 3 * H }, "float64"), false }
      local dout = attn.randn({ T, Bg, H }, "float64")
      local _, _, s1, seed1 = core.gru_forward(x, h0, params, 0)
      local _, _, s2, seed2 = core.gru_forward(x, h0, params, 0)
      for _ in pairs(s2) do end
      assert.is_nil(rawget(s1, "hs"))
      helper.assert_identical(core.gru_backward(x, h0, params, 0, seed2, s2, dout),
        core.gru_backward(x, h0, params, 0, seed1, s1, dout))
    end)

    it("parts are views of the forward's buffer, which they and the table keep alive", function()
      local Q, K, V, Wq, Wk, wv = operands()
      local _, _, _, saved = core.additive_layer_forward(Q, K, V, Wq, Wk, wv, {})
      local want = qh_by_loops(Q, Wq)
      local kh = saved.kh
      local kh_values = kh:clone()
      -- a reassigned buffer: parts read later are still the forward's, and the backward refuses
      -- the table (its parts are not blocks of the new buffer), read or not, as an eager one did
      saved.buffer = attn.zeros({ saved.buffer:numel() }, "float64")
      collectgarbage("collect")
      collectgarbage("collect")
      helper.assert_close(saved.qh, want, { atol = 1e-12, rtol = 0 })
      helper.assert_identical(kh_values, kh)
      raises("projected_additive_attention backward: saved part qh is not the forward's", core.additive_layer_saved,
        saved, Q, K, Wq)
      local _, _, _, fresh = core.additive_layer_forward(Q, K, V, Wq, Wk, wv, {})
      fresh.buffer = fresh.buffer:clone() -- no part read yet
      raises("projected_additive_attention backward: saved part qh is not the forward's", core.additive_layer_saved,
        fresh, Q, K, Wq)
      fresh.buffer = nil
      raises("projected_additive_attention backward: saved field buffer must be a tensor, got a nil",
        core.additive_layer_saved, fresh, Q, K, Wq)
      -- a part read and the table dropped: the view alone keeps the storage
      local _, _, _, other = core.additive_layer_forward(Q, K, V, Wq, Wk, wv, {})
      local qh = other.qh
      other = nil -- luacheck: ignore 311
      collectgarbage("collect")
      collectgarbage("collect")
      attn.zeros({ B * Nq * h * 4 }, "float64") -- (a freed block would be reused here)
      helper.assert_close(qh, want, { atol = 1e-12, rtol = 0 })
      -- a replaced part is checked as before
      fresh = select(4, core.additive_layer_forward(Q, K, V, Wq, Wk, wv, {}))
      fresh.kh = fresh.kh:clone()
      raises("projected_additive_attention backward: saved part kh is not the forward's", core.additive_layer_saved,
        fresh, Q, K, Wq)
    end)
  end)
end)
