--- Self-contained HTML reports for experiments.
--
-- A report collects headings, paragraphs, tables, preformatted text and inline
-- SVG figures, and writes one HTML file with no external references (styles
-- inline, figures as inline SVG), so it can be mailed or archived as it is.
-- Text is escaped; SVG is embedded as given (it comes from `attn.plot`).
-- @module attn.d2l.report
-- @usage
-- local report = require "attn.d2l.report"
-- local r = report.new("Bahdanau attention")
-- r:paragraph("Trained 250 epochs on 601 pairs.")
-- r:table({"source", "translation", "BLEU"}, {{"go .", "va !", "1.000"}})
-- r:figure(plot.heatmaps(w, {format = "svg"}), "decoder attention")
-- assert(r:write("out/bahdanau/report.html"))
local report = {}

local Report = {}
Report.__index = Report

--- Escapes text for HTML element content and attribute values.
-- @tparam string s
-- @treturn string
function report.escape(s)
  return (tostring(s):gsub("[&<>\"']", {
    ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&#39;",
  }))
end
local escape = report.escape

--- A new, empty report.
-- @tparam string title shown as the page title and first heading
-- @treturn Report
function report.new(title)
  return setmetatable({ title = tostring(title), parts = {} }, Report)
end

local function add(self, html)
  self.parts[#self.parts + 1] = html
  return self
end

--- Adds a section heading.
-- @tparam string text
-- @treturn Report self
function Report:heading(text) return add(self, "<h2>" .. escape(text) .. "</h2>") end

--- Adds a paragraph of text.
-- @tparam string text
-- @treturn Report self
function Report:paragraph(text) return add(self, "<p>" .. escape(text) .. "</p>") end

--- Adds preformatted text (printed numbers, logs).
-- @tparam string text
-- @treturn Report self
function Report:pre(text) return add(self, "<pre>" .. escape(text) .. "</pre>") end

--- Adds a table.
-- @tparam {string,...} header column names
-- @tparam {{any,...},...} rows cells (converted with tostring)
-- @treturn Report self
function Report:table(header, rows)
  local out = { "<table><thead><tr>" }
  for _, h in ipairs(header) do out[#out + 1] = "<th>" .. escape(h) .. "</th>" end
  out[#out + 1] = "</tr></thead><tbody>"
  for _, row in ipairs(rows) do
    out[#out + 1] = "<tr>"
    for i = 1, #header do out[#out + 1] = "<td>" .. escape(row[i] == nil and "" or row[i]) .. "</td>" end
    out[#out + 1] = "</tr>"
  end
  out[#out + 1] = "</tbody></table>"
  return add(self, table.concat(out))
end

--- Adds an inline SVG figure with a caption.
-- @tparam string svg SVG document text (an XML declaration, if present, is dropped)
-- @tparam[opt] string caption
-- @treturn Report self
-- @raise when svg is not SVG text
function Report:figure(svg, caption)
  if type(svg) ~= "string" or not svg:find("<svg", 1, true) then
    error("report:figure: expected SVG text, got " .. (type(svg) == "string" and "a string without <svg" or type(svg)), 2)
  end
  svg = svg:gsub("^%s*<%?xml.-%?>%s*", "")
  local cap = caption and ("<figcaption>" .. escape(caption) .. "</figcaption>") or ""
  return add(self, "<figure>" .. svg .. cap .. "</figure>")
end

--- Draws one figure twice through an `attn.plot` function: to a PNG file and as
-- inline SVG in the report. The last argument is the plot's options table.
-- @tparam string caption
-- @tparam[opt] string png_path where the PNG goes (nil: SVG only)
-- @tparam function plot_fn e.g. `plot.heatmaps` or `plot.lines`
-- @param ... the plot function's arguments, options table last
-- @treturn[1] Report self
-- @treturn[2] nil
-- @treturn[2] string message (the PNG could not be written)
function Report:plot(caption, png_path, plot_fn, ...)
  local args = table.pack(...)
  local opts = args[args.n]
  if type(opts) ~= "table" then error("report:plot: the last argument must be the plot's options table", 2) end
  local function with(extra)
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    for k, v in pairs(extra) do o[k] = v end
    local a = table.pack(table.unpack(args, 1, args.n))
    a[a.n] = o
    return plot_fn(table.unpack(a, 1, a.n))
  end
  if png_path then
    local ok, err = with { path = png_path }
    if not ok then return nil, err end
  end
  return self:figure(with { format = "svg" }, caption)
end

local STYLE = [[
body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:.25em .6em;text-align:left}
th{background:#eee}pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}figcaption{color:#555;font-size:.9em}]]

--- The whole document as a string.
-- @treturn string
function Report:html()
  return table.concat {
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", escape(self.title),
    "</title><style>", STYLE, "</style></head><body>\n<h1>", escape(self.title), "</h1>\n",
    table.concat(self.parts, "\n"), "\n</body></html>\n",
  }
end

--- Writes the report (to a temporary file, then renamed, so a reader never sees half a page).
-- @tparam string path
-- @treturn[1] string path
-- @treturn[2] nil
-- @treturn[2] string message
function Report:write(path)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then return nil, "report: cannot write " .. path .. ": " .. tostring(err) end
  local ok, werr = f:write(self:html())
  local closed, cerr = f:close()
  if not ok or not closed then
    os.remove(tmp)
    return nil, "report: writing " .. path .. " failed: " .. tostring(werr or cerr)
  end
  local renamed, rerr = os.rename(tmp, path)
  if not renamed then
    os.remove(tmp)
    return nil, "report: cannot rename to " .. path .. ": " .. tostring(rerr)
  end
  return path
end

return report
