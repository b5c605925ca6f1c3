-- The fused softmax cross-entropy (one C kernel each way, one node) against
-- the composed path (log_softmax, gather, squeeze, neg and a mask product,
-- each its own node) beyond spec/nn/fused_paths_spec.lua's rows: length
-- dtypes, rows past their length, finite differences, every reduction,
-- strided logits, id checks and the padding rule.
local attn = require "attn"
local helper = require "helper"
local loss = require "attn.nn.loss"

local nn = attn.nn

local TOL = { float32 = { rtol = 1e-5, atol = 1e-6 }, float64 = { rtol = 1e-12, atol = 1e-13 } }

-- Runs fn on a fresh leaf copy of x and backward through the sum weighted by
-- w (so every row gets its own incoming gradient); returns the value and grad.
local function value_and_grad(fn, x, w)
  local leaf = x:clone():requires_grad_()
  local out = fn(leaf)
  local weighted = w and (out * w):sum() or out:sum()
  weighted:backward()
  return out:detach(), leaf.grad
end

local function ids(B, T, V, dtype)
  local t = {}
  for b = 1, B do
    t[b] = {}
    for s = 1, T do t[b][s] = (b * 7 + s * 3) % V + 1 end
  end
  return attn.tensor(t, dtype)
end

describe("fused softmax cross-entropy", function()
  for _, dtype in ipairs { "float32", "float64" } do
    for _, id_dtype in ipairs { "int64", "float64" } do
      it("masks by valid length as the composed path does, " .. dtype .. " logits, " .. id_dtype .. " lengths", function()
        attn.manual_seed(6)
        local x = attn.randn({ 5, 4, 9 }, dtype) * 2
        local y = ids(5, 4, 9, "int64")
        -- none, some, all, more than T, and negative valid steps
        local lens = attn.tensor({ 0, 2, 4, 7, -1 }, id_dtype)
        local w = attn.rand({ 5, 4 }, dtype)
        local v1, g1 = value_and_grad(function(l) return select(1, loss.masked_token_mean(l, y, lens)) end, x)
        local v2, g2 = value_and_grad(function(l)
          local masked, mask = loss.masked_ce_composed(l, y, lens)
          return masked:sum() / mask:sum():item()
        end, x)
        assert.close(v1, v2, TOL[dtype])
        assert.close(g1, g2, TOL[dtype])
        local per_seq1, pg1 = value_and_grad(function(l) return nn.MaskedSoftmaxCELoss()(l, y, lens) end, x, w:mean(2))
        local per_seq2, pg2 = value_and_grad(function(l) return loss.masked_ce_composed(l, y, lens):mean(2) end, x,
          w:mean(2))
        assert.close(per_seq1, per_seq2, TOL[dtype])
        assert.close(pg1, pg2, TOL[dtype])
        -- rows past their length: loss 0 and no gradient
        assert.are.equal(0, per_seq1[1])
        assert.are.equal(0, pg1[1]:abs():sum():item())
        assert.are.equal(0, pg1[{ 2, { 3, 4 } }]:abs():sum():item())
      end)
    end
  end

  it("gives the same bits on 1 and 3 threads (rows split over the pool)", function()
    local function run(n)
      attn.set_num_threads(n)
      attn.manual_seed(12)
      local x = attn.randn({ 16, 20, 300 }):requires_grad_()
      local l = nn.MaskedSoftmaxCELoss()(x, ids(16, 20, 300, "int64"), attn.randint(0, 21, { 16 }, "int64"))
      l:sum():backward()
      return l, x.grad
    end
    local l1, g1 = run(1)
    local l3, g3 = run(3)
    attn.set_num_threads(2)
    helper.assert_identical(l3, l1)
    helper.assert_identical(g3, g1)
  end)

  it("counts valid tokens as an integer, a fractional length rounding down as t <= v does", function()
    local x = attn.randn({ 3, 4, 5 })
    local _, _, count = loss.masked_token_mean(x, ids(3, 4, 5, "int64"), { 2.5, 4, 1 })
    assert.are.equal(7, count)
    assert.are.equal("integer", math.type(count))
  end)

  it("passes finite differences (float64), plain and masked", function()
    local y = ids(2, 3, 4, "int64")
    helper.gradcheck(function(l) return nn.cross_entropy(l, y) end, { helper.param({ 2, 3, 4 }) })
    helper.gradcheck(function(l) return nn.MaskedSoftmaxCELoss()(l, y, { 2, 3 }) end, { helper.param({ 2, 3, 4 }) })
    helper.gradcheck(function(l) return (loss.masked_token_mean(l, y, attn.tensor({ 1, 3 }, "int64"))) end,
      { helper.param({ 2, 3, 4 }) })
  end)

  it("gives every CrossEntropyLoss reduction the composed path's value", function()
    attn.manual_seed(8)
    local x, y = attn.randn({ 6, 5 }, "float64"), attn.tensor({ 1, 5, 2, 2, 4, 3 }, "int64")
    local ref = loss.cross_entropy_composed(x, y)
    local tol = TOL.float64
    assert.close(nn.CrossEntropyLoss { reduction = "none" }(x, y), ref, tol)
    assert.close(nn.CrossEntropyLoss { reduction = "sum" }(x, y), ref:sum(), tol)
    assert.close(nn.CrossEntropyLoss()(x, y), ref:mean(), tol)
  end)

  it("reads strided logits", function()
    attn.manual_seed(9)
    local base = attn.randn({ 7, 3 }, "float64")
    local y = { 1, 7, 2 }
    local v1, g1 = value_and_grad(function(l) return nn.cross_entropy(l:transpose(1, 2), y) end, base)
    local v2, g2 = value_and_grad(function(l) return loss.cross_entropy_composed(l:transpose(1, 2), y) end, base)
    assert.close(v1, v2, TOL.float64)
    assert.close(g1, g2, TOL.float64)
  end)

  it("reads the rows of a permuted view in place (the decoder's time-major output)", function()
    attn.manual_seed(10)
    local base = attn.randn({ 4, 3, 6 }, "float64") -- (T, B, V), read as (B, T, V)
    local y, lens = ids(3, 4, 6, "int64"), { 4, 2, 3 }
    local fn = function(l) return nn.MaskedSoftmaxCELoss()(l:transpose(1, 2), y, lens) end
    local ref = function(l) return loss.masked_ce_composed(l:transpose(1, 2), y, lens):mean(2) end
    local v1, g1 = value_and_grad(fn, base, attn.tensor({ 1, 2, 3 }, "float64"))
    local v2, g2 = value_and_grad(ref, base, attn.tensor({ 1, 2, 3 }, "float64"))
    assert.close(v1, v2, TOL.float64)
    assert.close(g1, g2, TOL.float64)
  end)

  it("propagates a NaN in a padded row through the mask product, as the composed path does", function()
    local x = attn.zeros({ 1, 2, 3 })
    x[{ 1, 2, 1 }] = 0 / 0
    local l = loss.masked_ce_composed(x, { { 1, 1 } }, { 1 })
    local fused = nn.MaskedSoftmaxCELoss()(x, { { 1, 1 } }, { 1 })
    assert.is_true(l[1][2] ~= l[1][2])
    assert.is_true(fused[1] ~= fused[1])
  end)

  it("checks ids in the core and names the operation, value and position", function()
    local x = attn.zeros({ 2, 3, 4 })
    assert.error_matches(function() nn.MaskedSoftmaxCELoss()(x, attn.tensor({ { 1, 2, 3 }, { 4, 5, 1 } }), { 3, 3 }) end,
      "MaskedSoftmaxCELoss: label 5 at position 5 .- out of range 1%.%.4")
    assert.error_matches(function() nn.cross_entropy(x, attn.tensor({ { 1, 2, 3 }, { 1.5, 1, 1 } })) end,
      "cross_entropy: label 1%.5 at position 4 .-not an integer")
    assert.error_matches(function() nn.cross_entropy(x, attn.ones({ 3, 2 })) end,
      "cross_entropy: labels %[3x2%] must have the shape of logits %[2x3x4%] without its last %(class%) dim")
    assert.error_matches(function() nn.MaskedSoftmaxCELoss()(x, attn.ones({ 2, 3 }), { 1 }) end,
      "valid_len must be a tensor or table of 2 lengths")
  end)
end)
