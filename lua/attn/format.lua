--- tostring for tensors: a header line with dtype and shape, then the values
-- (matrices row by row, higher dims as labelled 2-D slices, Torch style),
-- elided with "..." past `edge` entries per dim when the tensor is large.
local core = require "attn.core"

local format = {}

local THRESHOLD, EDGE = 1000, 3

local function number_format(values)
  local all_int, max_abs = true, 0
  for _, v in ipairs(values) do
    if v ~= v or v == math.huge or v == -math.huge then
      all_int = false
    else
      if v ~= math.floor(v) then all_int = false end
      if math.abs(v) > max_abs then max_abs = math.abs(v) end
    end
  end
  if all_int and max_abs < 1e9 then return "%.0f" end
  if max_abs >= 1e5 or (max_abs < 1e-3 and max_abs > 0) then return "%.4e" end
  return "%.4f"
end

local displayed_values

-- Indices to show along a dim of size n: all, or the first and last EDGE with a gap marker (false).
local function shown(n, elide)
  local idx = {}
  if not elide or n <= 2 * EDGE then
    for i = 1, n do idx[#idx + 1] = i end
  else
    for i = 1, EDGE do idx[#idx + 1] = i end
    idx[#idx + 1] = false
    for i = n - EDGE + 1, n do idx[#idx + 1] = i end
  end
  return idx
end

-- string.format of one value; a NaN prints as "nan" whatever its sign bit
-- (glibc shows "-nan" for the NaN that 0/0 gives, which reads like a value).
local function format_value(fmt, v)
  local s = string.format(fmt, v)
  if v ~= v then s = s:gsub("%-nan", " nan") end
  return s
end

local function render_matrix(m, fmt, elide, lines)
  local rows, cols = core.size(m, 1), core.size(m, 2)
  local ri, ci = shown(rows, elide), shown(cols, elide)
  local cells, width = {}, 1
  for r, i in ipairs(ri) do
    cells[r] = {}
    for c, j in ipairs(ci) do
      local s = (i and j) and format_value(fmt, core.get(m, i, j)) or "..."
      cells[r][c] = s
      if #s > width then width = #s end
    end
  end
  for r = 1, #ri do
    local parts = {}
    for c = 1, #ci do parts[c] = string.rep(" ", width - #cells[r][c]) .. cells[r][c] end
    lines[#lines + 1] = " " .. table.concat(parts, " ")
  end
end

-- The values that will be shown (all of them, or the edges of each dim), so the
-- number format fits exactly what is printed.
function displayed_values(t, elide)
  local out = {}
  local function walk(view)
    if core.dim(view) == 0 then
      out[#out + 1] = core.item(view)
      return
    end
    for _, i in ipairs(shown(core.size(view, 1), elide)) do
      if i then walk(core.select(view, 1, i)) end
    end
  end
  walk(t)
  return out
end

function format.tostring(t)
  local shape, dtype = core.shape(t), core.dtype(t)
  local header = string.format("attn.Tensor %s %s", dtype, core.shape_str(shape))
  local n = core.numel(t)
  if n == 0 then return header .. " (empty)" end
  local elide = n > THRESHOLD
  -- int64 values are Lua integers: %d prints them exactly, past 2^53 included
  local fmt = dtype == "int64" and "%d" or number_format(displayed_values(t, elide))
  local lines = { header }
  local nd = #shape
  if nd == 0 then
    lines[#lines + 1] = " " .. format_value(fmt, core.item(t))
  elseif nd == 1 then
    render_matrix(core.unsqueeze(t, 1), fmt, elide, lines)
  elseif nd == 2 then
    render_matrix(t, fmt, elide, lines)
  else
    -- walk the leading dims; label each 2-D slice like "(2,1,.,.)"
    local lead = {}
    for d = 1, nd - 2 do lead[d] = shown(shape[d], elide) end
    local pos = {}
    local function walk(d, view)
      if d > nd - 2 then
        lines[#lines + 1] = "(" .. table.concat(pos, ",") .. ",.,.) ="
        render_matrix(view, fmt, elide, lines)
        return
      end
      for _, i in ipairs(lead[d]) do
        if i then
          pos[d] = i
          walk(d + 1, core.select(view, 1, i))
        else
          lines[#lines + 1] = "..."
        end
      end
    end
    walk(1, t)
  end
  return table.concat(lines, "\n")
end

return format
