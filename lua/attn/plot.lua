--- attn.plot: heatmaps of attention weights, line plots and attention overlays on images, as PNG,
-- SVG or PDF, and shade-block heatmaps for a terminal.
--
-- A figure is laid out once into a display list of rectangles, polylines and
-- texts (coordinates in pixels, which are SVG user units and PDF points).
-- That list is rendered by cairo (`attn.cairo`) for PNG and PDF, and by the
-- small SVG writer below for SVG: cairo's SVG surface turns text into glyph
-- outlines, while a report wants real, searchable, small `<text>` elements.
-- Text is measured with cairo's font metrics in both cases, so the two
-- formats share every position.
local core = require "attn.core"
local check = require "attn.check"

local plot = {}

local FONT = "DejaVu Sans"
local SVG_FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
local TICK_SIZE, LABEL_SIZE, TITLE_SIZE = 10, 11, 11
local INK = { 0.13, 0.13, 0.13 }
local FRAME = { 0.2, 0.2, 0.2 }
local NAN_COLOR = { 0.75, 0.75, 0.75 }

local function is_tensor(v) return getmetatable(v) == core.metatable end

-- ------------------------------------------------------------------ options

local check_options = check.options

local function set(list)
  local s = {}
  for _, k in ipairs(list) do s[k] = true end
  return s
end

local function opt_number(fn, opts, name, lo, hi)
  local v = opts[name]
  if v == nil then return nil end
  if type(v) ~= "number" or not (v >= lo and v <= hi) then
    error(string.format("%s: %s must be a number in [%g, %g], got %s", fn, name, lo, hi, tostring(v)), 3)
  end
  return v
end

local function opt_string(fn, opts, name)
  local v = opts[name]
  if v ~= nil and type(v) ~= "string" then
    error(string.format("%s: %s must be a string, got a %s", fn, name, type(v)), 3)
  end
  if v and (not utf8.len(v) or #v > 1000) then
    error(string.format("%s: %s is not valid UTF-8 of at most 1000 bytes", fn, name), 3)
  end
  return v
end

-- A list of n strings (numbers are formatted), or nil.
local function opt_labels(fn, opts, name, n, n2)
  local v = opts[name]
  if v == nil then return nil end
  if type(v) ~= "table" or (#v ~= n and #v ~= n2) then
    error(string.format("%s: %s must be a list of %d labels%s, got %s", fn, name, n,
      n2 and n2 ~= n and (" (or " .. n2 .. ")") or "", type(v) == "table" and (#v .. " labels") or type(v)), 3)
  end
  local out = {}
  for i = 1, #v do
    local s = v[i]
    if type(s) == "number" then s = string.format("%g", s) end
    if type(s) ~= "string" then error(string.format("%s: %s[%d] must be a string, got a %s", fn, name, i, type(s)), 3) end
    if not utf8.len(s) or #s > 1000 then
      error(string.format("%s: %s[%d] is not valid UTF-8 of at most 1000 bytes", fn, name, i), 3)
    end
    out[i] = s
  end
  return out
end

-- ------------------------------------------------------------------ data

-- Values (flat, row-major) and shape of a tensor or a nested table of numbers.
local function array(fn, v, what)
  if is_tensor(v) then
    local shape = v:shape()
    local flat = {}
    local function walk(t)
      if type(t) == "table" then
        for _, x in ipairs(t) do walk(x) end
      else
        flat[#flat + 1] = t + 0.0
      end
    end
    walk(v:totable())
    return flat, shape
  end
  if type(v) ~= "table" then error(string.format("%s: %s must be a tensor or a nested table of numbers, got a %s",
    fn, what, type(v)), 3) end
  local shape, t = {}, v
  while type(t) == "table" and #shape <= 8 do -- bounded: a cyclic table would nest forever
    shape[#shape + 1] = #t
    if #t == 0 then break end
    t = t[1]
  end
  local flat = {}
  local function walk(x, d)
    if d > #shape then
      if type(x) ~= "number" then
        error(string.format("%s: %s must hold numbers, found a %s", fn, what, type(x)), 4)
      end
      flat[#flat + 1] = x + 0.0
      return
    end
    if type(x) ~= "table" or #x ~= shape[d] then
      error(string.format("%s: %s is not rectangular (expected %d entries at depth %d)", fn, what, shape[d], d), 4)
    end
    for i = 1, shape[d] do walk(x[i], d + 1) end
  end
  walk(v, 1)
  return flat, shape
end

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

local function finite_range(vals)
  local lo, hi = math.huge, -math.huge
  for _, x in ipairs(vals) do
    if finite(x) then
      if x < lo then lo = x end
      if x > hi then hi = x end
    end
  end
  if lo > hi then return 0, 1 end
  return lo, hi
end

-- ------------------------------------------------------------------ colours

local function hex(s)
  return { tonumber(s:sub(2, 3), 16) / 255, tonumber(s:sub(4, 5), 16) / 255, tonumber(s:sub(6, 7), 16) / 255 }
end

local function palette(list)
  local out = {}
  for i, s in ipairs(list) do out[i] = hex(s) end
  return out
end

-- Anchors, evenly spaced from low to high values: ColorBrewer's 9-class Reds
-- and Blues (matplotlib's "Reds"/"Blues") and samples of viridis.
local colormaps = {
  Reds = palette { "#fff5f0", "#fee0d2", "#fcbba1", "#fc9272", "#fb6a4a", "#ef3b2c", "#cb181d", "#a50f15", "#67000d" },
  Blues = palette { "#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b" },
  viridis = palette { "#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c", "#22a884", "#44bf70",
    "#7ad151", "#bddf26", "#fde725" },
}

-- Colour of t in [0, 1] by linear interpolation between anchors.
local function cmap_color(anchors, t)
  if t ~= t then return NAN_COLOR end
  t = math.max(0, math.min(1, t)) * (#anchors - 1)
  local i = math.min(#anchors - 2, math.floor(t))
  local f = t - i
  local a, b = anchors[i + 1], anchors[i + 2]
  return { a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f, a[3] + (b[3] - a[3]) * f }
end

-- The line colours and dash patterns of successive series.
local SERIES_COLORS = palette { "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2" }
local SERIES_DASHES = { false, { 6, 3 }, { 6, 2, 1.5, 2 }, { 1.5, 2 } }

-- ------------------------------------------------------------------ text metrics

local meter -- a 1x1 cairo surface used only to measure text
local metrics_cache = {}

local function cairo() return require "attn.cairo" end

local function text_width(str, size, bold)
  local key = size .. (bold and "b" or "") .. "\0" .. str
  local w = metrics_cache[key]
  if not w then
    meter = meter or cairo().surface("png", 1, 1)
    meter:font(FONT, size, bold)
    w = meter:text_extents(str)
    metrics_cache[key] = w
  end
  return w
end

-- Height of capitals (to centre a line of text on a point) and of a whole line.
local function cap_height(size) return 0.73 * size end
local function line_height(size) return 1.2 * size end

-- ------------------------------------------------------------------ display list

local Figure = {}
Figure.__index = Figure

local function new_figure(width, height)
  return setmetatable({ width = width, height = height, items = {} }, Figure)
end

function Figure:rect(x, y, w, h, color, class)
  self.items[#self.items + 1] = { kind = "rect", x = x, y = y, w = w, h = h, color = color, class = class }
end

-- A polyline made of one or more runs of points {x1, y1, x2, y2, ...}.
function Figure:path(runs, color, width, dash, class)
  self.items[#self.items + 1] = { kind = "path", runs = runs, color = color, width = width, dash = dash, class = class }
end

function Figure:line(x1, y1, x2, y2, color, width, class)
  self:path({ { x1, y1, x2, y2 } }, color, width, nil, class)
end

-- Text with its baseline origin at (x, y), turned by angle degrees clockwise,
-- shifted along the baseline by align (0 start, 0.5 middle, 1 end).
function Figure:text(x, y, str, size, opts)
  opts = opts or {}
  self.items[#self.items + 1] = { kind = "text", x = x, y = y, str = str, size = size, angle = opts.angle or 0,
    align = opts.align or 0, bold = opts.bold, color = opts.color or INK, class = opts.class }
end

-- An RGB picture of iw x ih pixels (rgb: 3 iw ih values in [0, 1], pixel by pixel, row by row)
-- drawn into the w x h box at (x, y).
function Figure:image(x, y, w, h, rgb, iw, ih, class)
  self.items[#self.items + 1] = { kind = "image", x = x, y = y, w = w, h = h, rgb = rgb, iw = iw, ih = ih,
    class = class }
end

-- Draws the frame of a box.
function Figure:frame(x, y, w, h, class)
  self:path({ { x, y, x + w, y, x + w, y + h, x, y + h, x, y } }, FRAME, 0.8, nil, class or "frame")
end

-- ------------------------------------------------------------------ renderers

local function render_cairo(fig, kind, path)
  local s, err = cairo().surface(kind, fig.width, fig.height, path)
  if not s then return nil, err end
  s:set_color(1, 1, 1)
  s:rectangle(0, 0, fig.width, fig.height)
  s:fill()
  for _, it in ipairs(fig.items) do
    local c = it.color or INK
    s:set_color(c[1], c[2], c[3])
    if it.kind == "image" then -- one filled rectangle per pixel (the binding draws no bitmaps)
      local sx, sy, rgb = it.w / it.iw, it.h / it.ih, it.rgb
      for i = 0, it.ih - 1 do
        for j = 0, it.iw - 1 do
          local k = 3 * (i * it.iw + j)
          s:set_color(rgb[k + 1], rgb[k + 2], rgb[k + 3])
          s:rectangle(it.x + j * sx, it.y + i * sy, sx, sy)
          s:fill()
        end
      end
    elseif it.kind == "rect" then
      s:rectangle(it.x, it.y, it.w, it.h)
      s:fill()
    elseif it.kind == "path" then
      s:set_line_width(it.width)
      s:set_dash(it.dash or nil)
      for _, run in ipairs(it.runs) do
        s:move_to(run[1], run[2])
        for i = 3, #run, 2 do s:line_to(run[i], run[i + 1]) end
      end
      s:stroke()
    else
      s:font(FONT, it.size, it.bold)
      s:text(it.x, it.y, it.str, it.angle, it.align)
    end
  end
  return s:finish()
end

local function num(x)
  local s = string.format("%.2f", x):gsub("0+$", ""):gsub("%.$", "")
  if s == "-0" then s = "0" end
  return s
end

local function color_hex(c)
  return string.format("#%02x%02x%02x", math.floor(c[1] * 255 + 0.5), math.floor(c[2] * 255 + 0.5),
    math.floor(c[3] * 255 + 0.5))
end

local escapes = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&apos;" }
local function escape(s) return (s:gsub("[&<>\"']", escapes)) end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local function base64(bytes)
  local out = {}
  for i = 1, #bytes, 3 do
    local a, b, c = bytes:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    local q = { n >> 18, (n >> 12) & 63, (n >> 6) & 63, n & 63 }
    out[#out + 1] = B64:sub(q[1] + 1, q[1] + 1) .. B64:sub(q[2] + 1, q[2] + 1) ..
      (b and B64:sub(q[3] + 1, q[3] + 1) or "=") .. (c and B64:sub(q[4] + 1, q[4] + 1) or "=")
  end
  return table.concat(out)
end

-- A PNG file's bytes of an RGB picture (as Figure:image holds it), through cairo.
local function png_bytes(rgb, iw, ih)
  local planes = {}
  for k = 1, 3 do
    local plane = {}
    for p = 0, iw * ih - 1 do plane[p + 1] = string.pack("<f", rgb[3 * p + k]) end
    planes[k] = table.concat(plane)
  end
  return assert(cairo().image(iw, ih, 3, table.concat(planes)):finish())
end

local function class_attr(it) return it.class and (' class="' .. it.class .. '"') or "" end

local function render_svg(fig)
  local out = {
    '<?xml version="1.0" encoding="UTF-8"?>',
    string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
      'font-family="%s">', fig.width, fig.height, fig.width, fig.height, SVG_FONT),
    '<rect class="background" width="100%" height="100%" fill="#ffffff"/>',
  }
  local in_rects = false
  for _, it in ipairs(fig.items) do
    -- Runs of rectangles share a group with crispEdges: adjacent cells without
    -- anti-aliased seams between them.
    if (it.kind == "rect") ~= in_rects then
      out[#out + 1] = in_rects and "</g>" or '<g shape-rendering="crispEdges">'
      in_rects = not in_rects
    end
    if it.kind == "rect" then
      out[#out + 1] = string.format('<rect%s x="%s" y="%s" width="%s" height="%s" fill="%s"/>',
        class_attr(it), num(it.x), num(it.y), num(it.w), num(it.h), color_hex(it.color))
    elseif it.kind == "image" then
      out[#out + 1] = string.format('<image%s x="%s" y="%s" width="%s" height="%s" preserveAspectRatio="none" ' ..
        'style="image-rendering:pixelated" href="data:image/png;base64,%s"/>', class_attr(it), num(it.x), num(it.y),
        num(it.w), num(it.h), base64(png_bytes(it.rgb, it.iw, it.ih)))
    elseif it.kind == "path" then
      local d = {}
      for _, run in ipairs(it.runs) do
        d[#d + 1] = "M" .. num(run[1]) .. " " .. num(run[2])
        for i = 3, #run, 2 do d[#d + 1] = "L" .. num(run[i]) .. " " .. num(run[i + 1]) end
      end
      local dash = ""
      if it.dash then
        local parts = {}
        for i, v in ipairs(it.dash) do parts[i] = num(v) end
        dash = ' stroke-dasharray="' .. table.concat(parts, " ") .. '"'
      end
      out[#out + 1] = string.format('<path%s d="%s" fill="none" stroke="%s" stroke-width="%s"%s/>', class_attr(it),
        table.concat(d, " "), color_hex(it.color), num(it.width), dash)
    else
      local anchor = it.align == 0 and "" or it.align == 1 and ' text-anchor="end"' or ' text-anchor="middle"'
      local rot = it.angle ~= 0 and string.format(' transform="rotate(%s %s %s)"', num(it.angle), num(it.x), num(it.y)) or ""
      out[#out + 1] = string.format('<text%s x="%s" y="%s" font-size="%s"%s%s%s%s>%s</text>', class_attr(it),
        num(it.x), num(it.y), num(it.size), it.bold and ' font-weight="bold"' or "", anchor, rot,
        (it.color ~= INK) and (' fill="' .. color_hex(it.color) .. '"') or "", escape(it.str))
    end
  end
  if in_rects then out[#out + 1] = "</g>" end
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

-- Writes fig as opts.path/opts.format says. Returns the path, or (no path) the
-- SVG text or the PNG/PDF bytes; nil, message when the file cannot be written.
local function output(fn, fig, opts)
  local path, format = opts.path, opts.format
  if path ~= nil and type(path) ~= "string" then
    error(string.format("%s: path must be a string, got a %s", fn, type(path)), 3)
  end
  local ext = path and path:match("%.(%a+)$")
  ext = ext and ext:lower()
  if format ~= nil and format ~= "png" and format ~= "svg" and format ~= "pdf" then
    error(string.format("%s: format must be 'png', 'svg' or 'pdf', got %s", fn, tostring(format)), 3)
  end
  if path and format and ext ~= format then
    error(string.format("%s: path '%s' does not end in .%s (format = '%s')", fn, path, format, format), 3)
  end
  format = format or ext
  if format ~= "png" and format ~= "svg" and format ~= "pdf" then
    error(string.format("%s: %s", fn, path and ("path '" .. path .. "' must end in .png, .svg or .pdf")
      or "give a path (.png, .svg or .pdf) or a format"), 3)
  end
  if format ~= "svg" then
    local res, err = render_cairo(fig, format, path)
    if not res then return nil, err end
    return path or res
  end
  local text = render_svg(fig)
  if not path then return text end
  local f, err = io.open(path, "wb")
  if not f then return nil, err end
  local ok, werr = f:write(text)
  local cok, cerr = f:close()
  if not ok or not cok then return nil, string.format("%s: %s", path, werr or cerr) end
  return path
end

-- Figure size in pixels from width/height or figsize (inches) times dpi.
local function figure_size(fn, opts)
  local w = opt_number(fn, opts, "width", 16, 16384)
  local h = opt_number(fn, opts, "height", 16, 16384)
  local fs = opts.figsize
  if fs ~= nil then
    if w or h then error(fn .. ": give figsize or width/height, not both", 3) end
    if type(fs) ~= "table" or type(fs[1]) ~= "number" or type(fs[2]) ~= "number" or #fs ~= 2 then
      error(fn .. ": figsize must be {width, height} in inches", 3)
    end
    local dpi = opt_number(fn, opts, "dpi", 10, 1000) or 100
    w, h = fs[1] * dpi, fs[2] * dpi
    if not (w >= 16 and w <= 16384 and h >= 16 and h <= 16384) then
      error(string.format("%s: figsize x dpi must give 16..16384 pixels, got %gx%g", fn, w, h), 3)
    end
  elseif opts.dpi ~= nil then
    error(fn .. ": dpi goes with figsize", 3)
  end
  return w and math.floor(w + 0.5), h and math.floor(h + 0.5)
end

-- ------------------------------------------------------------------ ticks

-- Round values from lo to hi, about n of them, and the decimals to print.
local function nice_ticks(lo, hi, n)
  if hi <= lo then return { lo }, 3 end
  local raw = (hi - lo) / n
  local mag = 10 ^ math.floor(math.log(raw, 10))
  local step = 10 * mag
  for _, m in ipairs { 1, 2, 5 } do
    if m * mag >= raw then step = m * mag; break end
  end
  local ticks = {}
  local k = math.ceil(lo / step - 1e-9)
  while k * step <= hi + step * 1e-9 do
    ticks[#ticks + 1] = k * step
    k = k + 1
  end
  return ticks, math.max(0, math.ceil(-math.log(step, 10) - 1e-9))
end

local function tick_label(v, decimals)
  if decimals > 6 or math.abs(v) >= 1e7 then return string.format("%.4g", v) end
  local s = string.format("%." .. decimals .. "f", v)
  if tonumber(s) == 0 then s = string.format("%." .. decimals .. "f", 0) end -- no "-0.0"
  return s
end

local function max_width(labels, size)
  local w = 0
  for _, s in ipairs(labels) do w = math.max(w, text_width(s, size)) end
  return w
end

-- Every step-th of n positions (1, 1 + step, ...), step the smallest of
-- 1, 2, 5, 10, 20, ... that leaves `need` pixels between shown labels.
local function thin_step(n, spacing, need)
  local step, k = 1, 0
  local mult = { 2, 2.5, 2 }
  while step * spacing < need and step < n do
    k = k % 3 + 1
    step = math.floor(step * mult[k] + 0.5)
  end
  return step
end

-- How column tick labels fit under cells `spacing` wide: angle, shown every
-- step-th, and the height they take.
local function column_label_fit(labels, spacing, size)
  local w, h = max_width(labels, size), line_height(size)
  if w + 4 <= spacing then return 0, 1, h end
  if spacing * 0.7071 >= h then return -45, 1, (w + h) * 0.7071 end
  return -90, thin_step(#labels, spacing, h), w
end

-- ------------------------------------------------------------------ heatmaps

local heatmap_options = set { "path", "format", "xlabel", "ylabel", "titles", "row_labels", "col_labels", "cmap",
  "vmin", "vmax", "figsize", "dpi", "width", "height", "colorbar" }

--- Draws attention weights as heatmaps, one panel per (row, column) like the
-- book's `show_heatmaps`.
-- @tparam Tensor|table weights (Nq, Nk), (C, Nq, Nk) or (R, C, Nq, Nk): a tensor or a nested table
-- @tparam[opt] table opts `path` (".png", ".svg" or ".pdf" picks the format) or `format`
--   ("png", "svg", "pdf"); `xlabel`, `ylabel`; `titles` (C titles repeated on every row, as
--   the book does, or R*C row-major); `row_labels` (Nq) and `col_labels` (Nk) tick labels;
--   `cmap` ("Reds" default, "Blues", "viridis"); `vmin`, `vmax` (default: data range);
--   `width`/`height` in pixels or `figsize` in inches with `dpi` (default 100);
--   `colorbar` (default true)
-- @treturn string the path; without a path, the SVG text (or PNG/PDF bytes)
-- @treturn[2] nil when the file cannot be written, and a message
-- @raise on a bad shape, non-numbers or a bad option
-- @usage plot.heatmaps(weights, {path = "out/attn.png", xlabel = "Keys", ylabel = "Queries"})
function plot.heatmaps(weights, opts)
  local fn = "plot.heatmaps"
  opts = check_options(fn, opts, heatmap_options)
  local vals, shape = array(fn, weights, "weights")
  if #shape < 2 or #shape > 4 then
    error(string.format("%s: weights must be 2-D, 3-D or 4-D (rows, cols, queries, keys), got shape %s",
      fn, core.shape_str(shape)), 2)
  end
  while #shape < 4 do table.insert(shape, 1, 1) end
  local R, C, NQ, NK = shape[1], shape[2], shape[3], shape[4]
  if R * C * NQ * NK == 0 then error(string.format("%s: weights are empty (shape %s)", fn, core.shape_str(shape)), 2) end
  if R * C > 400 or NQ * NK > 250000 or R * C * NQ * NK > 1000000 then
    error(string.format("%s: too many panels or cells for one figure (shape %s)", fn, core.shape_str(shape)), 2)
  end
  local cmap = opts.cmap or "Reds"
  local anchors = colormaps[cmap]
  if not anchors then error(string.format("%s: cmap must be 'Reds', 'Blues' or 'viridis', got %s", fn, tostring(cmap)), 2) end
  local xlabel, ylabel = opt_string(fn, opts, "xlabel"), opt_string(fn, opts, "ylabel")
  local titles = opt_labels(fn, opts, "titles", C, R * C)
  local row_labels = opt_labels(fn, opts, "row_labels", NQ)
  local col_labels = opt_labels(fn, opts, "col_labels", NK)
  local lo, hi = finite_range(vals)
  local vmin = opt_number(fn, opts, "vmin", -1e300, 1e300) or lo
  local vmax = opt_number(fn, opts, "vmax", -1e300, 1e300) or hi
  if vmax < vmin then error(string.format("%s: vmax (%g) is below vmin (%g)", fn, vmax, vmin), 2) end
  local span = vmax > vmin and vmax - vmin or 1
  if opts.colorbar ~= nil and type(opts.colorbar) ~= "boolean" then error(fn .. ": colorbar must be a boolean", 2) end
  local colorbar = opts.colorbar ~= false
  local W, H = figure_size(fn, opts)

  -- Tick labels: the given tokens, or 1-based positions.
  local numbered_cols, numbered_rows = not col_labels, not row_labels
  if not col_labels then col_labels = {}; for j = 1, NK do col_labels[j] = tostring(j) end end
  if not row_labels then row_labels = {}; for i = 1, NQ do row_labels[i] = tostring(i) end end
  local cticks, cdec = nice_ticks(vmin, vmax, 5)
  local cbar_labels = {}
  for i, v in ipairs(cticks) do cbar_labels[i] = tick_label(v, cdec) end

  local pad, gap, tick = 8, 14, 3
  local lh_label, lh_tick, lh_title = line_height(LABEL_SIZE), line_height(TICK_SIZE), line_height(TITLE_SIZE)
  local ylabel_w = ylabel and (lh_label + 4) or 0
  local rowtick_w = max_width(row_labels, TICK_SIZE) + tick + 3
  local title_h = titles and (lh_title + 4) or 0
  local xlabel_h = xlabel and (lh_label + 4) or 0
  local cbar_w = colorbar and (gap + 12 + tick + 3 + max_width(cbar_labels, TICK_SIZE)) or 0

  -- The space around the cells, given how the column labels fit cells `cell` wide.
  local function margins(cell)
    local angle, step, label_h
    if numbered_cols then
      angle, label_h = 0, lh_tick
      step = thin_step(NK, cell, max_width(col_labels, TICK_SIZE) + 6)
    else
      angle, step, label_h = column_label_fit(col_labels, cell, TICK_SIZE)
    end
    local left = pad + ylabel_w + rowtick_w
    if angle == -45 then -- a turned label hangs left of its tick: keep the first ones inside
      for j, l in ipairs(col_labels) do
        left = math.max(left, pad + (text_width(l, TICK_SIZE) + line_height(TICK_SIZE)) * 0.7071 - (j - 0.5) * cell)
      end
    end
    local right = cbar_w + pad + (angle == 0 and max_width(col_labels, TICK_SIZE) / 2 or 0)
    local top = pad + title_h
    local bottom = tick + 3 + label_h + xlabel_h + pad
    return left, right, top, bottom, angle, step, label_h
  end
  -- Square cells: a default size from the matrix, or the largest that fits W x H.
  local default_cell = math.max(4, math.min(R * C > 1 and 24 or 36, math.floor(300 / math.max(NQ, NK))))
  local function cell_for(left, right, top, bottom)
    local aw = W and (W - left - right - (C - 1) * gap) / (C * NK) or math.huge
    local ah = H and (H - top - bottom - (R - 1) * (gap + title_h)) / (R * NQ) or math.huge
    return math.max(1, math.min(aw, ah))
  end
  local cell = default_cell
  if W or H then -- the largest square cells that fit the given size(s)
    cell = cell_for(margins(default_cell))
    cell = cell_for(margins(cell))
  end
  local left, right, top, bottom, angle, cstep, xtick_h = margins(cell)
  local rstep = numbered_rows and thin_step(NQ, cell, lh_tick * 1.6) or thin_step(NQ, cell, lh_tick * 0.9)
  -- Thinned numbers sit on multiples of the step (5, 10, ...); thinned tokens on 1, 1 + step, ...
  local function shown(step, numbered, n)
    local list, first = {}, (numbered and step > 1) and step or 1
    for k = first, n, step do list[#list + 1] = k end
    return list
  end
  local pw, ph = cell * NK, cell * NQ
  local vgap = gap + title_h -- between panel rows: the next row's titles (x labels go under the last row only)
  local gw, gh = C * pw + (C - 1) * gap, R * ph + (R - 1) * vgap
  -- Room for axis labels longer than the whole grid: a free-size figure grows,
  -- a fixed size gets a smaller font (down to 7 px).
  local xlabel_size, ylabel_size = LABEL_SIZE, LABEL_SIZE
  -- (a long y label may reach down beside the column tick labels, never to the x label)
  local span_h = gh + tick + 3 + xtick_h
  local ylabel_need = ylabel and text_width(ylabel, LABEL_SIZE) + 4 or 0
  if ylabel then
    if not H and ylabel_need > span_h then top = top + ylabel_need - span_h end
    while H and ylabel_size > 7 and text_width(ylabel, ylabel_size) > H - 2 * pad do ylabel_size = ylabel_size - 1 end
  end
  if xlabel then
    local half = text_width(xlabel, LABEL_SIZE) / 2 + pad
    if not W then left, right = math.max(left, half - gw / 2), math.max(right, half - gw / 2) end
    while W and xlabel_size > 7 and text_width(xlabel, xlabel_size) > W - 2 * pad do xlabel_size = xlabel_size - 1 end
  end
  W = W or math.ceil(left + gw + right)
  H = H or math.ceil(top + gh + bottom)
  if W > 16384 or H > 16384 then error(string.format("%s: figure would be %dx%d pixels; give width/height", fn, W, H), 2) end
  -- Centre the grid in a fixed-size figure.
  local ox = left + math.max(0, (W - left - right - gw) / 2)
  local oy = top + math.max(0, (H - top - bottom - gh) / 2)

  local fig = new_figure(W, H)
  local round = function(x) return math.floor(x + 0.5) end
  local capt = cap_height(TICK_SIZE)
  -- Axis labels go with each panel, as in the book, unless they are longer than
  -- a panel; then one label spans the whole grid.
  local xlabel_each = xlabel and text_width(xlabel, LABEL_SIZE) <= pw + gap - 6
  local ylabel_each = ylabel and text_width(ylabel, LABEL_SIZE) <= ph + vgap - 6
  local ylabel_x = ox - rowtick_w - 4
  if ylabel and not ylabel_each then
    local yc = ylabel_need <= gh and oy + gh / 2 or oy + span_h - ylabel_need / 2
    fig:text(ylabel_x, yc, ylabel, ylabel_size, { angle = -90, align = 0.5, class = "ylabel" })
  end
  local xlabel_y = oy + gh + tick + 3 + xtick_h + 2 + cap_height(LABEL_SIZE)
  if xlabel and not xlabel_each then
    fig:text(ox + gw / 2, xlabel_y, xlabel, xlabel_size, { align = 0.5, class = "xlabel" })
  end
  for r = 1, R do
    for c = 1, C do
      local x0, y0 = ox + (c - 1) * (pw + gap), oy + (r - 1) * (ph + vgap)
      local base = ((r - 1) * C + (c - 1)) * NQ * NK
      -- Cell edges on whole pixels, so neighbours meet without seams.
      for i = 1, NQ do
        local ya, yb = round(y0 + (i - 1) * cell), round(y0 + i * cell)
        for j = 1, NK do
          local xa, xb = round(x0 + (j - 1) * cell), round(x0 + j * cell)
          local v = vals[base + (i - 1) * NK + j]
          fig:rect(xa, ya, xb - xa, yb - ya, cmap_color(anchors, (v - vmin) / span), "cell")
        end
      end
      fig:frame(round(x0), round(y0), round(x0 + pw) - round(x0), round(y0 + ph) - round(y0))
      if titles then
        local t = #titles == C and titles[c] or titles[(r - 1) * C + c]
        -- a title wider than its panel gets a smaller font (down to 7 px) rather than meeting the next one
        local size = TITLE_SIZE
        while size > 7 and text_width(t, size) > pw + gap - 6 do size = size - 1 end
        fig:text(x0 + pw / 2, y0 - 5, t, size, { align = 0.5, class = "title" })
      end
      if c == 1 then -- row tick labels and the y label, left of the first column
        for _, i in ipairs(shown(rstep, numbered_rows, NQ)) do
          local y = y0 + (i - 0.5) * cell
          fig:line(x0 - tick, y, x0, y, FRAME, 0.8, "tick")
          fig:text(x0 - tick - 3, y + capt / 2, row_labels[i], TICK_SIZE, { align = 1, class = "ytick" })
        end
        if ylabel_each then
          fig:text(ylabel_x, y0 + ph / 2, ylabel, LABEL_SIZE, { angle = -90, align = 0.5, class = "ylabel" })
        end
      end
      if r == R then -- column tick labels and the x label, under the last row
        local ty = y0 + ph + tick + 3
        for _, j in ipairs(shown(cstep, numbered_cols, NK)) do
          local x = x0 + (j - 0.5) * cell
          fig:line(x, y0 + ph, x, y0 + ph + tick, FRAME, 0.8, "tick")
          if angle == 0 then
            fig:text(x, ty + capt, col_labels[j], TICK_SIZE, { align = 0.5, class = "xtick" })
          elseif angle == -45 then
            fig:text(x + 0.7071 * capt / 2, ty + 0.7071 * capt / 2, col_labels[j], TICK_SIZE,
              { angle = -45, align = 1, class = "xtick" })
          else
            fig:text(x + capt / 2, ty, col_labels[j], TICK_SIZE, { angle = -90, align = 1, class = "xtick" })
          end
        end
        if xlabel_each then fig:text(x0 + pw / 2, xlabel_y, xlabel, LABEL_SIZE, { align = 0.5, class = "xlabel" }) end
      end
    end
  end

  if colorbar then -- a column of 64 steps beside the panels, vmax at the top
    local x0, y0, steps = round(ox + gw + gap), round(oy), 64
    local y1 = round(oy + gh)
    for k = 1, steps do
      local ya, yb = round(y0 + (y1 - y0) * (k - 1) / steps), round(y0 + (y1 - y0) * k / steps)
      fig:rect(x0, ya, 12, yb - ya, cmap_color(anchors, 1 - (k - 0.5) / steps), "cbar")
    end
    fig:frame(x0, y0, 12, y1 - y0)
    for i, v in ipairs(cticks) do
      local y = y1 - (v - vmin) / span * (y1 - y0)
      fig:line(x0 + 12, y, x0 + 12 + tick, y, FRAME, 0.8, "tick")
      fig:text(x0 + 12 + tick + 3, y + capt / 2, cbar_labels[i], TICK_SIZE, { class = "cbar-label" })
    end
  end
  return output(fn, fig, opts)
end

-- ------------------------------------------------------------------ line plots

-- A list of series from ys: a list of tables/1-D tensors, one table of
-- numbers, a 1-D tensor, or a 2-D tensor whose rows are series.
local function series_list(fn, ys)
  if is_tensor(ys) then
    if ys:dim() == 1 then return { (array(fn, ys, "ys")) } end
    if ys:dim() == 2 then -- one totable, which is bounded (a (2^63, 0) view has no rows worth looping over)
      local out = {}
      for i, row in ipairs(ys:totable()) do out[i] = (array(fn, row, "ys")) end
      return out
    end
    error(string.format("%s: ys must be 1-D or 2-D (rows are series), got shape %s", fn, core.shape_str(ys)), 3)
  end
  if type(ys) ~= "table" or #ys == 0 then error(fn .. ": ys must be a non-empty list of series or a tensor", 3) end
  if type(ys[1]) == "number" then return { (array(fn, ys, "ys")) } end
  local out = {}
  for i, s in ipairs(ys) do
    local v, shape = array(fn, s, "ys[" .. i .. "]")
    if #shape ~= 1 then error(string.format("%s: ys[%d] must be 1-D, got shape %s", fn, i, core.shape_str(shape)), 3) end
    out[i] = v
  end
  return out
end

local line_options = set { "path", "format", "xlabel", "ylabel", "title", "legend", "figsize", "dpi", "width",
  "height", "xscale", "yscale", "markers" }

-- true for a log axis, false for a linear one.
local function axis_scale(fn, opts, name)
  local v = opts[name]
  if v == nil or v == "linear" then return false end
  if v == "log" then return true end
  error(string.format("%s: %s must be 'linear' or 'log', got %s", fn, name, tostring(v)), 3)
end

-- log10 of each value; values <= 0 become NaN, i.e. gaps, as matplotlib masks them.
local function log10_all(vals)
  local out = {}
  for i, v in ipairs(vals) do out[i] = v > 0 and math.log(v, 10) or 0 / 0 end
  return out
end

-- Tick positions (in axis units: log10 of the value on a log axis) and labels.
local function axis_ticks(lo, hi, n, log)
  local pos, labels = {}, {}
  if not log then
    local dec
    pos, dec = nice_ticks(lo, hi, n)
    for i, v in ipairs(pos) do labels[i] = tick_label(v, dec) end
    return pos, labels
  end
  -- powers of ten (every few when there are many), with 2x and 5x between them when that gives too few
  local k0, k1 = math.floor(lo), math.ceil(hi)
  local function decades(mults, every)
    pos, labels = {}, {}
    for k = k0, k1 do
      if k % every == 0 then
        for _, m in ipairs(mults) do
          local p = k + math.log(m, 10)
          if p >= lo - 1e-9 and p <= hi + 1e-9 then
            pos[#pos + 1], labels[#labels + 1] = p, string.format("%g", m * 10 ^ k)
          end
        end
      end
    end
  end
  decades({ 1 }, math.max(1, math.ceil((k1 - k0) / n)))
  if #pos < 3 then decades({ 1, 2, 5 }, 1) end
  if #pos < 3 then -- within about a decade: round values, placed on the log axis, if they give more
    local vals, dec = nice_ticks(10 ^ lo, 10 ^ hi, n)
    local lpos, llabels = {}, {}
    for _, v in ipairs(vals) do
      if v > 0 then lpos[#lpos + 1], llabels[#llabels + 1] = math.log(v, 10), tick_label(v, dec) end
    end
    if #lpos > #pos then pos, labels = lpos, llabels end
  end
  return pos, labels
end

--- Draws several series against x with ticks, axis labels, a title and a legend.
-- @tparam Tensor|table|nil x the n positions (nil: 1..n)
-- @tparam Tensor|table ys a list of series (tables or 1-D tensors of n numbers), one series, or a
--   2-D tensor whose rows are series; NaN and infinite values leave gaps
-- @tparam[opt] table opts `path`/`format` as for heatmaps; `xlabel`, `ylabel`, `title`; `legend`
--   (one name per series); `xscale`/`yscale` ("linear" or "log"; a log axis leaves gaps at
--   values <= 0); `markers` (true: a square at every point, for measured data); `width`/`height`
--   (default 480 x 300) or `figsize` with `dpi`
-- @treturn string the path; without a path, the SVG text (or PNG/PDF bytes)
-- @treturn[2] nil when the file cannot be written, and a message
-- @raise on mismatched lengths, non-numbers or a bad option
-- @usage plot.lines(nil, {losses}, {path = "out/loss.svg", xlabel = "epoch", ylabel = "loss"})
function plot.lines(x, ys, opts)
  local fn = "plot.lines"
  opts = check_options(fn, opts, line_options)
  local series = series_list(fn, ys)
  local n = #series[1]
  if #series > 64 then error(fn .. ": at most 64 series", 2) end
  local xs
  if x == nil then
    xs = {}
    for i = 1, n do xs[i] = i end
  else
    local shape
    xs, shape = array(fn, x, "x")
    if #shape ~= 1 then error(string.format("%s: x must be 1-D, got shape %s", fn, core.shape_str(shape)), 2) end
  end
  for i, s in ipairs(series) do
    if #s ~= #xs then
      error(string.format("%s: series %d has %d values but x has %d", fn, i, #s, #xs), 2)
    end
  end
  if #xs == 0 then error(fn .. ": series are empty", 2) end
  if #xs > 1000000 then error(fn .. ": at most 1000000 points per series", 2) end
  local xlabel, ylabel, title = opt_string(fn, opts, "xlabel"), opt_string(fn, opts, "ylabel"),
    opt_string(fn, opts, "title")
  local legend = opt_labels(fn, opts, "legend", #series)
  local W, H = figure_size(fn, opts)
  W, H = W or 480, H or 300

  local xlog, ylog = axis_scale(fn, opts, "xscale"), axis_scale(fn, opts, "yscale")
  if opts.markers ~= nil and type(opts.markers) ~= "boolean" then error(fn .. ": markers must be a boolean", 2) end
  local markers = opts.markers
  if xlog then xs = log10_all(xs) end
  if ylog then
    for k, s in ipairs(series) do series[k] = log10_all(s) end
  end
  local all = {}
  for _, s in ipairs(series) do for _, v in ipairs(s) do all[#all + 1] = v end end
  local x_lo, x_hi = finite_range(xs)
  local y_lo, y_hi = finite_range(all)
  if x_hi == x_lo then x_lo, x_hi = x_lo - 0.5, x_hi + 0.5 end
  if y_hi == y_lo then y_lo, y_hi = y_lo - 0.5, y_hi + 0.5 end
  -- 5% margins inside the axes, as matplotlib leaves them
  local mx, my = 0.05 * (x_hi - x_lo), 0.05 * (y_hi - y_lo)
  x_lo, x_hi, y_lo, y_hi = x_lo - mx, x_hi + mx, y_lo - my, y_hi + my
  local xt, xtl = axis_ticks(x_lo, x_hi, 6, xlog)
  local yt, ytl = axis_ticks(y_lo, y_hi, 5, ylog)

  local pad, tick = 8, 3
  local lh_tick, lh_label = line_height(TICK_SIZE), line_height(LABEL_SIZE)
  local legend_w = legend and (12 + 24 + 6 + max_width(legend, TICK_SIZE)) or 0
  local left = pad + (ylabel and lh_label + 4 or 0) + max_width(ytl, TICK_SIZE) + tick + 3
  local right = pad + math.max(legend_w, max_width(xtl, TICK_SIZE) / 2)
  local top = pad + (title and line_height(TITLE_SIZE) + 4 or lh_tick / 2)
  local bottom = pad + tick + 3 + lh_tick + (xlabel and lh_label + 4 or 0)
  local aw, ah = W - left - right, H - top - bottom
  if aw < 20 or ah < 20 then
    error(string.format("%s: a %dx%d figure leaves no room for the axes; make it larger", fn, W, H), 2)
  end
  local function px(v) return left + (v - x_lo) / (x_hi - x_lo) * aw end
  local function py(v) return top + ah - (v - y_lo) / (y_hi - y_lo) * ah end

  local fig = new_figure(W, H)
  local grid = { 0.9, 0.9, 0.9 }
  local capt = cap_height(TICK_SIZE)
  for i, v in ipairs(xt) do
    local gx = px(v)
    fig:line(gx, top, gx, top + ah, grid, 0.8, "grid")
    fig:line(gx, top + ah, gx, top + ah + tick, FRAME, 0.8, "tick")
    fig:text(gx, top + ah + tick + 3 + capt, xtl[i], TICK_SIZE, { align = 0.5, class = "xtick" })
  end
  for i, v in ipairs(yt) do
    local gy = py(v)
    fig:line(left, gy, left + aw, gy, grid, 0.8, "grid")
    fig:line(left - tick, gy, left, gy, FRAME, 0.8, "tick")
    fig:text(left - tick - 3, gy + capt / 2, ytl[i], TICK_SIZE, { align = 1, class = "ytick" })
  end
  for k, s in ipairs(series) do
    -- Runs of consecutive finite points; a NaN or infinity breaks the line.
    local runs, run = {}, nil
    for i = 1, #xs do
      if finite(xs[i]) and finite(s[i]) then
        if not run then run = {}; runs[#runs + 1] = run end
        run[#run + 1] = px(xs[i])
        run[#run + 1] = py(s[i])
      else
        run = nil
      end
    end
    for _, r in ipairs(runs) do -- a lone point still shows as a dot
      if #r == 2 then r[3], r[4] = r[1] + 0.01, r[2] end
    end
    local color = SERIES_COLORS[(k - 1) % #SERIES_COLORS + 1]
    local dash = SERIES_DASHES[(k - 1) % #SERIES_DASHES + 1] or nil
    fig:path(runs, color, 1.5, dash, "series")
    if markers then
      for _, r in ipairs(runs) do
        for i = 1, #r, 2 do
          if not (i == 3 and #r == 4 and r[3] == r[1] + 0.01) then fig:rect(r[i] - 2, r[i + 1] - 2, 4, 4, color, "marker") end
        end
      end
    end
  end
  fig:frame(left, top, aw, ah)
  if title then fig:text(left + aw / 2, top - 6, title, TITLE_SIZE, { align = 0.5, class = "title" }) end
  if xlabel then
    fig:text(left + aw / 2, H - pad - 2, xlabel, LABEL_SIZE, { align = 0.5, class = "xlabel" })
  end
  if ylabel then
    fig:text(pad + cap_height(LABEL_SIZE) + 2, top + ah / 2, ylabel, LABEL_SIZE,
      { angle = -90, align = 0.5, class = "ylabel" })
  end
  if legend then
    local lx, ly = left + aw + 12, top + 4
    for k, name in ipairs(legend) do
      local y = ly + (k - 0.5) * lh_tick * 1.3
      local color = SERIES_COLORS[(k - 1) % #SERIES_COLORS + 1]
      fig:path({ { lx, y, lx + 24, y } }, color, 1.5, SERIES_DASHES[(k - 1) % #SERIES_DASHES + 1] or nil, "legend-line")
      if markers then fig:rect(lx + 10, y - 2, 4, 4, color, "legend-marker") end
      fig:text(lx + 30, y + capt / 2, name, TICK_SIZE, { class = "legend" })
    end
  end
  return output(fn, fig, opts)
end

-- ------------------------------------------------------------------ terminal

local SHADES = { " ", "░", "▒", "▓", "█" }

local terminal_options = set { "row_labels", "col_labels", "vmin", "vmax", "titles", "cell_width" }

-- ------------------------------------------------------------------ attention overlays

local overlay_options = set { "path", "format", "cmap", "alpha", "scale", "columns", "title" }

-- Bilinear interpolation of an n-point row to m points (align_corners = false, as PyTorch's and
-- OpenCV's resize): for each output point, the two source indices and the second one's weight.
local function bilinear_taps(n, m)
  local taps = {}
  for i = 0, m - 1 do
    local src = math.max(0, math.min(n - 1, (i + 0.5) * n / m - 0.5))
    local lo = math.floor(src)
    local hi = math.min(lo + 1, n - 1)
    taps[i + 1] = { lo + 1, hi + 1, src - lo }
  end
  return taps
end

--- Draws the attention of each generated word over an image (Show, Attend and Tell's
-- picture): one panel per word, the word's attention map (a coarse grid) upsampled bilinearly
-- to the image's size, scaled to its own maximum, coloured by `cmap` and blended over the
-- gray image, the word under the panel.
-- @tparam Tensor image (H, W) or (1, H, W), gray values in [0, 1]
-- @tparam Tensor|table weights (T, gh, gw): one attention map per word (a (T, L) tensor with a
--   square L is read as (T, sqrt L, sqrt L))
-- @tparam {string,...} words T words (the panels' captions)
-- @tparam[opt] table opts `path` (.png, .svg or .pdf) or `format`; `cmap` ("viridis" default,
--   "Reds", "Blues"); `alpha` the colour's weight in the blend (default 0.6); `scale` pixels
--   per image pixel (an integer, default 2); `columns` panels per row (default 6); `title`
-- @treturn string the path; without a path, the SVG text (or PNG/PDF bytes)
-- @treturn[2] nil when the file cannot be written, and a message
-- @raise on bad shapes, a word count that is not T, or a bad option
-- @usage plot.attention_overlay(canvas, alphas:reshape({T, 3, 3}), {"bag", "shirt", "<eos>"}, {path = "a.png"})
function plot.attention_overlay(image, weights, words, opts)
  local fn = "plot.attention_overlay"
  opts = check_options(fn, opts, overlay_options)
  if not is_tensor(image) or not (image:dim() == 2 or (image:dim() == 3 and image:size(1) == 1)) then
    error(string.format("%s: image must be a (H, W) or (1, H, W) tensor, got %s", fn,
      is_tensor(image) and core.shape_str(image:shape()) or type(image)), 2)
  end
  local H, W = image:size(image:dim() - 1), image:size(image:dim())
  local vals, shape = array(fn, weights, "weights")
  if #shape == 2 then
    local g = math.tointeger(math.sqrt(shape[2]))
    if not g or g * g ~= shape[2] then
      error(string.format("%s: weights %s: a (T, L) map needs a square L", fn, core.shape_str(shape)), 2)
    end
    shape = { shape[1], g, g }
  end
  if #shape ~= 3 or shape[1] * shape[2] * shape[3] == 0 then
    error(string.format("%s: weights must be (T, gh, gw) or (T, L), got %s", fn, core.shape_str(shape)), 2)
  end
  local T, gh, gw = shape[1], shape[2], shape[3]
  if T > 64 or H * W > 512 * 512 then error(string.format("%s: %d panels of %dx%d are too many", fn, T, H, W), 2) end
  local labels = opt_labels(fn, { words = words }, "words", T)
  if not labels then error(fn .. ": words must be a list of " .. T .. " strings", 2) end
  local anchors = colormaps[opts.cmap or "viridis"]
  if not anchors then error(string.format("%s: cmap must be 'Reds', 'Blues' or 'viridis', got %s", fn,
    tostring(opts.cmap)), 2) end
  local alpha = opt_number(fn, opts, "alpha", 0, 1) or 0.6
  local scale = opts.scale or 2
  if math.type(scale) ~= "integer" or scale < 1 or scale > 16 then
    error(fn .. ": scale must be an integer in 1..16, got " .. tostring(scale), 2)
  end
  local columns = opts.columns or 6
  if math.type(columns) ~= "integer" or columns < 1 then
    error(fn .. ": columns must be a positive integer, got " .. tostring(columns), 2)
  end
  local title = opt_string(fn, opts, "title")
  local gray = array(fn, image:reshape({ H * W }), "image")
  local ty, tx = bilinear_taps(gh, H), bilinear_taps(gw, W)

  local pw, ph, gap = W * scale, H * scale, 10
  local word_h = line_height(LABEL_SIZE) + 4
  local title_h = title and line_height(TITLE_SIZE) + 6 or 0
  columns = math.min(columns, T)
  local rows = (T + columns - 1) // columns
  local fig = new_figure(math.ceil(2 * gap + columns * pw + (columns - 1) * gap),
    math.ceil(2 * gap + title_h + rows * (ph + word_h) + (rows - 1) * gap))
  if title then fig:text(fig.width / 2, gap + cap_height(TITLE_SIZE), title, TITLE_SIZE, { align = 0.5, class = "title" }) end
  for t = 1, T do
    local base, top = (t - 1) * gh * gw, 0
    for k = 1, gh * gw do top = math.max(top, vals[base + k]) end
    top = top > 0 and top or 1
    local rgb = {}
    for i = 1, H do
      local a, b, fy = ty[i][1], ty[i][2], ty[i][3]
      for j = 1, W do
        local c, d, fx = tx[j][1], tx[j][2], tx[j][3]
        local v00, v01 = vals[base + (a - 1) * gw + c], vals[base + (a - 1) * gw + d]
        local v10, v11 = vals[base + (b - 1) * gw + c], vals[base + (b - 1) * gw + d]
        local v = ((v00 * (1 - fx) + v01 * fx) * (1 - fy) + (v10 * (1 - fx) + v11 * fx) * fy) / top
        local col, g = cmap_color(anchors, v), math.max(0, math.min(1, gray[(i - 1) * W + j]))
        local at = 3 * ((i - 1) * W + j - 1)
        for k = 1, 3 do rgb[at + k] = (1 - alpha) * g + alpha * col[k] end
      end
    end
    local r, c = (t - 1) // columns, (t - 1) % columns
    local x0, y0 = gap + c * (pw + gap), gap + title_h + r * (ph + word_h + gap)
    fig:image(x0, y0, pw, ph, rgb, W, H, "overlay")
    fig:frame(x0, y0, pw, ph)
    fig:text(x0 + pw / 2, y0 + ph + 4 + cap_height(LABEL_SIZE), labels[t], LABEL_SIZE, { align = 0.5, class = "word" })
  end
  return output(fn, fig, opts)
end

-- Pads a UTF-8 string with spaces to n characters (right-aligned when right).
local function pad_to(s, n, right)
  local fill = string.rep(" ", math.max(0, n - utf8.len(s)))
  return right and fill .. s or s .. fill
end

--- A heatmap as lines of Unicode shade blocks, for a terminal.
-- @tparam Tensor|table weights 2-D, 3-D or 4-D as for `plot.heatmaps`
-- @tparam[opt] table opts `row_labels`, `col_labels` (written vertically above the columns),
--   `titles` (one per panel), `vmin`, `vmax` (default: data range), `cell_width` (characters
--   per cell: 2, the default, looks square in most terminals; 1 for wide matrices)
-- @treturn string the picture, lines separated by "\n", ending with the shade scale
-- @raise on a bad shape, non-numbers or a bad option
-- @usage print(plot.terminal_heatmap(w, {row_labels = src, col_labels = tgt}))
function plot.terminal_heatmap(weights, opts)
  local fn = "plot.terminal_heatmap"
  opts = check_options(fn, opts, terminal_options)
  local vals, shape = array(fn, weights, "weights")
  if #shape < 2 or #shape > 4 then
    error(string.format("%s: weights must be 2-D, 3-D or 4-D, got shape %s", fn, core.shape_str(shape)), 2)
  end
  local NQ, NK = shape[#shape - 1], shape[#shape]
  if NQ * NK == 0 then error(string.format("%s: weights are empty (shape %s)", fn, core.shape_str(shape)), 2) end
  local panels = #vals // (NQ * NK)
  local row_labels = opt_labels(fn, opts, "row_labels", NQ)
  local col_labels = opt_labels(fn, opts, "col_labels", NK)
  local titles = opt_labels(fn, opts, "titles", panels)
  local lo, hi = finite_range(vals)
  local vmin = opt_number(fn, opts, "vmin", -1e300, 1e300) or lo
  local vmax = opt_number(fn, opts, "vmax", -1e300, 1e300) or hi
  local span = vmax > vmin and vmax - vmin or 1
  local cw = opts.cell_width or 2
  if cw ~= 1 and cw ~= 2 then error(string.format("%s: cell_width must be 1 or 2, got %s", fn, tostring(cw)), 2) end
  local lw = 0
  for _, s in ipairs(row_labels or {}) do lw = math.max(lw, utf8.len(s)) end
  local indent = lw > 0 and lw + 1 or 0
  local header = {}
  if col_labels then -- one character per line, top-aligned above the columns
    local chars, depth = {}, 0
    for j, s in ipairs(col_labels) do
      chars[j] = {}
      for _, cp in utf8.codes(s) do chars[j][#chars[j] + 1] = utf8.char(cp) end
      depth = math.max(depth, #chars[j])
    end
    for d = 1, depth do
      local row = { string.rep(" ", indent), " " }
      for j = 1, NK do row[#row + 1] = (chars[j][d] or " ") .. string.rep(" ", cw - 1) end
      header[d] = (table.concat(row):gsub("%s+$", ""))
    end
  end
  local lines = {}
  for p = 1, panels do
    if titles then lines[#lines + 1] = titles[p]
    elseif #shape == 4 and panels > 1 then
      lines[#lines + 1] = string.format("[%d, %d]", (p - 1) // shape[2] + 1, (p - 1) % shape[2] + 1)
    elseif panels > 1 then
      lines[#lines + 1] = string.format("[%d]", p)
    end
    for _, h in ipairs(header) do lines[#lines + 1] = h end
    for i = 1, NQ do
      local row = { row_labels and pad_to(row_labels[i], lw, true) .. " " or "", "|" }
      for j = 1, NK do
        local v = vals[(p - 1) * NQ * NK + (i - 1) * NK + j]
        local t = (v - vmin) / span
        local ch = t ~= t and string.rep("?", cw)
          or string.rep(SHADES[math.floor(math.max(0, math.min(1, t)) * (#SHADES - 1) + 0.5) + 1], cw)
        row[#row + 1] = ch
      end
      row[#row + 1] = "|"
      lines[#lines + 1] = table.concat(row)
    end
  end
  local scale = {}
  for k, s in ipairs(SHADES) do
    scale[k] = string.format("%s=%.3g", s == " " and "' '" or s, vmin + (vmax - vmin) * (k - 1) / (#SHADES - 1))
  end
  lines[#lines + 1] = "scale: " .. table.concat(scale, "  ")
  return table.concat(lines, "\n")
end

return plot
