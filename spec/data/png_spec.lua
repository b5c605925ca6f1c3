-- attn.data.write_png / read_png (through attn.cairo): round trips of gray, RGB
-- and RGBA images, channel conversion, and broken files.
local attn = require "attn"
local data = require "attn.data"
local helper = require "helper"

-- the largest difference between two tensors of the same shape
local function max_diff(a, b) return (a:to("float64") - b:to("float64")):abs():max():item() end

describe("attn.data PNG", function()
  local dir
  before_each(function()
    dir = helper.make_tmpdir()
    attn.manual_seed(7)
  end)
  after_each(function() helper.remove_tree(dir) end)

  it("round-trips gray images within half a level (8 bits)", function()
    local img = attn.rand(5, 7)
    assert.is_true(data.write_png(dir .. "/g.png", img))
    local back = assert(data.read_png(dir .. "/g.png"))
    assert.equal("float32", back:dtype())
    assert.same({ 5, 7 }, back:shape())
    assert.is_true(max_diff(back, img) <= 0.5 / 255 + 1e-6)
    -- (1, H, W) and float64 are gray too
    assert.is_true(data.write_png(dir .. "/g1.png", img:to("float64"):reshape(1, 5, 7)))
    helper.assert_identical(assert(data.read_png(dir .. "/g1.png")), back)
  end)

  it("keeps 8-bit levels exactly and clamps values outside [0, 1]", function()
    local levels = attn.arange(0, 256, "float64"):reshape(16, 16) / 255
    assert.is_true(data.write_png(dir .. "/levels.png", levels))
    assert.is_true(max_diff(assert(data.read_png(dir .. "/levels.png")), levels) < 1e-7)
    assert.is_true(data.write_png(dir .. "/clamp.png", attn.tensor({ { -0.5, 1.5, 0.25 } })))
    assert.is_true(max_diff(assert(data.read_png(dir .. "/clamp.png")), attn.tensor({ { 0, 1, 64 / 255 } })) < 1e-7)
  end)

  it("round-trips RGB and RGBA images", function()
    local rgb = attn.rand(3, 4, 6)
    assert.is_true(data.write_png(dir .. "/c.png", rgb))
    local back = assert(data.read_png(dir .. "/c.png"))
    assert.same({ 3, 4, 6 }, back:shape())
    assert.is_true(max_diff(back, rgb) <= 0.5 / 255 + 1e-6)

    local rgba = attn.rand(4, 3, 5)
    rgba:select(1, 4):narrow(1, 1, 2):fill_(1) -- rows 1-2 opaque, row 3 translucent
    assert.is_true(data.write_png(dir .. "/a.png", rgba))
    local back4 = assert(data.read_png(dir .. "/a.png"))
    assert.same({ 4, 3, 5 }, back4:shape())
    assert.is_true(max_diff(back4:select(1, 4), rgba:select(1, 4)) <= 0.5 / 255 + 1e-6)
    -- colour is stored premultiplied: exact to 8 bits where opaque
    assert.is_true(max_diff(back4:narrow(1, 1, 3):narrow(2, 1, 2), rgba:narrow(1, 1, 3):narrow(2, 1, 2)) <=
      0.5 / 255 + 1e-6)
  end)

  it("converts channels on request: luma for gray, copies for RGB", function()
    local rgb = attn.rand(3, 2, 3)
    assert.is_true(data.write_png(dir .. "/c.png", rgb))
    local read = assert(data.read_png(dir .. "/c.png")):totable()
    local gray = assert(data.read_png(dir .. "/c.png", { channels = 1 }))
    assert.same({ 2, 3 }, gray:shape())
    for y = 1, 2 do
      for x = 1, 3 do
        local want = 0.299 * read[1][y][x] + 0.587 * read[2][y][x] + 0.114 * read[3][y][x]
        assert.near(want, gray:get(y, x), 1e-6)
      end
    end
    local g = attn.rand(2, 3)
    assert.is_true(data.write_png(dir .. "/g.png", g))
    local three = assert(data.read_png(dir .. "/g.png", { channels = 3 }))
    assert.same({ 3, 2, 3 }, three:shape())
    helper.assert_identical(three:select(1, 3):contiguous(), assert(data.read_png(dir .. "/g.png")))
    assert.same({ 4, 2, 3 }, assert(data.read_png(dir .. "/g.png", { channels = 4 })):shape())
  end)

  it("returns nil and a message for missing, corrupt and truncated files and unwritable paths", function()
    local t, msg = data.read_png(dir .. "/absent.png")
    assert.is_nil(t)
    assert.matches("^read_png: .*absent%.png: No such file", msg)
    helper.write_bytes(dir .. "/text.png", "not a png at all")
    t, msg = data.read_png(dir .. "/text.png")
    assert.is_nil(t)
    assert.matches("^read_png: .*text%.png: cannot read as PNG", msg)
    assert.is_true(data.write_png(dir .. "/ok.png", attn.rand(3, 20, 20)))
    local bytes = helper.read_bytes(dir .. "/ok.png")
    helper.write_bytes(dir .. "/cut.png", bytes:sub(1, #bytes // 2))
    t, msg = data.read_png(dir .. "/cut.png")
    assert.is_nil(t)
    assert.matches("cannot read as PNG", msg)
    local ok, werr = data.write_png(dir .. "/no/such/dir/x.png", attn.rand(2, 2))
    assert.is_nil(ok)
    assert.matches("^write_png: .*x%.png: No such file", werr)
  end)

  it("raises for wrong images and options, before creating the file", function()
    local path = dir .. "/x.png"
    assert.has_error(function() data.write_png(path, attn.zeros(2, 3, "int64")) end,
      "write_png: image must be a float (H, W) or (C, H, W) tensor with C = 1, 3 or 4, got int64 [2x3]")
    assert.has_error(function() data.write_png(path, attn.zeros(2, 3, 3)) end)
    assert.has_error(function() data.write_png(path, attn.zeros(4)) end)
    assert.has_error(function() data.write_png(path, attn.tensor({ { 0, 0 / 0 } })) end, "write_png: image has NaN values")
    assert.is_nil(io.open(path))
    assert.has_error(function() data.read_png(path, { channels = 2 }) end, "read_png: channels must be 1, 3 or 4, got 2")
  end)
end)
