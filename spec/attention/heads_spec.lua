-- Multi-head layout (split_heads / merge_heads / repeat_interleave), the book's multi-head shape
-- check composed from the functional pieces, and the sinusoidal positional encoding.
local attn = require "attn"
local helper = require "helper"

-- Multi-head attention from the functional pieces (projections are plain tensors, no bias).
local function multihead(q, k, v, W, H, valid_lens)
  local Q = attn.split_heads(q:matmul(W.q), H)
  local K = attn.split_heads(k:matmul(W.k), H)
  local V = attn.split_heads(v:matmul(W.v), H)
  local out, w = attn.dot_product_attention(Q, K, V, { valid_lens = attn.repeat_interleave(valid_lens, H) })
  return attn.merge_heads(out, H):matmul(W.o), w
end

local function weights(D, dtype)
  return { q = attn.randn({ D, D }, dtype) * 0.1, k = attn.randn({ D, D }, dtype) * 0.1,
    v = attn.randn({ D, D }, dtype) * 0.1, o = attn.randn({ D, D }, dtype) * 0.1 }
end

-- Head h of sample b is row (b-1)*H + h of the head layout Y and columns (h-1)*dh+1 .. h*dh of
-- sample b in the merged layout X: checked head by head, exactly.
local function assert_heads(X, Y, H, dh)
  for b = 1, X:size(1) do
    for h = 1, H do
      helper.assert_close(Y:select(1, (b - 1) * H + h), X:select(1, b):narrow(2, (h - 1) * dh + 1, dh), { atol = 0 })
    end
  end
end

describe("split_heads and merge_heads", function()
  it("use d2l's batch-major layout: row b*H + h holds head h of sample b", function()
    local B, N, H, dh = 2, 3, 4, 5
    local X = attn.arange(0, B * N * H * dh, 1, "float64"):reshape(B, N, H * dh)
    local Y = attn.split_heads(X, H)
    assert.same({ B * H, N, dh }, Y:shape())
    assert_heads(X, Y, H, dh)
    helper.assert_close(attn.merge_heads(Y, H), X, { atol = 0 })
  end)

  it("read strided views (one copy in C) with the same layout, float32 and float64", function()
    local B, N, H, dh = 3, 4, 2, 3
    for _, dtype in ipairs({ "float32", "float64" }) do
      -- (B, N, H*dh) as a transposed view of (B, H*dh, N), and (B*H, N, dh) as one of (B*H, dh, N)
      local X = attn.randn({ B, H * dh, N }, dtype):transpose(2, 3)
      local Y = attn.split_heads(X, H)
      assert.is_true(Y:is_contiguous())
      assert_heads(X, Y, H, dh)
      local Z = attn.randn({ B * H, dh, N }, dtype):transpose(2, 3)
      assert_heads(attn.merge_heads(Z, H), Z, H, dh)
    end
  end)

  it("move rows of 16, 32 and 64 bytes (the fixed-size row copies) to the same layout", function()
    for _, dtype in ipairs({ "float32", "float64" }) do
      for _, dh in ipairs({ 4, 8, 16 }) do
        local B, N, H = 3, 5, 4
        local X = attn.randn({ B, N, H * dh }, dtype)
        assert_heads(X, attn.split_heads(X, H), H, dh)
        local Z = attn.randn({ B * H, N, dh }, dtype)
        assert_heads(attn.merge_heads(Z, H), Z, H, dh)
      end
    end
  end)

  it("split copies past 32768 elements over the threads, with the same layout on 1, 2 and 3 threads", function()
    -- a decoder step's (B, 10, 32) keys at B = 256 (rows of 32 bytes), rows of 64 bytes, and a
    -- transposed view (strided rows): each run of rows is its own stretch of the output
    local before = attn.get_num_threads()
    local cases = {
      { attn.randn { 256, 10, 32 }, 4, 8 },
      { attn.randn({ 128, 10, 64 }, "float64"), 4, 16 },
      { attn.randn({ 64, 32, 40 }):transpose(2, 3), 4, 8 },
    }
    for _, c in ipairs(cases) do
      local X, H, dh = c[1], c[2], c[3]
      local Z = attn.split_heads(X, H):contiguous()
      local first
      for _, n in ipairs { 1, 2, 3 } do
        attn.set_num_threads(n)
        local Y, M = attn.split_heads(X, H), attn.merge_heads(Z, H)
        if n == 1 then
          assert_heads(X, Y, H, dh)
          assert_heads(M, Z, H, dh)
          first = { Y, M }
        else
          helper.assert_close(Y, first[1], { atol = 0 })
          helper.assert_close(M, first[2], { atol = 0 })
        end
      end
    end
    attn.set_num_threads(before)
  end)

  it("are differentiable", function()
    helper.gradcheck(function(x) return attn.merge_heads(attn.split_heads(x, 3):pow(2), 3) end,
      { helper.param({ 2, 4, 6 }) })
    -- each one node: checked alone too, so one backward cannot hide a wrong other
    helper.gradcheck(function(x) return attn.split_heads(x, 3) end, { helper.param({ 2, 4, 6 }) })
    helper.gradcheck(function(x) return attn.merge_heads(x, 2) end, { helper.param({ 4, 3, 5 }) })
  end)

  it("check divisibility and head counts", function()
    local ok, err = pcall(attn.split_heads, attn.ones({ 2, 3, 10 }), 4)
    assert.is_false(ok)
    assert.is_truthy(err:find("width 10 of X [2x3x10] is not divisible by num_heads 4", 1, true), err)
    ok, err = pcall(attn.merge_heads, attn.ones({ 3, 3, 10 }), 2)
    assert.is_false(ok)
    assert.is_truthy(err:find("batch 3", 1, true), err)
    ok, err = pcall(attn.split_heads, attn.ones({ 2, 3, 10 }), 0)
    assert.is_false(ok)
    assert.is_truthy(err:find("num_heads must be a positive integer", 1, true), err)
  end)
end)

describe("repeat_interleave", function()
  it("repeats each sample's lengths for its heads (tables and tensors, 1-D and 2-D along dim 1)", function()
    assert.same({ 3, 3, 3, 2, 2, 2 }, attn.repeat_interleave({ 3, 2 }, 3))
    assert.same({ { 1, 3 }, { 1, 3 }, { 2, 4 }, { 2, 4 } }, attn.repeat_interleave({ { 1, 3 }, { 2, 4 } }, 2))
    helper.assert_close(attn.repeat_interleave(attn.tensor({ 3, 2 }), 2), { 3, 3, 2, 2 }, { atol = 0 })
    helper.assert_close(attn.repeat_interleave(attn.tensor({ { 1, 3 }, { 2, 4 } }), 2, 1),
      { { 1, 3 }, { 1, 3 }, { 2, 4 }, { 2, 4 } }, { atol = 0 })
    assert.is_nil(attn.repeat_interleave(nil, 4))
    assert.is_false(pcall(attn.repeat_interleave, { 1, 2 }, 1.5))
  end)

  it("keeps int64 lengths int64 and exact", function()
    local r = attn.repeat_interleave(attn.tensor({ 3, (1 << 53) + 1 }, "int64"), 2)
    assert.are.equal("int64", r:dtype())
    assert.same({ 3, 3, (1 << 53) + 1, (1 << 53) + 1 }, r:totable())
  end)

  it("reads strided lengths (one copy in C): a transposed (B, Q) table", function()
    local lens = attn.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, "int64"):t() -- (2, 3), not contiguous
    assert.same({ { 1, 3, 5 }, { 1, 3, 5 }, { 1, 3, 5 }, { 2, 4, 6 }, { 2, 4, 6 }, { 2, 4, 6 } },
      attn.repeat_interleave(lens, 3, 1):totable())
  end)
end)

describe("multi-head attention from the functional pieces", function()
  it("gives the book's shape (2, 4, 100) for 100 hidden units, 5 heads, valid_lens {3, 2}", function()
    attn.manual_seed(0)
    local X = attn.ones({ 2, 4, 100 })
    local Y = attn.ones({ 2, 6, 100 })
    local out, w = multihead(X, Y, Y, weights(100), 5, { 3, 2 })
    assert.same({ 2, 4, 100 }, out:shape())
    assert.same({ 10, 4, 6 }, w:shape())
    -- head rows of sample 1 use length 3, of sample 2 length 2
    for h = 1, 5 do
      helper.assert_close(w:select(1, h):select(1, 1), { 1 / 3, 1 / 3, 1 / 3, 0, 0, 0 }, { atol = 1e-6 })
      helper.assert_close(w:select(1, 5 + h):select(1, 1), { 0.5, 0.5, 0, 0, 0, 0 }, { atol = 1e-6 })
    end
    -- self-attention (section E): the same block with X as queries, keys and values
    assert.same({ 2, 4, 100 }, (multihead(X, X, X, weights(100), 5, { 3, 2 })):shape())
  end)

  it("gives each sample the result it gets alone (no per-head mask tiling bug)", function()
    attn.manual_seed(1)
    local W = weights(12, "float64")
    local q, kv = attn.randn({ 3, 5, 12 }, "float64"), attn.randn({ 3, 7, 12 }, "float64")
    for _, vl in ipairs { { 2, 7, 4 }, { { 1, 2, 3, 4, 5 }, { 7, 6, 5, 4, 3 }, { 0, 1, 0, 1, 0 } } } do
      local out = multihead(q, kv, kv, W, 3, vl)
      for b = 1, 3 do
        local one = multihead(q:narrow(1, b, 1), kv:narrow(1, b, 1), kv:narrow(1, b, 1), W, 3, { vl[b] })
        helper.assert_close(out:narrow(1, b, 1), one, { atol = 1e-12 })
      end
    end
  end)

  it("back-propagates into the projection matrices", function()
    attn.manual_seed(2)
    local q, kv = attn.randn({ 2, 3, 4 }, "float64"), attn.randn({ 2, 5, 4 }, "float64")
    helper.gradcheck(function(wq, wk, wv, wo)
      return (multihead(q, kv, kv, { q = wq, k = wk, v = wv, o = wo }, 2, { 3, 5 }))
    end, { helper.param({ 4, 4 }), helper.param({ 4, 4 }), helper.param({ 4, 4 }), helper.param({ 4, 4 }) })
  end)
end)

describe("positional_encoding", function()
  it("follows P[pos, 2j] = sin(pos / 10000^(2j/d)), P[pos, 2j+1] = cos(...)", function()
    for _, d in ipairs { 32, 5 } do
      local P = attn.positional_encoding(60, d, "float64")
      assert.same({ 60, d }, P:shape())
      local p = P:totable()
      for pos = 0, 59 do
        for col = 0, d - 1 do
          local j2 = col - col % 2
          local a = pos / 10000 ^ (j2 / d)
          local want = col % 2 == 0 and math.sin(a) or math.cos(a)
          assert(math.abs(p[pos + 1][col + 1] - want) < 1e-12, string.format("P[%d, %d]", pos, col))
        end
      end
    end
  end)

  it("starts with [0, 1, 0, 1, ...], defaults to float32 and checks its arguments", function()
    local P = attn.positional_encoding(4, 6)
    assert.equal("float32", P:dtype())
    helper.assert_close(P:select(1, 1), { 0, 1, 0, 1, 0, 1 }, { atol = 0 })
    helper.assert_close(P:select(1, 2):narrow(1, 1, 2), { math.sin(1), math.cos(1) }, { atol = 1e-7 })
    assert.is_false(pcall(attn.positional_encoding, -1, 4))
    assert.is_false(pcall(attn.positional_encoding, 4, 2.5))
  end)

  it("makes an empty table at once, however wide (no work without rows)", function()
    local P = attn.positional_encoding(0, 1 << 40)
    assert.are.same({ 0, 1 << 40 }, P:shape())
  end)
end)
