local attn = require "attn"
local metrics = require "attn.d2l.metrics"
local helper = require "helper"

local function round3(x) return math.floor(x * 1000 + 0.5) / 1000 end

describe("metrics.bleu", function()
  it("gives the book's 0.658 for il est paresseux . against il est calme .", function()
    -- p1 = 3/4, p2 = 1/3, no brevity penalty: sqrt(0.75) * (1/3)^(1/4) = 0.65804
    assert.are.equal(0.658, round3(metrics.bleu("il est paresseux .", "il est calme .", 2)))
    assert.is_true(math.abs(metrics.bleu("il est paresseux .", "il est calme .", 2) - 0.75 ^ 0.5 * (1 / 3) ^ 0.25) < 1e-12)
  end)

  it("reproduces the book's seq2seq scores 0.687, 0.447, 0.447 and 0.497", function()
    -- va ! feu / va !: BP = 1 (prediction longer), p1 = 2/3, p2 = 1/2 -> (2/3)^(1/2) (1/2)^(1/4) = 0.6866
    assert.are.equal(0.687, round3(metrics.bleu("va ! feu", "va !", 2)))
    -- j'ai perdu gagné aller ? / j'ai perdu .: p1 = 2/5, p2 = 1/4 -> 0.4^(1/2) 0.25^(1/4) = 0.4472
    assert.are.equal(0.447, round3(metrics.bleu("j'ai perdu gagné aller ?", "j'ai perdu .", 2)))
    -- il est riche bon ? / il est calme .: p1 = 2/5, p2 = 1/4 -> 0.4472
    assert.are.equal(0.447, round3(metrics.bleu("il est riche bon ?", "il est calme .", 2)))
    -- je suis chez en suis <unk> ! / je suis chez moi .: p1 = 3/7 (the second "suis" is clipped),
    -- p2 = 2/6 (je suis, suis chez) -> (3/7)^(1/2) (1/3)^(1/4) = 0.4974
    assert.are.equal(0.497, round3(metrics.bleu("je suis chez en suis <unk> !", "je suis chez moi .", 2)))
  end)

  it("applies the brevity penalty: ABCDEF against AB gives exp(1 - 3)", function()
    local v = metrics.bleu({ "A", "B" }, { "A", "B", "C", "D", "E", "F" }, 2)
    assert.is_true(math.abs(v - math.exp(-2)) < 1e-12)
    assert.are.equal(0.1353, math.floor(v * 1e4 + 0.5) / 1e4)
  end)

  it("gives 1 for identical sentences, 0 for an empty prediction, and no NaN for a prediction shorter than k", function()
    assert.are.equal(1, metrics.bleu("je suis chez moi .", "je suis chez moi .", 2))
    assert.are.equal(1, metrics.bleu({ "va", "!" }, { "va", "!" }, 4))
    assert.are.equal(0, metrics.bleu("", "va !", 2))
    assert.are.equal(0, metrics.bleu({}, { "va", "!" }, 2))
    -- One token against two: only n = 1 counts (later edition), BP = exp(1 - 2), p1 = 1.
    local v = metrics.bleu("va", "va !", 2)
    assert.is_true(v == v and math.abs(v - math.exp(-1)) < 1e-12)
    assert.are.equal(0, metrics.bleu("feu", "va !", 2))
  end)

  it("raises on bad arguments", function()
    assert.error_matches(function() metrics.bleu("a", "a", 0) end, "k must be a positive integer")
    assert.error_matches(function() metrics.bleu(3, "a", 2) end, "pred_tokens must be a string or a list")
  end)
end)

describe("metrics.accuracy and metrics.perplexity", function()
  -- Naive references over nested tables, in double.
  local function naive(logits, labels, lens)
    local correct, total, nll = 0, 0, 0
    for b = 1, #logits do
      for t = 1, math.min(lens[b], #logits[b]) do
        local row, best, mx = logits[b][t], 1, -math.huge
        for v = 1, #row do
          if row[v] > row[best] then best = v end
          mx = math.max(mx, row[v])
        end
        local z = 0
        for v = 1, #row do z = z + math.exp(row[v] - mx) end
        nll = nll - (row[labels[b][t]] - mx - math.log(z))
        if best == labels[b][t] then correct = correct + 1 end
        total = total + 1
      end
    end
    return correct, total, nll
  end

  it("match naive loops over a random batch with valid lengths", function()
    attn.manual_seed(17)
    local B, T, V = 4, 6, 7
    local logits = attn.randn({ B, T, V }, "float64") * 2
    local lt = logits:totable()
    local labels, lens = {}, { 6, 0, 3, 5 }
    for b = 1, B do
      labels[b] = {}
      for t = 1, T do
        -- Make about half of the labels the arg-max, so accuracy is neither 0 nor 1.
        local best = 1
        for v = 2, V do if lt[b][t][v] > lt[b][t][best] then best = v end end
        labels[b][t] = (t % 2 == 0) and best or (best % V) + 1
      end
    end
    local correct, total, nll = naive(lt, labels, lens)
    assert.are.equal(14, total)
    local acc, c, n = metrics.accuracy(logits, labels, lens)
    assert.are.same({ correct, total }, { c, n })
    assert.is_true(c > 0 and c < n)
    assert.are.equal(correct / total, acc)
    local ppl, sum, count = metrics.perplexity(logits, attn.tensor(labels), attn.tensor(lens))
    assert.are.equal(total, count)
    assert.is_true(math.abs(sum - nll) < 1e-9 * nll)
    assert.is_true(math.abs(ppl - math.exp(nll / total)) < 1e-9 * ppl)
    -- Integer id tensors (what attn.d2l.data yields) give the same numbers.
    local ids, lens64 = attn.tensor(labels, "int64"), attn.tensor(lens, "int64")
    assert.are.same({ acc, c, n }, { metrics.accuracy(logits, ids, lens64) })
    assert.are.same({ ppl, sum, count }, { metrics.perplexity(logits, ids, lens64) })
    -- float32 logits agree to float32 rounding.
    local ppl32 = metrics.perplexity(logits:to("float32"), labels, lens)
    assert.is_true(math.abs(ppl32 - ppl) < 1e-5 * ppl)
  end)

  it("give uniform logits a perplexity equal to the vocabulary size", function()
    local ppl = metrics.perplexity(attn.ones({ 2, 3, 10 }), { { 1, 2, 3 }, { 4, 5, 6 } }, { 3, 1 })
    assert.is_true(math.abs(ppl - 10) < 1e-5)
  end)

  it("raise on logits that are not (B, T, V)", function()
    assert.error_matches(function() metrics.accuracy(attn.ones({ 2, 3 }), { 1, 2 }, { 1, 1 }) end,
      "accuracy: logits must be a tensor %(B, T, V%), got %[2x3%]")
    assert.error_matches(function() metrics.perplexity(nil, {}, {}) end, "perplexity: logits must be a tensor")
  end)
end)

describe("metrics.corpus_bleu", function()
  it("sums clipped n-gram matches and counts over the corpus (hand-counted example)", function()
    local preds = { "the cat sat on the mat", "il est calme ." }
    local refs = { "the cat is on the mat", "il est calme ." }
    -- sentence 1: 1-grams the x2, cat, on, mat match (5/6), 2-grams the cat, on the, the mat (3/5),
    -- 3-grams on the mat (1/4), 4-grams none (0/3); sentence 2 matches everything (4/4, 3/3, 2/2, 1/1)
    local bleu, d = metrics.corpus_bleu(preds, refs)
    assert.are.same({ 9, 6, 3, 1 }, d.matches)
    assert.are.same({ 10, 8, 6, 4 }, d.totals)
    assert.are.equal(1, d.bp)
    assert.are.equal(10, d.pred_len)
    helper.assert_close(bleu, (9 / 10 * 6 / 8 * 3 / 6 * 1 / 4) ^ 0.25, { rtol = 1e-14 })
    -- the first sentence alone has no matching 4-gram: 0, however good the rest
    assert.are.equal(0, (metrics.corpus_bleu({ preds[1] }, { refs[1] })))
    -- a repeated word is clipped at the reference's count
    local _, c = metrics.corpus_bleu({ "the the the the" }, { "the cat" }, 1)
    assert.are.same({ 1 }, c.matches)
  end)

  it("meets the closed forms: identity 1, a prefix exp(1 - r/c), no overlap 0", function()
    local words = {}
    for i = 1, 12 do words[i] = "w" .. i end
    local ref = table.concat(words, " ")
    assert.are.equal(1, (metrics.corpus_bleu({ ref, "a b c d" }, { ref, "a b c d" })))
    for k = 4, 12 do
      local pred = table.concat(words, " ", 1, k)
      helper.assert_close(metrics.corpus_bleu({ pred }, { ref }), math.exp(1 - 12 / k), { rtol = 1e-14 })
    end
    assert.are.equal(0, (metrics.corpus_bleu({ "x y z q" }, { ref })))
    assert.are.equal(0, (metrics.corpus_bleu({ "" }, { ref })))
    -- token lists work as strings do; lengths are summed before the brevity penalty
    local bleu, d = metrics.corpus_bleu({ { "a", "b", "c", "d" }, { "a", "b", "c", "d", "e", "f" } },
      { "a b c d e f", "a b c d" })
    assert.are.equal(1, d.bp)
    assert.is_true(bleu > 0)
  end)

  -- orders past the longest prediction have no candidate n-grams: p_n = 0 and the score 0, and the
  -- lists stop at the first such order, however large max_n (2^40 looped for ever: the fuzzer)
  it("stops its lists at the first order longer than every prediction", function()
    local preds, refs = { "a b c", "a b" }, { "a b c", "a b" }
    assert.are.equal(1, (metrics.corpus_bleu(preds, refs, 3)))
    for _, max_n in ipairs { 4, 5, 1 << 40 } do
      local bleu, d = metrics.corpus_bleu(preds, refs, max_n)
      assert.are.equal(0, bleu)
      assert.are.same({ 5, 3, 1, 0 }, d.totals)
      assert.are.same({ 1, 1, 1, 0 }, d.precisions)
    end
    local bleu, d = metrics.corpus_bleu({ "" }, { "a" }, 1 << 40)
    assert.are.equal(0, bleu)
    assert.are.same({ 0 }, d.totals)
  end)

  it("raises on lists of different lengths and a bad max_n", function()
    assert.has_error(function() metrics.corpus_bleu({ "a" }, {}) end, "corpus_bleu: 1 predictions for 0 references")
    assert.has_error(function() metrics.corpus_bleu({}, {}, 0) end, "corpus_bleu: max_n must be a positive integer, got 0")
  end)
end)
