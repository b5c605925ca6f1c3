-- The flash kernels of dot-product attention against the blocked sgemm reference path (the
-- kernel option picks one; the reference itself is checked against naive loops in
-- dot_product_attention_spec.lua): every mask kind, odd sizes, strided operands, weights on and
-- off, dropout, each instruction set this CPU runs, and thread-count independence.
local attn = require "attn"
local core = attn.core
local helper = require "helper"

local copy = helper.with

-- max |a - b| / max |b|: the 1e-5 relative bound of the issue, over a whole tensor.
local function assert_rel(a, b, what, tol)
  local scale = math.max(b:abs():max():item(), 1e-30)
  local err = (a - b):abs():max():item() / scale
  assert(err <= (tol or 1e-5), string.format("%s: relative error %.3g", what, err))
end

-- Forward and backward through `kernel` against the reference on the same inputs.
local function compare(q, k, v, opts, kernel)
  local ref, flash = copy(opts, { kernel = "reference" }), copy(opts, { kernel = kernel })
  local r_out, r_w = core.sdpa_forward(q, k, v, ref)
  local f_out, f_w, _, lse = core.sdpa_forward(q, k, v, flash)
  assert(lse ~= nil, "the flash path ran and returned the log-sum-exp")
  assert_rel(f_out, r_out, kernel .. " out")
  if opts.need_weights ~= false then assert_rel(f_w, r_w, kernel .. " weights") end
  local dout = attn.randn(f_out:size())
  local rq, rk, rv = core.sdpa_backward(q, k, v, ref, dout, nil, nil)
  local fq, fk, fv = core.sdpa_backward(q, k, v, flash, dout, nil, nil, nil, f_out, lse)
  assert_rel(fq, rq, kernel .. " dq")
  assert_rel(fk, rk, kernel .. " dk")
  assert_rel(fv, rv, kernel .. " dv")
end

local function inputs(B, Nq, Nk, d, dv)
  return attn.randn { B, Nq, d }, attn.randn { B, Nk, d }, attn.randn { B, Nk, dv }
end

describe("flash dot-product attention", function()
  before_each(function() attn.manual_seed(7) end)

  local cases = {
    { "no mask, sizes off the 64 tile", { 3, 70, 133, 17, 9 }, {} },
    { "causal", { 2, 130, 130, 64, 64 }, { causal = true } },
    { "causal with more keys than queries", { 2, 40, 150, 8, 8 }, { causal = true } },
    { "window", { 2, 100, 90, 8, 5 }, { window = 7 } },
    { "window with causal", { 2, 150, 150, 16, 4 }, { window = 70, causal = true } },
    { "1-D valid_lens with a zero length (uniform row)", { 2, 65, 200, 8, 5 }, { valid_lens = { 0, 150 } } },
    { "2-D valid_lens", { 2, 3, 70, 8, 5 }, { valid_lens = { { 1, 70, 0 }, { 65, 64, 2 } } } },
    { "valid_lens with causal", { 2, 80, 80, 8, 8 }, { valid_lens = { 10, 0 }, causal = true } },
    { "need_weights off", { 2, 90, 77, 32, 16 }, { need_weights = false } },
    { "dropout", { 2, 65, 200, 8, 5 }, { dropout = 0.3, seed = 5 } },
    { "dropout with valid_lens", { 2, 65, 100, 8, 5 }, { dropout = 0.5, seed = 9, valid_lens = { 0, 30 } } },
    { "scale", { 1, 20, 30, 8, 8 }, { scale = 0.05 } },
  }
  for _, kernel in ipairs(helper.flash_kernels()) do
    for _, c in ipairs(cases) do
      it(kernel .. " equals the reference: " .. c[1], function()
        local s = c[2]
        local q, k, v = inputs(s[1], s[2], s[3], s[4], s[5])
        compare(q, k, v, c[3], kernel)
      end)
    end

    it(kernel .. " equals the reference with a keep-mask (rows with no key come out 0)", function()
      local q, k, v = inputs(2, 70, 90, 8, 8)
      local m = attn.rand({ 2, 70, 90 }):gt(0.5):totable()
      for j = 1, 90 do m[1][3][j] = 0 end -- query 3 of batch 1 sees nothing
      local mask = attn.tensor(m)
      compare(q, k, v, { mask = mask, valid_lens = { 40, 90 } }, kernel)
      local out = core.sdpa_forward(q, k, v, { mask = mask, kernel = kernel }):totable()
      for c = 1, 8 do assert.are.equal(0, out[1][3][c]) end
    end)

    it(kernel .. " equals the reference on strided operands", function()
      local qt, kt, v = attn.randn { 2, 24, 70 }, attn.randn { 2, 24, 90 }, attn.randn { 90, 2, 12 }
      local q, k = qt:transpose(2, 3), kt:transpose(2, 3) -- column stride 70 / 90
      compare(q, k, v:transpose(1, 2), { causal = true }, kernel)
    end)
  end

  -- Masked tiles compute only the lane vectors some row of a block sees (queries in the forward
  -- and dq, keys in dk and dv, where each vector's sums also start at its first visible query):
  -- the causal diagonal, windows (vectors left out at both ends), lengths and keep-masks on top,
  -- at odd sizes so the tiles end mid-vector.
  for _, kernel in ipairs(helper.flash_kernels()) do
    local skip_cases = {
      { "causal, odd N", { 2, 197, 197, 33, 17 }, { causal = true } },
      { "causal, more queries than keys", { 2, 203, 131, 16, 24 }, { causal = true } },
      { "causal, more keys than queries", { 2, 131, 203, 16, 24 }, { causal = true } },
      { "window alone", { 2, 201, 199, 8, 8 }, { window = 9 } },
      { "window with causal", { 1, 259, 259, 16, 16 }, { window = 40, causal = true } },
      { "causal with valid_lens", { 2, 150, 150, 8, 8 }, { causal = true, valid_lens = { 3, 149 } } },
      { "causal with dropout", { 2, 140, 140, 8, 8 }, { causal = true, dropout = 0.25, seed = 11 } },
    }
    for _, c in ipairs(skip_cases) do
      it(kernel .. " skips the lane vectors no row sees and still equals the reference: " .. c[1], function()
        local q, k, v = inputs(table.unpack(c[2]))
        compare(q, k, v, c[3], kernel)
      end)
    end
    it(kernel .. " skips the lane vectors no row sees under a keep-mask with causal", function()
      local q, k, v = inputs(2, 170, 170, 8, 8)
      local m = attn.rand({ 2, 170, 170 }):gt(0.3):totable()
      local mask = attn.tensor(m)
      compare(q, k, v, { mask = mask, causal = true }, kernel)
    end)
  end

  it("gives the same bits on 1, 2 and 3 threads (dropout included)", function()
    local q, k, v = inputs(3, 150, 140, 32, 16)
    local dout = attn.randn { 3, 150, 16 }
    local opts = { dropout = 0.2, seed = 3, valid_lens = { 5, 0, 140 }, causal = true }
    local before = attn.get_num_threads()
    local res = {}
    for _, n in ipairs { 1, 2, 3 } do
      attn.set_num_threads(n)
      local out, w, _, lse = core.sdpa_forward(q, k, v, opts)
      local dq, dk, dv = core.sdpa_backward(q, k, v, opts, dout, nil, nil, nil, out, lse)
      res[n] = { out, w, dq, dk, dv }
    end
    attn.set_num_threads(before)
    for n = 2, 3 do
      for i = 1, 5 do assert.are.equal(0, (res[1][i] - res[n][i]):abs():max():item()) end
    end
  end)

  it("leaves float64 and non-finite operands to the reference path", function()
    local q, k, v = inputs(1, 5, 6, 4, 4)
    local _, _, _, lse = core.sdpa_forward(q:to("float64"), k:to("float64"), v:to("float64"))
    assert.is_nil(lse)
    local vt = v:totable()
    for c = 1, 4 do vt[1][6][c] = 0 / 0 end -- NaN in a key nobody sees
    local out, _, _, lse2 = core.sdpa_forward(q, k, attn.tensor(vt), { valid_lens = { 5 }, kernel = "flash" })
    assert.is_nil(lse2)
    for _, row in ipairs(out:totable()[1]) do
      for _, x in ipairs(row) do assert(x == x, "the NaN of a masked key does not reach the output") end
    end
  end)

  it("returns the log-sum-exp of the scaled scores, +inf for a row with no key", function()
    local q, k, v = inputs(1, 3, 4, 2, 2)
    local mask = attn.tensor { { { 1, 1, 0, 1 }, { 0, 0, 0, 0 }, { 1, 0, 0, 0 } } }
    local _, _, _, lse = core.sdpa_forward(q, k, v, { mask = mask, kernel = "flash" })
    local qt, kt, lt = q:totable()[1], k:totable()[1], lse:totable()[1]
    for i, keys in ipairs { { 1, 2, 4 }, {}, { 1 } } do
      local s = 0
      for _, j in ipairs(keys) do
        local dot = 0
        for c = 1, 2 do dot = dot + qt[i][c] * kt[j][c] end
        s = s + math.exp(dot / math.sqrt(2))
      end
      local want = #keys == 0 and math.huge or math.log(s)
      local got = lt[i]
      assert(got == want or math.abs(got - want) <= 1e-5 * (1 + math.abs(want)), "row " .. i)
    end
  end)

  it("rejects an unknown kernel name", function()
    local q, k, v = inputs(1, 2, 2, 2, 2)
    assert.has_error(function() core.sdpa_forward(q, k, v, { kernel = "fast" }) end,
      "dot_product_attention: kernel must be one of auto, reference, flash, flash_generic, flash_avx2, flash_avx512, tiny")
  end)
end)
