local cairo = require "attn.cairo"
local helper = require "helper"
local files = require "plot.files"

describe("attn.cairo", function()
  local dir
  setup(function() dir = helper.make_tmpdir() end)
  teardown(function() helper.remove_tree(dir) end)

  it("writes a PNG in memory whose header has the requested size and whose pixels read back", function()
    local s = cairo.surface("png", 37, 21)
    s:set_color(1, 1, 1)
    s:rectangle(0, 0, 37, 21)
    s:fill()
    s:set_color(0.2, 0.4, 0.6)
    s:rectangle(10, 5, 4, 3)
    s:fill()
    assert.same({ 51, 102, 153, 255 }, { s:pixel(11.5, 6.5) })
    assert.same({ 255, 255, 255, 255 }, { s:pixel(14, 6) })
    local bytes = s:finish()
    assert.equals(files.PNG_SIGNATURE, bytes:sub(1, 8))
    assert.same({ 37, 21 }, { files.png_size(bytes) })
    local path = dir .. "/a.png"
    helper.write_bytes(path, bytes)
    local back = assert(cairo.read_png(path))
    assert.same({ 37, 21 }, { back:size() })
    assert.same({ 51, 102, 153, 255 }, { back:pixel(12, 7) })
  end)

  it("reads pixels of an opaque (RGB, no alpha) PNG as opaque", function()
    -- a 3x2 PNG of colour type 2 (RGB) filled with (10, 200, 30), written by hand
    local path = dir .. "/rgb.png"
    helper.write_bytes(path, "\137PNG\013\010\026\010\000\000\000\013IHDR\000\000\000\003\000\000\000\002\008\002\000"
      .. "\000\000\018\022\241M\000\000\000\016IDATx\156c\224:!\007A\012p\022\0007\220\005\161~"
      .. "\201XE\000\000\000\000IEND\174B`\130")
    local img = assert(cairo.read_png(path))
    assert.same({ 3, 2 }, { img:size() })
    assert.same({ 10, 200, 30, 255 }, { img:pixel(2, 1) })
  end)

  it("writes SVG and PDF to memory and to files", function()
    for kind, head in pairs { svg = "<?xml", pdf = "%PDF" } do
      local s = cairo.surface(kind, 50, 40)
      s:set_color(0, 0, 0)
      s:move_to(1, 1)
      s:line_to(40, 30)
      s:stroke()
      assert.equals(head, s:finish():sub(1, #head))
      local path = dir .. "/f." .. kind
      local f = assert(cairo.surface(kind, 50, 40, path))
      f:rectangle(1, 1, 5, 5)
      f:fill()
      assert.is_true(f:finish())
      assert.equals(head, helper.read_bytes(path):sub(1, #head))
    end
  end)

  it("returns nil and a message naming the path when a file cannot be written or read", function()
    for _, kind in ipairs { "png", "svg", "pdf" } do
      local s, msg = cairo.surface(kind, 10, 10, dir .. "/missing/x." .. kind)
      assert.is_nil(s)
      assert.matches("missing/x%." .. kind .. ": No such file", msg)
    end
    local s, msg = cairo.read_png(dir .. "/none.png")
    assert.is_nil(s)
    assert.matches("none%.png", msg)
    helper.write_bytes(dir .. "/fake.png", "not a png at all")
    s, msg = cairo.read_png(dir .. "/fake.png")
    assert.is_nil(s)
    assert.matches("fake%.png: cannot read as PNG", msg)
  end)

  it("measures text: longer strings advance further, and text draws where it is told, rotated", function()
    local s = cairo.surface("png", 120, 120)
    s:font("DejaVu Sans", 12)
    local a1 = s:text_extents("ab")
    local a2 = s:text_extents("abab")
    assert.is_true(a1 > 5 and math.abs(a2 - 2 * a1) < 0.01)
    local ascent, descent, height = s:font_extents()
    assert.is_true(ascent > 8 and descent > 1 and height > ascent)
    -- "ça <eos>" turned -90 degrees (reading upwards) from (60, 100): all ink
    -- in a narrow column about x = 60 (descenders cross it) and above y = 100.
    s:set_color(0, 0, 0)
    s:text(60, 100, "ça <eos>", -90)
    local x0, x1, y0, y1 = math.huge, -1, math.huge, -1
    for y = 0, 119 do
      for x = 0, 119 do
        local _, _, _, alpha = s:pixel(x, y)
        if alpha > 128 then
          x0, x1, y0, y1 = math.min(x0, x), math.max(x1, x), math.min(y0, y), math.max(y1, y)
        end
      end
    end
    assert.is_true(x1 <= 64 and x0 >= 45, "ink spans x " .. x0 .. ".." .. x1)
    assert.is_true(y1 <= 101 and y1 - y0 > 30, "ink spans y " .. y0 .. ".." .. y1)
  end)

  it("raises on misuse instead of passing it to cairo", function()
    local s = cairo.surface("png", 10, 10)
    local nan, inf = 0 / 0, math.huge
    local cases = {
      { function() s:move_to(nan, 1) end, "x must be a finite number" },
      { function() s:line_to(1, inf) end, "y must be a finite number" },
      { function() s:rectangle(0, 0, 2e6, 1) end, "width must be a finite number" },
      { function() s:set_color(1.5, 0, 0) end, "red must be in %[0, 1%]" },
      { function() s:set_color(0, nan, 0) end, "green must be in %[0, 1%]" },
      { function() s:set_line_width(0) end, "line width" },
      { function() s:set_dash({ 0, 0 }) end, "dash lengths must not all be zero" },
      { function() s:set_dash({ -1 }) end, "dash length 1" },
      { function() s:font("DejaVu Sans", nan) end, "font size" },
      { function() s:text(1, 1, "\xff\xfe") end, "not valid UTF%-8" },
      { function() s:text(1, 1, "a\0b") end, "not valid UTF%-8" },
      { function() s:text(1, 1, "ok", nan) end, "angle" },
      { function() s:text(1, 1, "ok", 0, 2) end, "align must be in" },
      { function() s:pixel(10, 0) end, "outside the 10x10 image" },
      { function() cairo.surface("png", 0, 10) end, "width must be an integer in 1%.%.16384" },
      { function() cairo.surface("svg", 10, 1e9) end, "height must be an integer" },
      { function() cairo.surface("png", 16384, 16384) end, "too large" },
      { function() cairo.surface("gif", 10, 10) end, "invalid option 'gif'" },
      { function() cairo.surface("svg", 10, 10):pixel(1, 1) end, "pixel%(%) needs a png surface" },
    }
    for i, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok, "case " .. i .. " did not raise")
      assert.matches(c[2], tostring(err), nil, false, "case " .. i)
    end
    -- the surface is still usable after every refused call
    s:set_color(0, 0, 1)
    s:rectangle(0, 0, 10, 10)
    s:fill()
    assert.same({ 0, 0, 255, 255 }, { s:pixel(5, 5) })
    assert.equals(files.PNG_SIGNATURE, s:finish():sub(1, 8))
    assert.has_error(function() s:fill() end, "cairo: surface is already finished")
  end)
end)
