--- attn: tensors, attention kernels, autograd and layers for Lua 5.4.
-- This facade gathers the pieces: creation functions with dtype/options
-- handling, the differentiable tensor methods (attn.tensor module), operator
-- metamethods, and lazily loaded sub-modules (linalg, nn, optim, progress, the
-- book's kit attn.d2l, and the functions of attn.io and attn.attention).
local core = require "attn.core"
local autograd = require "attn.autograd"
local Tensor = require "attn.tensor"
local format = require "attn.format"
local check = require "attn.check"

local attn = { _VERSION = core._VERSION, core = core, Tensor = Tensor }

-- ---------------------------------------------------------------- metamethods

local mt = core.metatable
mt.__add = function(a, b) return Tensor.add(a, b) end
mt.__sub = function(a, b) return Tensor.sub(a, b) end
mt.__mul = function(a, b) return Tensor.mul(a, b) end
mt.__div = function(a, b) return Tensor.div(a, b) end
mt.__pow = function(a, b) return Tensor.pow(a, b) end
mt.__unm = function(a) return Tensor.neg(a) end
mt.__len = function(a) return core.dim(a) > 0 and core.size(a, 1) or 0 end
mt.__tostring = format.tostring

-- ---------------------------------------------------------------- options

-- The last argument of a creation function: nil, a dtype string, or a table
-- {dtype = ..., requires_grad = ...}.
local CREATION_OPTIONS = { "dtype", "requires_grad" }
local function options(opt, fn)
  if opt == nil then return nil, false end
  if type(opt) == "string" then return opt, false end
  if type(opt) == "table" then
    check.options(fn, opt, CREATION_OPTIONS, 4)
    return opt.dtype, opt.requires_grad == true
  end
  error(string.format("%s: options must be a dtype string or a table, got a %s", fn, type(opt)), 3)
end

local function finish(t, requires_grad)
  if requires_grad then Tensor.requires_grad_(t, true) end
  return t
end

-- The shape of a creation function: a table ({2, 3}) or leading integers
-- (2, 3), followed by the other arguments; the last `keep` leading numbers
-- are not sizes (full's value, bernoulli's p). Checked here so the error
-- names the function the user called (error level 4: shape_of, the creation
-- function, then the user's line).
local function shape_of(fn, keep, ...)
  local shape, rest
  local first = ...
  if type(first) == "table" then
    shape, rest = first, table.pack(select(2, ...))
  else
    local n = 0
    while type((select(n + 1, ...))) == "number" do n = n + 1 end
    if first ~= nil and type(first) ~= "number" and type(first) ~= "string" then
      error(string.format("%s: expected sizes like (2, 3) or {2, 3}, got a %s", fn, type(first)), 4)
    end
    n = math.max(n - keep, 0)
    shape, rest = table.pack(...), table.pack(select(n + 1, ...))
    for i = shape.n, n + 1, -1 do shape[i] = nil end
    shape.n = nil
  end
  for d, size in ipairs(shape) do
    if math.type(size) ~= "integer" and not (type(size) == "number" and size == math.floor(size) and size < 2 ^ 63) then
      error(string.format("%s: size %d is %s, not an integer", fn, d, tostring(size)), 4)
    end
    if size < 0 then
      error(string.format("%s: negative size %s in shape %s", fn, tostring(size), core.shape_str(shape)), 4)
    end
  end
  return shape, table.unpack(rest, 1, rest.n)
end

-- ---------------------------------------------------------------- creation

--- A tensor from a number or a nested table of numbers, or a copy of a tensor.
-- @param data a number, a rectangular nested table of numbers, or a tensor
-- @param[opt] opt dtype string or options table `{dtype =, requires_grad =}`
-- @treturn Tensor a new tensor (float32 by default; a copy keeps the source's dtype)
-- @raise on a ragged table, a non-number element or an unknown option
-- @usage local x = attn.tensor({{1, 2, 3}, {4, 5, 6}}, "float64") -- (2, 3)
function attn.tensor(data, opt, ...)
  if select("#", ...) > 0 then
    error("tensor: expected (data [, dtype or options]), got a third argument; put dtype and requires_grad in one " ..
      "options table", 2)
  end
  local dtype, rg = options(opt, "tensor")
  return finish(core.tensor(data, dtype), rg)
end

-- Creation from a shape (a table or sizes) and the optional last argument
-- (dtype or options).
local function shaped(fn_name, make)
  return function(...)
    local shape, opt = shape_of(fn_name, 0, ...)
    local dtype, rg = options(opt, fn_name)
    return finish(make(shape, dtype), rg)
  end
end
local function zeros_of(s, dt) return core.full(s, 0, dt) end
local function ones_of(s, dt) return core.full(s, 1, dt) end
--- A tensor with uninitialised contents.
-- @function empty
-- @param ... sizes as varargs (2, 3) or one table {2, 3}, then optionally a dtype
--   string or `{dtype =, requires_grad =}`
-- @treturn Tensor
-- @raise "empty: negative size -2 in shape [3x-2]"; "empty: size 2 is 1.5, not an integer"
-- @usage local buf = attn.empty(1024, "float64")
attn.empty = shaped("empty", core.empty)
--- A tensor of zeros.
-- @function zeros
-- @param ... sizes as varargs or a table, then optionally a dtype or options
-- @treturn Tensor
-- @raise on a negative or non-integer size, an unknown dtype or option
-- @usage attn.zeros(2, 3) -- same as attn.zeros({2, 3})
attn.zeros = shaped("zeros", zeros_of)
--- A tensor of ones.
-- @function ones
-- @param ... sizes as varargs or a table, then optionally a dtype or options
-- @treturn Tensor
-- @raise like zeros
-- @usage attn.ones(4, {dtype = "float64", requires_grad = true})
attn.ones = shaped("ones", ones_of)
--- Uniform random values in [0, 1) from the seeded generator (attn.manual_seed).
-- @function rand
-- @param ... sizes as varargs or a table, then optionally a dtype or options
-- @treturn Tensor
-- @raise like zeros
-- @usage attn.rand(3, 3)
attn.rand = shaped("rand", core.rand)
--- Standard normal random values from the seeded generator.
-- @function randn
-- @param ... sizes as varargs or a table, then optionally a dtype or options
-- @treturn Tensor
-- @raise like zeros
-- @usage local w = attn.randn(3, 2, {requires_grad = true})
attn.randn = shaped("randn", core.randn)

--- full(shape, value [, opt]) or full(n1, n2, ..., value [, opt]): every entry is value.
function attn.full(...)
  local shape, value, opt = shape_of("full", 1, ...)
  local dtype, rg = options(opt, "full")
  return finish(core.full(shape, value, dtype), rg)
end

--- arange(stop), arange(start, stop), arange(start, stop, step): values in [start, stop).
function attn.arange(a, b, c, d)
  local args = { a, b, c, d }
  local n = 0
  while n < 4 and type(args[n + 1]) == "number" do n = n + 1 end
  local dtype, rg = options(args[n + 1], "arange")
  local start, stop, step
  if n == 1 then
    start, stop, step = 0, a, 1
  elseif n == 2 then
    start, stop, step = a, b, 1
  elseif n == 3 then
    start, stop, step = a, b, c
  else
    error("arange: expected arange(stop), arange(start, stop) or arange(start, stop, step)", 2)
  end
  return finish(core.arange(start, stop, step, dtype), rg)
end

--- n evenly spaced values from start to stop, both included.
-- @tparam number start
-- @tparam number stop
-- @tparam int n count (>= 0)
-- @param[opt] opt dtype or options
-- @treturn Tensor (n)
-- @raise "linspace: negative count -1"
-- @usage attn.linspace(0, 1, 5) --> 0, 0.25, 0.5, 0.75, 1
function attn.linspace(start, stop, n, opt)
  local dtype, rg = options(opt, "linspace")
  return finish(core.linspace(start, stop, n, dtype), rg)
end

--- eye(n [, m] [, opt])
function attn.eye(n, m, opt)
  if type(m) ~= "number" then m, opt = n, m end
  local dtype, rg = options(opt, "eye")
  return finish(core.eye(n, m, dtype), rg)
end

--- Random integers uniform in [low, high) (PyTorch's `randint`: low inclusive,
-- high exclusive), int64 unless opt names another dtype. Drawn sequentially
-- from the seeded generator, so the thread count never changes them.
-- @tparam integer low (optional: `randint(high, shape)` means low = 0)
-- @tparam integer high
-- @tparam {integer,...} shape
-- @tparam[opt] string|table opt dtype or `{dtype =}`
-- @treturn Tensor
-- @raise when low >= high or the bounds are not integers
-- @usage local ids = attn.randint(1, 11, { 4, 7 }) -- token ids 1..10
function attn.randint(low, high, shape, opt)
  if type(high) == "table" then low, high, shape, opt = 0, low, high, shape end
  for _, v in ipairs({ low, high }) do
    if math.type(v) ~= "integer" and not (type(v) == "number" and v == math.floor(v) and math.abs(v) < 2 ^ 63) then
      error(string.format("randint: bounds must be integers, got %s", tostring(v)), 2)
    end
  end
  local sizes, rest = shape_of("randint", 0, shape, opt)
  local dtype, rg = options(rest, "randint")
  if rg then error("randint: integer samples cannot require grad", 2) end
  return core.randint(sizes, math.tointeger(low), math.tointeger(high), dtype)
end

--- Normal samples N(mean, std^2) of a shape (PyTorch's `normal(mean, std, size)`
-- with number arguments), from the seeded generator.
-- @tparam number mean
-- @tparam number std >= 0
-- @tparam {integer,...} shape
-- @tparam[opt] string|table opt dtype or `{dtype =, requires_grad =}`
-- @treturn Tensor
-- @raise when std < 0 or mean or std is not finite
-- @usage local w = attn.normal(0, 0.01, { 4, 3 })
function attn.normal(mean, std, shape, opt)
  local sizes, rest = shape_of("normal", 0, shape, opt)
  local dtype, rg = options(rest, "normal")
  if type(mean) ~= "number" or type(std) ~= "number" then
    error(string.format("normal: mean and std must be numbers, got %s and %s", type(mean), type(std)), 2)
  end
  return finish(core.normal_(core.empty(sizes, dtype), mean, std), rg)
end

--- Draws category ids from rows of probabilities (PyTorch's `multinomial`).
-- Rows need not sum to 1 (weights >= 0). Without replacement a category is
-- drawn at most once per row. Draws come from the seeded generator in row
-- order, so the thread count never changes them.
-- @tparam Tensor probs (C) or (R, C), float
-- @tparam integer num_samples
-- @tparam[opt=false] boolean replacement
-- @treturn Tensor int64 1-based ids, (num_samples) or (R, num_samples)
-- @raise on negative or non-finite weights, an all-zero row, or more samples
-- than nonzero categories without replacement
-- @usage local next_token = attn.multinomial(logits:softmax(-1), 1)
function attn.multinomial(probs, num_samples, replacement)
  if math.type(num_samples) ~= "integer" then
    error(string.format("multinomial: num_samples must be an integer, got %s", tostring(num_samples)), 2)
  end
  return core.multinomial(probs, num_samples, replacement == true)
end

--- bernoulli(shape, p [, opt]) or bernoulli(n1, n2, ..., p [, opt]): ones with probability p.
function attn.bernoulli(...)
  local shape, p, opt = shape_of("bernoulli", 1, ...)
  local dtype, rg = options(opt, "bernoulli")
  return finish(core.bernoulli(shape, p, dtype), rg)
end

local function like(fn_name, make)
  return function(t, opt)
    local dtype, rg = options(opt, fn_name)
    return finish(make(core.shape(t), dtype or core.dtype(t)), rg)
  end
end
--- Zeros with t's shape and dtype (the dtype may be overridden).
-- @function zeros_like
-- @tparam Tensor t
-- @param[opt] opt dtype or options
-- @treturn Tensor
-- @usage local g = attn.zeros_like(p)
attn.zeros_like = like("zeros_like", zeros_of)
--- Ones with t's shape and dtype.
-- @function ones_like
-- @tparam Tensor t
-- @param[opt] opt dtype or options
-- @treturn Tensor
-- @usage attn.ones_like(x)
attn.ones_like = like("ones_like", ones_of)
--- Uniform [0, 1) values with t's shape and dtype.
-- @function rand_like
-- @tparam Tensor t
-- @param[opt] opt dtype or options
-- @treturn Tensor
-- @usage attn.rand_like(x):lt(0.5)
attn.rand_like = like("rand_like", core.rand)
--- Standard normal values with t's shape and dtype.
-- @function randn_like
-- @tparam Tensor t
-- @param[opt] opt dtype or options
-- @treturn Tensor
-- @usage x + attn.randn_like(x) * 0.1
attn.randn_like = like("randn_like", core.randn)
--- value everywhere, with t's shape and dtype.
-- @tparam Tensor t
-- @tparam number value
-- @param[opt] opt dtype or options
-- @treturn Tensor
-- @usage attn.full_like(x, -1e6)
function attn.full_like(t, value, opt)
  local dtype, rg = options(opt, "full_like")
  return finish(core.full(core.shape(t), value, dtype or core.dtype(t)), rg)
end

--- cat(list, dim): differentiable concatenation along an existing dim.
function attn.cat(list, dim)
  dim = dim or 1
  local out = core.cat(list, dim)
  list = table.move(list, 1, #list, 1, {}) -- the graph keeps a copy: the caller may reuse the table
  return autograd.record("cat", out, list, function(g)
    local grads, start = {}, 1
    for i, t in ipairs(list) do
      local len = core.size(t, dim)
      grads[i] = core.narrow(g, dim, start, len)
      start = start + len
    end
    return table.unpack(grads, 1, #list)
  end)
end

--- stack(list, dim): joins along a new dim (1..ndim+1, negative from the end).
-- One autograd node: the gradient of tensor i is slice i of the output's.
function attn.stack(list, dim)
  dim = dim or 1
  if type(list) ~= "table" or #list == 0 then error("stack: expected a non-empty list of tensors", 2) end
  local parts = {}
  local first = autograd.is_tensor(list[1]) and core.shape_str(list[1])
  for i, t in ipairs(list) do
    if not autograd.is_tensor(t) then
      error(string.format("stack: element %d is a %s, not a tensor", i, type(t)), 2)
    end
    local s = core.shape_str(t)
    if s ~= first or core.dtype(t) ~= core.dtype(list[1]) then
      error(string.format("stack: tensor %d is %s %s, tensor 1 is %s %s; all must match", i, core.dtype(t), s,
        core.dtype(list[1]), first), 2)
    end
    parts[i] = core.unsqueeze(t, dim)
  end
  local out = core.cat(parts, dim) -- dim counts in the output's dims, as unsqueeze's did
  list = table.move(list, 1, #list, 1, {}) -- the graph keeps a copy: the caller may reuse the table
  return autograd.record("stack", out, list, function(g)
    local grads = {}
    for i = 1, #list do grads[i] = core.select(g, dim, i) end
    return table.unpack(grads, 1, #list)
  end)
end

-- ---------------------------------------------------------------- functions

-- Every tensor method is also a function: attn.exp(x), attn.matmul(a, b), ...
for name, f in pairs(Tensor) do
  if attn[name] == nil then attn[name] = f end
end
attn.where = Tensor.where
attn.bmm = Tensor.bmm

--- Seeds the random generator (xoshiro256**) of rand, randn, bernoulli,
-- uniform_, normal_ and dropout: a seed gives the same numbers on every
-- thread count.
-- @function manual_seed
-- @tparam int seed
-- @raise "manual_seed: argument 1 (seed) must be an integer, got 1.5"
-- @usage attn.manual_seed(42)
attn.manual_seed = core.manual_seed
--- The random generator's state (PyTorch's `get_rng_state`): its four 64-bit
-- words as Lua integers, a copy. Saved with a checkpoint, it makes a resumed
-- run draw the same dropout masks as an unbroken one.
-- @treturn {integer,integer,integer,integer}
-- @usage local s = attn.get_rng_state(); attn.rand({2}); attn.set_rng_state(s)
function attn.get_rng_state() return core.rng_state() end
--- Restores a state from `get_rng_state`.
-- @tparam {integer,integer,integer,integer} state
-- @raise when state is not four integers, not all zero (xoshiro's one dead state)
function attn.set_rng_state(state)
  local ok = type(state) == "table" and #state == 4
  local any = false
  for i = 1, 4 do
    if not ok or math.type(state[i]) ~= "integer" then
      error("set_rng_state: expected a table of four integers (from get_rng_state)", 2)
    end
    any = any or state[i] ~= 0
  end
  if not any then error("set_rng_state: the all-zero state never leaves zero", 2) end
  core.rng_state(state)
end
--- Seconds from a monotonic wall clock (CLOCK_MONOTONIC), for timing code.
-- Unlike `os.clock` (CPU time of the process) it counts time spent waiting and
-- in other threads, and unlike `os.time` it has sub-microsecond resolution and
-- never jumps when the system clock is set.
-- @treturn number seconds since an arbitrary fixed point
-- @usage local t0 = attn.clock(); step(); print(attn.clock() - t0, "s")
attn.clock = core.clock
--- Sets the worker pool's thread count (OpenBLAS runs inside it, pinned to
-- one thread). Results are the same bits on every count.
-- @function set_num_threads
-- @tparam int n 1..64
-- @raise "set_num_threads: n = 4294967296 must be in 1..64"
-- @usage attn.set_num_threads(2)
attn.set_num_threads = core.set_num_threads
--- The worker pool's thread count.
-- @function get_num_threads
-- @treturn int
-- @usage print(attn.get_num_threads())
attn.get_num_threads = core.get_num_threads
--- Gives the allocator's cached blocks back to the system.
-- @function empty_cache
-- @usage attn.empty_cache(); print(attn.memory())
attn.empty_cache = core.empty_cache
--- Bounds the bytes the allocator keeps cached after release.
-- @function set_cache_limit
-- @tparam int bytes >= 0
-- @raise "set_cache_limit: bytes = -1 must be >= 0"
-- @usage attn.set_cache_limit(256 * 2^20)
attn.set_cache_limit = core.set_cache_limit
--- memory(): bytes held by live tensors, and bytes kept in the allocator's cache.
attn.memory = core.memory
--- Whether v is a tensor (a live or freed attn.Tensor userdata).
-- @function is_tensor
-- @param v any value
-- @treturn boolean
-- @usage if attn.is_tensor(x) then print(x:shape()) end
attn.is_tensor = autograd.is_tensor

attn.autograd = autograd
--- Runs fn(...) without recording operations for autograd and returns its results.
-- @function no_grad
-- @tparam function fn
-- @param ... fn's arguments
-- @return fn's results
-- @usage local y = attn.no_grad(function() return model(x) end)
attn.no_grad = autograd.no_grad
--- Runs fn(...) with recording on (inside a no_grad block) and returns its results.
-- @function enable_grad
-- @tparam function fn
-- @param ... fn's arguments
-- @return fn's results
-- @usage attn.enable_grad(function() loss:backward() end)
attn.enable_grad = autograd.enable_grad
--- Whether operations are being recorded for autograd.
-- @function is_grad_enabled
-- @treturn boolean
-- @usage assert(attn.is_grad_enabled())
attn.is_grad_enabled = autograd.is_enabled
attn.backward = autograd.backward
attn.gradcheck = autograd.gradcheck

-- ---------------------------------------------------------------- sub-modules

-- Loaded on first use, and only these keys load anything: `attn.<unknown>`
-- is nil and requires nothing (so a typo never loads a module as a side
-- effect). attn.seq2seq is the deprecated name of attn.d2l.train (kept for one
-- release, see CHANGELOG).
local submodules = { linalg = "attn.linalg", nn = "attn.nn", optim = "attn.optim", progress = "attn.progress",
  d2l = "attn.d2l", seq2seq = "attn.d2l.train" }
-- The functions of these modules appear as attn.save, attn.masked_softmax, ...
-- (spec/core/facade_spec.lua checks the lists against the modules).
local function_modules = {
  ["attn.io"] = { "save", "load", "save_npy", "load_npy" },
  ["attn.attention"] = { "sequence_mask", "masked_softmax", "dot_product_attention", "additive_scores",
    "bilinear_scores", "additive_attention", "projected_additive_attention", "split_heads", "merge_heads",
    "multi_head_attention", "positional_encoding", "alibi_slopes" },
  ["attn.rope"] = { "rope" },
  ["attn.efficient"] = { "linear_attention", "performer_attention", "performer_features", "nystrom_attention",
    "nystrom_pinv" },
}
local module_of = {}
for modname, names in pairs(function_modules) do
  for _, name in ipairs(names) do module_of[name] = modname end
end

setmetatable(attn, {
  __index = function(t, key)
    local modname = submodules[key]
    if modname then
      local m = require(modname)
      rawset(t, key, m)
      return m
    end
    modname = module_of[key]
    if modname == nil then return nil end
    local f = require(modname)[key]
    if f == nil then error(string.format("attn.%s: %s has no function %s", key, modname, key), 2) end
    rawset(t, key, f)
    return f
  end,
})

return attn
