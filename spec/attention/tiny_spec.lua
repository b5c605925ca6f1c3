-- The tiny-head path of dot-product attention (kernel "tiny": the blocked driver with its products
-- as plain vectorised loops and, in float32, one exp over a whole block of scores) against the
-- blocked sgemm reference path: every mask kind, odd sizes, strided operands, dropout, both
-- dtypes, each instruction set this CPU runs, NaN where the reference has it, and the same bits
-- on 1 and 2 threads. The reference itself is checked against naive loops in
-- dot_product_attention_spec.lua; softmax_rows_spec.lua runs its rows of -inf on this path too.
local attn = require "attn"
local core = attn.core
local helper = require "helper"

local copy = helper.with

-- max |a - b| / max |b| within tol over the finite entries; a NaN in one must be a NaN in the other.
local function assert_rel(a, b, what, tol)
  local x, y = a:reshape(a:numel()):totable(), b:reshape(b:numel()):totable()
  local scale, err = 1e-30, 0
  for i = 1, #y do
    assert((x[i] ~= x[i]) == (y[i] ~= y[i]), what .. ": NaN in different places")
    if y[i] == y[i] then
      scale = math.max(scale, math.abs(y[i]))
      err = math.max(err, math.abs(x[i] - y[i]))
    end
  end
  assert(err / scale <= tol, string.format("%s: relative error %.3g", what, err / scale))
end

-- Forward (out, weights) and backward (dq, dk, dv) through the tiny path against the reference.
local function compare(q, k, v, opts)
  local tol = q:dtype() == "float64" and 1e-12 or 1e-5
  local ref, tiny = copy(opts, { kernel = "reference" }), copy(opts, { kernel = "tiny" })
  local r_out, r_w = core.sdpa_forward(q, k, v, ref)
  local t_out, t_w = core.sdpa_forward(q, k, v, tiny)
  assert_rel(t_out, r_out, "out", tol)
  if opts.need_weights ~= false then assert_rel(t_w, r_w, "weights", tol) end
  local dout = attn.randn(t_out:size(), q:dtype())
  local rq, rk, rv = core.sdpa_backward(q, k, v, ref, dout)
  local tq, tk, tv = core.sdpa_backward(q, k, v, tiny, dout)
  assert_rel(tq, rq, "dq", tol)
  assert_rel(tk, rk, "dk", tol)
  assert_rel(tv, rv, "dv", tol)
end

local function inputs(dtype, B, Nq, Nk, d, dv)
  return attn.randn({ B, Nq, d }, dtype), attn.randn({ B, Nk, d }, dtype), attn.randn({ B, Nk, dv }, dtype)
end

describe("tiny-head dot-product attention", function()
  local saved
  before_each(function()
    attn.manual_seed(11)
    saved = core.isa()
  end)
  after_each(function() core.isa(saved) end)

  local cases = {
    { "the Transformer's heads", { 12, 10, 10, 8, 8 }, {} },
    { "odd sizes", { 3, 7, 13, 5, 3 }, {} },
    { "one query, one key", { 2, 1, 1, 3, 2 }, {} },
    { "more than one row block", { 2, 70, 9, 17, 33 }, {} },
    { "widths past 16", { 2, 9, 21, 40, 19 }, {} },
    { "1-D valid_lens with a zero length", { 3, 6, 9, 4, 5 }, { valid_lens = { 0, 4, 9 } } },
    { "2-D valid_lens", { 2, 3, 7, 4, 5 }, { valid_lens = { { 1, 7, 0 }, { 9, 3, 2 } } } },
    { "causal", { 2, 9, 9, 8, 8 }, { causal = true } },
    { "causal with valid_lens", { 2, 8, 11, 4, 4 }, { causal = true, valid_lens = { 3, 0 } } },
    { "window", { 2, 10, 12, 8, 3 }, { window = 2 } },
    { "dropout", { 3, 10, 10, 8, 8 }, { dropout = 0.3, seed = 5 } },
    { "dropout with valid_lens", { 2, 9, 13, 8, 5 }, { dropout = 0.5, seed = 9, valid_lens = { 0, 6 } } },
    { "scale, weights off", { 2, 5, 6, 8, 8 }, { scale = 0.05, need_weights = false } },
    -- the short-row kernels (rows of at most 16 keys) and their edges
    { "short rows: 16 keys, one vector", { 3, 11, 16, 8, 8 }, { valid_lens = { 16, 5, 0 } } },
    { "short rows: 17 keys, past one vector", { 2, 5, 17, 8, 8 }, { valid_lens = { 17, 9 } } },
    { "short rows: one key, width 1", { 4, 3, 1, 1, 1 }, {} },
    { "short rows: widths 64 and 37", { 2, 4, 10, 64, 37 }, { dropout = 0.2, seed = 4 } },
    { "short rows: widths 16 (one vector per row)", { 2, 6, 10, 16, 16 }, { valid_lens = { 3, 10 } } },
    { "short rows: causal 2-D lengths with dropout (the decoder's self-attention)", { 4, 10, 10, 8, 8 },
      { causal = true, dropout = 0.2, seed = 7, valid_lens = { { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 },
        { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 }, { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, { 10, 9, 8, 7, 6, 5, 4, 3, 2, 1 } } } },
    { "short rows: window with 1-D lengths and dropout", { 3, 12, 12, 8, 5 },
      { window = 1, dropout = 0.4, seed = 2, valid_lens = { 12, 3, 0 } } },
    { "short rows: dropout 1", { 2, 4, 6, 8, 8 }, { dropout = 1, seed = 1 } },
  }
  for _, dtype in ipairs { "float32", "float64" } do
    for _, isa in ipairs(helper.isa_paths()) do
      for _, c in ipairs(cases) do
        it(string.format("equals the reference: %s (%s, %s)", c[1], dtype, isa), function()
          core.isa(isa)
          local s = c[2]
          local q, k, v = inputs(dtype, s[1], s[2], s[3], s[4], s[5])
          compare(q, k, v, c[3])
        end)
      end
    end

    it("equals the reference with a keep-mask; a query with no key is zero (" .. dtype .. ")", function()
      local q, k, v = inputs(dtype, 2, 7, 9, 8, 4)
      local m = attn.rand({ 2, 7, 9 }):gt(0.5):totable()
      for j = 1, 9 do m[1][3][j] = 0 end
      local mask = attn.tensor(m, dtype)
      compare(q, k, v, { mask = mask, valid_lens = { 5, 9 } })
      local out = core.sdpa_forward(q, k, v, { mask = mask, kernel = "tiny" }):totable()
      for c = 1, 4 do assert.are.equal(0, out[1][3][c]) end
    end)

    it("equals the reference on strided operands (" .. dtype .. ")", function()
      local qt, kt, v = attn.randn({ 2, 6, 7 }, dtype), attn.randn({ 2, 6, 9 }, dtype), attn.randn({ 9, 2, 5 }, dtype)
      compare(qt:transpose(2, 3), kt:transpose(2, 3), v:transpose(1, 2), { causal = true })
    end)

    it("lets a NaN value under an underflowed weight reach the output, as the reference (" .. dtype .. ")", function()
      local q, k, v = inputs(dtype, 1, 3, 4, 2, 2)
      q:set(1e3, 1, 1, 1)
      k:set(1e3, 1, 1, 1) -- query 1 puts all its weight on key 1: key 4's weight underflows to 0
      k:set(-1e3, 1, 4, 1)
      v:set(0 / 0, 1, 4, 2)
      compare(q, k, v, {})
      local out = core.sdpa_forward(q, k, v, { kernel = "tiny" })
      assert.is_true(out[1][1][2] ~= out[1][1][2])
      -- masked by the lengths, the same NaN never reaches the output
      out = core.sdpa_forward(q, k, v, { kernel = "tiny", valid_lens = { 3 } })
      for _, x in ipairs(out:reshape(6):totable()) do assert.is_true(x == x) end
    end)
  end

  it("sends rows with inf or NaN to the blocked path, which decides them as the reference (short rows)", function()
    for _, case in ipairs { { "inf", math.huge, {} }, { "NaN", 0 / 0, {} }, { "NaN", 0 / 0, { valid_lens = { 3, 2 } } } } do
      local q, k, v = inputs("float32", 2, 5, 6, 4, 3)
      k:set(case[2], 1, 5, 2) -- key 5 of head 1: read unless the lengths mask it
      v:set(case[2], 2, 4, 1)
      compare(q, k, v, case[3])
      local out = core.sdpa_forward(q, k, v, copy(case[3], { kernel = "tiny" }))
      local finite = true
      for _, x in ipairs(out:reshape(30):totable()) do finite = finite and x == x and math.abs(x) < math.huge end
      assert.equal(case[3].valid_lens ~= nil, finite, case[1])
    end
  end)

  it("is what the default kernel runs for the book's sizes", function()
    local q, k, v = inputs("float32", 4, 10, 10, 8, 8)
    local a = core.sdpa_forward(q, k, v, {})
    local t = core.sdpa_forward(q, k, v, { kernel = "tiny" })
    assert.are.equal(0, (a - t):abs():max():item())
  end)

  it("splits a decoder step's one-query rows over the threads, the same bits on 1, 2 and 3", function()
    -- (1024, 1, 8) queries on 10 keys: each row costs little in products, but 1024 of them are
    -- worth two threads (the grain counts a fixed cost per row); each kernel against the reference
    local q, k, v = inputs("float32", 1024, 1, 10, 8, 8)
    local lens = {}
    for i = 1, 1024 do lens[i] = 1 + i % 10 end
    local before = attn.get_num_threads()
    for _, kernel in ipairs { "tiny", "reference" } do
      local opts = { valid_lens = lens, kernel = kernel }
      local first
      for _, n in ipairs { 1, 2, 3 } do
        attn.set_num_threads(n)
        local out, w = core.sdpa_forward(q, k, v, opts)
        if n == 1 then
          first = { out, w }
        else
          assert.are.equal(0, (out - first[1]):abs():max():item())
          assert.are.equal(0, (w - first[2]):abs():max():item())
        end
      end
    end
    attn.set_num_threads(before)
    compare(q, k, v, { valid_lens = lens })
  end)

  it("gives the same bits on 1, 2 and 3 threads (dropout included)", function()
    local q, k, v = inputs("float32", 64, 10, 10, 8, 8)
    local dout = attn.randn { 64, 10, 8 }
    local lens = {}
    for i = 1, 64 do lens[i] = i % 11 end
    local opts = { dropout = 0.2, seed = 3, valid_lens = lens, kernel = "tiny" }
    local before = attn.get_num_threads()
    local res = {}
    for _, n in ipairs { 1, 2, 3 } do
      attn.set_num_threads(n)
      local out, w = core.sdpa_forward(q, k, v, opts)
      local dq, dk, dv = core.sdpa_backward(q, k, v, opts, dout)
      res[n] = { out, w, dq, dk, dv }
    end
    attn.set_num_threads(before)
    for n = 2, 3 do
      for i = 1, 5 do assert.are.equal(0, (res[1][i] - res[n][i]):abs():max():item()) end
    end
  end)
end)
