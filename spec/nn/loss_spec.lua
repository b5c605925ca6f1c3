-- Cross-entropy, d2l's MaskedSoftmaxCELoss, the true token mean, and gradient
-- clipping. Expected values are computed by naive Lua loops.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn

-- -log softmax(row)[label] in plain Lua.
local function naive_ce(row, label)
  local m = -math.huge
  for _, v in ipairs(row) do m = math.max(m, v) end
  local s = 0
  for _, v in ipairs(row) do s = s + math.exp(v - m) end
  return -(row[label] - m - math.log(s))
end

describe("nn.CrossEntropyLoss", function()
  before_each(function() attn.manual_seed(41) end)

  it("matches a naive loop for every reduction, with 1-based labels", function()
    local logits = attn.randn({ 4, 5 }) * 2
    local labels = { 1, 5, 3, 3 }
    local rows = logits:totable()
    local per, sum = {}, 0
    for i = 1, 4 do
      per[i] = naive_ce(rows[i], labels[i])
      sum = sum + per[i]
    end
    assert.close(nn.CrossEntropyLoss{ reduction = "none" }(logits, labels), per, { atol = 1e-5 })
    assert.close(nn.CrossEntropyLoss{ reduction = "sum" }(logits, labels), sum, { atol = 1e-5 })
    assert.close(nn.CrossEntropyLoss()(logits, attn.tensor(labels)), sum / 4, { atol = 1e-5 })
  end)

  it("takes class-last logits (..., C) with labels (...) when asked: class_dim = -1", function()
    local logits = attn.randn({ 2, 3, 4 })
    local labels = { { 1, 2, 3 }, { 4, 4, 1 } }
    local out = nn.CrossEntropyLoss{ reduction = "none", class_dim = -1 }(logits, labels)
    assert.same({ 2, 3 }, out:shape())
    local rows = logits:totable()
    assert.close(out:get(2, 1), naive_ce(rows[2][1], 4), { atol = 1e-5 })
  end)

  it("validates labels and names the shapes", function()
    local loss = nn.CrossEntropyLoss()
    local logits = attn.randn({ 2, 3 })
    assert.error_matches(function() loss(logits, { 1, 4 }) end,
      "CrossEntropyLoss: label 4 at position 2 is out of range 1..3 (labels [2], logits [2x3])", nil, true)
    assert.error_matches(function() loss(logits, { 0, 1 }) end, "label 0 at position 1", nil, true)
    assert.error_matches(function() loss(logits, { 1, 2, 3 }) end,
      "CrossEntropyLoss: target [3] must be class ids [2] or probabilities [2x3] for input [2x3]", nil, true)
    assert.error_matches(function() nn.CrossEntropyLoss{ reduction = "avg" } end, "reduction must be")
  end)

  it("passes gradcheck (float64)", function()
    local x = helper.param({ 3, 4 })
    helper.gradcheck(function(l) return nn.CrossEntropyLoss()(l, { 2, 4, 1 }) end, { x })
    helper.gradcheck(function(l) return nn.CrossEntropyLoss{ reduction = "none" }(l, { 2, 4, 1 }) end, { x })
  end)
end)

describe("nn.MaskedSoftmaxCELoss", function()
  it("gives the book's {2.3026, 1.1513, 0} on uniform logits with lens {4, 2, 0}", function()
    local loss = nn.MaskedSoftmaxCELoss()
    local out = loss(attn.ones({ 3, 4, 10 }), attn.ones({ 3, 4 }), attn.tensor({ 4, 2, 0 }))
    assert.close(out, { 2.3026, 1.1513, 0 }, { atol = 1e-4 })
    -- exactly ln(10) * len / 4: the book divides by all T = 4 positions
    assert.close(out, { math.log(10), math.log(10) / 2, 0 }, { atol = 1e-6 })
    assert.close(loss(attn.ones({ 3, 4, 10 }), attn.ones({ 3, 4 }), { 4, 2, 0 }), out, { atol = 0 })
  end)

  it("matches a naive loop and ignores labels past valid_len", function()
    attn.manual_seed(3)
    local pred = attn.randn({ 2, 3, 5 })
    local label = { { 1, 2, 5 }, { 3, 4, 4 } }
    local lens = { 2, 3 }
    local rows = pred:totable()
    local expected = {}
    for b = 1, 2 do
      local s = 0
      for t = 1, lens[b] do s = s + naive_ce(rows[b][t], label[b][t]) end
      expected[b] = s / 3
    end
    local loss = nn.MaskedSoftmaxCELoss()
    assert.close(loss(pred, label, lens), expected, { atol = 1e-5 })
    -- any label (still a valid class) past the valid length changes nothing
    label[1][3] = 1
    assert.close(loss(pred, label, lens), expected, { atol = 1e-5 })
    local x = helper.param({ 2, 3, 5 })
    helper.gradcheck(function(p) return loss(p, label, lens) end, { x })
  end)

  it("masked_token_mean gives the true per-token mean and the book's number (= mean / T)", function()
    attn.manual_seed(4)
    local pred = attn.randn({ 3, 4, 6 })
    local label = { { 1, 2, 3, 4 }, { 5, 6, 1, 1 }, { 2, 2, 2, 2 } }
    local lens = { 4, 1, 2 }
    local rows = pred:totable()
    local total, count = 0, 0
    for b = 1, 3 do
      for t = 1, lens[b] do
        total = total + naive_ce(rows[b][t], label[b][t])
        count = count + 1
      end
    end
    local mean, book, n = nn.masked_token_mean(pred, label, lens)
    assert.equal(7, n)
    assert.close(mean, total / count, { atol = 1e-5 })
    assert.close(book, total / count / 4, { atol = 1e-6 })
    -- d2l's printed metric: sum of per-sequence losses / number of valid tokens
    local per_seq = nn.MaskedSoftmaxCELoss()(pred, label, lens)
    assert.close(per_seq:sum():item() / n, book, { atol = 1e-6 })
    -- no valid token: 0, not NaN
    local zero = nn.masked_token_mean(pred, label, { 0, 0, 0 })
    assert.equal(0, zero:item())
  end)

  it("validates its arguments", function()
    local loss = nn.MaskedSoftmaxCELoss()
    assert.error_matches(function() loss(attn.ones({ 3, 10 }), attn.ones({ 3 }), { 1, 1, 1 }) end,
      "pred must be a tensor %(B, T, V%), got %[3x10%]")
    assert.error_matches(function() loss(attn.ones({ 2, 3, 4 }), attn.ones({ 2, 3 }), { 1 }) end,
      "valid_len must be a tensor or table of 2 lengths")
  end)
end)

describe("nn.clip_grad_norm_", function()
  it("scales every gradient by max_norm / norm when the global norm is larger", function()
    local a = attn.zeros({ 2 }):requires_grad_()
    local b = attn.zeros({ 1 }):requires_grad_()
    local c = attn.zeros({ 1 }):requires_grad_() -- no grad: skipped
    a.grad = attn.tensor({ 3, 0 })
    b.grad = attn.tensor({ 4 })
    local norm = nn.clip_grad_norm_({ a, b, c }, 1)
    assert.close(norm, 5, { atol = 1e-6 })
    assert.close(a.grad, { 0.6, 0 }, { atol = 1e-6 })
    assert.close(b.grad, { 0.8 }, { atol = 1e-6 })
    assert.is_nil(c.grad)
    -- under the threshold: unchanged
    norm = nn.clip_grad_norm_({ a, b }, 2)
    assert.close(norm, 1, { atol = 1e-6 })
    assert.close(a.grad, { 0.6, 0 }, { atol = 1e-6 })
  end)

  it("accepts a module", function()
    local m = nn.Linear(3, 3)
    m(attn.ones({ 2, 3 }) * 100):sum():backward()
    local before = nn.clip_grad_norm(m, 1)
    assert.is_true(before > 1)
    local after = nn.clip_grad_norm(m, 1e9)
    assert.close(after, 1, { atol = 1e-5 })
  end)

  it("keeps the old name as an alias and names itself in errors", function()
    assert.are.equal(nn.clip_grad_norm_, nn.clip_grad_norm)
    assert.error_matches(function() nn.clip_grad_norm_({ attn.zeros(1) }, -1) end,
      "clip_grad_norm_: max_norm must be a non%-negative number, got %-1")
  end)
end)

describe("losses with int64 labels and lengths", function()
  it("equal the float-id results, with gradients", function()
    attn.manual_seed(8)
    local logits = attn.randn({ 2, 3, 5 })
    local label = { { 1, 5, 2 }, { 3, 3, 4 } }
    local lens = { 2, 3 }
    local L, V = attn.tensor(label, "int64"), attn.tensor(lens, "int64")
    local ce = nn.CrossEntropyLoss { class_dim = -1 }
    assert.close(ce(logits, L), ce(logits, label), { atol = 0 })
    local masked = nn.MaskedSoftmaxCELoss()
    assert.close(masked(logits, L, V), masked(logits, label, lens), { atol = 0 })
    local m1, b1, n1 = nn.masked_token_mean(logits, L, V)
    local m2, b2, n2 = nn.masked_token_mean(logits, label, lens)
    assert.close(m1, m2, { atol = 0 })
    assert.close(b1, b2, { atol = 0 })
    assert.equal(n2, n1)
    helper.gradcheck(function(p) return masked(p, L, V) end, { helper.param({ 2, 3, 5 }) })
    assert.error_matches(function() ce(logits, attn.tensor({ { 1, 6, 2 }, { 3, 3, 4 } }, "int64")) end,
      "CrossEntropyLoss: label 6 at position 2 is out of range 1..5 (labels [2x3], logits [2x3x5])", nil, true)
  end)
end)
