-- Window attention, the fixed sparse patterns (strided, fixed) and global tokens: each equals
-- attention under the explicit keep-mask built here by naive loops from the definitions in
-- src/attention/attn_attention.h ("Sparse patterns"), in values and gradients, on the reference
-- path (float64 and float32) and on every flash kernel set this CPU runs (float32); the same bits
-- on 1 and 2 threads; the flash work of a window is banded (counted in score tiles); bad options
-- raise errors naming the values.
local attn = require "attn"
local core = attn.core
local helper = require "helper"

local with = helper.with

local keeps = helper.pattern_keeps

-- The (1, Nq, Nk) keep-mask of opts, and the options that ask for it instead of the pattern.
local function explicit(opts, Nq, Nk)
  local m = {}
  for i = 1, Nq do
    local row = {}
    for j = 1, Nk do row[j] = keeps(opts, i - 1, j - 1) and 1 or 0 end
    m[i] = row
  end
  local o = with(opts, {})
  o.window, o.pattern, o.stride, o.summary, o.global, o.causal = nil, nil, nil, nil, nil, nil
  o.mask = attn.tensor({ m }, "float64")
  return o
end

-- max |a - b| / max |b| (tol relative) or max |a - b| <= tol (float64: absolute on unit data)
local function assert_close(a, b, what, tol)
  local scale = math.max(b:abs():max():item(), 1)
  local err = (a - b):abs():max():item() / scale
  assert(err <= tol, string.format("%s: error %.3g > %.3g", what, err, tol))
end

-- Forward and backward of opts under kernel against the explicit mask on the reference path.
local function compare(dtype, B, Nq, Nk, d, opts, kernel, tol)
  local q = attn.randn({ B, Nq, d }, dtype)
  local k, v = attn.randn({ B, Nk, d }, dtype), attn.randn({ B, Nk, d }, dtype)
  local ref = with(explicit(opts, Nq, Nk), { kernel = "reference" })
  local o = with(opts, { kernel = kernel })
  local r_out, r_w = core.sdpa_forward(q, k, v, ref)
  local out, w, _, lse = core.sdpa_forward(q, k, v, o)
  assert_close(out, r_out, "out", tol)
  assert_close(w, r_w, "weights", tol)
  local dout = attn.randn({ B, Nq, d }, dtype)
  local rq, rk, rv = core.sdpa_backward(q, k, v, ref, dout, nil, nil)
  local gq, gk, gv = core.sdpa_backward(q, k, v, o, dout, nil, nil, nil, out, lse)
  assert_close(gq, rq, "dq", tol)
  assert_close(gk, rk, "dk", tol)
  assert_close(gv, rv, "dv", tol)
  return out, w
end

local cases = {
  { "window 0 (own key only)", { window = 0 } },
  { "window 1", { window = 1 } },
  { "window 1, causal", { window = 1, causal = true } },
  { "window >= N (full)", { window = 500 } },
  { "window 40 causal (Mistral-style)", { window = 40, causal = true } },
  { "strided, causal (the paper's)", { pattern = "strided", stride = 12, causal = true } },
  { "strided, not causal", { pattern = "strided", stride = 7 } },
  { "fixed, causal, one summary column", { pattern = "fixed", stride = 16, causal = true } },
  { "fixed, not causal, summary 3", { pattern = "fixed", stride = 9, summary = 3 } },
  { "window + global at both edges", { window = 5, global = { 1, 203 } } },
  { "window + global, causal", { window = 5, global = { 203, 1, 70 }, causal = true } },
  { "global only (no local rule)", { global = { 2 }, causal = true } },
  { "strided + global", { pattern = "strided", stride = 30, global = { 100 } } },
}

describe("sparse attention patterns", function()
  before_each(function() attn.manual_seed(21) end)

  for _, c in ipairs(cases) do
    it("float64 reference equals the explicit keep-mask: " .. c[1], function()
      compare("float64", 1, 203, 203, 5, c[2], "reference", 1e-12)
    end)
  end

  it("keys outside the pattern get weight exactly 0 (window 3, N 70)", function()
    local _, w = compare("float32", 1, 70, 70, 4, { window = 3 }, "flash", 1e-5)
    local t = w:totable()[1]
    for i = 1, 70 do
      for j = 1, 70 do
        if math.abs(i - j) > 3 then assert.equal(0, t[i][j]) end
      end
    end
  end)

  it("queries and keys of different counts (window, global within both)", function()
    compare("float64", 2, 130, 150, 4, { window = 9, global = { 1, 130 } }, "reference", 1e-12)
    compare("float32", 2, 130, 150, 4, { window = 9, global = { 1, 130 } }, "flash", 1e-5)
  end)

  for _, kernel in ipairs(helper.flash_kernels()) do
    it(kernel .. " (float32) equals the explicit keep-mask on every pattern, odd N over tiles", function()
      for _, c in ipairs(cases) do
        local ok, err = pcall(compare, "float32", 2, 203, 203, 8, c[2], kernel, 1e-5)
        assert(ok, c[1] .. ": " .. tostring(err))
      end
    end)
  end

  it("float32 reference path (tiny heads) equals the explicit keep-mask", function()
    compare("float32", 1, 12, 12, 4, { pattern = "fixed", stride = 4, causal = true }, "tiny", 1e-5)
    compare("float32", 1, 12, 12, 4, { window = 2, global = { 12 } }, "reference", 1e-5)
  end)

  it("gives the same bits on 1 and 2 threads", function()
    local q, k, v = attn.randn { 2, 300, 16 }, attn.randn { 2, 300, 16 }, attn.randn { 2, 300, 16 }
    local opts = { window = 20, global = { 1, 150 }, causal = true, need_weights = false }
    local function run()
      local out, _, _, lse = core.sdpa_forward(q, k, v, opts)
      local gq, gk, gv = core.sdpa_backward(q, k, v, opts, q, nil, nil, nil, out, lse)
      return { out, gq, gk, gv }
    end
    local n = attn.get_num_threads()
    attn.set_num_threads(1)
    local one = run()
    attn.set_num_threads(2)
    local two = run()
    attn.set_num_threads(n)
    for i = 1, 4 do assert.equal(0, (one[i] - two[i]):abs():max():item()) end
  end)

  it("passes through dot_product_attention and its gradients", function()
    local q = attn.randn({ 1, 40, 4 }, "float64"):requires_grad_()
    local k = attn.randn({ 1, 40, 4 }, "float64")
    local v = attn.randn({ 1, 40, 4 }, "float64")
    local opts = { pattern = "strided", stride = 6, causal = true, global = { 40 } }
    local out = attn.dot_product_attention(q, k, v, opts)
    attn.sum(out * out):backward()
    local g = q.grad
    q.grad = nil
    local ref = attn.dot_product_attention(q, k, v, explicit(opts, 40, 40))
    attn.sum(ref * ref):backward()
    assert_close(out, ref, "out", 1e-12)
    assert_close(g, q.grad, "dq", 1e-12)
  end)

  it("does banded work: score tiles of window (+ global) against full attention", function()
    local N = 4096
    local q, k, v = attn.randn { 1, N, 8 }, attn.randn { 1, N, 8 }, attn.randn { 1, N, 8 }
    local function tiles(opts)
      local t0 = core.flash_tiles()
      core.sdpa_forward(q, k, v, with(opts, { need_weights = false, kernel = "flash" }))
      return core.flash_tiles() - t0
    end
    local blocks, ktiles = N // 64, N // 128
    assert.equal(blocks * ktiles, tiles {}) -- every (64-query block, 128-key tile)
    assert.is_true(tiles { window = 32 } <= 2 * blocks) -- the band spans at most 2 key tiles
    assert.is_true(tiles { window = 32, causal = true } <= 2 * blocks)
    -- non-global blocks: the band and the two global keys' tiles; the 2 global queries' blocks: all
    assert.is_true(tiles { window = 32, global = { 1, N } } <= 4 * blocks + 2 * ktiles)
    assert.is_true(tiles { pattern = "fixed", stride = 512, causal = true } < blocks * ktiles / 2)
  end)

  describe("bad options", function()
    local q = attn.randn { 1, 10, 4 }
    local function run(opts) return attn.dot_product_attention(q, q, q, opts) end
    it("window 0 is fine, a negative window raises", function()
      assert.has_no.errors(function() run { window = 0 } end)
      assert.has_error(function() run { window = -1 } end,
        "dot_product_attention: window must be an integer >= 0 (keys within that distance), got -1")
    end)
    it("global positions out of range or twice raise naming the value", function()
      assert.has_error(function() run { global = { 0 } } end,
        "dot_product_attention: global position 0 is out of range 1..10 (Nq 10, Nk 10)")
      assert.has_error(function() run { window = 2, global = { 11 } } end,
        "dot_product_attention: global position 11 is out of range 1..10 (Nq 10, Nk 10)")
      assert.has_error(function() run { global = { 3, 5, 3 } } end,
        "dot_product_attention: global position 3 is given twice")
      assert.has_error(function() run { global = { 1.5 } } end,
        "dot_product_attention: global must be a table of integer positions, got 1.5")
    end)
    it("unknown patterns and bad strides raise", function()
      assert.has_error(function() run { pattern = "dilated", stride = 2 } end,
        'dot_product_attention: pattern must be "strided" or "fixed", got dilated')
      assert.has_error(function() run { pattern = "fixed" } end,
        "dot_product_attention: pattern fixed needs a stride >= 1, got 0")
      assert.has_error(function() run { pattern = "fixed", stride = 4, summary = 5 } end,
        "dot_product_attention: summary 5 must lie in 1..stride (4)")
      assert.has_error(function() run { stride = 4 } end,
        'dot_product_attention: stride is given without a pattern ("strided" or "fixed")')
      assert.has_error(function() run { pattern = "strided", stride = 3, window = 2 } end,
        "dot_product_attention: pattern strided and window 2 exclude each other (the pattern is the local rule)")
    end)
  end)
end)
