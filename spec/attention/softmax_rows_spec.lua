-- What a softmax row means in every attention kernel (src/attention/attn_attention.h, "Softmax rows"):
-- masked keys are the only ones a kernel may leave out; a row with no key left is zero; any
-- other row is the ordinary softmax, so a row whose kept scores are all -inf (or hold NaN) is NaN
-- as `softmax` gives, and a NaN in a value whose weight underflows to 0 still reaches the output.
-- Each path is forced: the reference and the tiny heads (one block and several row blocks of 64), the flash
-- kernels, the scores kernels (masked_softmax, additive attention), forward and backward.
local attn = require "attn"
local core = attn.core
local helper = require "helper"

local NAN, INF = 0 / 0, math.huge

local function values(t) return t:reshape(t:numel()):totable() end

-- "n" for NaN, "0" for an exact zero, "f" for any other finite number, "i" for +-inf.
local function pattern(t)
  local p = {}
  for i, x in ipairs(values(t)) do
    p[i] = x ~= x and "n" or x == 0 and "0" or (x == INF or x == -INF) and "i" or "f"
  end
  return table.concat(p)
end

local function row(t, b, i) return t:select(1, b):select(1, i) end

local function with(opts, extra)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  for k, v in pairs(extra) do o[k] = v end
  return o
end

describe("softmax rows", function()
  describe("masked_softmax", function()
    for _, dtype in ipairs { "float32", "float64" } do
      it("gives NaN for a row of -inf scores, as softmax does (" .. dtype .. ")", function()
        local X = attn.tensor({ { { -INF, -INF, -INF }, { 1, 2, 3 } }, { { -INF, -INF, -INF }, { 0, 0, 0 } } }, dtype)
        local ref = attn.softmax(X, 3)
        assert.equal("nnn", pattern(row(ref, 1, 1)))
        for _, lens in ipairs { {}, { 3, 3 }, { 5, 9 }, { { 3, 3 }, { 3, 4 } } } do
          local Y = attn.masked_softmax(X, #lens > 0 and lens or nil)
          assert.equal("nnn", pattern(row(Y, 1, 1)))
          assert.equal("nnn", pattern(row(Y, 2, 1)))
          helper.assert_close(row(Y, 1, 2), row(ref, 1, 2))
          helper.assert_close(row(Y, 2, 2), { 1 / 3, 1 / 3, 1 / 3 })
        end
        -- filled keys take part (d2l's -1e6): softmax of (-inf, -inf, -1e6) is (0, 0, 1)
        helper.assert_close(row(attn.masked_softmax(X, { 2, 3 }), 1, 1), { 0, 0, 1 }, { atol = 0 })
        -- a NaN score makes its row NaN and leaves the others alone
        local Z = attn.tensor({ { { 1, NAN, 2 }, { 1, 2, 3 } } }, dtype)
        local Y = attn.masked_softmax(Z, { 3 })
        assert.equal("nnn", pattern(row(Y, 1, 1)))
        helper.assert_close(row(Y, 1, 2), row(attn.softmax(Z, 3), 1, 2))
      end)

      it("back-propagates NaN from a NaN row only (" .. dtype .. ")", function()
        local X = attn.tensor({ { { -INF, -INF, -INF }, { 1, 2, 3 } } }, dtype):requires_grad_()
        local Y = attn.masked_softmax(X, { 3 })
        ;(Y * attn.tensor({ { { 1, 2, 3 }, { 3, 1, 2 } } }, dtype)):sum():backward()
        assert.equal("nnn", pattern(row(X.grad, 1, 1)))
        assert.equal("fff", pattern(row(X.grad, 1, 2)))
      end)
    end
  end)

  -- Scores of query 3 overflow to -inf (finite operands, so the flash kernels run too); every
  -- other query has ordinary scores. Key 5 is removed for query 3 by the keep-mask.
  local function overflow_inputs(dtype, Nq, Nk)
    local big, small = dtype == "float32" and 1e30 or 1e300, 1e10
    attn.manual_seed(3)
    local Q, K, V = attn.randn({ 1, Nq, 3 }, dtype), attn.randn({ 1, Nk, 3 }, dtype), attn.randn({ 1, Nk, 2 }, dtype)
    for i = 1, Nq do Q:set(0, 1, i, 1) end
    Q:set(big, 1, 3, 1)
    for j = 1, Nk do K:set(-small, 1, j, 1) end
    local mask = attn.ones({ 1, Nq, Nk }, dtype)
    mask:set(0, 1, 3, 5)
    return Q, K, V, mask
  end

  -- The bad row: NaN weights on its kept keys, exactly 0 on the removed ones, NaN output; the
  -- other rows finite.
  local function assert_bad_row(out, w, Nq, Nk, removed)
    local expect = {}
    for j = 1, Nk do expect[j] = removed[j] and "0" or "n" end
    assert.equal(table.concat(expect), pattern(row(w, 1, 3)))
    assert.equal("nn", pattern(row(out, 1, 3)))
    for i = 1, Nq do
      if i ~= 3 then assert.is_falsy(pattern(row(out, 1, i)):find("[ni]"), "row " .. i .. " is finite") end
    end
  end

  for _, dtype in ipairs { "float32", "float64" } do
    for _, size in ipairs { { 6, 8 }, { 130, 70 } } do -- one row block, three row blocks
      for _, kernel in ipairs { "reference", "tiny" } do
        local Nq, Nk = size[1], size[2]
        it(string.format("dot-product %s: a row of -inf scores is NaN (%s, Nq %d)", kernel, dtype, Nq), function()
          local Q, K, V, mask = overflow_inputs(dtype, Nq, Nk)
          for _, o in ipairs { { mask = mask }, { mask = mask, valid_lens = { Nk } }, { causal = true } } do
            local opts = with(o, { kernel = kernel })
            local out, w = core.sdpa_forward(Q, K, V, opts)
            local removed = {}
            for j = 1, Nk do removed[j] = (o.mask and j == 5) or (o.causal and j > 3) end
            assert_bad_row(out, w, Nq, Nk, removed)
            -- backward: NaN only where the bad row reaches
            local dq, _, dv = core.sdpa_backward(Q, K, V, opts, attn.ones({ 1, Nq, 2 }, dtype))
            assert.equal("nnn", pattern(row(dq, 1, 3)))
            assert.is_falsy(pattern(row(dq, 1, 1)):find("[ni]"))
            if o.causal then assert.is_falsy(pattern(row(dv, 1, Nk)):find("[ni]")) end
          end
        end)
      end
    end
  end

  for _, kernel in ipairs(helper.flash_kernels()) do
    it("flash (" .. kernel .. "): a row whose scores overflow to -inf is NaN like the reference", function()
      local Nq, Nk = 70, 140
      local Q, K, V, mask = overflow_inputs("float32", Nq, Nk)
      for _, o in ipairs { { mask = mask }, { mask = mask, valid_lens = { Nk } }, {} } do
        local ref = with(o, { kernel = "reference" })
        local r_out, r_w = core.sdpa_forward(Q, K, V, ref)
        local out, w, _, lse = core.sdpa_forward(Q, K, V, with(o, { kernel = kernel }))
        assert.equal(pattern(r_w), pattern(w))
        assert.equal(pattern(r_out), pattern(out))
        assert_bad_row(out, w, Nq, Nk, { [5] = o.mask ~= nil })
        -- a row without a finite softmax sends the call to the reference path, which owns the
        -- NaN rules: no log-sum-exp, and the backward runs there too
        assert.is_nil(lse)
        local dout = attn.ones { 1, Nq, 2 }
        local dq = core.sdpa_backward(Q, K, V, with(o, { kernel = kernel }), dout, nil, nil, nil, out, lse)
        local rq = core.sdpa_backward(Q, K, V, ref, dout)
        assert.equal(pattern(rq), pattern(dq))
        assert.equal("nnn", pattern(row(dq, 1, 3)))
      end
      -- filled keys take part: with all unfilled scores -inf they share the weight (finite row)
      local _, w, _, lse = core.sdpa_forward(Q, K, V, { valid_lens = { 100 }, kernel = kernel })
      assert.is_not_nil(lse, "every row finite: the flash kernel's result stands")
      local expect = string.rep("0", 100) .. string.rep("f", 40)
      assert.equal(expect, pattern(row(w, 1, 3)))
      helper.assert_close(row(w, 1, 3):narrow(1, 101, 40), attn.full({ 40 }, 1 / 40), { rtol = 1e-5 })
    end)
  end

  for _, dtype in ipairs { "float32", "float64" } do
    it("a NaN value whose weight underflows to 0 reaches the output (" .. dtype .. ")", function()
      -- key 1 dominates every row: the weights of keys 2.. underflow to exactly 0
      local Nq, Nk = 130, 6
      local Q, K, V = attn.zeros({ 1, Nq, 2 }, dtype), attn.zeros({ 1, Nk, 2 }, dtype), attn.ones({ 1, Nk, 2 }, dtype)
      for i = 1, Nq do Q:set(100, 1, i, 1) end
      K:set(100, 1, 1, 1)
      for j = 2, Nk do K:set(-100, 1, j, 1) end
      V:set(NAN, 1, 3, 2)
      for _, kernel in ipairs { "reference", "auto" } do
        local out, w = core.sdpa_forward(Q, K, V, { causal = true, kernel = kernel })
        assert.equal("f00000", pattern(row(w, 1, 4)))
        assert.equal("ff", pattern(row(out, 1, 2))) -- key 3 is masked (causal) for query 2
        for _, i in ipairs { 3, 4, 64, 65, 130 } do assert.equal("fn", pattern(row(out, 1, i))) end
        -- without the causal mask every row sees key 3
        local all = core.sdpa_forward(Q, K, V, { kernel = kernel })
        assert.equal("fn", pattern(row(all, 1, 1)))
        -- through autograd: dQ is NaN where the value is seen (0 * NaN in dL/dweights), finite before
        local q = Q:clone():requires_grad_()
        local o2 = attn.dot_product_attention(q, K, V, { causal = true })
        o2:narrow(3, 1, 1):sum():backward()
        assert.equal("00", pattern(row(q.grad, 1, 2)))
        assert.is_truthy(pattern(row(q.grad, 1, 3)):find("n"))
      end
      -- a NaN in the output's gradient reaches dV of every key its row sees, masked keys excepted
      local P = attn.randn({ 1, 4, 2 }, dtype)
      local dout = attn.ones({ 1, 4, 2 }, dtype)
      dout:set(NAN, 1, 2, 1)
      local _, _, dv = core.sdpa_backward(P, P, P, { causal = true, kernel = "reference" }, dout)
      assert.equal("nfnf", pattern(dv:narrow(2, 1, 2)))
      assert.equal("ffff", pattern(dv:narrow(2, 3, 2)))
    end)

    it("scores kernels: -inf rows are NaN and zero weights do not hide NaN values (" .. dtype .. ")", function()
      local S = attn.tensor({ { { -INF, -INF, -INF }, { 500, -500, -500 } } }, dtype)
      local V = attn.tensor({ { { 1, 2 }, { 3, NAN }, { 5, 6 } } }, dtype)
      local out, w = core.scores_attention_forward(S, V, {})
      assert.equal("nnn", pattern(row(w, 1, 1)))
      assert.equal("nn", pattern(row(out, 1, 1)))
      assert.equal("f00", pattern(row(w, 1, 2)))
      assert.equal("fn", pattern(row(out, 1, 2)))
      -- key 2 removed for every query: never read
      local m = attn.tensor({ 1, 0, 1 }, dtype)
      local out2 = core.scores_attention_forward(S, V, { mask = m })
      assert.equal("ff", pattern(row(out2, 1, 2)))
      -- every key removed: zeros, not NaN
      local out3, w3 = core.scores_attention_forward(S, V, { mask = attn.zeros({ 3 }, dtype) })
      assert.equal("000", pattern(row(w3, 1, 1)))
      assert.equal("0000", pattern(out3))
    end)

    it("additive scores: a zero gradient does not hide a NaN in the projections (" .. dtype .. ")", function()
      local Qh, Kh, w_v = attn.randn({ 1, 2, 3 }, dtype), attn.randn({ 1, 4, 3 }, dtype), attn.randn({ 3 }, dtype)
      Qh:set(NAN, 1, 1, 2)
      local g = attn.ones({ 1, 2, 4 }, dtype)
      for j = 1, 4 do g:set(0, 1, 1, j) end -- no gradient reaches query 1's scores
      local dq, dk = core.additive_scores_backward(Qh, Kh, w_v, g)
      assert.equal("0n0", pattern(row(dq, 1, 1))) -- 0 * (1 - tanh(NaN)^2) = NaN, as autograd gives
      assert.equal("fff", pattern(row(dq, 1, 2)))
      assert.is_truthy(pattern(dk):find("n"))
      -- finite projections: the zero-gradient pairs are skipped and contribute exactly 0
      Qh:set(0.5, 1, 1, 2)
      local dq2 = core.additive_scores_backward(Qh, Kh, w_v, g)
      assert.equal("000", pattern(row(dq2, 1, 1)))
    end)
  end
end)
