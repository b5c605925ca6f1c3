-- nn.DecoderOnlyTransformer: cached decoding equals recomputing the prefix (float64 to 1e-12,
-- float32 to 1e-5), with grouped-query heads, a sliding window and right-padded batches;
-- grouped-query attention equals attention over repeated K and V; generate is reproducible;
-- filter_logits on hand-made logits; errors naming the values.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn
local decoder_only = require "attn.nn.decoder_only"

local function model(o)
  attn.manual_seed(o.seed or 1)
  return nn.DecoderOnlyTransformer { vocab_size = 11, d_model = 16, num_heads = 4, num_kv_heads = o.kv or 4,
    num_layers = 2, max_len = o.max_len or 32, window = o.window, dtype = o.dtype or "float64" }
end

local function max_logit_diff(a, b)
  local md = 0
  for s = 1, #a do
    for r = 1, #a[s] do
      for v = 1, #a[s][r] do md = math.max(md, math.abs(a[s][r][v] - b[s][r][v])) end
    end
  end
  return md
end

-- generate with and without the cache (greedy): the tokens and the largest logit difference.
local function both(m, prompts, n)
  local a, ia = m:generate(prompts, { max_new_tokens = n, temperature = 0, keep_logits = true })
  local b, ib = m:generate(prompts, { max_new_tokens = n, temperature = 0, keep_logits = true, cache = false })
  return a, b, max_logit_diff(ia.logits, ib.logits)
end

describe("nn.DecoderOnlyTransformer", function()
  local prompts = { { 1, 2, 3, 4, 5, 6, 7 }, { 4, 5, 6 } }

  it("decodes with the cache as recomputing the prefix (float64, 1e-12), with grouped-query heads", function()
    for _, kv in ipairs { 4, 2, 1 } do
      local a, b, diff = both(model { kv = kv }, prompts, 10)
      assert.same(a, b)
      assert.is_true(diff < 1e-12, "max diff " .. diff)
    end
  end)

  it("rolls the cache of a sliding window past its size", function()
    local a, b, diff = both(model { kv = 2, window = 4 }, prompts, 12) -- 19 positions through 4 slots
    assert.same(a, b)
    assert.is_true(diff < 1e-12, "max diff " .. diff)
  end)

  it("float32: the cache equals recomputing to 1e-5", function()
    local a, b, diff = both(model { kv = 2, dtype = "float32" }, prompts, 8)
    assert.same(a, b)
    assert.is_true(diff < 1e-5, "max diff " .. diff)
  end)

  it("a right-padded batch gives each sample its unpadded logits", function()
    local m = model { kv = 2 }
    m:eval()
    local both_logits = m:forward(prompts)
    local alone = m:forward({ prompts[2] })
    helper.assert_close(both_logits:select(1, 2):narrow(1, 1, 3), alone:select(1, 1), { atol = 1e-13, rtol = 0 })
  end)

  it("grouped-query attention equals attention over repeated keys and values", function()
    attn.manual_seed(7)
    local B, H, Hkv, N, d = 2, 6, 2, 5, 4
    local q = attn.randn({ B * H, N, d }, "float64")
    local k, v = attn.randn({ B * Hkv, N, d }, "float64"), attn.randn({ B * Hkv, N, d }, "float64")
    local idx = {} -- query head h of sample b uses key/value head ceil(h / (H / Hkv))
    for b = 1, B do
      for h = 1, H do idx[#idx + 1] = (b - 1) * Hkv + (h - 1) // (H // Hkv) + 1 end
    end
    local kr, vr = k:index_select(1, attn.tensor(idx, "int64")), v:index_select(1, attn.tensor(idx, "int64"))
    local o = { causal = true, window = 2 }
    local out = decoder_only._attend(q, k, v, H // Hkv, o)
    helper.assert_close(out, attn.dot_product_attention(q, kr, vr, o), { atol = 1e-14, rtol = 0 })
  end)

  it("generate with a seed is reproducible, and the seed matters", function()
    local m = model { kv = 2 }
    local o = { max_new_tokens = 16, top_k = 6, top_p = 0.95, seed = 42 }
    local a, b = m:generate(prompts, o), m:generate(prompts, o)
    assert.same(a, b)
    o.seed = 43
    assert.are_not.same(a, m:generate(prompts, o))
  end)

  it("trains (gradients reach every parameter)", function()
    local m = model { kv = 2 }
    m:train()
    local logits = m:forward(attn.tensor({ { 1, 2, 3, 4 } }, "int64"))
    nn.cross_entropy(logits:reshape({ -1, 11 }), attn.tensor({ 2, 3, 4, 5 }, "int64")):mean():backward()
    local named = m:named_parameters()
    assert.is_true(#named >= 2 * 9 + 2)
    for _, e in ipairs(named) do assert.is_not_nil(e[2].grad, e[1]) end
  end)

  it("raises on cache overflow, Hkv not dividing H and a bad cache call, naming the values", function()
    local m = model { kv = 2, max_len = 8 }
    local ok, err = pcall(m.generate, m, prompts, { max_new_tokens = 3 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("cache overflow: sample 1 needs 9 positions, more than max_len 8 (no window)",
      1, true), err)
    ok, err = pcall(m.generate, m, prompts, { max_new_tokens = 3, cache = false })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("more than max_len 8", 1, true), err)
    assert.has_error(function()
      nn.DecoderOnlyTransformer { vocab_size = 5, d_model = 12, num_heads = 4, num_kv_heads = 3, num_layers = 1 }
    end, "CausalSelfAttention: num_kv_heads 3 does not divide num_heads 4")
    ok, err = pcall(m.generate, m, { { 1, 12 } }, {})
    assert.is_false(ok)
    assert.truthy(tostring(err):find("sample 1 token 2 is 12, not an id in 1..11", 1, true), err)
  end)
end)

describe("nn.filter_logits", function()
  local inf = -math.huge
  it("keeps the top k (ties with the k-th kept)", function()
    assert.same({ 3, inf, 2, inf, 2 }, nn.filter_logits({ 3, 1, 2, 0, 2 }, { top_k = 2 }))
    assert.same({ 3, 1, 2 }, nn.filter_logits({ 3, 1, 2 }, { top_k = 5 }))
  end)

  it("keeps the smallest set of most likely tokens reaching top_p", function()
    -- probabilities 0.5, 0.25, 0.125, 0.125
    local l = { math.log(0.5), math.log(0.25), math.log(0.125), math.log(0.125) }
    assert.same({ l[1], inf, inf, inf }, nn.filter_logits(l, { top_p = 0.5 }))
    assert.same({ l[1], l[2], inf, inf }, nn.filter_logits(l, { top_p = 0.6 }))
    assert.same({ l[1], l[2], l[3], inf }, nn.filter_logits(l, { top_p = 0.8 }))
    assert.same({ l[1], inf, inf, inf }, nn.filter_logits(l, { top_p = 0.1 })) -- the top one always stays
  end)

  it("divides by the temperature first, then top_k, then top_p", function()
    local out = nn.filter_logits({ 2, 4, 0 }, { temperature = 2, top_k = 2, top_p = 1 })
    assert.same({ 1, 2, inf }, out)
    assert.has_error(function() nn.filter_logits({ 1 }, { top_p = 0 }) end, "filter_logits: top_p must be in (0, 1], got 0")
    assert.has_error(function() nn.filter_logits(attn.zeros({ 3 })) end,
      "filter_logits: logits must be a list of numbers, got a tensor [3]")
    assert.has_error(function() nn.filter_logits("1 2") end, "filter_logits: logits must be a list of numbers, got a string")
  end)
end)
