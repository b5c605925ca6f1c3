-- attn.data.scenes: reproducibility, boxes, reading-order captions and split
-- disjointness, on a synthetic source (always) and on Fashion-MNIST (when installed).
local attn = require "attn"
local data = require "attn.data"
local helper = require "helper"

local function installed()
  local f = io.open("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", "rb")
  if f then f:close() end
  return f ~= nil
end

-- 60 distinct random 28x28 "items" with labels 1..10 (a stand-in for the dataset)
local function synthetic()
  attn.manual_seed(99)
  local labels = {}
  for m = 1, 60 do labels[m] = (m * 7) % 10 + 1 end
  return { images = attn.rand(60, 28, 28), labels = attn.tensor(labels, "int64") }
end

-- The canvas of scene i, as a (H, W) tensor
local function canvas(s, i) return s.canvases:select(1, i):select(1, 1) end
local function region(t, box) return t:narrow(1, box[1], box[2] - box[1] + 1):narrow(2, box[3], box[4] - box[3] + 1) end

-- Checks every scene of s against its source images: boxes, captions, word maps.
local function check_scenes(s, images, lo, hi, first, last)
  local words, vocab = s.words, s.vocab
  local n = s.canvases:shape()[1]
  local captions, valid = s.captions:totable(), s.valid_len:totable()
  local seen_k = {}
  for i = 1, n do
    local k = #s.boxes[i]
    seen_k[k] = true
    assert.is_true(k >= lo and k <= hi)
    assert.equal(k + 1, valid[i])
    local c = canvas(s, i)
    local covered = attn.zeros(84, 84)
    for j = 1, k do
      local box, src = s.boxes[i][j], s.sources[i][j]
      assert.is_true(src >= first and src <= last, "source " .. src .. " outside " .. first .. ".." .. last)
      -- a cell of the grid, and the canvas there is exactly the item's image
      assert.equal(27, box[2] - box[1])
      assert.equal(27, box[4] - box[3])
      assert.equal(1, (box[1] - 1) % 28 + 1)
      assert.equal(1, (box[3] - 1) % 28 + 1)
      helper.assert_identical(region(c, box):contiguous(), images:select(1, src):contiguous())
      region(covered, box):add_(1)
    end
    assert.equal(1, covered:max():item()) -- distinct cells
    -- reading order: the named items' boxes by rows, then columns
    for t = 1, k do
      local j = s.word_item[i][t]
      assert.equal(vocab:id(words[s.classes[i][j]]), captions[i][t])
      if t > 1 then
        local a, b = s.boxes[i][s.word_item[i][t - 1]], s.boxes[i][j]
        assert.is_true(a[1] < b[1] or (a[1] == b[1] and a[3] < b[3]), "scene " .. i .. " word " .. t)
      end
    end
    assert.equal(vocab:id("<eos>"), captions[i][k + 1])
    for t = k + 2, hi + 1 do assert.equal(vocab:id("<pad>"), captions[i][t]) end
  end
  return seen_k
end

describe("attn.data.scenes", function()
  local source = synthetic()

  it("places items in distinct cells, copies them exactly and captions them in reading order", function()
    local s = assert(data.scenes({ n = 40, source = source, seed = 5 }))
    assert.same({ 40, 1, 84, 84 }, s.canvases:shape())
    assert.same({ 40, 5 }, s.captions:shape())
    assert.equal("int64", s.captions:dtype())
    assert.same({ "<unk>", "<pad>", "<bos>", "<eos>", "tshirt" }, { table.unpack(s.vocab.idx_to_token, 1, 5) })
    assert.equal(14, #s.vocab)
    local seen = check_scenes(s, source.images, 1, 4, 1, 50)
    for k = 1, 4 do assert.is_true(seen[k], "no scene with " .. k .. " items") end
    -- nothing outside the boxes without clutter: the canvas' sum is the items' sum
    for i = 1, 40 do
      local items = 0
      for j = 1, #s.boxes[i] do items = items + source.images:select(1, s.sources[i][j]):to("float64"):sum():item() end
      assert.near(items, canvas(s, i):to("float64"):sum():item(), 1e-6 * (1 + items))
    end
  end)

  it("is reproducible by seed and leaves attn's generator as it was", function()
    attn.manual_seed(123)
    local expected = attn.rand(3)
    attn.manual_seed(123)
    local a = data.scenes({ n = 10, source = source, seed = 8, clutter = 0.3 })
    helper.assert_identical(attn.rand(3), expected)
    local b = data.scenes({ n = 10, source = source, seed = 8, clutter = 0.3 })
    helper.assert_identical(b.canvases, a.canvases)
    helper.assert_identical(b.captions, a.captions)
    assert.same(a.boxes, b.boxes)
    assert.same(a.word_item, b.word_item)
    local c = data.scenes({ n = 10, source = source, seed = 9, clutter = 0.3 })
    assert.is_false(a.canvases:eq(c.canvases):sum():item() == a.canvases:numel())
  end)

  it("adds clutter to the empty cells only", function()
    local s = data.scenes({ n = 6, source = source, seed = 2, clutter = 0.25, items = { 2, 2 } })
    check_scenes(s, source.images, 2, 2, 1, 50)
    for i = 1, 6 do
      local c = canvas(s, i)
      local outside = c:clone()
      for _, box in ipairs(s.boxes[i]) do region(outside, box):fill_(-1) end
      local free = outside:ge(0)
      assert.equal(84 * 84 - 2 * 28 * 28, free:sum():item())
      assert.is_true(outside:max():item() < 0.25)
      assert.is_true(outside:max():item() > 0.2) -- (7 cells of uniform noise)
    end
  end)

  it("takes train and validation items from disjoint ranges of the training images", function()
    local train = data.scenes({ n = 30, source = source, seed = 1, split = "train" })
    local val = data.scenes({ n = 30, source = source, seed = 1, split = "val" })
    check_scenes(train, source.images, 1, 4, 1, 50)
    check_scenes(val, source.images, 1, 4, 51, 60)
    assert.equal("val", val.split)
  end)

  it("raises for wrong options", function()
    assert.has_error(function() data.scenes({ source = source }) end, "scenes: n must be a positive integer, got nil")
    assert.has_error(function() data.scenes({ n = 1, source = source, split = "dev" }) end,
      'scenes: split must be "train", "val" or "test", got dev')
    assert.has_error(function() data.scenes({ n = 1, source = source, items = { 0, 2 } }) end,
      "scenes: items must be {min, max} with 1 <= min <= max <= grid^2 = 9")
    assert.has_error(function() data.scenes({ n = 1, source = source, items = { 3, 2 } }) end)
    assert.has_error(function() data.scenes({ n = 1, source = source, grid = 1, items = { 1, 2 } }) end)
    assert.has_error(function() data.scenes({ n = 1, source = source, clutter = 2 }) end)
    assert.has_error(function() data.scenes({ n = 1, source = source, seed = 0.5 }) end)
    assert.has_error(function() data.scenes({ n = 1, source = { images = attn.rand(4, 4), labels = source.labels } }) end,
      "scenes: source.images must be (N, h, w), got [4x4]")
    assert.has_error(function() data.scenes({ n = 1, sorce = source }) end)
  end)

  it("on Fashion-MNIST: train and validation from its training images, test from its test images", function()
    if not installed() then return pending("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)") end
    local test_images = assert(data.fashion_mnist({ split = "test" }))
    local s = assert(data.scenes({ n = 20, split = "test", seed = 4 }))
    check_scenes(s, test_images, 1, 4, 1, 10000)
    local train_images, train_labels = assert(data.fashion_mnist({ split = "train" }))
    local src = { images = train_images, labels = train_labels }
    check_scenes(assert(data.scenes({ n = 20, split = "train", seed = 4, source = src })), train_images, 1, 4, 1, 50000)
    check_scenes(assert(data.scenes({ n = 20, split = "val", seed = 4, source = src })), train_images, 1, 4, 50001,
      60000)
  end)

  it("passes a missing dataset's message on", function()
    local dir = helper.make_tmpdir()
    local s, msg = data.scenes({ n = 2, dir = dir })
    helper.remove_tree(dir)
    assert.is_nil(s)
    assert.matches("dataset%-fashion%-mnist", msg)
  end)
end)
