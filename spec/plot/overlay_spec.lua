-- plot.attention_overlay: bilinear upsampling and colour blending read back from the PNG,
-- the SVG's embedded pictures and words, and bad arguments.
local attn = require "attn"
local helper = require "helper"
local plot = require "attn.plot"
local data = require "attn.data"
local files = require "plot.files"

-- viridis' anchors, as plot.lua's colormap, for an independent colour of t in [0, 1]
local VIRIDIS = { "440154", "482475", "414487", "355f8d", "2a788e", "21918c", "22a884", "44bf70", "7ad151", "bddf26",
  "fde725" }
local function viridis(t)
  local x = t * 10
  local i = math.min(9, math.floor(x))
  local f = x - i
  local out = {}
  for k = 1, 3 do
    local a = tonumber(VIRIDIS[i + 1]:sub(2 * k - 1, 2 * k), 16)
    local b = tonumber(VIRIDIS[i + 2]:sub(2 * k - 1, 2 * k), 16)
    out[k] = (a + (b - a) * f) / 255
  end
  return out
end

describe("plot.attention_overlay", function()
  local dir
  setup(function() dir = helper.make_tmpdir() end)
  teardown(function() helper.remove_tree(dir) end)

  it("upsamples each map bilinearly (align_corners = false) and blends it over the image", function()
    -- a black 8 x 8 image, a 2 x 2 map with all weight on the top-left cell, the colour alone
    local w = attn.tensor({ { { 1, 0 }, { 0, 0 } }, { { 0, 0 }, { 0, 0.5 } } })
    local path = dir .. "/o.png"
    assert.equal(path, plot.attention_overlay(attn.zeros(8, 8), w, { "bag", "<eos>" },
      { path = path, alpha = 1, scale = 1 }))
    local img = assert(data.read_png(path, { channels = 3 }))
    local function pixel(panel, i, j) -- 0-based pixel (i, j) of a panel (panels at x = 10 + 18 (p - 1), y = 10)
      local out = {}
      for k = 1, 3 do out[k] = img[k][10 + i + 1][10 + 18 * (panel - 1) + j + 1] end
      return out
    end
    -- output pixel i reads source (i + 0.5) * 2 / 8 - 0.5, clamped to [0, 1]
    local function weight(i) return 1 - math.max(0, math.min(1, (i + 0.5) / 4 - 0.5)) end
    for _, ij in ipairs { { 1, 1 }, { 3, 1 }, { 2, 5 }, { 6, 6 }, { 4, 4 }, { 5, 2 } } do -- (the frame covers the edges)
      local v = weight(ij[1]) * weight(ij[2])
      helper.assert_close(pixel(1, ij[1], ij[2]), viridis(v), { atol = 1 / 255 + 1e-6 })
      -- the second panel is scaled to its own maximum, mirrored
      helper.assert_close(pixel(2, 7 - ij[1], 7 - ij[2]), viridis(v), { atol = 1 / 255 + 1e-6 })
    end
    -- half the colour, half the image
    assert(plot.attention_overlay(attn.full({ 8, 8 }, 1), w:narrow(1, 1, 1), { "bag" },
      { path = path, alpha = 0.5, scale = 1 }))
    img = assert(data.read_png(path, { channels = 3 }))
    local c = viridis(1)
    helper.assert_close(pixel(1, 1, 1), { 0.5 + c[1] / 2, 0.5 + c[2] / 2, 0.5 + c[3] / 2 }, { atol = 1 / 255 + 1e-6 })
  end)

  it("writes SVG with one embedded picture and one word per panel", function()
    local w = attn.rand(3, 9)
    local svg = plot.attention_overlay(attn.rand(1, 84, 84), w, { "sneaker", "bag", "<eos>" }, { format = "svg" })
    local elems = assert(files.svg_elements(svg))
    local images = files.select(elems, "image", "overlay")
    assert.equal(3, #images)
    assert.equal("168", images[1].attrs.width)
    assert.equal("data:image/png;base64,iVBORw0KGgo", images[1].attrs.href:sub(1, 33))
    local words = {}
    for i, e in ipairs(files.select(elems, "text", "word")) do words[i] = e.text end
    assert.same({ "sneaker", "bag", "<eos>" }, words)
  end)

  it("raises on shapes and words that do not fit", function()
    assert.has_error(function() plot.attention_overlay(attn.rand(8, 8), attn.rand(2, 3), { "a", "b" }) end,
      "plot.attention_overlay: weights [2x3]: a (T, L) map needs a square L")
    assert.has_error(function() plot.attention_overlay(attn.rand(8, 8), attn.rand(2, 4), { "a" }, { format = "svg" }) end,
      "plot.attention_overlay: words must be a list of 2 labels, got 1 labels")
    assert.has_error(function() plot.attention_overlay(attn.rand(2, 8, 8), attn.rand(2, 4), { "a", "b" }) end,
      "plot.attention_overlay: image must be a (H, W) or (1, H, W) tensor, got [2x8x8]")
  end)
end)
