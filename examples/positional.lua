-- Sinusoidal positional encoding (d2l "Self-Attention and Positional Encoding"):
-- columns 6-9 against position, the whole table as a heatmap, the binary
-- analogy, and the chapter's claim that position i+delta is a linear map of
-- position i that does not depend on i: fitted with attn.linalg.lstsq and
-- compared with the closed-form rotation, in float64.
local attn = require "attn"
local cli = require "attn.d2l.cli"
local plot = require "attn.plot"
local report = require "attn.d2l.report"

local opts = cli.start(arg, {
  name = "positional",
  description = "Sinusoidal positional encoding: plots and the relative-position rotation, checked numerically.",
  options = {
    { "dim", "integer", 32, "encoding dimension (even)" },
    { "steps", "integer", 60, "number of positions" },
    { "delta", "integer", 5, "position offset for the linear-map check" },
  },
})
assert(opts.dim % 2 == 0 and opts.dim >= 10, "--dim must be even and at least 10")
assert(opts.delta >= 1 and opts.delta < opts.steps - 2, "--delta must be in 1 .. steps-3")
local out = opts.out
local r = report.new("Positional encoding")
local d, n, delta = opts.dim, opts.steps, opts.delta

-- The book's demo: an nn.PositionalEncoding with dropout 0 applied to zeros
-- returns the table itself.
local pe = attn.nn.PositionalEncoding { num_hiddens = d, dropout = 0 }
pe:eval()
local P = pe(attn.zeros({ 1, n, d })):select(1, 1) -- (n, d), float32 as the book's
local positions = attn.arange(0, n, 1)

-- Columns 6..9 of the book (0-based) are columns 7..10 here.
local series, names = {}, {}
for c = 6, 9 do
  series[#series + 1] = P:select(2, c + 1)
  names[#names + 1] = "Col " .. c
end
r:heading("Columns 6-9 against position")
r:paragraph("Lower columns oscillate faster: column 2j has frequency 1/10000^(2j/d).")
assert(r:plot("P[:, 6:10] against position (the book's figure)", out .. "/columns.png", plot.lines, positions, series,
  { legend = names, xlabel = "Row (position)", title = "Positional encoding, columns 6-9" }))

r:heading("The encoding table")
assert(r:plot("The " .. n .. "x" .. d .. " table: frequency falls from left to right", out .. "/table.png",
  plot.heatmaps, P:unsqueeze(1):unsqueeze(1),
  { xlabel = "Column (encoding dimension)", ylabel = "Row (position)", cmap = "Blues" }))

-- The binary analogy: higher bits alternate less often.
local lines = {}
for i = 0, 7 do
  local bits = {}
  for b = 2, 0, -1 do bits[#bits + 1] = (i >> b) & 1 end
  lines[#lines + 1] = string.format("%d in binary is %s", i, table.concat(bits))
end
print(table.concat(lines, "\n"))
r:heading("Binary representations of 0..7")
r:paragraph("Like the encoding's columns, a higher bit alternates less often than a lower one.")
r:pre(table.concat(lines, "\n"))
local bits = attn.zeros({ 8, 3 })
for i = 0, 7 do
  for b = 2, 0, -1 do bits:set((i >> b) & 1, i + 1, 3 - b) end
end
local numbers = {}
for i = 0, 7 do numbers[i + 1] = tostring(i) end
assert(r:plot("0..7 in binary, beside the encoding table: bit 2 (left) changes slowest", out .. "/binary.png",
  plot.heatmaps, bits:unsqueeze(1):unsqueeze(1), { xlabel = "bit", ylabel = "number", row_labels = numbers,
    col_labels = { "2", "1", "0" }, cmap = "Blues", colorbar = false }))

-- Relative positions, in float64. For each frequency w_j the pair
-- (P[i, 2j], P[i, 2j+1]) = (sin(i w_j), cos(i w_j)) maps to position i+delta by
-- [s, c] @ [[cos(delta w_j), -sin(delta w_j)], [sin(delta w_j), cos(delta w_j)]].
local P64 = attn.positional_encoding(n, d, "float64")
local X = P64:narrow(1, 1, n - delta)         -- positions 0 .. n-delta-1
local Y = P64:narrow(1, 1 + delta, n - delta) -- the same positions shifted by delta
local worst_residual, worst_deviation = 0, 0
local rows = {}
for j = 0, d // 2 - 1 do
  local Xj, Yj = X:narrow(2, 2 * j + 1, 2), Y:narrow(2, 2 * j + 1, 2)
  local M = attn.linalg.lstsq(Xj, Yj) -- (2, 2), fitted over every i at once
  local w = 1 / 10000 ^ (2 * j / d)
  local c, s = math.cos(delta * w), math.sin(delta * w)
  local R = attn.tensor({ { c, -s }, { s, c } }, "float64")
  local residual = (Xj:matmul(M) - Yj):abs():max():item()
  local deviation = (M - R):abs():max():item()
  worst_residual = math.max(worst_residual, residual)
  worst_deviation = math.max(worst_deviation, deviation)
  if j < 3 or j == d // 2 - 1 then
    rows[#rows + 1] = { j, string.format("%.6f", w), string.format("%.3e", residual), string.format("%.3e", deviation) }
  end
end
-- The same claim for the whole row: one (d, d) matrix maps every P[i] to P[i+delta].
local R_full = attn.zeros({ d, d }, "float64")
for j = 0, d // 2 - 1 do
  local w = 1 / 10000 ^ (2 * j / d)
  local c, s = math.cos(delta * w), math.sin(delta * w)
  R_full:set(c, 2 * j + 1, 2 * j + 1)
  R_full:set(-s, 2 * j + 1, 2 * j + 2)
  R_full:set(s, 2 * j + 2, 2 * j + 1)
  R_full:set(c, 2 * j + 2, 2 * j + 2)
end
local full_residual = (X:matmul(R_full) - Y):abs():max():item()

local summary = string.format(
  "delta = %d over %d positions, float64:\n" ..
  "  per-frequency 2x2 maps fitted by least squares: worst residual %.3e, worst deviation from the rotation %.3e\n" ..
  "  the block-diagonal rotation applied to whole rows: worst residual %.3e",
  delta, n, worst_residual, worst_deviation, full_residual)
print(summary)
r:heading("Position i+delta is a linear map of position i")
r:paragraph("For each frequency pair, a 2x2 matrix is fitted over all positions at once with attn.linalg.lstsq " ..
  "and compared with the closed-form rotation by delta*w_j: a residual near zero means one matrix serves every " ..
  "position i; a deviation near zero means it is the rotation.")
r:table({ "pair j", "w_j", "max |X M - Y|", "max |M - R|" }, rows)
r:pre(summary)
assert(r:write(out .. "/report.html"))
print("wrote " .. out .. "/columns.png, " .. out .. "/table.png, " .. out .. "/binary.png and " .. out .. "/report.html")
if worst_residual > 1e-9 or worst_deviation > 1e-6 or full_residual > 1e-9 then
  error("the linear-map check failed beyond float64 rounding")
end
