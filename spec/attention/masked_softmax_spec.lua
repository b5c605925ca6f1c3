-- d2l's masked_softmax and sequence_mask: the book's examples, a naive reference, gradients,
-- numerical stability and argument validation.
local attn = require "attn"
local helper = require "helper"

-- Naive masked softmax (plain Lua): entries past the valid length become -1e6.
local function naive_masked_softmax(X, vl)
  local out = {}
  for b = 1, #X do
    out[b] = {}
    for i = 1, #X[b] do
      local len = vl == nil and #X[b][i] or (type(vl[b]) == "table" and vl[b][i] or vl[b])
      local z, m = {}, -math.huge
      for j = 1, #X[b][i] do
        z[j] = j <= len and X[b][i][j] or -1e6
        m = math.max(m, z[j])
      end
      local s = 0
      for j = 1, #z do
        z[j] = math.exp(z[j] - m)
        s = s + z[j]
      end
      for j = 1, #z do z[j] = z[j] / s end
      out[b][i] = z
    end
  end
  return out
end

local function tol(dtype) return dtype == "float64" and { atol = 1e-12 } or { atol = 1e-6, rtol = 1e-5 } end

describe("masked_softmax", function()
  it("zeros the book's example past the valid lengths {2, 3}", function()
    attn.manual_seed(0)
    local X = attn.rand({ 2, 2, 4 })
    local Y = attn.masked_softmax(X, { 2, 3 })
    helper.assert_close(Y, naive_masked_softmax(X:totable(), { 2, 3 }), tol("float32"))
    local y = Y:totable()
    for i = 1, 2 do
      assert.equal(0, y[1][i][3])
      assert.equal(0, y[1][i][4])
      assert.equal(0, y[2][i][4])
      assert.is_true(y[2][i][3] > 0)
    end
    helper.assert_close(Y:sum(3), attn.ones({ 2, 2 }), { atol = 1e-6 })
  end)

  it("takes 2-D lengths, as the book's [[1, 3], [2, 4]]", function()
    attn.manual_seed(1)
    local X = attn.rand({ 2, 2, 4 })
    local vl = { { 1, 3 }, { 2, 4 } }
    local Y = attn.masked_softmax(X, vl)
    helper.assert_close(Y, naive_masked_softmax(X:totable(), vl), tol("float32"))
    helper.assert_close(Y:select(1, 1):select(1, 1), { 1, 0, 0, 0 }, { atol = 0 })
  end)

  it("gives a uniform row for a valid length of 0 (d2l's -1e6 fill), never NaN", function()
    local X = attn.randn({ 2, 3, 5 }, "float64")
    local Y = attn.masked_softmax(X, { 0, 2 })
    helper.assert_close(Y:select(1, 1), attn.full({ 3, 5 }, 0.2, "float64"), { atol = 1e-15 })
    Y = attn.masked_softmax(X, { { 1, 0, 5 }, { 0, 0, 2 } })
    helper.assert_close(Y:select(1, 2):select(1, 1), { 0.2, 0.2, 0.2, 0.2, 0.2 }, { atol = 1e-15 })
  end)

  it("matches the naive reference for tables, tensors, nil lengths and both dtypes", function()
    for _, dtype in ipairs { "float32", "float64" } do
      attn.manual_seed(2)
      local X = attn.randn({ 3, 70, 9 }, dtype) * 3
      local vl1, vl2 = { 4, 0, 9 }, {}
      for b = 1, 3 do
        vl2[b] = {}
        for i = 1, 70 do vl2[b][i] = (b * i) % 10 end
      end
      local x = X:totable()
      helper.assert_close(attn.masked_softmax(X), naive_masked_softmax(x, nil), tol(dtype))
      helper.assert_close(attn.masked_softmax(X), X:softmax(3), tol(dtype))
      helper.assert_close(attn.masked_softmax(X, vl1), naive_masked_softmax(x, vl1), tol(dtype))
      helper.assert_close(attn.masked_softmax(X, vl2), naive_masked_softmax(x, vl2), tol(dtype))
      helper.assert_close(attn.masked_softmax(X, attn.tensor(vl1)), attn.masked_softmax(X, vl1), { atol = 0 })
      helper.assert_close(attn.masked_softmax(X, attn.tensor(vl2, "float64")), attn.masked_softmax(X, vl2),
        { atol = 0 })
    end
  end)

  it("reads non-contiguous inputs", function()
    attn.manual_seed(3)
    local X = attn.randn({ 2, 6, 5 }):transpose(2, 3) -- (2, 5, 6)
    local vl = { { 1, 2, 3, 4, 5 }, { 6, 0, 6, 1, 2 } }
    helper.assert_close(attn.masked_softmax(X, vl), naive_masked_softmax(X:totable(), vl), tol("float32"))
    local lens = attn.tensor({ { 9, 3 }, { 5, 9 } }):transpose(1, 2) -- a transposed lengths tensor
    helper.assert_close(attn.masked_softmax(attn.rand({ 2, 2, 9 }), lens):select(1, 2):select(1, 1):narrow(1, 6, 4),
      { 0, 0, 0, 0 }, { atol = 0 })
  end)

  it("back-propagates into non-contiguous inputs like the naive reference", function()
    attn.manual_seed(4)
    for _, dtype in ipairs { "float64", "float32" } do
      local X = attn.randn({ 2, 7, 5 }, dtype):transpose(2, 3):requires_grad_() -- (2, 5, 7)
      local G = attn.randn({ 2, 5, 7 }, dtype)
      local vl = { { 1, 7, 0, 3, 2 }, { 7, 6, 5, 4, 3 } }
      local Y = attn.masked_softmax(X, vl)
      ;(Y * G):sum():backward()
      local p, g, want = naive_masked_softmax(X:totable(), vl), G:totable(), {}
      for b = 1, 2 do
        want[b] = {}
        for i = 1, 5 do
          local dot = 0
          for j = 1, 7 do dot = dot + p[b][i][j] * g[b][i][j] end
          want[b][i] = {}
          for j = 1, 7 do want[b][i][j] = j <= vl[b][i] and p[b][i][j] * (g[b][i][j] - dot) or 0 end
        end
      end
      helper.assert_close(X.grad, want, dtype == "float64" and { atol = 1e-12 } or { atol = 1e-5 })
    end
  end)

  it("stays exact for logits of magnitude 1e4 and rows with one huge value", function()
    for _, dtype in ipairs { "float32", "float64" } do
      local X = attn.tensor({ { { 1e4, -1e4, 0, 5e3 }, { -1e4, -1e4 + 1, -1e4 + 2, 1e4 } } }, dtype)
      local Y = attn.masked_softmax(X, { 3 })
      helper.assert_close(Y, naive_masked_softmax(X:totable(), { 3 }), tol(dtype))
      helper.assert_close(Y:select(1, 1):select(1, 1), { 1, 0, 0, 0 }, { atol = 0 })
      local e = math.exp(1)
      helper.assert_close(Y:select(1, 1):select(1, 2), { 1 / (1 + e + e * e), e / (1 + e + e * e),
        e * e / (1 + e + e * e), 0 }, tol(dtype))
      -- scores far below the fill value: the fill wins, as in the book
      local low = attn.masked_softmax(attn.full({ 1, 1, 3 }, -3e6, dtype), { 1 })
      helper.assert_close(low, { { { 0, 0.5, 0.5 } } }, { atol = 1e-6 })
    end
  end)

  it("has exact zero gradients past the valid lengths and passes gradient checks", function()
    local X = helper.param({ 2, 3, 5 })
    for _, vl in ipairs { {}, { 2, 5 }, { 0, 3 }, { { 1, 0, 5 }, { 2, 3, 4 } } } do
      local lens = #vl > 0 and vl or nil
      helper.gradcheck(function(x) return attn.masked_softmax(x, lens) end, { X })
    end
    X.grad = nil
    local Y = attn.masked_softmax(X, { 2, 0 })
    ;(Y * attn.randn({ 2, 3, 5 }, "float64")):sum():backward()
    local g = X.grad:totable()
    for i = 1, 3 do
      for j = 3, 5 do assert.equal(0, g[1][i][j]) end
      for j = 1, 5 do assert.equal(0, g[2][i][j]) end -- length 0: the row does not depend on X
    end
  end)

  it("does not read masked entries (NaN there stays out)", function()
    local X = attn.randn({ 2, 2, 4 }, "float64")
    X:set(0 / 0, 1, 2, 4)
    X:set(1 / 0, 2, 1, 3)
    X:requires_grad_()
    local Y = attn.masked_softmax(X, { 3, 2 })
    for _, v in ipairs(Y:reshape(16):totable()) do assert.is_true(v == v) end
    Y:sum():backward()
    for _, v in ipairs(X.grad:reshape(16):totable()) do assert.is_true(v == v and v ~= 1 / 0) end
  end)

  it("validates lengths and X, naming valid_lens and the shapes", function()
    local X = attn.rand({ 2, 2, 4 })
    local function fails(pattern, ...)
      local ok, err = pcall(attn.masked_softmax, ...)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(pattern, 1, true), "message '" .. tostring(err) .. "' lacks " .. pattern)
    end
    fails("valid_lens has shape [3], which does not fit X [2x2x4] (expected [2] or [2x2])", X, { 1, 2, 3 })
    fails("valid_lens has shape [2x3]", X, { { 1, 2, 3 }, { 1, 2, 3 } })
    fails("holds -1 at entry 1 (1-based), a negative length", X, { -1, 2 })
    fails("a negative length", X, attn.tensor({ 2, -3 }, "int64"))
    fails("not an integer", X, { 1.5, 2 })
    fails("not an integer", X, attn.tensor({ 0 / 0, 1 }))
    fails("valid_lens entry 2 is a string", X, { 1, "2" })
    fails("X must be (B, Q, K), got [2x4]", attn.rand({ 2, 4 }), { 1, 2 })
  end)
end)

describe("sequence_mask", function()
  it("gives the book's [[1, 0, 0], [4, 5, 0]]", function()
    local X = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    helper.assert_close(attn.sequence_mask(X, { 1, 2 }), { { 1, 0, 0 }, { 4, 5, 0 } }, { atol = 0 })
    helper.assert_close(attn.sequence_mask(X, attn.tensor({ 1, 2 })), { { 1, 0, 0 }, { 4, 5, 0 } }, { atol = 0 })
  end)

  it("sets whole feature rows of 3-D inputs, with any value", function()
    local X = attn.ones({ 2, 3, 4 })
    local Y = attn.sequence_mask(X, { 1, 2 }, -1)
    helper.assert_close(Y, { { { 1, 1, 1, 1 }, { -1, -1, -1, -1 }, { -1, -1, -1, -1 } },
      { { 1, 1, 1, 1 }, { 1, 1, 1, 1 }, { -1, -1, -1, -1 } } }, { atol = 0 })
    local Z = attn.sequence_mask(attn.ones({ 2, 2, 2, 2 }):transpose(1, 2):transpose(1, 2), { 0, 2 })
    helper.assert_close(Z:sum(), 8, { atol = 0 })
  end)

  it("replaces NaN at masked steps and has zero gradient there", function()
    local X = helper.param({ 2, 3, 2 })
    helper.gradcheck(function(x) return attn.sequence_mask(x, { 2, 0 }, 3) end, { X })
    local Xn = X:detach():clone()
    Xn:set(0 / 0, 1, 3, 1)
    local Y = attn.sequence_mask(Xn, { 2, 3 })
    assert.equal(0, Y:get(1, 3, 1))
  end)

  it("validates its arguments", function()
    local X = attn.ones({ 2, 3 })
    local function fails(pattern, ...)
      local ok, err = pcall(attn.sequence_mask, ...)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(pattern, 1, true), "message '" .. tostring(err) .. "' lacks " .. pattern)
    end
    fails("valid_len has shape [3], which does not fit X [2x3] (expected [2])", X, { 1, 2, 3 })
    fails("a negative length", X, { -4, 1 })
    fails("not an integer", X, { 0.5, 1 })
    fails("at least 2 dims", attn.ones({ 3 }), { 1, 2, 3 })
  end)
end)

describe("masked_softmax with int64 lengths", function()
  it("equals the float-length result, for 1-D and 2-D lengths", function()
    attn.manual_seed(3)
    local X = attn.randn({ 2, 3, 5 }, "float64")
    for _, lens in ipairs({ { 2, 5 }, { { 1, 0, 5 }, { 3, 4, 2 } } }) do
      local expected = naive_masked_softmax(X:totable(), lens)
      assert.close(attn.masked_softmax(X, attn.tensor(lens, "int64")), expected, { atol = 1e-12 })
      assert.close(attn.masked_softmax(X, attn.tensor(lens, "float32")), expected, { atol = 1e-12 })
    end
    helper.gradcheck(function(x) return attn.masked_softmax(x, attn.tensor({ 2, 4 }, "int64")) end,
      { helper.param({ 2, 2, 4 }) })
  end)

  it("drive sequence_mask too", function()
    local X = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, "int64")
    assert.same({ { 1, 0, 0 }, { 4, 5, 0 } }, attn.sequence_mask(X, attn.tensor({ 1, 2 }, "int64")):totable())
    local F = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.same({ { 1, -1, -1 }, { 4, 5, 6 } }, attn.sequence_mask(F, attn.tensor({ 1, 3 }, "int64"), -1):totable())
  end)

  it("reads lengths past K as all of K (the book's untruncated source lengths), 1-D and 2-D", function()
    attn.manual_seed(4)
    local X = attn.randn({ 2, 3, 4 }, "float64")
    local cases = { { { 9, 2 }, { 4, 2 } }, { { { 5, 1, 4 }, { 100, 0, 1 << 40 } }, { { 4, 1, 4 }, { 4, 0, 4 } } } }
    for _, case in ipairs(cases) do
      local long, clipped = case[1], case[2]
      local expected = naive_masked_softmax(X:totable(), clipped)
      for _, dtype in ipairs({ "int64", "float64", "float32" }) do
        local lens = attn.tensor(long, dtype)
        assert.close(attn.masked_softmax(X, lens), expected, { atol = 1e-12 })
      end
      assert.close(attn.masked_softmax(X, long), expected, { atol = 1e-12 })
    end
    helper.gradcheck(function(x) return attn.masked_softmax(x, attn.tensor({ 7, 2 }, "int64")) end,
      { helper.param({ 2, 2, 4 }) })
    local Y = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.same({ { 1, 2, 3 }, { 4, 0, 0 } }, attn.sequence_mask(Y, attn.tensor({ 10, 1 }, "int64")):totable())
    assert.same({ { 1, 2, 3 }, { 4, 0, 0 } }, attn.sequence_mask(Y, { 4.0, 1 }):totable())
  end)

  it("refuses negative int64 lengths, naming the entry", function()
    local ok, err = pcall(attn.masked_softmax, attn.ones({ 2, 1, 3 }), attn.tensor({ 1, -1 }, "int64"))
    assert.is_false(ok)
    assert.truthy(err:find("valid_lens holds -1 at entry 2 (1-based), a negative length", 1, true), err)
  end)
end)
