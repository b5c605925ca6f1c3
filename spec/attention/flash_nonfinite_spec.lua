-- The flash kernels never scan their operands for inf or NaN: they run on whatever they are
-- given, and a block whose results come out not finite sends the whole call to the reference
-- path (src/attention/attn_attention_internal.h, attn_flash_item_fn). These cases check that this keeps
-- the "Softmax rows" rule (src/attention/attn_attention.h) exactly: for each flash kernel, each mask kind
-- and each place an inf or NaN can sit (queries, keys, values, the output's gradient; in entries
-- that are masked for every query, for some, or for none), the forward's output and weights and
-- the backward's gradients hold NaN, +inf and -inf where the reference's do, and the same values
-- (1e-5 relative) everywhere else. Each case also says which path must have answered, so a case
-- that stopped exercising the flash kernels would fail rather than pass through the reference.
local attn = require "attn"
local core = attn.core
local helper = require "helper"

local NAN, INF = 0 / 0, math.huge
local B, Nq, Nk, d, dv = 2, 130, 140, 9, 5 -- three query blocks, key tiles off the 64 grid

-- 1 NaN, 2 +inf, 3 -inf, 0 finite.
local function classes(t) return t:ne(t) + t:eq(INF) * 2 + t:eq(-INF) * 3 end

local function assert_same(a, b, what)
  local ca, cb = classes(a), classes(b)
  local wrong = ca:ne(cb):sum():item()
  assert(wrong == 0, string.format("%s: %d entries differ in NaN/inf from the reference", what, wrong))
  local fa, fb = a:masked_fill(ca:ne(0), 0), b:masked_fill(cb:ne(0), 0)
  local scale = math.max(fb:abs():max():item(), 1e-30)
  local err = (fa - fb):abs():max():item() / scale
  assert(err <= 1e-5, string.format("%s: relative error %.3g", what, err))
end

local function keep_mask()
  attn.manual_seed(11)
  local m = attn.rand({ B, Nq, Nk }):gt(0.3)
  m[{ 1, 3 }] = 0 -- query 3 of sample 1 sees no key
  for i = 1, Nq do m[{ 2, i, 2 }] = 0 end -- key 2 of sample 2 is removed for every query
  return m
end

local lens2 = {}
for b = 1, B do
  lens2[b] = {}
  for i = 1, Nq do lens2[b][i] = (i * 37 + b * 11) % (Nk + 5) end -- zeros and lengths past Nk included
end

local masks = {
  { "no mask", {} },
  { "causal", { causal = true } },
  { "window", { window = 20 } },
  { "1-D valid_lens with a zero length", { valid_lens = { 0, 100 } } },
  { "2-D valid_lens", { valid_lens = lens2 } },
  { "keep-mask", { mask = keep_mask() } },
  { "keep-mask with valid_lens", { mask = keep_mask(), valid_lens = { 120, 60 } } },
  { "causal with valid_lens", { causal = true, valid_lens = { 50, 140 } } },
}

-- Where the bad value goes: {operand, sample, row, column} (1-based); "dout" only reaches the
-- backward. Key 140 is after every causal query (130) and past both lengths of the 1-D case.
local places = {
  { "a query", "q", 1, 70, 2 },
  { "the query that sees no key under the keep-mask", "q", 1, 3, 1 },
  { "a key every query sees", "k", 1, 2, 1 },
  { "the last key", "k", 1, 140, 3 },
  { "the key the keep-mask removes everywhere", "k", 2, 2, 4 },
  { "a value every query sees", "v", 1, 2, 2 },
  { "the last value", "v", 1, 140, 1 },
  { "a value only nearby queries see (window)", "v", 2, 125, 5 },
  { "the value the keep-mask removes everywhere", "v", 2, 2, 3 },
  { "the output's gradient", "dout", 1, 5, 1 },
}

local function inputs(place, x)
  attn.manual_seed(5)
  local t = { q = attn.randn { B, Nq, d }, k = attn.randn { B, Nk, d }, v = attn.randn { B, Nk, dv },
    dout = attn.randn { B, Nq, dv } }
  if place then t[place[2]][{ place[3], place[4], place[5] }] = x end
  return t
end

-- Forward (output, weights) and backward (dq, dk, dv) through `kernel`, with the forward's lse
-- as the autograd passes it, against the reference; returns whether the flash forward's result
-- stood (it returns the log-sum-exp) and the flash backward's outputs.
local function check(t, opts, kernel, what)
  local ref, fl = helper.with(opts, { kernel = "reference" }), helper.with(opts, { kernel = kernel })
  local r_out, r_w = core.sdpa_forward(t.q, t.k, t.v, ref)
  local f_out, f_w, _, lse = core.sdpa_forward(t.q, t.k, t.v, fl)
  assert_same(f_out, r_out, what .. ": out")
  assert_same(f_w, r_w, what .. ": weights")
  local rq, rk, rv = core.sdpa_backward(t.q, t.k, t.v, ref, t.dout)
  local fq, fk, fv = core.sdpa_backward(t.q, t.k, t.v, fl, t.dout, nil, nil, nil, f_out, lse)
  assert_same(fq, rq, what .. ": dq")
  assert_same(fk, rk, what .. ": dk")
  assert_same(fv, rv, what .. ": dv")
  return lse ~= nil
end

describe("flash attention on operands holding inf or NaN", function()
  for _, kernel in ipairs(helper.flash_kernels()) do
    for _, m in ipairs(masks) do
      it(kernel .. " keeps the softmax-row rule: " .. m[1], function()
        assert.is_true(check(inputs(), m[2], kernel, "finite"), "finite operands run on the flash kernel")
        local stood = 0
        for _, place in ipairs(places) do
          for _, x in ipairs { NAN, INF, -INF } do
            local what = string.format("%s in %s", tostring(x), place[1])
            if check(inputs(place, x), m[2], kernel, what) then stood = stood + 1 end
          end
        end
        -- the output's gradient never reaches the forward: its three cases keep the flash result
        assert.is_true(stood >= 3)
      end)
    end

    it(kernel .. ": a bad value in a masked entry the forward never reads keeps the flash result", function()
      -- causal: no query sees key 140, so its tile is skipped in the forward (the log-sum-exp
      -- comes back) and the backward masks its scores inside the tile: dk and dv of that key are 0
      for _, x in ipairs { NAN, INF, -INF } do
        for _, op in ipairs { "k", "v" } do
          local t = inputs({ "", op, 1, 140, 1 }, x)
          assert.is_true(check(t, { causal = true }, kernel, op .. " " .. tostring(x)))
          local o = { causal = true, kernel = kernel }
          local out, _, _, lse = core.sdpa_forward(t.q, t.k, t.v, o)
          local _, dk, dvv = core.sdpa_backward(t.q, t.k, t.v, o, t.dout, nil, nil, nil, out, lse)
          assert.equal(0, dk[{ 1, 140 }]:abs():max():item())
          assert.equal(0, dvv[{ 1, 140 }]:abs():max():item())
        end
      end
    end)

    it(kernel .. ": unmasked scores of -inf get weight 0 on both paths, the flash result standing", function()
      -- key 7 has a -inf component where every query is positive: its score is -inf for every
      -- query, so its weight is exactly 0, the rows stay finite and the flash result stands;
      -- its gradients are 0 * inf = NaN on both paths
      local t = inputs()
      t.q[{ {}, {}, 1 }] = t.q[{ {}, {}, 1 }]:abs() + 0.5
      t.k[{ 1, 7, 1 }] = -INF
      local _, w, _, lse = core.sdpa_forward(t.q, t.k, t.v, { kernel = kernel })
      assert.is_not_nil(lse)
      assert.equal(0, w[{ 1, {}, 7 }]:abs():max():item())
      check(t, {}, kernel, "-inf key")
    end)

    it(kernel .. ": a call that falls back gives the same bits on 1, 2 and 3 threads", function()
      -- whether a block's results are finite depends on the block alone, never on the range or
      -- thread it ran in, so the fallback (and each path's bits) does not follow the thread count
      local before = attn.get_num_threads()
      local res = {}
      for n = 1, 3 do
        attn.set_num_threads(n)
        res[n] = {}
        for _, x in ipairs { NAN, INF } do
          for _, place in ipairs { places[3], places[6], places[10] } do
            local t = inputs(place, x)
            local o = { causal = true, kernel = kernel }
            local out, w, _, lse = core.sdpa_forward(t.q, t.k, t.v, o)
            local dq, dk, dvv = core.sdpa_backward(t.q, t.k, t.v, o, t.dout, nil, nil, nil, out, lse)
            for _, r in ipairs { out, w, dq, dk, dvv } do res[n][#res[n] + 1] = r end
          end
        end
      end
      attn.set_num_threads(before)
      for n = 2, 3 do
        for i, r in ipairs(res[1]) do
          local a, b = r:reshape(r:numel()), res[n][i]:reshape(r:numel())
          assert.equal(0, classes(a):ne(classes(b)):sum():item())
          assert.equal(0, (a:masked_fill(classes(a):ne(0), 0) - b:masked_fill(classes(b):ne(0), 0)):abs():max():item())
        end
      end
    end)

    it(kernel .. ": a denormal query times an infinite key is -inf on the reference, NaN in flash", function()
      -- q scaled before the product underflows to -0 in the flash kernel, so 0 * inf = NaN there
      -- while the reference's score is -inf (weight 0): the NaN sends the call to the reference
      local t = inputs()
      t.q[{ {}, {}, 1 }] = -1e-45
      t.k[{ 1, 7, 1 }] = INF
      local _, _, _, lse = core.sdpa_forward(t.q, t.k, t.v, { kernel = kernel })
      assert.is_nil(lse)
      check(t, {}, kernel, "denormal query")
    end)
  end
end)
