--- Rotary position embedding (RoPE, Su et al., arXiv:2104.09864), differentiable.
--
-- The facade copies `rope` into `attn`: `attn.rope(x, opts)`. x is (..., N, d) with d even; the
-- d/2 frequencies are theta_i = base^(-2(i-1)/d), i = 1..d/2, and the token at (1-based) index t
-- along N is at the **0-based** position t - 1 (as every reference implementation counts) unless
-- `positions` says otherwise. Each pair of features is rotated by the angle position * theta_i:
--
-- * default (`interleaved = false`, GPT-NeoX, Hugging Face Llama): pairs (x_i, x_{i+d/2});
-- * `interleaved = true` (RoFormer, GPT-J, Meta's original LLaMA): pairs (x_{2i-1}, x_{2i}).
--
-- Mixing the two conventions between training and inference gives fluent output that ignores
-- the prompt, so a model stores the one it was trained with (nn.RotaryEmbedding). The angles are
-- computed in double precision and rounded once to x's dtype. The backward is the rotation by
-- the opposite angle (one node, no saved activations).
--
-- Two paths with the same numbers, bit for bit (attn.nn.fused's vocabulary, reported to its trace
-- as "rope"): the fused C kernel (src/nn/attn_rope.c: one pass forward, one backward, threaded)
-- and the composed tensor ops below, which `attn.nn.set_fused(false)` selects.
-- @module attn.rope
local core = require "attn.core"
local autograd = require "attn.autograd"
local check = require "attn.check"
local fused = require "attn.nn.fused"

local M = {}

local shape_str = core.shape_str

-- cos/sin tables per (d, base, dtype), (P, d/2) for positions 0..P-1, grown on demand: a decode
-- step reads one row instead of computing d/2 cosines.
local tables = {}

local function build(P, d, base, dtype)
  local half = d // 2
  local c, s = {}, {}
  for p = 0, P - 1 do
    local crow, srow = {}, {}
    for i = 1, half do
      local a = p * base ^ (-(2 * (i - 1)) / d)
      crow[i], srow[i] = math.cos(a), math.sin(a)
    end
    c[p + 1], s[p + 1] = crow, srow
  end
  return core.tensor(c, dtype), core.tensor(s, dtype)
end

-- The (P, d/2) cos and sin of positions 0..P-1 (at least), cached.
local function cos_sin(P, d, base, dtype)
  local key = d .. ":" .. base .. ":" .. dtype
  local t = tables[key]
  if t == nil or t.P < P then
    local n = math.max(P, t and 2 * t.P or 64)
    local c, s = build(n, d, base, dtype)
    t = { P = n, c = c, s = s }
    tables[key] = t
  end
  return t.c, t.s
end

-- positions as a Lua list of 0-based integers (from a table or a tensor), checked.
local function position_list(fn, positions)
  local list = positions
  if autograd.is_tensor(positions) then
    list = core.totable(core.reshape(positions, -1))
  elseif type(positions) ~= "table" then
    error(string.format("%s: positions must be a tensor or a table of integers, got a %s", fn, type(positions)), 4)
  end
  local out, max = {}, -1
  for i, p in ipairs(list) do
    local v = math.tointeger(p)
    if v == nil or v < 0 then
      error(string.format("%s: positions[%d] = %s is not a non-negative integer (positions are 0-based)", fn, i,
        tostring(p)), 4)
    end
    out[i] = v
    if v > max then max = v end
  end
  return out, max
end

-- The (N, d/2) angles' cos and sin, or (P, 1, ..., 1, N, d/2) for per-sample positions (P, N)
-- against x of `xdim` dims.
-- positions' shape, and positions flattened when they are a table of rows (checked).
local function flat_positions(fn, positions)
  local pshape = autograd.is_tensor(positions) and core.shape(positions)
    or (type(positions) == "table" and type(positions[1]) == "table" and { #positions, #positions[1] })
    or { type(positions) == "table" and #positions or -1 }
  if type(positions) == "table" and type(positions[1]) == "table" then
    local flat = {}
    for _, row in ipairs(positions) do
      if #row ~= pshape[2] then
        error(string.format("%s: positions rows have different lengths (%d and %d)", fn, pshape[2], #row), 4)
      end
      for _, p in ipairs(row) do flat[#flat + 1] = p end
    end
    positions = flat
  end
  return positions, pshape
end

local function angle_tables(fn, positions, N, d, base, dtype, xdim)
  if positions == nil then
    local c, s = cos_sin(N, d, base, dtype)
    return core.narrow(c, 1, 1, N), core.narrow(s, 1, 1, N)
  end
  local pshape
  positions, pshape = flat_positions(fn, positions)
  if not ((#pshape == 1 and pshape[1] == N) or (#pshape == 2 and pshape[2] == N and xdim >= 3)) then
    error(string.format("%s: positions %s must be (%d) or (B, %d) (x has N = %d)", fn, shape_str(pshape), N, N, N),
      3)
  end
  local list, max = position_list(fn, positions)
  local c, s = cos_sin(max + 1, d, base, dtype)
  local rows = {}
  for i, p in ipairs(list) do rows[i] = p + 1 end
  c, s = core.index_select(c, 1, rows), core.index_select(s, 1, rows)
  if #pshape == 2 then
    local view = { pshape[1] }
    for _ = 1, xdim - 3 do view[#view + 1] = 1 end
    view[#view + 1] = N
    view[#view + 1] = d // 2
    c, s = core.reshape(c, view), core.reshape(s, view)
  end
  return c, s
end

-- x rotated by the angles with cosines c and sines s (broadcast over x's pairs), raw (no graph).
local function rotate(x, c, s, interleaved)
  local shape = core.shape(x)
  local nd, d = #shape, shape[#shape]
  local half = d // 2
  local out = core.empty(shape, core.dtype(x))
  local x1, x2, o1, o2
  if interleaved then
    local pairs_shape = { table.unpack(shape) }
    pairs_shape[nd] = half
    pairs_shape[nd + 1] = 2
    local xp = core.reshape(core.contiguous(x), pairs_shape)
    local op = core.reshape(out, pairs_shape)
    x1, x2 = core.select(xp, nd + 1, 1), core.select(xp, nd + 1, 2)
    o1, o2 = core.select(op, nd + 1, 1), core.select(op, nd + 1, 2)
  else
    x1, x2 = core.narrow(x, nd, 1, half), core.narrow(x, nd, half + 1, half)
    o1, o2 = core.narrow(out, nd, 1, half), core.narrow(out, nd, half + 1, half)
  end
  core.copy_(o1, core.sub(core.mul(x1, c), core.mul(x2, s)))
  core.copy_(o2, core.add(core.mul(x2, c), core.mul(x1, s)))
  return out
end

-- The fused path's (P, d/2) tables per (d, base, dtype), filled by the kernel's own formula
-- (core.rope_tables) and grown as the composed path's; positions past them are computed in the
-- kernel (the same numbers), so a decode step never grows them.
local kernel_tables = {}

local function kernel_cos_sin(P, d, base, dtype)
  local key = d .. ":" .. base .. ":" .. dtype
  local t = kernel_tables[key]
  if P ~= nil and (t == nil or t.P < P) then
    local n = math.max(P, t and 2 * t.P or 64)
    local c, s = core.rope_tables(n, d, base, dtype)
    t = { P = n, c = c, s = s }
    kernel_tables[key] = t
  end
  if t == nil then return nil, nil end
  return t.c, t.s
end

-- The fused path: one kernel call forward and one backward.
local function rope_fused(fn, x, positions, N, d, base, interleaved)
  local c, s
  if positions == nil then
    c, s = kernel_cos_sin(N, d, base, core.dtype(x))
  else
    if not autograd.is_tensor(positions) then
      -- a table: checked here as the composed path checks it (the kernel checks a tensor's values)
      local flat, pshape = flat_positions(fn, positions)
      positions = core.reshape(core.tensor(position_list(fn, flat), "int64"), pshape)
    end
    c, s = kernel_cos_sin(nil, d, base, core.dtype(x))
  end
  local y = core.rope(x, positions, c, s, base, interleaved, false)
  if autograd.wants(x) then
    autograd.record_wanted(fn, y, { x }, function(g)
      if g == nil then return nil end
      return core.rope(g, positions, c, s, base, interleaved, true)
    end)
  end
  return y
end

-- The composed path: the angle tables gathered at the positions, then tensor ops.
local function rope_composed(fn, x, positions, shape, d, base, interleaved)
  local c, s = angle_tables(fn, positions, shape[#shape - 1], d, base, core.dtype(x), #shape)
  local y = rotate(x, c, s, interleaved)
  if autograd.wants(x) then
    -- the transpose of a rotation is the rotation by the opposite angle
    autograd.record_wanted(fn, y, { x }, function(g)
      if g == nil then return nil end
      return rotate(g, c, core.neg(s), interleaved)
    end)
  end
  return y
end

local rope_options = { positions = true, base = true, interleaved = true }

--- Rotary position embedding of x.
-- Runs the fused kernel, or the composed tensor ops under `attn.nn.set_fused(false)` (the same
-- numbers).
-- @tparam Tensor x (..., N, d), d even, float32 or float64, any strides
-- @tparam[opt] table opts `positions`: 0-based positions of the N tokens, a 1-D tensor or
--   table of length N (default 0 .. N-1), or (B, N) per sample when x is (B, ..., N, d);
--   `base` (default 10000); `interleaved` (default false: pairs (x_i, x_{i+d/2}))
-- @treturn Tensor (..., N, d)
-- @raise for odd d, positions that are not non-negative integers or do not fit N
-- @usage local q_rot = attn.rope(q, {positions = {7}}) -- one decode step at position 7
function M.rope(x, opts)
  local fn = "rope"
  check.tensor(fn, "x", x, nil, "(..., N, d)")
  opts = check.options(fn, opts, rope_options)
  local shape = core.shape(x)
  local d = shape[#shape]
  if #shape < 2 then error(string.format("%s: x %s must be (..., N, d)", fn, shape_str(shape)), 2) end
  if d % 2 ~= 0 then
    error(string.format("%s: the feature size d = %d of x %s must be even (features rotate in pairs)", fn, d,
      shape_str(shape)), 2)
  end
  local base = opts.base or 10000
  if type(base) ~= "number" or not (base > 0 and base < math.huge) then
    error(string.format("%s: base must be a positive number, got %s", fn, tostring(opts.base)), 2)
  end
  local positions = opts.positions
  if positions ~= nil and type(positions) ~= "table" and not autograd.is_tensor(positions) then
    error(string.format("%s: positions must be a tensor or a table of integers, got a %s", fn, type(positions)), 2)
  end
  local interleaved = opts.interleaved == true
  if fused.choose(fn) then return rope_fused(fn, x, positions, shape[#shape - 1], d, base, interleaved) end
  return rope_composed(fn, x, positions, shape, d, base, interleaved)
end

return M
