local attn = require "attn"
local cairo = require "attn.cairo"
local plot = require "attn.plot"
local helper = require "helper"
local files = require "plot.files"

-- A (R, C, NQ, NK) table whose entries are distinct, in a scrambled order.
local function scrambled(R, C, NQ, NK)
  local out, k, n = {}, 0, R * C * NQ * NK
  for r = 1, R do
    out[r] = {}
    for c = 1, C do
      out[r][c] = {}
      for i = 1, NQ do
        out[r][c][i] = {}
        for j = 1, NK do
          k = k + 1
          out[r][c][i][j] = ((k * 37) % n) / n -- 37 is coprime with the sizes used
        end
      end
    end
  end
  return out
end

local function parse(svg)
  local elems, err = files.svg_elements(svg)
  assert(elems, err)
  return elems
end

describe("attn.plot.heatmaps", function()
  local dir
  setup(function() dir = helper.make_tmpdir() end)
  teardown(function() helper.remove_tree(dir) end)

  it("writes a PNG with the requested size", function()
    local w = attn.rand({ 2, 4, 10, 10 })
    local path = dir .. "/h.png"
    assert.equals(path, plot.heatmaps(w, { path = path, width = 640, height = 360, xlabel = "Keys" }))
    local bytes = helper.read_bytes(path)
    assert.equals(files.PNG_SIGNATURE, bytes:sub(1, 8))
    assert.same({ 640, 360 }, { files.png_size(bytes) })
    -- figsize in inches at dpi, and PNG bytes when there is no path
    local mem = plot.heatmaps(w, { format = "png", figsize = { 3.5, 4 }, dpi = 80 })
    assert.same({ 280, 320 }, { files.png_size(mem) })
    -- a width alone: cells fill it, and the height follows
    local cells = files.select(parse(plot.heatmaps(w, { format = "svg", width = 900 })), "rect", "cell")
    assert.is_true(tonumber(cells[1].attrs.width) >= 15, "cell width " .. cells[1].attrs.width)
    assert.same(900, (files.png_size(plot.heatmaps(w, { format = "png", width = 900 }))))
  end)

  it("returns SVG text with one rect per cell, a colour bar, and escaped real text", function()
    local toks = { "j'ai", "ça", "<eos>", "a&b", "x" }
    local svg = plot.heatmaps(attn.rand({ 2, 4, 10, 10 }), { format = "svg", xlabel = "Key positions",
      ylabel = "Query positions", titles = { "Head 1", "Head 2", "Head 3", "Head 4" } })
    local elems = parse(svg)
    assert.equals("svg", elems[1].name)
    assert.equals(800, #files.select(elems, "rect", "cell"))
    local groups = files.select(elems, "g") -- cells (and the colour bar) drawn without seams
    assert.is_true(#groups >= 1)
    for _, e in ipairs(groups) do assert.equals("crispEdges", e.attrs["shape-rendering"]) end
    assert.equals(64, #files.select(elems, "rect", "cbar"))
    assert.equals(8, #files.select(elems, "text", "title")) -- per column, repeated on each row as in the book
    assert.equals(4, #files.select(elems, "text", "xlabel"))
    assert.equals(2, #files.select(elems, "text", "ylabel"))

    svg = plot.heatmaps({ { 1, 2, 3, 4, 5 }, { 5, 4, 3, 2, 1 } }, { format = "svg", col_labels = toks,
      row_labels = { "<bos>", "il" }, titles = { "<t>" } })
    assert.matches("&lt;eos&gt;", svg, 1, true)
    assert.matches("a&amp;b", svg, 1, true)
    assert.matches("j&apos;ai", svg, 1, true)
    assert.is_nil(svg:find("<eos>", 1, true))
    elems = parse(svg)
    local shown = {}
    for _, e in ipairs(files.select(elems, "text", "xtick")) do shown[#shown + 1] = e.text end
    assert.same(toks, shown)
    assert.equals("<t>", files.select(elems, "text", "title")[1].text)
    assert.equals(10, #files.select(elems, "rect", "cell"))
    assert.is_true(#svg < 12000, "small: " .. #svg .. " bytes")
  end)

  it("colours cells in the order of their values, and the PNG shows the SVG's colours", function()
    local w = scrambled(1, 2, 6, 7)
    local flat = helper.flatten(w)
    for _, cmap in ipairs { "Reds", "Blues", "viridis" } do
      local opts = { format = "svg", cmap = cmap, width = 400, height = 260 }
      local cells = files.select(parse(plot.heatmaps(w, opts)), "rect", "cell")
      assert.equals(#flat, #cells)
      -- cells come row-major: sort them by value and check the fill moves one way
      local order = {}
      for k = 1, #flat do order[k] = k end
      table.sort(order, function(a, b) return flat[a] < flat[b] end)
      local function key(k)
        local r, g, b = files.rgb(cells[k].attrs.fill)
        -- Reds and Blues darken (falling channel sum); viridis brightens (rising green)
        if cmap == "viridis" then return g end
        return -(r + g + b)
      end
      for n = 2, #order do
        assert.is_true(key(order[n]) >= key(order[n - 1]),
          string.format("%s: value %g is not coloured beyond value %g", cmap, flat[order[n]], flat[order[n - 1]]))
      end
      assert.is_true(key(order[#order]) > key(order[1]))
      -- the PNG of the same figure: every cell centre has the SVG's fill
      opts.format, opts.path = nil, dir .. "/c.png"
      plot.heatmaps(w, opts)
      local img = assert(cairo.read_png(opts.path))
      for _, cell in ipairs(cells) do
        local a = cell.attrs
        local px = { img:pixel(a.x + a.width / 2, a.y + a.height / 2) }
        local r, g, b = files.rgb(a.fill)
        assert.is_true(math.abs(px[1] - r) <= 1 and math.abs(px[2] - g) <= 1 and math.abs(px[3] - b) <= 1,
          string.format("PNG pixel %d,%d,%d vs SVG %s", px[1], px[2], px[3], a.fill))
      end
    end
  end)

  it("places cells row-major with whole-pixel edges, and maps vmin/vmax to the colour map's ends", function()
    local cells = files.select(parse(plot.heatmaps({ { 0, 0.5 }, { 2, -1 } }, { format = "svg", vmin = 0, vmax = 1 })),
      "rect", "cell")
    local function at(k) return tonumber(cells[k].attrs.x), tonumber(cells[k].attrs.y) end
    local x1, y1 = at(1)
    local x2, y2 = at(2)
    local x3, y3 = at(3)
    assert.is_true(x2 > x1 and y2 == y1 and x3 == x1 and y3 > y1)
    for _, c in ipairs(cells) do
      for _, k in ipairs { "x", "y", "width", "height" } do
        assert.equals(math.floor(tonumber(c.attrs[k])), tonumber(c.attrs[k]))
      end
    end
    assert.equals("#fff5f0", cells[1].attrs.fill) -- Reds' lightest at vmin
    assert.equals("#67000d", cells[3].attrs.fill) -- above vmax: clamped to the darkest
    assert.equals("#fff5f0", cells[4].attrs.fill) -- below vmin: clamped to the lightest
  end)

  it("turns long column labels where they would collide, and thins them when even that is too tight", function()
    local function xticks(nk, labels, width)
      local w = {}
      for i = 1, 3 do
        w[i] = {}
        for j = 1, nk do w[i][j] = i + j end
      end
      return files.select(parse(plot.heatmaps(w, { format = "svg", col_labels = labels, width = width, height = 300 })),
        "text", "xtick")
    end
    local short = xticks(3, { "a", "b", "c" }, 300)
    assert.equals(3, #short)
    assert.is_nil(short[1].attrs.transform)
    local long = xticks(8, { "j'ai", "perdu", "<eos>", "bonjour", "chez", "moi", "ça", "va" }, 260)
    assert.equals(8, #long)
    assert.matches("rotate%(%-", long[1].attrs.transform)
    -- 120 tokens across 600 pixels: at most one label per line height
    local many = {}
    for j = 1, 120 do many[j] = "tok" .. j end
    local thin = xticks(120, many, 600)
    assert.is_true(#thin < 120 and #thin >= 10, #thin .. " labels shown")
    for k = 2, #thin do
      assert.is_true(tonumber(thin[k].attrs.x) - tonumber(thin[k - 1].attrs.x) >= 10 * 1.2 - 1e-9)
    end
  end)

  it("keeps turned labels inside the figure and spans one axis label over panels too narrow for it", function()
    local toks = { "<unknown-token>", "perdu", ".", "<eos>" }
    local elems = parse(plot.heatmaps(attn.rand({ 2, 3, 4, 4 }), { format = "svg", col_labels = toks,
      xlabel = "Key positions, a label much longer than one panel", ylabel = "Queries", titles = { "a", "b", "c" } }))
    local meter = cairo.surface("png", 1, 1)
    meter:font("DejaVu Sans", 10)
    for _, e in ipairs(files.select(elems, "text", "xtick")) do
      assert.matches("rotate%(%-45", e.attrs.transform)
      local reach = tonumber(e.attrs.x) - meter:text_extents(e.text) * 0.7071
      assert.is_true(reach >= 0, e.text .. " starts at x = " .. reach)
    end
    assert.equals(1, #files.select(elems, "text", "xlabel"))
    assert.equals(2, #files.select(elems, "text", "ylabel")) -- short enough for each row
  end)

  it("makes room for axis labels longer than the whole grid, keeping them apart", function()
    local xl, yl = "Key positions (source tokens, the whole sentence)", "Query positions (decoder steps)"
    local elems = parse(plot.heatmaps(attn.rand({ 2, 4 }), { format = "svg", xlabel = xl, ylabel = yl,
      col_labels = { "i'm", "home", ".", "<eos>" } }))
    local svg = elems[1].attrs
    local meter = cairo.surface("png", 1, 1)
    meter:font("DejaVu Sans", 11)
    local x = files.select(elems, "text", "xlabel")[1].attrs
    local y = files.select(elems, "text", "ylabel")[1].attrs
    local xw, yw = meter:text_extents(xl), meter:text_extents(yl)
    -- both inside the figure
    assert.is_true(x.x - xw / 2 >= 0 and x.x + xw / 2 <= tonumber(svg.width))
    assert.is_true(y.y - yw / 2 >= 0 and y.y + yw / 2 <= tonumber(svg.height))
    -- the turned y label ends above the x label's capitals
    assert.is_true(y.y + yw / 2 <= x.y - 11 * 0.73, string.format("y label ends at %g, x label top at %g",
      y.y + yw / 2, x.y - 11 * 0.73))
  end)

  it("takes tensors and nested tables alike, 2-D to 4-D", function()
    local t = attn.rand({ 2, 3, 4 })
    local a = plot.heatmaps(t, { format = "svg" })
    local b = plot.heatmaps(t:totable(), { format = "svg" })
    local c = plot.heatmaps(t:reshape({ 1, 2, 3, 4 }), { format = "svg" })
    assert.equals(a, b)
    assert.equals(a, c)
    assert.equals(24, #files.select(parse(a), "rect", "cell"))
  end)

  it("writes PDF", function()
    local path = dir .. "/h.pdf"
    assert.equals(path, plot.heatmaps(attn.rand({ 3, 3 }), { path = path, xlabel = "ça" }))
    assert.equals("%PDF", helper.read_bytes(path):sub(1, 4))
  end)

  it("returns nil and a message for a path that cannot be written", function()
    for _, ext in ipairs { "png", "svg", "pdf" } do
      local res, msg = plot.heatmaps({ { 1, 2 } }, { path = dir .. "/no/such/dir/x." .. ext })
      assert.is_nil(res)
      assert.matches("no/such/dir/x%." .. ext .. ": No such file", msg)
    end
  end)

  it("raises clear errors on bad input", function()
    local cases = {
      { { 1, 2, 3 }, nil, "weights must be 2%-D, 3%-D or 4%-D" },
      { attn.rand({ 1, 1, 1, 2, 2 }), nil, "got shape %[1x1x1x2x2%]" },
      { { { 1, 2 }, { 3 } }, nil, "not rectangular" },
      { { { 1, "a" } }, nil, "must hold numbers" },
      { "x", nil, "weights must be a tensor or a nested table" },
      { { {} }, nil, "weights are empty" },
      { { { 1 } }, { cmap = "jet" }, "cmap must be 'Reds', 'Blues' or 'viridis'" },
      { { { 1 } }, { colour = "red" }, "unknown option 'colour'" },
      { { { 1, 2 } }, { col_labels = { "a" } }, "col_labels must be a list of 2 labels" },
      { { { 1, 2 } }, { row_labels = { "a\xff" } }, "row_labels%[1%] is not valid UTF%-8" },
      { { { 1 } }, { vmin = 1, vmax = 0 }, "vmax %(0%) is below vmin %(1%)" },
      { { { 1 } }, { vmin = 0 / 0 }, "vmin must be a number" },
      { { { 1 } }, { path = "x.gif" }, "must end in %.png, %.svg or %.pdf" },
      { { { 1 } }, {}, "give a path" },
      { { { 1 } }, { path = "x.png", format = "svg" }, "does not end in %.svg" },
      { { { 1 } }, { format = "svg", width = 1e9 }, "width must be a number in" },
      { { { 1 } }, { format = "svg", figsize = { 2, 2 }, width = 100 }, "figsize or width/height" },
    }
    for i, c in ipairs(cases) do
      local ok, err = pcall(plot.heatmaps, c[1], c[2])
      assert.is_false(ok, "case " .. i .. " did not raise")
      assert.matches(c[3], tostring(err), nil, false, "case " .. i)
    end
  end)

  -- How long a (2, 4, 10, 10) figure takes as PNG + SVG is bench/bench.lua's plot_heatmaps row,
  -- with the 0.5 s this spec once asserted as its budget; the specs above draw both formats.
end)

describe("attn.plot.lines", function()
  it("draws one path per series and one legend entry each", function()
    local pe = attn.positional_encoding(60, 32)
    local svg = plot.lines(attn.arange(60), pe:narrow(2, 7, 4):t(), { format = "svg", xlabel = "Row (position)",
      legend = { "Col 6", "Col 7", "Col 8", "<Col 9>" }, figsize = { 6, 2.5 }, title = "PE" })
    local elems = parse(svg)
    assert.equals("600", elems[1].attrs.width)
    assert.equals("250", elems[1].attrs.height)
    local paths = files.select(elems, "path", "series")
    assert.equals(4, #paths)
    assert.equals(4, #files.select(elems, "path", "legend-line"))
    local names = {}
    for _, e in ipairs(files.select(elems, "text", "legend")) do names[#names + 1] = e.text end
    assert.same({ "Col 6", "Col 7", "Col 8", "<Col 9>" }, names)
    assert.matches("&lt;Col 9&gt;", svg, 1, true)
    -- series 1 is column 6, sin(i / 10000^(6/32)): its points follow the values
    local pts = {}
    for x, y in paths[1].attrs.d:gmatch("[ML]([%d.%-]+) ([%d.%-]+)") do pts[#pts + 1] = { tonumber(x), tonumber(y) } end
    assert.equals(60, #pts)
    for i = 2, 60 do assert.is_true(pts[i][1] > pts[i - 1][1]) end
    local function val(i) return math.sin((i - 1) / 10000 ^ (6 / 32)) end
    for i = 2, 60 do -- screen y falls as the value rises
      local dv, dy = val(i) - val(i - 1), pts[i][2] - pts[i - 1][2]
      if math.abs(dv) > 1e-3 then assert.is_true(dv * dy < 0, "point " .. i) end
    end
    -- distinct dash patterns after the first series
    assert.is_nil(paths[1].attrs["stroke-dasharray"])
    assert.is_not_nil(paths[2].attrs["stroke-dasharray"])
  end)

  it("breaks a line at NaN, takes tables and a default x, and writes PNG at the requested size", function()
    local nan = 0 / 0
    local elems = parse(plot.lines(nil, { { 1, 2, nan, 4, 5 }, { 3, 3, 3, 3, 3 } }, { format = "svg" }))
    local paths = files.select(elems, "path", "series")
    assert.equals(2, #paths)
    local _, moves = paths[1].attrs.d:gsub("M", "")
    assert.equals(2, moves)
    assert.equals(0, #files.select(elems, "text", "legend"))
    local png = plot.lines({ 1, 2, 3 }, { 3, 1, 2 }, { format = "png", width = 320, height = 200 })
    assert.same({ 320, 200 }, { files.png_size(png) })
  end)

  it("puts a log axis' decades at equal distances, labels them, and leaves gaps at values <= 0", function()
    local elems = parse(plot.lines(nil, { { 1, 0.1, 0.01, 0, 0.0001, 0.00001 } }, { format = "svg", yscale = "log" }))
    local d = files.select(elems, "path", "series")[1].attrs.d
    local ys = {}
    for y in d:gmatch("[ML][%d.%-]+ ([%d.%-]+)") do ys[#ys + 1] = tonumber(y) end
    assert.equals(5, #ys) -- the 0 is left out ...
    local _, moves = d:gsub("M", "")
    assert.equals(2, moves) -- ... as a gap
    local step = ys[2] - ys[1]
    assert.is_true(step > 10)
    assert.is_true(math.abs(ys[3] - ys[2] - step) < 0.02 and math.abs(ys[4] - ys[3] - 2 * step) < 0.02)
    local labels = {}
    for _, e in ipairs(files.select(elems, "text", "ytick")) do labels[e.text] = tonumber(e.attrs.y) end
    -- six decades: every other power of ten is labelled
    for _, l in ipairs { "1", "0.01", "0.0001" } do assert.is_not_nil(labels[l], "tick " .. l) end
    assert.is_nil(labels["0.1"])
    assert.is_true(math.abs((labels["0.01"] - labels["1"]) - 2 * step) < 0.02)
    assert.has_error(function() plot.lines(nil, { 1, 2 }, { format = "svg", xscale = "ln" }) end,
      "plot.lines: xscale must be 'linear' or 'log', got ln")
  end)

  it("marks every finite point on request, with a marker in the legend", function()
    local elems = parse(plot.lines({ 16, 32, 64, 128 }, { { 1, 2, 0 / 0, 4 }, { 3, 2, 1, 0.5 } },
      { format = "svg", markers = true, legend = { "a", "b" }, xscale = "log", yscale = "log" }))
    assert.equals(7, #files.select(elems, "rect", "marker"))
    assert.equals(2, #files.select(elems, "rect", "legend-marker"))
    -- the log-log axes label round values on both axes
    local xt = {}
    for _, e in ipairs(files.select(elems, "text", "xtick")) do xt[#xt + 1] = e.text end
    assert.same({ "20", "50", "100" }, xt)
    assert.has_error(function() plot.lines(nil, { 1, 2 }, { format = "svg", markers = "yes" }) end,
      "plot.lines: markers must be a boolean")
  end)

  it("raises clear errors on bad input and returns nil, message on an unwritable path", function()
    local cases = {
      { { 1, 2 }, { { 1, 2, 3 } }, nil, "series 1 has 3 values but x has 2" },
      { nil, {}, nil, "ys must be a non%-empty list" },
      { nil, { { 1, "a" } }, nil, "must hold numbers" },
      { nil, attn.rand({ 2, 2, 2 }), nil, "ys must be 1%-D or 2%-D" },
      { nil, { 1, 2 }, { legend = { "a", "b" }, format = "svg" }, "legend must be a list of 1 labels" },
      { nil, { 1, 2 }, { format = "svg", width = 40, height = 40 }, "no room for the axes" },
      { nil, { 1, 2 }, { format = "jpg" }, "format must be 'png', 'svg' or 'pdf'" },
      -- views with 2^63 - 1 or 2^40 rows: refused at once, not looped over (make fuzz, seed 4242)
      { attn.zeros(0), attn.zeros({ math.maxinteger, 0 }), nil, "more than memory allows" },
      { attn.arange(3), attn.zeros(1, 3):expand(1 << 40, 3), nil, "more than memory allows" },
    }
    for i, c in ipairs(cases) do
      local ok, err = pcall(plot.lines, c[1], c[2], c[3])
      assert.is_false(ok, "case " .. i .. " did not raise")
      assert.matches(c[4], tostring(err), nil, false, "case " .. i)
    end
    local res, msg = plot.lines(nil, { 1, 2 }, { path = "/nonexistent-dir/l.svg" })
    assert.is_nil(res)
    assert.matches("/nonexistent%-dir/l%.svg", msg)
  end)
end)

describe("attn.plot.terminal_heatmap", function()
  it("draws shade blocks scaled from the data range, with labels", function()
    local s = plot.terminal_heatmap({ { 0, 1 }, { 0.5, 0.25 } }, { row_labels = { "a", "<eos>" },
      col_labels = { "xy", "z" } })
    assert.equals(table.concat({
      "       x z",
      "       y",
      "    a |  ██|",
      "<eos> |▒▒░░|",
      "scale: ' '=0  ░=0.25  ▒=0.5  ▓=0.75  █=1",
    }, "\n"), s)
  end)

  it("draws one titled block per panel and honours vmin/vmax", function()
    local w = attn.tensor({ { { { 1 } }, { { 3 } } } }) -- (1, 2, 1, 1)
    local s = plot.terminal_heatmap(w, { titles = { "h1", "h2" }, vmin = 0, vmax = 4 })
    assert.equals("h1\n|░░|\nh2\n|▓▓|\nscale: ' '=0  ░=1  ▒=2  ▓=3  █=4", s)
    -- without titles, panels are named by their (row, column) index
    s = plot.terminal_heatmap(w, { vmin = 0, vmax = 4 })
    assert.equals("[1, 1]\n|░░|\n[1, 2]\n|▓▓|\nscale: ' '=0  ░=1  ▒=2  ▓=3  █=4", s)
  end)

  it("draws one character per cell on request", function()
    local s = plot.terminal_heatmap({ { 1, 0, 0.5 } }, { cell_width = 1, col_labels = { "ab", "c", "d" } })
    assert.equals(" acd\n b\n|█ ▒|\nscale: ' '=0  ░=0.25  ▒=0.5  ▓=0.75  █=1", s)
  end)

  it("raises on bad input", function()
    assert.has_error(function() plot.terminal_heatmap({ 1, 2 }) end)
    assert.has_error(function() plot.terminal_heatmap({ { 1 } }, { cell_width = 3 }) end,
      "plot.terminal_heatmap: cell_width must be 1 or 2, got 3")
    local ok, err = pcall(plot.terminal_heatmap, { { 1, 2 } }, { col_labels = { "a" } })
    assert.is_false(ok)
    assert.matches("col_labels must be a list of 2 labels", err)
  end)
end)
