-- attn.data.fashion_mnist: on hand-built files always, and on Debian's
-- dataset-fashion-mnist when it is installed (skipped with a message if not).
local data = require "attn.data"
local helper = require "helper"

local DIR = "/usr/share/datasets/fashion-mnist"
local function installed()
  local f = io.open(DIR .. "/t10k-labels-idx1-ubyte.gz", "rb")
  if f then f:close() end
  return f ~= nil
end
local MISSING = "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist, or make deps-images)"

local function idx(code, dims, body)
  local head = string.char(0, 0, code, #dims)
  for _, d in ipairs(dims) do head = head .. string.pack(">I4", d) end
  return head .. body
end

describe("attn.data.fashion_mnist", function()
  local dir
  before_each(function() dir = helper.make_tmpdir() end)
  after_each(function() helper.remove_tree(dir) end)

  it("names the Debian package and --data when the files are missing", function()
    local images, msg = data.fashion_mnist({ dir = dir })
    assert.is_nil(images)
    assert.matches("dataset%-fashion%-mnist", msg)
    assert.matches("%-%-data DIR", msg)
    assert.matches("train%-images%-idx3%-ubyte", msg)
    assert.matches(dir, msg, 1, true)
  end)

  it("scales pixels to [0, 1], makes labels 1-based int64 and checks the files agree", function()
    local pixels = {}
    for i = 1, 2 * 28 * 28 do pixels[i] = string.char((i * 7) % 256) end
    helper.write_bytes(dir .. "/t10k-images-idx3-ubyte", idx(8, { 2, 28, 28 }, table.concat(pixels)))
    helper.write_bytes(dir .. "/t10k-labels-idx1-ubyte", idx(8, { 2 }, string.char(9, 0)))
    local images, labels, names = assert(data.fashion_mnist({ split = "test", dir = dir }))
    assert.same({ 2, 28, 28 }, images:shape())
    assert.equal("float32", images:dtype())
    assert.near((5 * 28 + 3 + 1) * 7 % 256 / 255, images:get(1, 6, 4), 1e-7) -- row 6, column 4 of image 1
    assert.near((28 * 28 + 1) * 7 % 256 / 255, images:get(2, 1, 1), 1e-7)
    assert.equal("int64", labels:dtype())
    assert.same({ 10, 1 }, labels:totable())
    assert.equal("Ankle boot", names[10])
    assert.same({ 1, 28, 28 }, assert(data.fashion_mnist({ split = "test", dir = dir, n = 1 })):shape())

    helper.write_bytes(dir .. "/t10k-labels-idx1-ubyte", idx(8, { 3 }, string.char(9, 0, 1)))
    local none, msg = data.fashion_mnist({ split = "test", dir = dir })
    assert.is_nil(none)
    assert.matches("hold images %[2x28x28%] and labels %[3%]", msg)
    helper.write_bytes(dir .. "/t10k-labels-idx1-ubyte", idx(8, { 2 }, string.char(9, 10)))
    none, msg = data.fashion_mnist({ split = "test", dir = dir })
    assert.is_nil(none)
    assert.matches("labels outside 0..9", msg)
    helper.write_bytes(dir .. "/t10k-labels-idx1-ubyte", idx(8, { 2 }, string.char(9)))
    none, msg = data.fashion_mnist({ split = "test", dir = dir })
    assert.is_nil(none)
    assert.matches("^read_idx: .*truncated", msg)
  end)

  it("gives the class names and the captions' words", function()
    local names, words = data.fashion_classes()
    assert.same({ "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
      "Ankle boot" }, names)
    assert.same({ "tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot" }, words)
    names[1] = "changed"
    assert.equal("T-shirt/top", (data.fashion_classes())[1])
  end)

  it("raises for wrong options", function()
    assert.has_error(function() data.fashion_mnist({ split = "val" }) end,
      'fashion_mnist: split must be "train" or "test", got val')
    assert.has_error(function() data.fashion_mnist({ n = 0 }) end)
    assert.has_error(function() data.fashion_mnist({ spilt = "test" }) end)
  end)

  describe("on Debian's dataset-fashion-mnist", function()
    -- per-class counts of the labels (a Lua table: 10 entries)
    local function counts(labels)
      local c = {}
      for _, l in ipairs(labels:totable()) do c[l] = (c[l] or 0) + 1 end
      return c
    end

    it("has 60,000 training images, 6,000 per class, of the published mean", function()
      if not installed() then return pending(MISSING) end
      local images, labels = assert(data.fashion_mnist({ split = "train" }))
      assert.same({ 60000, 28, 28 }, images:shape())
      assert.same({ 60000 }, labels:shape())
      local c = counts(labels)
      for k = 1, 10 do assert.equal(6000, c[k]) end
      assert.equal(10, labels:get(1)) -- the first training image is an ankle boot
      assert.equal(0, images:min():item())
      assert.equal(1, images:max():item())
      -- the usual normalisation constants: mean 0.2860, std 0.3530 (72.94 and 90.02 of 255)
      local mean, square = images:mean():item(), images:square():mean():item()
      assert.near(0.2860, mean, 1e-4)
      assert.near(0.3530, math.sqrt(square - mean * mean), 1e-4)
    end)

    it("has 10,000 test images, 1,000 per class, and n reads their prefix", function()
      if not installed() then return pending(MISSING) end
      local images, labels = assert(data.fashion_mnist({ split = "test" }))
      assert.same({ 10000, 28, 28 }, images:shape())
      local c = counts(labels)
      for k = 1, 10 do assert.equal(1000, c[k]) end
      local few, few_labels = assert(data.fashion_mnist({ split = "test", n = 3 }))
      helper.assert_identical(few, images:narrow(1, 1, 3):contiguous())
      assert.same({ 10, 3, 2 }, few_labels:totable()) -- ankle boot, pullover, trouser
    end)
  end)
end)
