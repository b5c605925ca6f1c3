--- Tensor methods: the C core's functions made differentiable.
-- Each method runs the core op, then records a backward closure through
-- attn.autograd when an input requires grad. Non-differentiable helpers
-- (shape queries, comparisons, in-place updates) are the core functions as is.
-- The reference of every method is in doc-src/tensor.luadoc and here.
-- @module attn.Tensor
local core = require "attn.core"
local autograd = require "attn.autograd"

local record, sum_to, is_tensor, wants = autograd.record, autograd.sum_to, autograd.is_tensor, autograd.wants
local record_wanted = autograd.record_wanted

local Tensor = core.methods

-- Plain pass-through of the non-differentiable core functions.
for _, name in ipairs {
  "shape", "stride", "size", "dim", "numel", "dtype", "is_contiguous", "storage_id", "storage_offset",
  "totable", "item", "get", "eq", "ne", "lt", "le", "gt", "ge", "argmax", "argmin", "sign", "free",
} do
  Tensor[name] = core[name]
end

local function refuse_inplace(name, t, level)
  if autograd.is_enabled() and t._rg then
    error(name .. ": in-place update of a tensor that requires grad (use attn.no_grad or :detach())", level or 3)
  end
end

-- In-place updates are not recorded: they are for optimizers and no_grad code.
for _, name in ipairs { "add_", "sub_", "mul_", "div_", "copy_", "fill_", "set", "set_", "uniform_", "normal_",
  "index_add_", "scatter_add_" } do
  local f = core[name]
  Tensor[name] = function(t, ...)
    refuse_inplace(name, t)
    return f(t, ...)
  end
end

function Tensor.zero_(t) return Tensor.fill_(t, 0) end

--- Sets whether autograd records operations on t (a leaf) and returns t.
-- Read the flag as the field `t.requires_grad` (a boolean); assigning
-- `t.requires_grad = flag` calls this too.
-- @tparam Tensor t a float32 or float64 tensor
-- @tparam[opt=true] boolean flag
-- @treturn Tensor t
-- @raise when turning it off on a non-leaf, or on for a non-floating dtype
-- @usage local w = attn.randn(3, 2):requires_grad_()
function Tensor.requires_grad_(t, flag)
  if flag == nil then flag = true end
  if not flag and t.grad_fn then
    error("requires_grad_: cannot turn off grad on a non-leaf tensor (use :detach())", 2)
  end
  if flag and core.dtype(t) ~= "float32" and core.dtype(t) ~= "float64" then
    error("requires_grad_: only floating tensors can require grad, got " .. core.dtype(t), 2)
  end
  t._rg = flag and true or nil
  return t
end

-- Computed fields: t.requires_grad reads the flag as a boolean (false when
-- unset), and assigning it goes through the checks of requires_grad_.
local getters, setters = core.metatable.__getters, core.metatable.__setters
function getters.requires_grad(t) return t._rg == true end
function setters.requires_grad(t, flag) Tensor.requires_grad_(t, flag) end

function Tensor.is_leaf(t) return t.grad_fn == nil end

function Tensor.backward(t, grad, opts) return autograd.backward(t, grad, opts) end

function Tensor.zero_grad(t) t.grad = nil end

--- A view sharing storage, cut from the graph.
function Tensor.detach(t) return core.view(t, core.shape(t)) end

-- ---------------------------------------------------------------- arithmetic

local function binary(name, grad_fn)
  local f = core[name]
  return function(a, b)
    local out = f(a, b)
    if not wants(a, b) then return out end -- no closure or input list when nothing records
    return record_wanted(name, out, { a, b }, function(g) return grad_fn(g, a, b, out) end)
  end
end

local function shape_of(x) return core.shape(x) end

Tensor.add = binary("add", function(g, a, b)
  return is_tensor(a) and sum_to(g, shape_of(a)) or nil, is_tensor(b) and sum_to(g, shape_of(b)) or nil
end)

Tensor.sub = binary("sub", function(g, a, b)
  return is_tensor(a) and sum_to(g, shape_of(a)) or nil, is_tensor(b) and sum_to(core.neg(g), shape_of(b)) or nil
end)

Tensor.mul = binary("mul", function(g, a, b)
  return is_tensor(a) and sum_to(core.mul(g, b), shape_of(a)) or nil,
    is_tensor(b) and sum_to(core.mul(g, a), shape_of(b)) or nil
end)

Tensor.div = binary("div", function(g, a, b, out)
  local ga = is_tensor(a) and sum_to(core.div(g, b), shape_of(a)) or nil
  local gb = is_tensor(b) and sum_to(core.neg(core.div(core.mul(g, out), b)), shape_of(b)) or nil
  return ga, gb
end)

Tensor.pow = binary("pow", function(g, a, b, out)
  local ga, gb
  if is_tensor(a) then
    -- b a^(b-1), taken as 0 where b = 0 (so 0^0 has gradient 0, not NaN)
    local b_minus_1 = is_tensor(b) and core.sub(b, 1) or b - 1
    local d = core.mul(core.pow(a, b_minus_1), b)
    if is_tensor(b) then
      d = core.where(core.eq(b, 0), 0, d)
    elseif b == 0 then
      d = core.full(core.shape(d), 0, core.dtype(d))
    end
    ga = sum_to(core.mul(g, d), shape_of(a))
  end
  if is_tensor(b) then
    -- d/db a^b = a^b log a, taken as 0 where a = 0
    local lg
    if is_tensor(a) then
      lg = core.mul(out, core.log(core.where(core.eq(a, 0), 1, a)))
    else
      lg = core.mul(out, a == 0 and 0 or math.log(a))
    end
    gb = sum_to(core.mul(g, lg), shape_of(b))
  end
  return ga, gb
end)

-- Where a and b tie, each gets half of the gradient (the central-difference
-- value, as PyTorch does).
local function elementwise_extreme(name)
  return binary(name, function(g, a, b)
    local wins = name == "maximum" and core.gt(a, b) or core.lt(a, b)
    local share_a = core.add(wins, core.mul(core.eq(a, b), 0.5))
    local ga = is_tensor(a) and sum_to(core.mul(g, share_a), shape_of(a)) or nil
    local gb = is_tensor(b) and sum_to(core.mul(g, core.sub(1, share_a)), shape_of(b)) or nil
    return ga, gb
  end)
end
Tensor.maximum = elementwise_extreme("maximum")
Tensor.minimum = elementwise_extreme("minimum")

local function unary(name, grad_fn)
  local f = core[name]
  return function(x)
    local out = f(x)
    if not wants(x) then return out end
    return record_wanted(name, out, { x }, function(g) return grad_fn(g, x, out) end)
  end
end

Tensor.neg = unary("neg", function(g) return core.neg(g) end)
Tensor.exp = unary("exp", function(g, _, out) return core.mul(g, out) end)
Tensor.log = unary("log", function(g, x) return core.div(g, x) end)
Tensor.sqrt = unary("sqrt", function(g, _, out) return core.div(g, core.mul(out, 2)) end)
-- tanh' = 1 - y^2 and sigmoid' = y (1 - y) from the output y, each one fused kernel
Tensor.tanh = unary("tanh", function(g, _, out) return core.tanh_backward(g, out) end)
Tensor.sigmoid = unary("sigmoid", function(g, _, out) return core.sigmoid_backward(g, out) end)
Tensor.relu = unary("relu", function(g, x) return core.mul(g, core.gt(x, 0)) end)
Tensor.abs = unary("abs", function(g, x) return core.mul(g, core.sign(x)) end)
Tensor.square = unary("square", function(g, x) return core.mul(g, core.mul(x, 2)) end)
Tensor.reciprocal = unary("reciprocal", function(g, _, out) return core.neg(core.mul(g, core.square(out))) end)
Tensor.sin = unary("sin", function(g, x) return core.mul(g, core.cos(x)) end)
Tensor.cos = unary("cos", function(g, x) return core.neg(core.mul(g, core.sin(x))) end)

--- clamp(x, lo, hi): either bound may be nil. The gradient passes where
-- lo <= x <= hi (bounds included, as PyTorch).
function Tensor.clamp(x, lo, hi)
  local out = x
  if lo then out = core.maximum(out, lo) end
  if hi then out = core.minimum(out, hi) end
  if out == x then out = core.clone(x) end
  return record("clamp", out, { x }, function(g)
    local inside = core.full(core.shape(x), 1, core.dtype(x))
    if lo then inside = core.mul(inside, core.ge(x, lo)) end
    if hi then inside = core.mul(inside, core.le(x, hi)) end
    return core.mul(g, inside)
  end)
end

-- ---------------------------------------------------------------- reductions

-- The gradient of a reduction over dim, broadcast back to the input's shape.
local function expand_back(g, x, dim, keepdim)
  if dim == nil then return core.expand(core.reshape(g, {}), core.shape(x)) end
  if not keepdim then g = core.unsqueeze(g, dim < 0 and dim + core.dim(x) + 1 or dim) end
  return core.expand(g, core.shape(x))
end

function Tensor.sum(x, dim, keepdim)
  local out = core.sum(x, dim, keepdim)
  return record("sum", out, { x }, function(g) return expand_back(g, x, dim, keepdim) end)
end

function Tensor.mean(x, dim, keepdim)
  local out = core.mean(x, dim, keepdim)
  return record("mean", out, { x }, function(g)
    local n = dim and core.size(x, dim) or core.numel(x)
    return core.div(expand_back(g, x, dim, keepdim), n)
  end)
end

-- Gradient of values picked along dim at indices (max/min, sort, topk): g
-- (indices' shape) added into zeros of x's shape at those positions.
local function scatter_back(x, dim, indices, g)
  local gin = core.full(core.shape(x), 0, core.dtype(x))
  return core.scatter_add_(gin, dim, core.contiguous(indices), core.contiguous(g))
end

local function extreme(name)
  local f = core[name]
  return function(x, dim, keepdim)
    if dim == nil then
      local out = f(x)
      return record(name, out, { x }, function(g)
        -- split evenly among ties, as the subgradient PyTorch uses
        local hit = core.eq(x, out)
        return core.div(core.mul(hit, g), core.sum(hit))
      end)
    end
    local values, indices = f(x, dim, keepdim)
    record(name, values, { x }, function(g)
      local idx = keepdim and indices or core.unsqueeze(indices, dim)
      return scatter_back(x, dim, idx, keepdim and g or core.unsqueeze(g, dim))
    end)
    return values, indices
  end
end
Tensor.max = extreme("max")
Tensor.min = extreme("min")

--- Sorts along a dim, stably (equal values keep their order; NaN sorts above
-- every number). Differentiable in the values.
-- @tparam Tensor x
-- @tparam[opt=-1] integer dim
-- @tparam[opt=false] boolean descending
-- @treturn Tensor values, x's shape and dtype
-- @treturn Tensor indices, int64 1-based positions in x along dim
-- @usage local v, i = attn.tensor({3, 1, 2}):sort() -- {1, 2, 3}, {2, 3, 1}
function Tensor.sort(x, dim, descending)
  dim = dim or -1
  local values, indices = core.sort(x, dim, descending)
  record("sort", values, { x }, function(g) return scatter_back(x, dim, indices, g) end)
  return values, indices
end

--- The k largest (or smallest) entries along a dim, sorted, and their
-- indices; ties keep their order. Differentiable in the values.
-- @tparam Tensor x
-- @tparam integer k 0..size of dim
-- @tparam[opt=-1] integer dim
-- @tparam[opt=true] boolean largest
-- @treturn Tensor values, x's shape with k along dim
-- @treturn Tensor indices, int64 1-based
-- @raise when k is not an integer in 0..size
-- @usage local v, i = probs:topk(2) -- two most likely classes per row
function Tensor.topk(x, k, dim, largest)
  dim = dim or -1
  if largest == nil then largest = true end
  local n = core.dim(x) > 0 and core.size(x, dim) or 0
  if math.type(k) ~= "integer" or k < 0 or k > n then
    error(string.format("topk: k = %s must be an integer in 0..%d (size of dim %d of %s)", tostring(k), n, dim,
      core.shape_str(x)), 2)
  end
  local values, indices
  if k <= core.TOPK_MAX then -- a selection in C over the rows, split across the threads
    values, indices = core.topk(x, dim, k, largest)
  else
    local sorted, order = core.sort(x, dim, largest)
    values, indices = core.contiguous(core.narrow(sorted, dim, 1, k)), core.contiguous(core.narrow(order, dim, 1, k))
  end
  record("topk", values, { x }, function(g) return scatter_back(x, dim, indices, g) end)
  return values, indices
end

function Tensor.softmax(x, dim)
  local out = core.softmax(x, dim)
  return record("softmax", out, { x }, function(g)
    return core.mul(out, core.sub(g, core.sum(core.mul(g, out), dim, true)))
  end)
end

function Tensor.log_softmax(x, dim)
  local out = core.log_softmax(x, dim)
  return record("log_softmax", out, { x }, function(g)
    return core.sub(g, core.mul(core.exp(out), core.sum(g, dim, true)))
  end)
end

-- ---------------------------------------------------------------- views

local function view_op(name, grad_fn)
  local f = core[name]
  return function(x, ...)
    local out = f(x, ...)
    if not wants(x) then return out end
    local args = table.pack(...)
    return record_wanted(name, out, { x }, function(g) return grad_fn(g, x, args) end)
  end
end

local function back_to_shape(g, x) return core.reshape(g, core.shape(x)) end

Tensor.reshape = view_op("reshape", back_to_shape)
Tensor.view = view_op("view", back_to_shape)
Tensor.squeeze = view_op("squeeze", back_to_shape)
Tensor.unsqueeze = view_op("unsqueeze", back_to_shape)
Tensor.contiguous = view_op("contiguous", function(g) return g end)
Tensor.clone = view_op("clone", function(g) return g end)
Tensor.expand = view_op("expand", function(g, x) return sum_to(g, core.shape(x)) end)
Tensor.transpose = view_op("transpose", function(g, _, a) return core.transpose(g, a[1], a[2]) end)
local to_float = view_op("to", function(g, x) return core.to(g, core.dtype(x)) end)
--- to(dtype): converts (a no-op when the dtype matches). Converting to int64
-- leaves the graph, as in PyTorch: ids carry no gradient.
function Tensor.to(x, dtype)
  if dtype == "int64" or dtype == "long" or dtype == "i64" then return core.to(x, dtype) end
  return to_float(x, dtype)
end

function Tensor.permute(x, ...)
  local perm = type(...) == "table" and table.move(..., 1, #..., 1, {}) or { ... } -- a copy: the caller may reuse it
  local out = core.permute(x, perm)
  return record("permute", out, { x }, function(g)
    local n = #perm
    local inverse = {}
    for i, p in ipairs(perm) do
      if p < 0 then p = p + n + 1 end
      inverse[p] = i
    end
    return core.permute(g, inverse)
  end)
end

-- Gradient of a slice: zeros with g written into the sliced place.
local function slice_back(slicer)
  return function(g, x, a)
    local gin = core.full(core.shape(x), 0, core.dtype(x))
    core.copy_(slicer(gin, a), g)
    return gin
  end
end
Tensor.narrow = view_op("narrow", slice_back(function(t, a) return core.narrow(t, a[1], a[2], a[3]) end))
Tensor.select = view_op("select", slice_back(function(t, a) return core.select(t, a[1], a[2]) end))

--- t:t() for 2-D tensors.
function Tensor.t(x)
  if core.dim(x) ~= 2 then error(string.format("t: expected a 2-D tensor, got %d-D", core.dim(x)), 2) end
  return Tensor.transpose(x, 1, 2)
end

function Tensor.flatten(x) return Tensor.reshape(x, core.numel(x)) end

--- Torch's `repeat(sizes)` under another name (`repeat` is a Lua keyword):
-- the tensor tiled sizes[d] times along each dim. With fewer sizes than dims
-- the leading dims are kept (as torch.tile); with more, x gains leading dims
-- of size 1 first. Built from unsqueeze, expand and reshape, so it is
-- differentiable and works for every dtype.
-- @tparam Tensor x
-- @param ... sizes as integers or one table
-- @treturn Tensor a new tensor, size x.size(d) * sizes[d] along each dim
-- @usage attn.tensor({1, 2}):tile(2, 2) -- {{1, 2, 1, 2}, {1, 2, 1, 2}}
function Tensor.tile(x, ...)
  if select("#", ...) == 0 then error("tile: expected repeat counts (integers or one table), got none", 2) end
  local reps = type(...) == "table" and table.move(..., 1, #..., 1, {}) or { ... }
  local shape = core.shape(x)
  for d, r in ipairs(reps) do
    if math.type(r) ~= "integer" or r < 0 then
      error(string.format("tile: repeat count %d is %s, not an integer >= 0", d, tostring(r)), 2)
    end
  end
  while #reps < #shape do table.insert(reps, 1, 1) end
  while #shape < #reps do table.insert(shape, 1, 1) end
  -- one dim at a time: (.., s, ..) -> (.., 1, s, ..) -> (.., r, s, ..) -> (.., r*s, ..)
  local t, copied = Tensor.reshape(x, table.move(shape, 1, #shape, 1, {})), false
  for d = 1, #shape do
    if reps[d] ~= 1 then
      local wide = core.shape(t)
      table.insert(wide, d, reps[d])
      shape[d] = shape[d] * reps[d]
      t = Tensor.reshape(Tensor.expand(Tensor.unsqueeze(t, d), wide), table.move(shape, 1, #shape, 1, {}))
      copied = true
    end
  end
  return copied and t or Tensor.clone(t) -- always a new tensor, as Torch's repeat
end

-- ---------------------------------------------------------------- indexing

function Tensor.index_select(x, dim, index)
  local out = core.index_select(x, dim, index)
  return record("index_select", out, { x }, function(g)
    local gin = core.full(core.shape(x), 0, core.dtype(x))
    return core.index_add_(gin, dim, index, g)
  end)
end

function Tensor.gather(x, dim, index)
  local out = core.gather(x, dim, index)
  return record("gather", out, { x }, function(g)
    local gin = core.full(core.shape(x), 0, core.dtype(x))
    return core.scatter_add_(gin, dim, index, core.contiguous(g))
  end)
end

function Tensor.masked_fill(x, mask, value)
  local out = core.masked_fill(x, mask, value)
  return record("masked_fill", out, { x }, function(g) return core.masked_fill(g, mask, 0) end)
end

function Tensor.where(cond, a, b)
  local out = core.where(cond, a, b)
  return record("where", out, { cond, a, b }, function(g)
    local ga = is_tensor(a) and sum_to(core.where(cond, g, 0), core.shape(a)) or nil
    local gb = is_tensor(b) and sum_to(core.where(cond, 0, g), core.shape(b)) or nil
    return nil, ga, gb
  end)
end

-- ---------------------------------------------------------------- Torch7-style indexing
-- t[i] is the i-th slice along dim 1 (a view, a number for a 1-D tensor) and
-- nil past the end, so ipairs(t) walks dim 1 and stops; t[{2, {1, 3}}] takes
-- one entry per leading dim: an integer selects (the dim goes away), {a, b}
-- narrows to a..b inclusive, {a} to a..a, {} keeps the dim; negative indices
-- count from the end. Reads record select/narrow for autograd; assignments
-- (t[i] = v, t[{...}] = v) fill or copy in place, like the other in-place
-- methods. The C __index sends every non-string key here, so method lookup
-- (string keys) never pays for it.

local KEY_HELP = "an integer or a table like {2, {1, 3}}"

-- A 1-based index i into a dim of size n (negative from the end); raises at
-- `level` naming the key when it is out of range.
local function position(i, n, d, shape_str, level)
  local j = math.tointeger(i)
  if j == nil then
    error(string.format("tensor index: %s at dim %d is not an integer (%s)", tostring(i), d, KEY_HELP), level)
  end
  if j < 0 then j = j + n + 1 end
  if j < 1 or j > n then
    error(string.format("tensor index: %d out of range for dim %d of size %d (%s; indices are 1-based)", i, d, n,
      shape_str), level)
  end
  return j
end

-- The view of t a key names, cut with select/narrow (the recorded methods
-- for reads, the core's for writes). `level` is the error level of the
-- caller's caller (the user's line).
local function locate(t, key, select, narrow, level)
  level = level + 1
  local view, dim, shape_str = t, 1, core.shape_str(t)
  for d = 1, #key do
    local e, n = key[d], core.size(view, dim)
    if type(e) == "number" then
      view = select(view, dim, position(e, n, d, shape_str, level + 1))
    elseif type(e) == "table" then
      if #e > 2 then
        error(string.format("tensor index: range at dim %d has %d entries; expected {}, {i} or {first, last}", d,
          #e), level)
      end
      if #e > 0 then
        local a = position(e[1], n, d, shape_str, level + 1)
        local b = position(e[2] or e[1], n, d, shape_str, level + 1)
        if b < a then
          error(string.format("tensor index: range {%s, %s} at dim %d is empty (%s)", tostring(e[1]), tostring(e[2]),
            d, shape_str), level)
        end
        view = narrow(view, dim, a, b - a + 1)
      end
      dim = dim + 1
    else
      error(string.format("tensor index: entry %d is a %s; expected an integer or a range table", d, type(e)), level)
    end
  end
  return view
end

-- The key as a table of entries, and whether it selects every dim (the
-- result is then a number). `level` as for locate.
local function index_key(t, key, level)
  local ndim = core.dim(t)
  if ndim == 0 then error("tensor index: a 0-d tensor has no slices (use :item() or :fill_())", level + 1) end
  if type(key) == "number" then key = { key } end
  if type(key) ~= "table" then
    error(string.format("tensor index: a %s key; expected %s", type(key), KEY_HELP), level + 1)
  end
  if #key > ndim then
    error(string.format("tensor index: %d entries for a %d-D tensor %s", #key, ndim, core.shape_str(t)), level + 1)
  end
  local selected = 0
  for _, e in ipairs(key) do
    if type(e) == "number" then selected = selected + 1 end
  end
  return key, selected == ndim
end

local hooks = core.metatable.__hooks

-- Called by the C __index for non-string keys: user line, C __index, here.
function hooks.get(t, key)
  if math.type(key) == "integer" and core.dim(t) > 0 then
    local n = core.size(t, 1)
    if key > n then return nil end -- the end of the sequence, for ipairs
    if core.dim(t) == 1 then return core.get(t, position(key, n, 1, core.shape_str(t), 4)) end
    return Tensor.select(t, 1, position(key, n, 1, core.shape_str(t), 4))
  end
  local k, scalar = index_key(t, key, 3)
  if scalar then return core.item(locate(t, k, core.select, core.narrow, 3)) end
  return locate(t, k, Tensor.select, Tensor.narrow, 3)
end

function hooks.set(t, key, value)
  refuse_inplace("tensor index assignment", t, 4)
  local view = locate(t, (index_key(t, key, 3)), core.select, core.narrow, 3)
  if type(value) == "number" then
    core.fill_(view, value)
  elseif is_tensor(value) then
    core.copy_(view, value)
  else
    error(string.format("tensor index assignment: the value is a %s; expected a number or a tensor", type(value)), 3)
  end
end

-- A list of parts that a generic `for` can walk: `for x in t:split(1)`. The
-- iterator is stateless (the previous part finds its own position), so the
-- list can be walked again or from two loops at once.
local function part_list(parts)
  local at = {}
  for i, p in ipairs(parts) do at[p] = i end
  return setmetatable(parts, {
    __call = function(self, _, prev) return self[prev == nil and 1 or at[prev] + 1] end,
  })
end

--- Splits t along dim into views of `size` entries each (the last may be
-- shorter), or of the sizes in a table, as torch.split. The result is a list
-- that a `for` can also walk directly.
-- @tparam Tensor t
-- @param size an integer > 0, or a table of sizes summing to t:size(dim)
-- @tparam[opt=1] int dim
-- @treturn table list of views (differentiable, recorded as narrow)
-- @raise on a size that is not a positive integer, or sizes that do not add up
-- @usage for row in x:split(1) do print(row) end   -- (1, n) views of x's rows
function Tensor.split(t, size, dim)
  dim = dim or 1
  local n = core.size(t, dim)
  local sizes = {}
  if type(size) == "table" then
    local total = 0
    for i, k in ipairs(size) do
      if math.type(k) ~= "integer" or k < 0 then
        error(string.format("split: size %d is %s, not a non-negative integer", i, tostring(k)), 2)
      end
      sizes[i], total = k, total + k
    end
    if total ~= n then
      error(string.format("split: sizes add up to %d, but dim %d of %s has %d", total, dim, core.shape_str(t), n), 2)
    end
  else
    if math.type(size) ~= "integer" or size < 1 then
      error(string.format("split: size must be a positive integer, got %s", tostring(size)), 2)
    end
    -- sized before building, as unbind is: an expanded view may name 2^62 pieces
    local pieces = n == 0 and 0 or (n - 1) // size + 1
    if pieces > core.max_request() // 64 then
      error(string.format("split: %d pieces of dim %d of %s are more than memory can hold", pieces, dim,
        core.shape_str(t)), 2)
    end
    for start = 1, n, size do sizes[#sizes + 1] = math.min(size, n - start + 1) end
  end
  local parts, start = {}, 1
  for i, k in ipairs(sizes) do
    parts[i] = Tensor.narrow(t, dim, start, k)
    start = start + k
  end
  return part_list(parts)
end

--- Splits t along dim into n views of ceil(size / n) entries (fewer parts
-- when the size does not allow n), as torch.chunk.
-- @tparam Tensor t
-- @tparam int n number of chunks (> 0)
-- @tparam[opt=1] int dim
-- @treturn table list of views, walkable by `for`
-- @raise when n is not a positive integer
-- @usage local q, k, v = table.unpack(qkv:chunk(3, -1))
function Tensor.chunk(t, n, dim)
  dim = dim or 1
  if math.type(n) ~= "integer" or n < 1 then
    error(string.format("chunk: n must be a positive integer, got %s", tostring(n)), 2)
  end
  local size = core.size(t, dim)
  -- ceil(size / n) without size + n, which overflows near 2^63
  return Tensor.split(t, math.max(1, size == 0 and 1 or (size - 1) // n + 1), dim)
end

-- ---------------------------------------------------------------- matmul

--- NumPy matmul. The C core decides the 1-D rule (a 1-D left operand acts
-- as (1, K), a 1-D right one as (K, 1), and those dims are not in the result).
function Tensor.matmul(a, b)
  if not is_tensor(a) or not is_tensor(b) then
    local bad = is_tensor(a) and b or a
    error(string.format("matmul: argument %d must be a tensor, got a %s", is_tensor(a) and 2 or 1, type(bad)), 2)
  end
  local out = core.matmul(a, b)
  return record("matmul", out, { a, b }, function(g)
    -- The product's gradient is taken in the core's promoted shapes, then
    -- viewed back to the operands' own (the promotion is only views).
    local a_vec, b_vec = core.dim(a) == 1, core.dim(b) == 1
    local a2 = a_vec and core.unsqueeze(a, 1) or a
    local b2 = b_vec and core.unsqueeze(b, 2) or b
    if b_vec then g = core.unsqueeze(g, -1) end
    if a_vec then g = core.unsqueeze(g, -2) end
    local ga = a._rg and sum_to(core.matmul(g, core.transpose(b2, -1, -2)), core.shape(a2)) or nil
    local gb = b._rg and sum_to(core.matmul(core.transpose(a2, -1, -2), g), core.shape(b2)) or nil
    if ga and a_vec then ga = core.select(ga, 1, 1) end
    if gb and b_vec then gb = core.select(gb, 2, 1) end
    return ga, gb
  end)
end

function Tensor.bmm(a, b)
  if core.dim(a) ~= 3 or core.dim(b) ~= 3 or core.size(a, 1) ~= core.size(b, 1) then
    core.bmm(a, b) -- raises the shaped error
  end
  return Tensor.matmul(a, b)
end

-- ---------------------------------------------------------------- PyTorch parity: more ops
-- erf, gelu, cumsum/cumprod, tril/triu, scatter_add, var/std, norm, repeat_interleave and einsum,
-- with PyTorch's names and semantics. Loops over elements are C kernels (src/core/attn_reduce.c,
-- attn_index.c, attn_elementwise.c); the rest is composed from recorded ops.

local fmt = string.format

--- The error function, libm's `erf` (double precision; float32 evaluated in double).
-- Differentiable: d/dx erf(x) = 2 / sqrt(pi) exp(-x^2).
-- @function erf
-- @tparam Tensor x float
-- @treturn Tensor x's shape
-- @usage attn.erf(attn.tensor({0.5}, "float64")):item() --> 0.5204998778130465
Tensor.erf = unary("erf", function(g, x)
  return core.mul(g, core.mul(core.exp(core.neg(core.square(x))), 2 / math.sqrt(math.pi)))
end)

--- The exact GELU, x Phi(x) = x erfc(-x / sqrt 2) / 2 (PyTorch's `gelu` with approximate
-- "none"), from libm's erfc: exact to double rounding, also for large negative x where
-- 1 + erf(x / sqrt 2) would cancel. Gradient Phi(x) + x phi(x) in one kernel.
-- @function gelu
-- @tparam Tensor x float
-- @treturn Tensor x's shape
-- @usage local y = attn.gelu(x)
Tensor.gelu = unary("gelu", function(g, x) return core.gelu_backward(g, x) end)

--- Cumulative sum along a dim (PyTorch's `cumsum`), accumulated in double (int64: exact).
-- The gradient is the cumulative sum of the incoming gradient from the end.
-- @tparam Tensor x
-- @tparam integer dim 1-based, negative from the end
-- @treturn Tensor x's shape and dtype
-- @raise "cumsum: argument 2 (dim) ..." for a dim out of range
-- @usage attn.tensor({1, 2, 3}):cumsum(1) --> {1, 3, 6}
function Tensor.cumsum(x, dim)
  local out = core.cumsum(x, dim)
  if not wants(x) then return out end
  return record_wanted("cumsum", out, { x }, function(g) return core.cumsum(g, dim, true) end)
end

--- Cumulative product along a dim (PyTorch's `cumprod`), accumulated in double. The gradient
-- is exact where x holds zeros (it never divides by them), as PyTorch's.
-- @tparam Tensor x
-- @tparam integer dim
-- @treturn Tensor x's shape and dtype
-- @usage attn.tensor({1, 2, 3}):cumprod(1) --> {1, 2, 6}
function Tensor.cumprod(x, dim)
  local out = core.cumprod(x, dim)
  if not wants(x) then return out end
  return record_wanted("cumprod", out, { x }, function(g) return core.cumprod_backward(x, out, g, dim) end)
end

local function triangle(name)
  local f = core[name]
  return function(x, diagonal)
    local out = f(x, diagonal)
    if not wants(x) then return out end
    return record_wanted(name, out, { x }, function(g) return f(g, diagonal) end)
  end
end
--- The lower triangle of the last two dims (PyTorch's `tril`): entry (i, j) is kept when
-- j - i <= diagonal, else 0. Differentiable (the gradient is the same triangle of g).
-- @function tril
-- @tparam Tensor x at least 2-D
-- @tparam[opt=0] integer diagonal 0 the main diagonal, > 0 above it, < 0 below
-- @treturn Tensor x's shape and dtype
-- @usage local causal = attn.ones(4, 4):tril()
Tensor.tril = triangle("tril")
--- The upper triangle of the last two dims (PyTorch's `triu`): entry (i, j) is kept when
-- j - i >= diagonal.
-- @function triu
-- @tparam Tensor x at least 2-D
-- @tparam[opt=0] integer diagonal
-- @treturn Tensor x's shape and dtype
-- @usage local future = attn.ones(4, 4):triu(1)
Tensor.triu = triangle("triu")

--- Out-of-place scatter-add (PyTorch's `scatter_add`): a copy of x with
-- `out[i][index[i][j]] += src[i][j]` along dim (1-D shown; any rank). index holds 1-based
-- positions and has src's shape, no larger than x outside dim. Differentiable in x (the
-- gradient passes unchanged) and src (the gradient gathered at index).
-- @tparam Tensor x
-- @tparam integer dim
-- @tparam Tensor index 1-based positions, src's shape
-- @tparam Tensor src x's dtype
-- @treturn Tensor x's shape
-- @raise on an index out of range, or shapes that do not fit (naming them)
-- @usage attn.zeros(3):scatter_add(1, attn.tensor({1, 1, 3}, "int64"), attn.ones(3)) --> {2, 0, 1}
function Tensor.scatter_add(x, dim, index, src)
  local out = core.scatter_add_(core.clone(x), dim, index, src)
  if not wants(x, src) then return out end
  return record_wanted("scatter_add", out, { x, src }, function(g)
    return x._rg and g or nil, src._rg and core.gather(g, dim, index) or nil
  end)
end

-- dims (nil for all, an integer or a table of integers, negative from the end) as sorted
-- 1-based dims of x, checked.
local function reduce_dims(fn, x, dim)
  local nd, list, seen = core.dim(x), {}, {}
  if dim == nil then
    for d = 1, nd do list[d] = d end
    return list
  end
  for _, d in ipairs(type(dim) == "table" and dim or { dim }) do
    if math.type(d) ~= "integer" or d == 0 or d < -nd or d > nd then
      error(fmt("%s: dim %s out of range for %d-D tensor %s", fn, tostring(d), nd, core.shape_str(x)), 3)
    end
    if d < 0 then d = d + nd + 1 end
    if seen[d] then error(fmt("%s: dim %d given twice", fn, d), 3) end
    seen[d] = true
    list[#list + 1] = d
  end
  table.sort(list)
  return list
end

-- x's shape reduced over dims: with keepdim they stay as 1, else they go.
local function reduced_shape(x, dims, keepdim)
  local shape, drop = core.shape(x), {}
  for _, d in ipairs(dims) do drop[d] = true end
  local out = {}
  for d, n in ipairs(shape) do
    if not drop[d] then out[#out + 1] = n elseif keepdim then out[#out + 1] = 1 end
  end
  return out
end

-- The number of entries a reduction over dims combines.
local function reduced_count(x, dims)
  local n = 1
  for _, d in ipairs(dims) do n = n * core.size(x, d) end
  return n
end

-- var/std options: a boolean (unbiased) or {unbiased =, correction =, keepdim =}.
local function variance_options(fn, opts)
  if opts == nil then return 1, false end
  if type(opts) == "boolean" then return opts and 1 or 0, false end
  if type(opts) ~= "table" then
    error(fmt("%s: options must be a boolean (unbiased) or a table {unbiased, correction, keepdim}, got a %s", fn,
      type(opts)), 3)
  end
  for k in pairs(opts) do
    if k ~= "unbiased" and k ~= "correction" and k ~= "keepdim" then
      error(fmt("%s: unknown option '%s' (expected unbiased, correction or keepdim)", fn, tostring(k)), 3)
    end
  end
  if opts.unbiased ~= nil and opts.correction ~= nil then
    error(fmt("%s: give unbiased or correction, not both", fn), 3)
  end
  local correction = opts.correction or (opts.unbiased == false and 0 or 1)
  if type(correction) ~= "number" then error(fmt("%s: correction must be a number, got %s", fn, type(correction)), 3) end
  return correction, opts.keepdim == true
end

local function variance(fn, x, dim, opts)
  local correction, keepdim = variance_options(fn, opts)
  local dims = reduce_dims(fn, x, dim)
  local n = reduced_count(x, dims)
  local s = x
  for _, d in ipairs(dims) do s = Tensor.sum(s, d, true) end
  local dev = Tensor.sub(x, Tensor.div(s, n))
  local ss = Tensor.mul(dev, dev)
  for _, d in ipairs(dims) do ss = Tensor.sum(ss, d, true) end
  -- PyTorch divides by max(0, N - correction): 0 entries or too few give inf or NaN
  local v = Tensor.div(ss, math.max(0, n - correction))
  return Tensor.reshape(v, reduced_shape(x, dims, keepdim))
end

--- Variance over dim (all entries when nil), PyTorch's `var`: sum (x - mean)^2 / (N - correction),
-- correction 1 (unbiased) by default.
-- @tparam Tensor x float
-- @tparam[opt] integer|{integer,...} dim one dim or several; nil for all
-- @param[opt] opts `true`/`false` (unbiased) or `{unbiased =, correction =, keepdim =}`
-- @treturn Tensor
-- @raise on a dim out of range or an unknown option
-- @usage attn.tensor({1, 2, 3, 4}):var() --> 1.6667 (unbiased)
function Tensor.var(x, dim, opts) return variance("var", x, dim, opts) end

--- Standard deviation, sqrt of `var` (same arguments and defaults: unbiased).
-- @tparam Tensor x float
-- @tparam[opt] integer|{integer,...} dim
-- @param[opt] opts `true`/`false` (unbiased) or `{unbiased =, correction =, keepdim =}`
-- @treturn Tensor
-- @usage x:std(2, {keepdim = true})
function Tensor.std(x, dim, opts) return Tensor.sqrt(variance("std", x, dim, opts)) end

-- reduce(t, dims) with core's keepdim reductions, one dim after another.
local function reduce_keep(f, t, dims)
  for _, d in ipairs(dims) do
    local r = f(t, d, true) -- max/min return values and indices: the values
    t = r
  end
  return t
end

local function vector_norm(fn, x, p, dim, keepdim)
  if p == nil or p == "fro" then p = 2 end
  if type(p) ~= "number" or p ~= p then
    error(fmt("%s: p must be a number (2, 1, math.huge, -math.huge, 0, any p) or 'fro', got %s", fn, tostring(p)), 3)
  end
  if core.dtype(x) == "int64" then error(fmt("%s: x must be float32 or float64, got int64", fn), 3) end
  local dims = reduce_dims(fn, x, dim)
  local a = core.abs(x)
  local nk -- the norm with the reduced dims kept as 1
  if p == math.huge then
    nk = reduce_keep(core.max, a, dims)
  elseif p == -math.huge then
    nk = reduce_keep(core.min, a, dims)
  elseif p == 0 then
    nk = reduce_keep(core.sum, core.ne(a, 0), dims)
  elseif p == 1 then
    nk = reduce_keep(core.sum, a, dims)
  elseif p == 2 then
    nk = core.sqrt(reduce_keep(core.sum, core.square(a), dims))
  else
    nk = core.pow(reduce_keep(core.sum, core.pow(a, p), dims), 1 / p)
  end
  local out = core.reshape(nk, reduced_shape(x, dims, keepdim))
  if not wants(x) then return out end
  return record_wanted(fn, out, { x }, function(g)
    local gk = core.reshape(g, core.shape(nk))
    if p == 0 then return core.full(core.shape(x), 0, core.dtype(x)) end
    if p == 1 then return core.mul(core.sign(x), gk) end
    local zero = core.eq(nk, 0) -- PyTorch's subgradient at a zero norm: 0
    if p == math.huge or p == -math.huge then
      -- shared evenly among the entries that reach the extreme, as PyTorch
      local hit = core.eq(a, nk)
      local count = reduce_keep(core.sum, hit, dims)
      return core.mul(core.mul(core.sign(x), hit), core.div(gk, count))
    end
    local scale
    if p == 2 then
      scale = core.div(gk, core.where(zero, 1, nk))
      return core.where(zero, 0, core.mul(x, scale))
    end
    -- g sign(x) |x|^(p-1) / norm^(p-1); 0 where x = 0 (p < 1 would give inf there) or the norm is 0
    scale = core.div(gk, core.pow(core.where(zero, 1, nk), p - 1))
    local d = core.mul(core.mul(core.sign(x), core.pow(core.where(core.eq(a, 0), 1, a), p - 1)), scale)
    return core.where(core.eq(a, 0), 0, core.where(zero, 0, d))
  end)
end

--- The vector p-norm over dim (all entries when nil), PyTorch's `norm` / `linalg.vector_norm`:
-- (sum |x|^p)^(1/p); p = math.huge is max |x|, -math.huge min |x|, 0 the count of nonzero
-- entries. Differentiable; at a zero norm the gradient is 0 (PyTorch's subgradient), and for
-- p = +-inf it is shared evenly among the entries that reach the extreme.
-- @tparam Tensor x float
-- @tparam[opt=2] number|string p a number or "fro" (= 2)
-- @tparam[opt] integer|{integer,...} dim
-- @tparam[opt=false] boolean keepdim
-- @treturn Tensor
-- @raise on a p that is not a number, a dim out of range or an int64 x
-- @usage attn.tensor({3, 4}):norm() --> 5
function Tensor.norm(x, p, dim, keepdim) return vector_norm("norm", x, p, dim, keepdim) end

-- d2l's valid_lens as a Lua table (numbers or rows), each entry repeated n times.
local function repeat_table(fn, lens, n)
  if n > 0 and #lens > 0 and n > core.max_request() // 16 // #lens then
    error(fmt("%s: %d rows x %d repeats are more than memory can hold", fn, #lens, n), 3)
  end
  local out = {}
  for b, row in ipairs(lens) do
    if type(row) ~= "number" and type(row) ~= "table" then
      error(fmt("%s: entry %d is a %s, not a number or a row", fn, b, type(row)), 3)
    end
    for _ = 1, n do out[#out + 1] = type(row) == "table" and table.move(row, 1, #row, 1, {}) or row end
  end
  return out
end

--- PyTorch's `repeat_interleave`: each entry of x along dim repeated. repeats is an integer
-- (every entry that many times) or per-entry counts (a 1-D tensor or a table of integers
-- >= 0, one per entry of dim, or one for all). With dim nil, x is flattened first. Works for
-- every dtype and is differentiable (the gradient sums the repeats back). As d2l uses it, a
-- Lua table x (valid lengths or rows of them) is repeated along its first level and returned
-- as a table, and nil gives nil.
-- @tparam ?Tensor|table x
-- @tparam integer|Tensor|table repeats
-- @tparam[opt] integer dim 1-based, negative from the end; nil flattens
-- @treturn ?Tensor|table
-- @raise on negative or non-integer repeats, counts that do not match the dim, or an output
-- larger than memory can hold
-- @usage attn.repeat_interleave(valid_lens, num_heads, 1) -- (B) -> (B * num_heads)
function Tensor.repeat_interleave(x, repeats, dim)
  local fn = "repeat_interleave"
  if x == nil then return nil end
  local counts = is_tensor(repeats) and core.totable(core.reshape(repeats, -1)) or repeats
  if type(counts) == "table" then
    local ints = {}
    for i, c in ipairs(counts) do
      ints[i] = math.tointeger(c)
      if not ints[i] or ints[i] < 0 then
        error(fmt("%s: repeats entry %d is %s, not an integer >= 0", fn, i, tostring(c)), 2)
      end
    end
    counts = ints
  elseif math.type(counts) ~= "integer" or counts < 0 then
    error(fmt("%s: repeats must be an integer >= 0, a 1-D tensor or a table of them, got %s", fn, tostring(repeats)), 2)
  end
  if not is_tensor(x) then
    if type(x) ~= "table" then error(fmt("%s: x must be a tensor or a table, got a %s", fn, type(x)), 2) end
    if type(counts) ~= "number" or (dim ~= nil and dim ~= 1) then
      error(fmt("%s: a table x takes one integer repeat count along dim 1", fn), 2)
    end
    return repeat_table(fn, x, counts)
  end
  if dim == nil then
    x, dim = Tensor.reshape(x, { core.numel(x) }), 1
  elseif core.dim(x) == 0 then
    x = Tensor.reshape(x, { 1 })
  end
  local nd = core.dim(x)
  if math.type(dim) ~= "integer" or dim == 0 or dim < -nd or dim > nd then
    error(fmt("%s: dim %s out of range for %d-D tensor %s", fn, tostring(dim), nd, core.shape_str(x)), 2)
  end
  if dim < 0 then dim = dim + nd + 1 end
  local shape, size = core.shape(x), core.size(x, dim)
  if type(counts) == "table" and #counts == 1 then counts = counts[1] end
  if type(counts) == "number" then
    if counts > 0 and size > math.maxinteger // counts then
      error(fmt("%s: %s repeated %d times along dim %d is more than memory can hold", fn, core.shape_str(x), counts,
        dim), 2)
    end
    shape[dim] = size * counts
    core.check_size(fn, "output", shape, core.dtype(x))
    -- (.., s, ..) -> (.., s, 1, ..) -> (.., s, r, ..) -> (.., s r, ..): one strided copy
    local wide = core.shape(x)
    table.insert(wide, dim + 1, counts)
    return Tensor.reshape(Tensor.expand(Tensor.unsqueeze(x, dim + 1), wide), shape)
  end
  if #counts ~= size then
    error(fmt("%s: %d repeat counts for dim %d of size %d (%s)", fn, #counts, dim, size, core.shape_str(x)), 2)
  end
  local total = 0
  for _, c in ipairs(counts) do total = total + c end
  shape[dim] = total
  core.check_size(fn, "output", shape, core.dtype(x))
  -- the source entry of every output position, built in C rather than by a Lua loop over the
  -- output (counts in the millions took seconds: the fuzzer): a mark at each nonzero count's
  -- first position, the step from the previous such entry, summed along
  local at, step, pos, prev = {}, {}, 1, 0
  for i, c in ipairs(counts) do
    if c > 0 then at[#at + 1], step[#step + 1], prev = pos, i - prev, i end
    pos = pos + c
  end
  local index = {}
  if total > 0 then
    local marks = core.full({ total }, 0, "int64")
    core.index_add_(marks, 1, at, core.tensor(step, "int64"))
    index = core.cumsum(marks, 1)
  end
  return Tensor.index_select(x, dim, index)
end

-- ---------------------------------------------------------------- einsum

-- One operand's labels made distinct: a label repeated in its term ("ii") keeps the diagonal
-- (x times an identity mask, summed over the second occurrence), as PyTorch.
local function einsum_diagonals(fn, x, labels, k)
  local i = 1
  while i <= #labels do
    local j = i + 1
    while j <= #labels and labels[j] ~= labels[i] do j = j + 1 end
    if j <= #labels then
      local n = core.size(x, i)
      if core.size(x, j) ~= n then
        error(fmt("%s: label '%s' of operand %d has sizes %d and %d (%s)", fn, labels[i], k, n, core.size(x, j),
          core.shape_str(x)), 4)
      end
      local mshape = {}
      for d = 1, #labels do mshape[d] = (d == i or d == j) and n or 1 end
      local eye = core.reshape(core.eye(n, n, core.dtype(x)), mshape)
      x = Tensor.sum(Tensor.mul(x, eye), j)
      table.remove(labels, j)
    else
      i = i + 1
    end
  end
  return x
end

-- Sums x over the labels that are in none of `keep` (a set), dropping them from labels.
local function einsum_sum_out(x, labels, keep)
  for d = #labels, 1, -1 do
    if not keep[labels[d]] then
      x = Tensor.sum(x, d)
      table.remove(labels, d)
    end
  end
  return x
end

-- x permuted so that its labels come in `order` (every label of x, once).
local function einsum_permute(x, labels, order)
  local at, perm, same = {}, {}, true
  for d, l in ipairs(labels) do at[l] = d end
  for i, l in ipairs(order) do
    perm[i] = at[l]
    if perm[i] ~= i then same = false end
  end
  if same then return x end
  return Tensor.permute(x, perm)
end

local function product(sizes, list)
  local n = 1
  for _, l in ipairs(list) do n = n * sizes[l] end
  return n
end

--- PyTorch's `einsum(equation, a [, b])` for one or two operands: "ij,jk->ik", "bij,bjk->bik",
-- "bhqd,bhkd->bhqk", "i,i->", "i,j->ij", traces and diagonals ("ii->", "ii->i"), sums
-- ("ij->j") and transposes ("ij->ji"); without "->" the output is the labels that appear
-- once, in alphabetical order. A label of size 1 in one operand broadcasts against the other.
-- Two operands go through one batched matmul (permute and reshape to (batch, m, k) @
-- (batch, k, n)); differentiable through those recorded ops. Labels are letters; "..." is not
-- supported. The operands may also be given as one table `einsum(eq, {a, b})`.
-- @tparam string equation
-- @tparam Tensor a
-- @tparam[opt] Tensor b
-- @treturn Tensor
-- @raise on a malformed equation, a term whose length differs from its operand's dims, a
-- label whose sizes differ, or more than two operands
-- @usage local scores = attn.einsum("bhqd,bhkd->bhqk", q, k)
function Tensor.einsum(equation, ...)
  local fn = "einsum"
  local ops = table.pack(...)
  if ops.n == 1 and type(ops[1]) == "table" and not is_tensor(ops[1]) then ops = table.pack(table.unpack(ops[1])) end
  if type(equation) ~= "string" then error(fmt("%s: equation must be a string, got a %s", fn, type(equation)), 2) end
  local eq = equation:gsub("%s", "")
  if eq:find("...", 1, true) then error(fmt("%s: '...' is not supported (%s)", fn, equation), 2) end
  local lhs, rhs = eq:match("^([^%-]*)%->(.*)$")
  if not lhs then
    if eq:find("-", 1, true) or eq:find(">", 1, true) then error(fmt("%s: malformed equation '%s'", fn, equation), 2) end
    lhs = eq
  end
  local terms = {}
  for t in (lhs .. ","):gmatch("([^,]*),") do terms[#terms + 1] = t end
  if #terms ~= ops.n then
    error(fmt("%s: the equation '%s' names %d operands, got %d", fn, equation, #terms, ops.n), 2)
  end
  if ops.n < 1 or ops.n > 2 then error(fmt("%s: one or two operands are supported, got %d", fn, ops.n), 2) end
  local labels, count, sizes = {}, {}, {}
  for k, t in ipairs(terms) do
    local x = ops[k]
    if not is_tensor(x) then error(fmt("%s: operand %d is a %s, not a tensor", fn, k, type(x)), 2) end
    if not t:match("^%a*$") then error(fmt("%s: term '%s' must be letters (%s)", fn, t, equation), 2) end
    if #t ~= core.dim(x) then
      error(fmt("%s: term '%s' names %d dims, operand %d is %s", fn, t, #t, k, core.shape_str(x)), 2)
    end
    labels[k] = {}
    for d = 1, #t do
      local l = t:sub(d, d)
      labels[k][d] = l
      count[l] = (count[l] or 0) + 1
      local n = core.size(x, d)
      if sizes[l] == nil or sizes[l] == 1 then
        sizes[l] = n
      elseif n ~= 1 and n ~= sizes[l] then
        error(fmt("%s: label '%s' has sizes %d and %d (%s with %s)", fn, l, sizes[l], n, equation,
          ops.n == 2 and core.shape_str(ops[1]) .. " and " .. core.shape_str(ops[2]) or core.shape_str(x)), 2)
      end
    end
  end
  if ops.n == 2 and core.dtype(ops[1]) ~= core.dtype(ops[2]) then
    error(fmt("%s: dtypes differ: %s %s vs %s %s", fn, core.dtype(ops[1]), core.shape_str(ops[1]), core.dtype(ops[2]),
      core.shape_str(ops[2])), 2)
  end
  local out = {}
  if rhs then
    if not rhs:match("^%a*$") then error(fmt("%s: output '%s' must be letters (%s)", fn, rhs, equation), 2) end
    for d = 1, #rhs do
      local l = rhs:sub(d, d)
      if not count[l] then error(fmt("%s: output label '%s' is in no operand (%s)", fn, l, equation), 2) end
      for e = 1, d - 1 do
        if out[e] == l then error(fmt("%s: output label '%s' appears twice (%s)", fn, l, equation), 2) end
      end
      out[d] = l
    end
  else
    for l, c in pairs(count) do
      if c == 1 then out[#out + 1] = l end
    end
    table.sort(out)
  end
  local in_out = {}
  for _, l in ipairs(out) do in_out[l] = true end
  local xs = {}
  for k = 1, ops.n do xs[k] = einsum_diagonals(fn, ops[k], labels[k], k) end
  if ops.n == 1 then
    local x = einsum_sum_out(xs[1], labels[1], in_out)
    return einsum_permute(x, labels[1], out)
  end
  -- labels of one operand only and not in the output are summed first; the rest are batch
  -- (both, kept), contracted (both, not kept) or free (one operand, kept)
  local a, b = xs[1], xs[2]
  local la, lb = labels[1], labels[2]
  local has_a, has_b = {}, {}
  for _, l in ipairs(la) do has_a[l] = true end
  for _, l in ipairs(lb) do has_b[l] = true end
  local keep_a, keep_b = {}, {}
  for l in pairs(has_a) do keep_a[l] = in_out[l] or has_b[l] end
  for l in pairs(has_b) do keep_b[l] = in_out[l] or has_a[l] end
  a, b = einsum_sum_out(a, la, keep_a), einsum_sum_out(b, lb, keep_b)
  local batch, contract, free_a, free_b = {}, {}, {}, {}
  for _, l in ipairs(out) do
    if has_a[l] and has_b[l] then
      batch[#batch + 1] = l
    elseif has_a[l] then
      free_a[#free_a + 1] = l
    else
      free_b[#free_b + 1] = l
    end
  end
  for _, l in ipairs(la) do
    if has_b[l] and not in_out[l] then contract[#contract + 1] = l end
  end
  -- a label of size 1 in one operand broadcasts: expand it to the other's size
  local function widen(x, ls)
    local shape, grow = core.shape(x), false
    for d, l in ipairs(ls) do
      if shape[d] ~= sizes[l] then shape[d], grow = sizes[l], true end
    end
    return grow and Tensor.expand(x, shape) or x
  end
  a, b = widen(a, la), widen(b, lb)
  local order_a, order_b = {}, {}
  for _, l in ipairs(batch) do order_a[#order_a + 1], order_b[#order_b + 1] = l, l end
  for _, l in ipairs(free_a) do order_a[#order_a + 1] = l end
  for _, l in ipairs(contract) do order_a[#order_a + 1], order_b[#order_b + 1] = l, l end
  for _, l in ipairs(free_b) do order_b[#order_b + 1] = l end
  local B, M, K, N = product(sizes, batch), product(sizes, free_a), product(sizes, contract), product(sizes, free_b)
  a = Tensor.reshape(einsum_permute(a, la, order_a), { B, M, K })
  b = Tensor.reshape(einsum_permute(b, lb, order_b), { B, K, N })
  local prod = Tensor.matmul(a, b) -- (B, M, N)
  local got, shape = {}, {}
  for _, group in ipairs { batch, free_a, free_b } do
    for _, l in ipairs(group) do
      got[#got + 1] = l
      shape[#shape + 1] = sizes[l]
    end
  end
  return einsum_permute(Tensor.reshape(prod, shape), got, out)
end

return Tensor
