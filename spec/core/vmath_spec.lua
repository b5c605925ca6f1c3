-- The vectorised float32 exp, log, tanh and sigmoid (attn_vmath) against libm
-- (the float64 ops, rounded to float32) over the whole float range: a sweep of
-- bit patterns plus zeros, denormals, the extremes, +-inf and NaN, on every
-- instruction-set path this CPU has, and each path against the generic one.
local attn = require "attn"
local core = attn.core
local helper = require "helper"

local function from_bits(b) return (string.unpack("<f", string.pack("<I4", b))) end

-- Floats in ulp order (negative floats mapped below positive ones), so the
-- distance of two floats in ulps is the difference of their orders.
local function order(v)
  local i = string.unpack("<i4", string.pack("<f", v))
  if i < 0 then i = -2147483648 - i end
  return i
end

-- Distance in ulps; NaN matches only NaN.
local function ulps(a, b)
  if a ~= a or b ~= b then return (a ~= a and b ~= b) and 0 or math.huge end
  return math.abs(order(a) - order(b))
end

local inputs = {}
for b = 0, 0xFFFFFFFF, 196613 do inputs[#inputs + 1] = from_bits(b) end
for _, b in ipairs { 0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000,
  0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001 } do
  inputs[#inputs + 1] = from_bits(b)
end
-- the edges where results overflow, underflow, saturate or turn denormal
for _, v in ipairs { 88.72, 88.7228, 88.73, -87.33, -103.9, -103.98, -104, 1e-30, -1e-30, 9e-4, -9e-4, 1e-3,
  9.01, 10, -10, 40, -110, 17, 1, -1, 0.5, 2 } do
  inputs[#inputs + 1] = v
end

local function worst(got, ref)
  local w, at = 0, nil
  for i = 1, #got do
    local d = ulps(got[i], ref[i])
    if d > w then w, at = d, i end
  end
  return w, at
end

local paths = helper.isa_paths()

-- The bounds README documents, measured over all 2^32 inputs by `make check-vmath-ulp`: the float
-- exp and tanh evaluate in float lanes, sigmoid and log in double.
local bound = { exp = 1, tanh = 2, sigmoid = 1, log = 1 }

describe("vectorised float32 math", function()
  local saved
  before_each(function() saved = core.isa() end)
  after_each(function() core.isa(saved) end)

  it("always has the generic path and picks a supported one", function()
    assert.is_true(core.isa_supported("generic"))
    assert.is_true(core.isa_supported(core.isa()))
    assert.is_false(core.isa_supported("sse9"))
    assert.has_error(function() core.isa("sse9") end,
      "set_isa: unknown path 'sse9' (generic, avx2, avx512 or auto)")
  end)

  for _, isa in ipairs(paths) do
    for _, f in ipairs { "exp", "log", "tanh", "sigmoid" } do
      it(string.format("%s on the %s path is within %d ulp of libm everywhere", f, isa, bound[f]), function()
        core.isa(isa)
        local x = attn.tensor(inputs, "float32")
        local ref = core[f](x:to("float64")):to("float32"):totable()
        local got = core[f](x):totable()
        local w, at = worst(got, ref)
        assert(w <= bound[f], string.format("%s(%.9g) = %.9g, libm %.9g (%s ulps)", f, inputs[at or 1],
          got[at or 1], ref[at or 1], tostring(w)))
        -- strided operands take the same path value by value
        local strided = core[f](attn.stack({ x, x }, 2):select(2, 1)):totable()
        assert.same(0, (worst(strided, got)))
      end)
    end
  end

  it("agrees with the generic path on every other path within the bound", function()
    local x = attn.tensor(inputs, "float32")
    for _, f in ipairs { "exp", "log", "tanh", "sigmoid" } do
      core.isa("generic")
      local base = core[f](x):totable()
      for _, isa in ipairs(paths) do
        core.isa(isa)
        local w = worst(core[f](x):totable(), base)
        assert(w <= bound[f], string.format("%s: %s path differs from generic by %s ulps", f, isa, tostring(w)))
      end
    end
  end)

  it("keeps the exact special values", function()
    local inf, nan = math.huge, 0 / 0
    for _, isa in ipairs(paths) do
      core.isa(isa)
      local x = attn.tensor({ 0, -inf, inf, nan, -200, 200 }, "float32")
      local e = core.exp(x):totable()
      assert.same({ 1, 0, inf, 0, inf }, { e[1], e[2], e[3], e[5], e[6] })
      assert.is_true(e[4] ~= e[4])
      local s = core.sigmoid(x):totable()
      assert.same({ 0.5, 0, 1, 0, 1 }, { s[1], s[2], s[3], s[5], s[6] })
      local t = core.tanh(x):totable()
      assert.same({ 0, -1, 1, -1, 1 }, { t[1], t[2], t[3], t[5], t[6] })
      local l = core.log(attn.tensor({ 0, -1, inf, 1, from_bits(1) }, "float32")):totable()
      assert.same(-inf, l[1])
      assert.is_true(l[2] ~= l[2])
      assert.same({ inf, 0 }, { l[3], l[4] })
      assert.near(math.log(2) * -149, l[5], 1e-4)
      -- tanh(-0) keeps its sign
      assert.same("-0.0", tostring(core.tanh(attn.tensor({ -0.0 }, "float32")):item()))
    end
  end)
end)
