-- attn.d2l.captioning: greedy and beam decoding, caption scores and attention correctness
-- against hand-made decodes of tiny scenes.
local attn = require "attn"
local cap = require "attn.d2l.captioning"
local data = require "attn.data"
local nn = attn.nn

-- Four scenes from a source of 60 tiny "items" of 4 x 4 pixels (2 x 2 grid of 8 x 8 canvases).
local function tiny_scenes()
  attn.manual_seed(11)
  local labels = {}
  for i = 1, 60 do labels[i] = (i * 7) % 10 + 1 end
  local source = { images = attn.rand(60, 4, 4), labels = attn.tensor(labels, "int64") }
  return assert(data.scenes({ n = 4, split = "test", seed = 3, grid = 2, items = { 1, 3 }, source = source }))
end

describe("attn.d2l.captioning", function()
  it("measures the share of each cell inside a box", function()
    assert.same({ 1, 0, 0, 0, 0, 0, 0, 0, 0 }, cap.cell_overlap({ 1, 28, 1, 28 }, 84, 84, 3, 3))
    assert.same({ 0, 0, 0, 0, 0, 0, 0, 0, 1 }, cap.cell_overlap({ 57, 84, 57, 84 }, 84, 84, 3, 3))
    -- a box over the middle of a 2 x 2 grid of 8 x 8: a quarter of each cell
    assert.same({ 0.25, 0.25, 0.25, 0.25 }, cap.cell_overlap({ 3, 6, 3, 6 }, 8, 8, 2, 2))
    -- off the diagonal, row by row: top right is cell 3, middle left cell 4 (not 7 and 2)
    assert.same({ 0, 0, 1, 0, 0, 0, 0, 0, 0 }, cap.cell_overlap({ 1, 28, 57, 84 }, 84, 84, 3, 3))
    assert.same({ 0, 0, 0, 1, 0, 0, 0, 0, 0 }, cap.cell_overlap({ 29, 56, 1, 28 }, 84, 84, 3, 3))
  end)

  it("pairs the weights of step t with the word of step t, on a hand-made 3 x 3 scene", function()
    -- items at the top right (cell 3, word 1) and the middle left (cell 4, word 2), then <eos>
    local scene = { canvases = attn.zeros(1, 1, 84, 84), captions = attn.tensor({ { 7, 9, 4 } }, "int64"),
      valid_len = attn.tensor({ 3 }, "int64"), boxes = { { { 29, 56, 1, 28 }, { 1, 28, 57, 84 } } },
      word_item = { { 2, 1 } } }
    local function at(cells) -- weights over the 9 cells, row by row
      local a = { 0, 0, 0, 0, 0, 0, 0, 0, 0 }
      for cell, w in pairs(cells) do a[cell] = w end
      return a
    end
    -- word 1 looks at its item; word 2 puts 0.8 on its item and 0.2 on cell 2 (its transpose);
    -- <eos> looks at cell 7 (word 1's transpose), which a metric one step late would count
    local decoded = { ids = { { 7, 9 } }, alphas = { { at { [3] = 1 }, at { [4] = 0.8, [2] = 0.2 }, at { [7] = 1 } } } }
    local share, uniform, counted = cap.attention_correctness(decoded, scene)
    assert.near((1 + 0.8) / 2, share, 1e-12)
    assert.near(1 / 9, uniform, 1e-12)
    assert.equal(2, counted)
    decoded.ids[1][1] = 8 -- a wrong first word is not counted
    local again = { cap.attention_correctness(decoded, scene) }
    assert.same({ 0.8, 1 }, { again[1], again[3] })
  end)

  it("scores captions: corpus BLEU, exact matches and attention on the named item", function()
    local s = tiny_scenes()
    local caps = s.captions:totable()
    local decoded = { ids = {}, alphas = {} }
    -- scene 1 right with all attention on each named item's cell; scene 2 wrong at its first
    -- word; scenes 3 and 4 right with uniform attention
    local share, counted = 0, 0
    for i = 1, 4 do
      local n = math.tointeger(s.valid_len[i]) - 1
      local ids = table.move(caps[i], 1, n, 1, {})
      local alphas = {}
      for t = 1, n + 1 do
        alphas[t] = { 0.25, 0.25, 0.25, 0.25 }
        if i == 1 and t <= n then
          local box = s.boxes[1][s.word_item[1][t]]
          local cell = (box[1] - 1) // 4 * 2 + (box[3] - 1) // 4 + 1
          alphas[t] = { 0, 0, 0, 0 }
          alphas[t][cell] = 1
        end
      end
      if i == 2 then ids[1] = ids[1] == 5 and 6 or 5 end
      decoded.ids[i], decoded.alphas[i] = ids, alphas
      for t = 1, n do
        if not (i == 2 and t == 1) then
          share, counted = share + (i == 1 and 1 or 0.25), counted + 1
        end
      end
    end
    local m = cap.evaluate(decoded, s)
    assert.near(0.75, m.exact, 1e-12)
    assert.equal(counted, m.counted)
    assert.near(share / counted, m.attention, 1e-12)
    assert.near(0.25, m.uniform, 1e-12)
    assert.is_true(m.bleu[1] < 1 and m.bleu[1] > 0.5)
    decoded.ids[2] = table.move(caps[2], 1, math.tointeger(s.valid_len[2]) - 1, 1, {})
    local perfect = cap.caption_scores(decoded, s)
    assert.same({ 1, 1, 1 }, { perfect.exact, perfect.bleu[1], perfect.bleu[2] })
  end)

  it("decodes greedily, and beam search of width 1 follows the greedy path", function()
    attn.manual_seed(12)
    local dec = nn.ShowAttendTell { vocab_size = 14, feature_size = 5, num_cells = 4, embed_size = 4, num_hiddens = 8,
      attention_size = 4 }
    local feats = attn.rand(3, 4, 5)
    local opts = { bos = 3, eos = 4, max_len = 6 }
    local g = cap.greedy(dec, feats, opts)
    local b = cap.beam(dec, feats, { bos = 3, eos = 4, max_len = 6, beam = 1 })
    assert.same(g.ids, b.ids)
    for i = 1, 3 do
      assert.equal(#g.ids[i] + (#g.ids[i] < 6 and 1 or 0), #g.alphas[i])
      for _, a in ipairs(g.alphas[i]) do assert.near(1, a[1] + a[2] + a[3] + a[4], 1e-5) end
      -- greedy by hand: argmax of each step's logits, fed back
      local state, tok, ids = dec:start(feats:narrow(1, i, 1)), 3, {}
      for _ = 1, 6 do
        local logits
        logits, state = dec:step(state, attn.tensor({ tok }, "int64"))
        tok = math.tointeger(logits:argmax(2):item())
        if tok == 4 then break end
        ids[#ids + 1] = tok
      end
      assert.same(ids, g.ids[i])
    end
    -- a wider beam never scores worse than greedy under its own length-normalised score
    local b3 = cap.beam(dec, feats, { bos = 3, eos = 4, max_len = 6, beam = 3 })
    assert.equal(3, #b3.ids)
  end)
end)
