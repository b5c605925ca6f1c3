-- The attention layers: DotProductAttention, AdditiveAttention,
-- MultiHeadAttention, PositionalEncoding and LearnedPositionalEncoding.
-- Expected numbers come from naive Lua loops over nested tables (the book's
-- formulas), never from the code under test.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn

-- ---------------------------------------------------------------- naive references

local function tanh(v)
  local e = math.exp(-2 * math.abs(v))
  local t = (1 - e) / (1 + e)
  return v < 0 and -t or t
end

local function dot(a, b)
  local s = 0
  for i = 1, #a do s = s + a[i] * b[i] end
  return s
end

-- rows (N x in) times W^T (W: out x in).
local function project(rows, W)
  local out = {}
  for n, r in ipairs(rows) do
    out[n] = {}
    for o = 1, #W do out[n][o] = dot(r, W[o]) end
  end
  return out
end

-- Softmax over the first `valid` of `scores` (the rest get weight 0).
local function masked_softmax(scores, valid)
  local m = -math.huge
  for k = 1, valid do m = math.max(m, scores[k]) end
  local w, s = {}, 0
  for k = 1, #scores do
    w[k] = k <= valid and math.exp(scores[k] - m) or 0
    s = s + w[k]
  end
  for k = 1, #scores do w[k] = w[k] / s end
  return w
end

-- weights (Nq x Nk) times values (Nk x dv).
local function weighted(weights, values)
  local out = {}
  for q, w in ipairs(weights) do
    out[q] = {}
    for j = 1, #values[1] do
      local s = 0
      for k = 1, #values do s = s + w[k] * values[k][j] end
      out[q][j] = s
    end
  end
  return out
end

-- Columns lo..hi of every row.
local function columns(rows, lo, hi)
  local out = {}
  for n, r in ipairs(rows) do out[n] = { table.unpack(r, lo, hi) } end
  return out
end

-- One sample of the book's multi-head attention: Q (Nq x dq), K, V nested
-- tables, valid a number; W_* nested weights. Returns output and per-head weights.
local function naive_mha(Q, K, V, valid, W, heads)
  local q, k, v = project(Q, W.q), project(K, W.k), project(V, W.v)
  local d = #W.q
  local dh = d // heads
  local concat, all_weights = {}, {}
  for n = 1, #Q do concat[n] = {} end
  for h = 1, heads do
    local lo, hi = (h - 1) * dh + 1, h * dh
    local qh, kh, vh = columns(q, lo, hi), columns(k, lo, hi), columns(v, lo, hi)
    local weights = {}
    for n = 1, #Q do
      local scores = {}
      for m = 1, #K do scores[m] = dot(qh[n], kh[m]) / math.sqrt(dh) end
      weights[n] = masked_softmax(scores, valid)
    end
    all_weights[h] = weights
    local out = weighted(weights, vh)
    for n = 1, #Q do
      for j = 1, dh do concat[n][lo + j - 1] = out[n][j] end
    end
  end
  return project(concat, W.o), all_weights
end

local function mha_weights(m)
  return { q = m.W_q.weight:totable(), k = m.W_k.weight:totable(), v = m.W_v.weight:totable(),
    o = m.W_o.weight:totable() }
end

local function inputs_with_params(m, ...)
  local list = { ... }
  for _, p in ipairs(m:parameters()) do list[#list + 1] = p end
  return list
end

-- ---------------------------------------------------------------- specs

describe("nn.DotProductAttention", function()
  before_each(function() attn.manual_seed(51) end)

  it("gives the book's toy result [[2,3,4,5]], [[10,11,12,13]] and stores the weights", function()
    local m = nn.DotProductAttention{ dropout = 0.5 }
    m:eval()
    local queries = attn.randn({ 2, 1, 2 })
    local keys = attn.ones({ 2, 10, 2 })
    local values = attn.arange(40):reshape({ 1, 10, 4 }):expand({ 2, 10, 4 }):contiguous()
    local out = m(queries, keys, values, attn.tensor({ 2, 6 }))
    assert.close(out, { { { 2, 3, 4, 5 } }, { { 10, 11, 12, 13 } } }, { atol = 1e-5 })
    assert.same({ 2, 1, 10 }, m.attention_weights:shape())
    assert.close(m.attention_weights:select(1, 1):select(1, 1):narrow(1, 1, 3), { 0.5, 0.5, 0 }, { atol = 1e-6 })
  end)

  it("matches a naive softmax(QK^T/sqrt(d))V and passes gradcheck", function()
    local m = nn.DotProductAttention():eval()
    local q, k, v = attn.randn({ 2, 3, 4 }), attn.randn({ 2, 5, 4 }), attn.randn({ 2, 5, 2 })
    local lens = { 5, 2 }
    local out = m(q, k, v, lens)
    local Q, K, V = q:totable(), k:totable(), v:totable()
    for b = 1, 2 do
      local w = {}
      for n = 1, 3 do
        local scores = {}
        for j = 1, 5 do scores[j] = dot(Q[b][n], K[b][j]) / 2 end
        w[n] = masked_softmax(scores, lens[b])
      end
      assert.close(out:select(1, b), weighted(w, V[b]), { atol = 1e-5 })
      assert.close(m.attention_weights:select(1, b), w, { atol = 1e-6 })
    end
    helper.gradcheck(function(a, b, c) return m(a, b, c, lens) end,
      { helper.param({ 2, 3, 4 }), helper.param({ 2, 5, 4 }), helper.param({ 2, 5, 2 }) })
  end)

  it("uses dropout on the weights only in training", function()
    local m = nn.DotProductAttention(0.5)
    local q, k, v = attn.randn({ 2, 4, 4 }), attn.randn({ 2, 6, 4 }), attn.randn({ 2, 6, 3 })
    local a, b = m(q, k, v), m(q, k, v)
    assert.is_false(helper.compare(a, b))
    m:eval()
    assert.close(m(q, k, v), m(q, k, v), { atol = 0 })
  end)
end)

describe("nn.AdditiveAttention", function()
  before_each(function() attn.manual_seed(52) end)

  it("has the book's parameters: W_k, W_q, w_v without bias (w_v.weight is (1, num_hiddens))", function()
    local m = nn.AdditiveAttention{ key_size = 2, query_size = 20, num_hiddens = 8, dropout = 0.1 }
    assert.same({ "W_k.weight", "W_q.weight", "w_v.weight" }, m:state_dict_keys())
    assert.same({ 8, 2 }, m.W_k.weight:shape())
    assert.same({ 8, 20 }, m.W_q.weight:shape())
    assert.same({ 1, 8 }, m:state_dict()["w_v.weight"]:shape())
    -- positional form
    assert.same({ 1, 8 }, nn.AdditiveAttention(2, 20, 8, 0.1).w_v.weight:shape())
  end)

  it("gives the book's toy result [[2,3,4,5]], [[10,11,12,13]]", function()
    local m = nn.AdditiveAttention{ key_size = 2, query_size = 20, num_hiddens = 8, dropout = 0.1 }
    m:eval()
    local queries = attn.randn({ 2, 1, 20 })
    local keys = attn.ones({ 2, 10, 2 })
    local values = attn.arange(40):reshape({ 1, 10, 4 }):expand({ 2, 10, 4 }):contiguous()
    local out = m(queries, keys, values, attn.tensor({ 2, 6 }))
    assert.close(out, { { { 2, 3, 4, 5 } }, { { 10, 11, 12, 13 } } }, { atol = 1e-5 })
    assert.same({ 2, 1, 10 }, m.attention_weights:shape())
  end)

  it("matches a naive w_v^T tanh(W_q q + W_k k) and passes gradcheck", function()
    local m = nn.AdditiveAttention(3, 4, 5, 0)
    local q, k, v = attn.randn({ 2, 2, 4 }), attn.randn({ 2, 3, 3 }), attn.randn({ 2, 3, 2 })
    local lens = { 3, 1 }
    local out = m(q, k, v, lens)
    local Wq, Wk, wv = m.W_q.weight:totable(), m.W_k.weight:totable(), m.w_v.weight:totable()[1]
    for b = 1, 2 do
      local qh, kh = project(q:totable()[b], Wq), project(k:totable()[b], Wk)
      local w = {}
      for n = 1, 2 do
        local scores = {}
        for j = 1, 3 do
          local s = 0
          for h = 1, 5 do s = s + wv[h] * tanh(qh[n][h] + kh[j][h]) end
          scores[j] = s
        end
        w[n] = masked_softmax(scores, lens[b])
      end
      assert.close(out:select(1, b), weighted(w, v:totable()[b]), { atol = 1e-5 })
    end
    m:to("float64")
    helper.gradcheck(function(a, b, c) return m(a, b, c, lens) end,
      inputs_with_params(m, helper.param({ 2, 2, 4 }), helper.param({ 2, 3, 3 }), helper.param({ 2, 3, 2 })))
  end)
end)

describe("nn.MultiHeadAttention", function()
  before_each(function() attn.manual_seed(53) end)

  local function book_mha()
    return nn.MultiHeadAttention{ key_size = 100, query_size = 100, value_size = 100, num_hiddens = 100,
      num_heads = 5, dropout = 0.5 }
  end

  it("gives the book's shapes: (2, 4, 100) and per-head weights (2, 5, 4, 6)", function()
    local m = book_mha()
    m:eval()
    local X, Y = attn.ones({ 2, 4, 100 }), attn.ones({ 2, 6, 100 })
    local out = m(X, Y, Y, attn.tensor({ 3, 2 }))
    assert.same({ 2, 4, 100 }, out:shape())
    assert.same({ 2, 5, 4, 6 }, m.attention_weights:shape())
    -- valid_lens per sample, for every head: zeros past 3 and 2
    local w = m.attention_weights
    assert.equal(0, w:select(1, 1):narrow(3, 4, 3):abs():sum():item())
    assert.equal(0, w:select(1, 2):narrow(3, 3, 4):abs():sum():item())
    assert.close(w:sum(-1), attn.ones({ 2, 5, 4 }), { atol = 1e-6 })
    -- self-attention (section E)
    assert.same({ 2, 4, 100 }, m(X, X, X, { 3, 2 }):shape())
  end)

  it("has the book's parameter names (no bias by default) and structure", function()
    local m = book_mha()
    assert.same({ "W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight" }, m:state_dict_keys())
    local b = nn.MultiHeadAttention(4, 6, 8, 10, 2, 0, true)
    assert.same({ "W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias", "W_v.weight", "W_v.bias", "W_o.weight",
      "W_o.bias" }, b:state_dict_keys())
    assert.same({ 10, 6 }, b.W_q.weight:shape())
    assert.same({ 10, 4 }, b.W_k.weight:shape())
    assert.same({ 10, 8 }, b.W_v.weight:shape())
    local s = tostring(m)
    assert.matches("^MultiHeadAttention%(\n", s)
    assert.matches("\n  %(attention%): DotProductAttention%(\n    %(dropout%): Dropout%(p=0.5, inplace=False%)\n  %)", s)
    assert.matches("\n  %(W_o%): Linear%(in_features=100, out_features=100, bias=False%)\n%)$", s)
  end)

  it("matches a naive per-head loop, outputs and weights", function()
    local m = nn.MultiHeadAttention{ key_size = 3, query_size = 5, value_size = 4, num_hiddens = 6, num_heads = 3,
      dropout = 0 }:eval()
    local q, k, v = attn.randn({ 2, 3, 5 }), attn.randn({ 2, 4, 3 }), attn.randn({ 2, 4, 4 })
    local lens = { 4, 2 }
    local out = m(q, k, v, lens)
    for b = 1, 2 do
      local eo, ew = naive_mha(q:totable()[b], k:totable()[b], v:totable()[b], lens[b], mha_weights(m), 3)
      assert.close(out:select(1, b), eo, { atol = 1e-5 })
      assert.close(m.attention_weights:select(1, b), ew, { atol = 1e-6 })
    end
  end)

  it("gives each sample the result it gets alone (different valid_lens, pitfall 7)", function()
    local m = nn.MultiHeadAttention{ key_size = 8, query_size = 8, value_size = 8, num_hiddens = 8, num_heads = 4,
      dropout = 0 }:eval()
    local q, kv = attn.randn({ 3, 5, 8 }), attn.randn({ 3, 7, 8 })
    local lens = { 2, 7, 4 }
    local batched = m(q, kv, kv, attn.tensor(lens))
    local bw = m.attention_weights
    for b = 1, 3 do
      local qb, kb = q:narrow(1, b, 1), kv:narrow(1, b, 1)
      local alone = m(qb, kb, kb, { lens[b] })
      assert.close(batched:narrow(1, b, 1), alone, { atol = 1e-6 })
      assert.close(bw:narrow(1, b, 1), m.attention_weights, { atol = 1e-7 })
    end
  end)

  it("skips the weights in training unless keep_weights is set, with the same output (pitfall 9)", function()
    local m = nn.MultiHeadAttention{ key_size = 4, query_size = 4, value_size = 4, num_hiddens = 4, num_heads = 2,
      dropout = 0 }
    local X = attn.randn({ 2, 5, 4 })
    local trained = m(X, X, X, { 3, 5 })
    assert.is_nil(m.attention_weights)
    m.keep_weights = true
    assert.close(m(X, X, X, { 3, 5 }), trained, { atol = 0 })
    assert.same({ 2, 2, 5, 5 }, m.attention_weights:shape())
    m.keep_weights = nil
    m:eval()
    assert.close(m(X, X, X, { 3, 5 }), trained, { atol = 0 })
    assert.same({ 2, 2, 5, 5 }, m.attention_weights:shape())
    local add = nn.AdditiveAttention{ key_size = 4, query_size = 4, num_hiddens = 3, dropout = 0 }
    add(X, X, X, { 3, 5 })
    assert.is_nil(add.attention_weights)
    add:eval()
    add(X, X, X, { 3, 5 })
    assert.same({ 2, 5, 5 }, add.attention_weights:shape())
  end)

  it("passes opts on: causal equals the book's 2-D valid_lens, a per-sample keep-mask is repeated per head", function()
    local m = nn.MultiHeadAttention{ key_size = 4, query_size = 4, value_size = 4, num_hiddens = 4, num_heads = 2,
      dropout = 0 }:eval()
    local X = attn.randn({ 2, 5, 4 })
    -- d2l's decoder training mask: query row t has valid length t
    local rows = { { 1, 2, 3, 4, 5 }, { 1, 2, 3, 4, 5 } }
    local by_lens = m(X, X, X, attn.tensor(rows))
    local by_lens_w = m.attention_weights
    assert.close(m(X, X, X, nil, { causal = true }), by_lens, { atol = 1e-6 })
    assert.close(m.attention_weights, by_lens_w, { atol = 1e-7 })
    -- a keep-mask per sample: sample 1 sees 3 keys, sample 2 sees 2
    local mask = {}
    for b, n in ipairs({ 3, 2 }) do
      mask[b] = {}
      for q = 1, 5 do
        mask[b][q] = {}
        for k = 1, 5 do mask[b][q][k] = k <= n and 1 or 0 end
      end
    end
    local by_mask = m(X, X, X, nil, { mask = attn.tensor(mask) })
    assert.close(by_mask, m(X, X, X, { 3, 2 }), { atol = 1e-6 })
  end)

  it("names the caller's mask, queries and keys when a mask does not fit (not the per-head copy)", function()
    local m = nn.MultiHeadAttention{ key_size = 4, query_size = 4, value_size = 4, num_hiddens = 4, num_heads = 2,
      dropout = 0 }
    local Q, K = attn.randn({ 3, 4, 4 }), attn.randn({ 3, 5, 4 })
    for _, shape in ipairs { { 3, 4, 6 }, { 2, 4, 5 }, { 6, 4, 5 }, { 3, 2, 4, 5 }, { 4, 6 } } do
      local bad = attn.ones(shape, "int64")
      assert.error_matches(function() m(Q, K, K, nil, { mask = bad }) end,
        "MultiHeadAttention: mask " .. attn.core.shape_str(bad):gsub("[%[%]]", "%%%0") .. " does not fit queries " ..
        "%[3x4x4%] and keys %[3x5x4%]: expected %(Nq, Nk%) = %[4x5%] or %(B, Nq, Nk%) = %[3x4x5%] %(sizes 1 " ..
        "broadcast%); the layer repeats a per%-sample mask for its 2 heads itself")
    end
    -- what it accepts: (Nq, Nk), (B, Nq, Nk) and shapes that broadcast to them
    for _, shape in ipairs { { 4, 5 }, { 3, 4, 5 }, { 1, 4, 5 }, { 3, 1, 5 }, { 1, 5 }, { 5 } } do
      assert.same({ 3, 4, 4 }, m(Q, K, K, nil, { mask = attn.ones(shape, "int64") }):shape())
    end
  end)

  it("passes gradcheck for queries, keys, values and every parameter (float64)", function()
    local m = nn.MultiHeadAttention{ key_size = 3, query_size = 4, value_size = 2, num_hiddens = 4, num_heads = 2,
      dropout = 0.5, bias = true }
    m:eval():to("float64")
    local lens = attn.tensor({ 3, 0 }, "float64") -- one all-padding sample (pitfall 2)
    helper.gradcheck(function(a, b, c) return m(a, b, c, lens) end,
      inputs_with_params(m, helper.param({ 2, 2, 4 }), helper.param({ 2, 3, 3 }), helper.param({ 2, 3, 2 })))
  end)

  it("applies attention dropout only in training", function()
    local m = book_mha()
    local X = attn.randn({ 2, 4, 100 })
    assert.is_false(helper.compare(m(X, X, X), m(X, X, X)))
    m:eval()
    assert.close(m(X, X, X), m(X, X, X), { atol = 0 })
  end)

  it("names the failing child in errors", function()
    local m = nn.MultiHeadAttention{ key_size = 8, query_size = 8, value_size = 8, num_hiddens = 8, num_heads = 2,
      dropout = 0 }
    local ok, err = pcall(m, attn.ones({ 2, 4, 3 }), attn.ones({ 2, 5, 8 }), attn.ones({ 2, 5, 8 }))
    assert.is_false(ok)
    assert.matches("^in MultiHeadAttention%.W_q %(Linear%): Linear: input %[2x4x3%] has last dim 3", err)
    assert.error_matches(function() nn.MultiHeadAttention(8, 8, 8, 10, 3, 0) end, "not divisible by num_heads 3")
    assert.error_matches(function() nn.MultiHeadAttention{ key_size = 8, num_hiddens = 8, num_heads = 2 } end,
      "query_size must be a positive integer")
  end)

  it("round-trips its state dict into a fresh instance", function()
    local a = book_mha()
    attn.manual_seed(1)
    local b = book_mha()
    a:eval()
    b:eval()
    b:load_state_dict(a:state_dict())
    local X = attn.randn({ 1, 3, 100 })
    assert.close(b(X, X, X), a(X, X, X), { atol = 0 })
    local sd = a:state_dict()
    sd["W_o.weight"] = nil
    assert.error_matches(function() b:load_state_dict(sd) end,
      "load_state_dict: MultiHeadAttention: missing key 'W_o.weight'", nil, true)
    sd["W_o.weight"] = attn.zeros({ 100, 100 })
    sd["W_q.weight"] = attn.zeros({ 4, 3 })
    assert.error_matches(function() b:load_state_dict(sd) end,
      "load_state_dict: MultiHeadAttention: key 'W_q.weight' has shape [4x3], parameter has [100x100]", nil, true)
  end)
end)

describe("nn.PositionalEncoding", function()
  it("adds the sinusoidal table P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(...)", function()
    local pe = nn.PositionalEncoding{ num_hiddens = 32, dropout = 0 }
    pe:eval()
    local out = pe(attn.zeros({ 1, 60, 32 }))
    assert.same({ 1, 60, 32 }, out:shape())
    local expected = {}
    for t = 1, 60 do
      local i = t - 1 -- position, 0-based as in the book
      expected[t] = {}
      for c = 1, 32 do
        local j = (c - 1) // 2
        local angle = i / 10000 ^ (2 * j / 32)
        expected[t][c] = (c - 1) % 2 == 0 and math.sin(angle) or math.cos(angle)
      end
    end
    assert.close(out:select(1, 1), expected, { atol = 1e-5 })
    -- adds to the input, batch broadcast
    local X = attn.randn({ 2, 5, 32 })
    assert.close(pe(X) - X, attn.tensor({ expected[1], expected[2], expected[3], expected[4], expected[5] })
      :unsqueeze(1):expand({ 2, 5, 32 }), { atol = 1e-5 })
    -- no state: the book's state dict for this layer is empty
    assert.same({}, pe:state_dict_keys())
    assert.equal("float64", pe(attn.zeros({ 1, 2, 32 }, "float64")):dtype())
  end)

  it("applies dropout in training, passes gradcheck and checks the length", function()
    attn.manual_seed(6)
    local pe = nn.PositionalEncoding(8, 0.5, 10)
    local X = attn.ones({ 2, 6, 8 })
    assert.is_false(helper.compare(pe(X), pe(X)))
    pe:eval()
    helper.gradcheck(function(x) return pe(x) end, { helper.param({ 2, 3, 8 }) })
    assert.error_matches(function() pe(attn.ones({ 1, 11, 8 })) end,
      "input %[1x11x8%] must be %(..., T, 8%) with offset %+ T <= max_len 10")
  end)
end)

describe("nn.LearnedPositionalEncoding", function()
  it("adds a learned row per position and passes gradcheck", function()
    attn.manual_seed(7)
    local pe = nn.LearnedPositionalEncoding{ num_hiddens = 4, max_len = 6, dropout = 0 }
    assert.same({ "embedding.weight" }, pe:state_dict_keys())
    assert.same({ 6, 4 }, pe.embedding.weight:shape())
    local X = attn.randn({ 2, 3, 4 })
    local W = pe.embedding.weight:totable()
    assert.close(pe(X) - X, attn.tensor({ W[1], W[2], W[3] }):unsqueeze(1):expand({ 2, 3, 4 }), { atol = 1e-6 })
    pe:to("float64")
    helper.gradcheck(function(x) return pe(x) end, { helper.param({ 2, 3, 4 }), pe.embedding.weight })
  end)
end)

describe("attention layers with int64 valid_lens", function()
  it("give the same outputs and weights as float lengths, 1-D and 2-D", function()
    attn.manual_seed(21)
    local q, k, v = attn.randn({ 2, 3, 4 }), attn.randn({ 2, 5, 4 }), attn.randn({ 2, 5, 6 })
    local layers = { nn.DotProductAttention(0), nn.AdditiveAttention(4, 4, 8, 0), nn.MultiHeadAttention(4, 4, 6, 8, 2, 0) }
    for _, m in ipairs(layers) do
      m:eval()
      for _, lens in ipairs({ { 5, 2 }, { { 1, 2, 3 }, { 4, 5, 0 } } }) do
        local a = m(q, k, v, attn.tensor(lens, "int64"))
        local wa = m.attention_weights
        local b = m(q, k, v, attn.tensor(lens))
        assert.close(a, b, { atol = 0 })
        assert.close(wa, m.attention_weights, { atol = 0 })
      end
    end
  end)
end)
