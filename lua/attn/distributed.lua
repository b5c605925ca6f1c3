--- Data-parallel training over MPI (Open MPI): collectives on tensors and a
-- wrapper that keeps replicas of one `nn.Module` in step.
--
-- Run a script under `mpirun -np N lua5.4 script.lua`: every process runs the
-- whole script, `init()` connects them, and each one trains on its share of
-- every batch. **Ranks are 1-based**, as everything in attn's Lua API: `rank()`
-- is in 1..`world_size()`, and rank 1 is the root (it prints, saves and is the
-- source of `broadcast_` by default). MPI's own ranks are these minus one.
--
-- Needs the separate C module `attn.mpi` (lua/attn/mpi.so), built against Open
-- MPI by `make mpi` (which installs `openmpi-bin` and `libopenmpi-dev` with
-- `make deps-mpi`); the rest of attn needs no MPI. Without it, `require
-- "attn.distributed"` raises a message saying so. See docs/DISTRIBUTED.md.
-- @module attn.distributed
-- @usage
-- local dist = require "attn.distributed"
-- dist.init()
-- local dp = dist.DataParallel(net)           -- broadcasts rank 1's weights
-- local first, last = dp:shard(X:size(1))     -- this rank's rows of the batch
-- local loss = lossf(net(X:narrow(1, first, last - first + 1)), ...)
-- loss:backward()
-- dp:sync_gradients()                         -- the mean over ranks
-- optimizer:step()
local attn = require "attn"

local HELP = "attn.distributed needs the MPI binding attn.mpi (lua/attn/mpi.so), which is built separately " ..
  "against Open MPI: `make mpi` installs the Debian packages openmpi-bin and libopenmpi-dev (`make deps-mpi`) " ..
  "and builds it; then run under `mpirun -np N lua5.4 script.lua`"

local loaded, mpi = pcall(require, "attn.mpi")
if not loaded then
  error(HELP .. " (require \"attn.mpi\" said: " .. tostring(mpi):match("^[^\n]*") .. ")", 2)
end

local distributed = {}

local function need_init(fn)
  if not mpi.initialized() then
    error(fn .. ": MPI is not initialised (call attn.distributed.init() first)", 3)
  end
end

local function check_tensor(fn, t)
  if not attn.is_tensor(t) then error(fn .. ": argument 1 must be a tensor, got " .. type(t), 3) end
end

--- Starts MPI (once per process; again is a no-op). Call it before any
-- collective; MPI errors are then returned to attn and raised as Lua errors.
-- @treturn integer this process's rank (1-based)
-- @treturn integer the number of processes
function distributed.init()
  mpi.init()
  return distributed.rank(), distributed.world_size()
end

--- Whether `init` has run and `finalize` has not.
-- @treturn boolean
function distributed.is_initialized() return mpi.initialized() end

--- This process's rank, 1-based (1 is the root).
-- @treturn integer
-- @raise before `init`
function distributed.rank()
  need_init("rank")
  return mpi.rank() + 1
end

--- The number of processes.
-- @treturn integer
-- @raise before `init`
function distributed.world_size()
  need_init("world_size")
  return mpi.size()
end

--- Whether this process is rank 1 (the one that prints and writes files).
-- Without `init`, true (a single process is its own root).
-- @treturn boolean
function distributed.is_root() return not mpi.initialized() or mpi.rank() == 0 end

-- Runs the C collective on t itself when it is contiguous, else on a contiguous
-- copy that is written back (views of parameters, transposed gradients).
local function in_place(t, call, ...)
  if t:is_contiguous() then
    call(t, ...)
  else
    local tmp = t:contiguous()
    call(tmp, ...)
    attn.no_grad(function() t:copy_(tmp) end)
  end
  return t
end

--- Sums (or averages) a tensor over all ranks, in place: afterwards every rank
-- holds the same values. float32, float64 and int64 tensors, views included
-- (a non-contiguous view goes through a contiguous copy). Every rank must pass
-- a tensor of the same dtype and shape: a mismatch is detected (the shapes are
-- exchanged first) and raised on every rank, naming each rank's tensor.
-- @tparam Tensor t
-- @tparam[opt="sum"] string op "sum" or "mean" (mean: float tensors only)
-- @treturn Tensor t
-- @raise before `init`, on a mismatch across ranks, or when MPI fails (naming the call)
function distributed.allreduce_(t, op)
  need_init("allreduce_")
  check_tensor("allreduce_", t)
  op = op or "sum"
  if op ~= "sum" and op ~= "mean" then error("allreduce_: op must be \"sum\" or \"mean\", got " .. tostring(op), 2) end
  return in_place(t, mpi.allreduce, op)
end

--- Copies `root`'s tensor into every other rank's, in place (same dtype and
-- shape on every rank, checked as for `allreduce_`).
-- @tparam Tensor t
-- @tparam[opt=1] integer root the 1-based rank whose values are sent
-- @treturn Tensor t
-- @raise before `init`, on a mismatch across ranks, a root out of range, or an MPI failure
function distributed.broadcast_(t, root)
  need_init("broadcast_")
  check_tensor("broadcast_", t)
  root = root or 1
  if math.type(root) ~= "integer" then error("broadcast_: root must be an integer rank, got " .. tostring(root), 2) end
  return in_place(t, mpi.bcast, root - 1)
end

--- Sums numbers over all ranks (in float64; a loss and a token count, say).
-- @tparam number ... this rank's values
-- @treturn number... the sums, in the same order
-- @raise before `init`
function distributed.sum_numbers(...)
  need_init("sum_numbers")
  local n = select("#", ...)
  if n == 0 then return end
  local t = attn.tensor({ ... }, "float64")
  mpi.allreduce(t, "sum")
  return table.unpack(t:totable())
end

--- Waits until every rank has called it.
-- @raise before `init`
function distributed.barrier()
  need_init("barrier")
  mpi.barrier()
end

--- Ends MPI in this process (every rank must call it; later calls are no-ops).
function distributed.finalize() mpi.finalize() end

--- Ends every process of the job at once, with an exit status (after an
-- error on one rank, so that the others do not wait in a collective forever).
-- @tparam[opt=1] integer code
function distributed.abort(code)
  io.stdout:flush()
  io.stderr:flush()
  mpi.abort(code or 1)
end

--- Runs `fn(...)`; if it raises, prints the error with this rank's number on
-- stderr and aborts the whole job (`abort`), so the other ranks stop within
-- moments instead of waiting in their next collective.
-- @tparam function fn
-- @param ... its arguments
-- @return what fn returns
function distributed.run(fn, ...)
  local res = table.pack(xpcall(fn, function(err)
    if type(err) ~= "string" then err = tostring(err) end
    return debug.traceback(err, 2)
  end, ...))
  if res[1] then return table.unpack(res, 2, res.n) end
  local where = mpi.initialized() and string.format("rank %d of %d", mpi.rank() + 1, mpi.size()) or "before init"
  io.stderr:write(string.format("attn.distributed: %s failed, aborting every rank: %s\n", where, res[2]))
  distributed.abort(1)
end

--- The rows of a batch of `n` that one rank takes: contiguous ranges in rank
-- order, sizes differing by at most one (the first `n % world` ranks take one
-- more). Deterministic: every rank computes every rank's range alike.
-- @tparam integer n the global batch size
-- @tparam[opt] integer rank 1-based (default this process's)
-- @tparam[opt] integer world number of ranks (default `world_size()`)
-- @treturn integer first row (1-based)
-- @treturn integer last row (`last < first` for an empty shard, when n < world)
function distributed.shard(n, rank, world)
  if math.type(n) ~= "integer" or n < 0 then error("shard: n must be an integer >= 0, got " .. tostring(n), 2) end
  rank = rank or distributed.rank()
  world = world or distributed.world_size()
  local base, extra = n // world, n % world
  local first = (rank - 1) * base + math.min(rank - 1, extra) + 1
  return first, first + base + (rank <= extra and 1 or 0) - 1
end

-- ------------------------------------------------------------ DataParallel

--- Keeps the replicas of a module identical across ranks: the constructor
-- broadcasts rank 1's parameters and buffers, `shard` picks this rank's rows,
-- and `sync_gradients` (after backward, before the optimizer's step) replaces
-- every gradient by its average over ranks. Gradients are flattened into
-- buckets of about `bucket_mb` MB of one dtype, one allreduce per bucket.
-- The reduction runs after backward, not overlapped with it: on CPU ranks the
-- backward already keeps every core busy, so there is little to hide behind.
-- Calling the wrapper calls the module.
--
-- With `shards = K`, the reduction is **ordered**, and the result is the same
-- bits for any number of processes: every batch is cut into K micro-shards
-- (rows `shard(n, k, K)`, whatever the world size), rank r computes the
-- micro-shards `shard(K, r, N)` one at a time (`micro_shards`), keeps each
-- one's gradient in its own slot of a K-slot buffer (`stash_gradients`), and
-- `sync_gradients` gathers all K slots to every rank, which sums them in the
-- order 1..K with the same code. One process computing the K micro-shards
-- itself takes exactly the steps that N processes take.
-- @type DataParallel
local DataParallel = {}
DataParallel.__index = DataParallel
DataParallel.__call = function(self, ...) return self.module(...) end

--- Wraps a module (see the class above).
-- @tparam Module module
-- @tparam[opt] table opts `bucket_mb` (25, as PyTorch's DDP), `broadcast` (true: send rank 1's
--   state now), `shards` (K: the ordered reduction over K micro-shards per batch; nil: the
--   allreduce of each rank's shard)
-- @treturn DataParallel
-- @raise before `init`
-- @function DataParallel
function distributed.DataParallel(module, opts)
  need_init("DataParallel")
  if not attn.nn.is_module(module) then error("DataParallel: argument 1 must be an nn.Module", 2) end
  opts = opts or {}
  local mb = opts.bucket_mb or 25
  if type(mb) ~= "number" or mb <= 0 then error("DataParallel: bucket_mb must be a number > 0", 2) end
  local K = opts.shards
  if K ~= nil and (math.type(K) ~= "integer" or K < 1) then
    error("DataParallel: shards must be an integer >= 1, got " .. tostring(K), 2)
  end
  local self = setmetatable({ module = module, bucket_bytes = math.floor(mb * 1024 * 1024), buckets = nil,
    shards = K }, DataParallel)
  -- this rank's micro-shards first_shard..last_shard (none when K < world size and the rank is past K)
  if K then self.first_shard, self.last_shard = distributed.shard(K) end
  if opts.broadcast ~= false then self:broadcast_state() end
  return self
end

--- Sends rank 1's parameters and buffers to every rank (after an
-- initialisation that drew different values per rank, or loading on rank 1).
-- @tparam[opt=1] integer root
function DataParallel:broadcast_state(root)
  for _, list in ipairs { self.module:named_parameters(), self.module:named_buffers() } do
    for _, e in ipairs(list) do distributed.broadcast_(e[2], root) end
  end
end

--- This rank's rows of a global batch of `n` (see `distributed.shard`).
-- @tparam integer n
-- @treturn integer first
-- @treturn integer last
function DataParallel.shard(_, n) return distributed.shard(n) end

--- The pieces of a global batch of `n` rows that this rank computes, each with
-- its own forward and backward: a list of `{index =, first =, last =}` (empty
-- pieces left out). Ordered (`shards = K`): this rank's micro-shards k, rows
-- `shard(n, k, K)`; else one piece, this rank's `shard(n)` with index its rank.
-- @tparam integer n
-- @treturn table
function DataParallel:micro_shards(n)
  local list, K = {}, self.shards
  if K then
    for k = self.first_shard, self.last_shard do
      local first, last = distributed.shard(n, k, K)
      if last >= first then list[#list + 1] = { index = k, first = first, last = last } end
    end
  else
    local first, last = distributed.shard(n)
    if last >= first then list[1] = { index = distributed.rank(), first = first, last = last } end
  end
  return list
end

-- Buckets of parameters: per dtype, in parameter order, each up to bucket_bytes.
local function make_buckets(params, bytes)
  local buckets, open = {}, {}
  for _, p in ipairs(params) do
    local dt, n = p:dtype(), p:numel()
    local size = dt == "float32" and 4 or 8
    local b = open[dt]
    if not b or (b.numel > 0 and (b.numel + n) * size > bytes) then
      b = { dtype = dt, params = {}, offsets = {}, numel = 0 }
      buckets[#buckets + 1] = b
      open[dt] = b
    end
    b.params[#b.params + 1] = p
    b.offsets[#b.offsets + 1] = b.numel
    b.numel = b.numel + n
  end
  return buckets
end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if rawequal(a[i], b[i]) == false then return false end
  end
  return true
end

-- The buckets of the module's current parameters (made again when they change).
function DataParallel:current_buckets()
  local params = self.module:parameters()
  if not self.buckets or not same_list(self.params, params) then
    self.params, self.buckets = params, make_buckets(params, self.bucket_bytes)
  end
  return self.buckets
end

--- Ordered reduction (`shards = K`): after the backward of micro-shard `k`, adds
-- the module's gradients to k's own slot (a step's later batches add to it,
-- gradient accumulation) and zeroes them for the next micro-shard. A no-op
-- without `shards`.
-- @tparam integer k the micro-shard's index, one of this rank's (`micro_shards`)
-- @raise when k is not one of this rank's micro-shards
function DataParallel:stash_gradients(k)
  if not self.shards then return end
  if math.type(k) ~= "integer" or k < self.first_shard or k > self.last_shard then
    error(string.format("stash_gradients: micro-shard %s is not one of this rank's (%d..%d)", tostring(k),
      self.first_shard, self.last_shard), 2)
  end
  attn.no_grad(function()
    for _, b in ipairs(self:current_buckets()) do
      b.slots = b.slots or attn.zeros({ self.shards * b.numel }, b.dtype)
      for i, p in ipairs(b.params) do
        if p.grad then
          b.slots:narrow(1, (k - 1) * b.numel + b.offsets[i] + 1, p:numel()):add_(p.grad:reshape({ -1 }))
          p.grad:zero_()
        end
      end
    end
  end)
end

-- The ordered reduction. Each bucket has K slots, one per micro-shard; a rank
-- fills its own and leaves the others +0, so an allreduce sum gathers them
-- exactly (x + 0 = x in any order; a slot starts at +0 and only adds, so it
-- never holds -0, whose sign an addition of +0 would lose). Every rank then
-- sums the slots in the order 1..K with the same code. (An allgather would
-- send half the bytes, but Open MPI's allgatherv of ~1 MB took 10 to 30 ms
-- in some runs on one machine, against 0.2 ms for this allreduce.)
local function sync_ordered(self)
  local K = self.shards
  attn.no_grad(function()
    for _, b in ipairs(self:current_buckets()) do
      local n = b.numel
      b.slots = b.slots or attn.zeros({ K * n }, b.dtype)
      b.sum = b.sum or attn.empty({ n }, b.dtype)
      mpi.allreduce(b.slots, "sum")
      local sum = b.sum
      sum:copy_(b.slots:narrow(1, 1, n))
      for k = 2, K do sum:add_(b.slots:narrow(1, (k - 1) * n + 1, n)) end
      b.slots:zero_()
      for i, p in ipairs(b.params) do
        local seg = sum:narrow(1, b.offsets[i] + 1, p:numel()):reshape(p:shape())
        if p.grad then p.grad:copy_(seg) else p.grad = seg:clone() end
      end
    end
  end)
end

--- Averages the gradients over ranks, in place (parameters without a
-- gradient on a rank, e.g. with an empty shard, count as zeros).
-- Without options, the plain mean: right when every rank's loss is a mean over
-- the same number of items. With `weight` (this rank's number of tokens, when
-- shards hold different numbers), each rank's gradient g_r being its local
-- mean, the result is sum_r w_r g_r / sum_r w_r: the gradient of the mean over
-- all tokens. With `op = "sum"`, the plain sum (for a loss that is a sum over
-- the batch, as the book's train_seq2seq).
--
-- Ordered (`shards = K`): the sum, in micro-shard order, of the buffers that
-- `stash_gradients` filled (only `op = "sum"`: scale the micro-shards' losses
-- by the global count beforehand for a mean); the gradients left in the
-- module since the last stash are not counted. Then every buffer is zeroed.
-- @tparam[opt] table opts `weight` (number >= 0) or `op` ("mean" or "sum")
-- @raise on bad options, or `op` other than "sum" or a weight with `shards`
function DataParallel:sync_gradients(opts)
  opts = opts or {}
  local op = opts.op or "mean"
  if op ~= "mean" and op ~= "sum" then error("sync_gradients: op must be \"mean\" or \"sum\", got " .. tostring(op), 2) end
  local w = opts.weight
  if w ~= nil and (type(w) ~= "number" or w < 0) then error("sync_gradients: weight must be a number >= 0", 2) end
  if w ~= nil and op == "sum" then error("sync_gradients: weight goes with op \"mean\"", 2) end
  if self.shards then
    if op ~= "sum" then
      error("sync_gradients: the ordered reduction (shards) sums; pass op = \"sum\" with losses scaled by the " ..
        "global count", 2)
    end
    return sync_ordered(self)
  end
  self:current_buckets()
  local divisor
  if op == "mean" then divisor = w ~= nil and distributed.sum_numbers(w) or distributed.world_size() end
  if divisor == 0 then error("sync_gradients: the weights sum to 0 over all ranks", 2) end
  attn.no_grad(function()
    for _, b in ipairs(self.buckets) do
      b.buffer = b.buffer or attn.zeros({ b.numel }, b.dtype)
      local buf = b.buffer
      for i, p in ipairs(b.params) do
        local seg = buf:narrow(1, b.offsets[i] + 1, p:numel())
        if p.grad then seg:copy_(p.grad:reshape({ -1 })) else seg:zero_() end
      end
      if w ~= nil and w ~= 1 then buf:mul_(w) end
      mpi.allreduce(buf, "sum")
      if divisor and divisor ~= 1 then buf:div_(divisor) end
      for i, p in ipairs(b.params) do
        local seg = buf:narrow(1, b.offsets[i] + 1, p:numel()):reshape(p:shape())
        if p.grad then p.grad:copy_(seg) else p.grad = seg:clone() end
      end
    end
  end)
end

--- Sums per-piece numbers (a loss sum and a token count, say) over all ranks.
-- Each argument is a table from a piece's index (`micro_shards`) to this
-- rank's number for it (missing: 0). Ordered (`shards = K`): the values of the
-- K micro-shards are gathered and added in the order 1..K, the same bits for
-- any number of processes; else each table's values are added here and summed
-- over ranks as `distributed.sum_numbers`.
-- @tparam table ... one table per quantity
-- @treturn number... one sum per table
function DataParallel:sum_numbers(...)
  local tables, m = { ... }, select("#", ...)
  if m == 0 then return end
  local K = self.shards
  if not K then
    local here = {}
    for j = 1, m do
      local keys = {}
      for k in pairs(tables[j]) do keys[#keys + 1] = k end
      table.sort(keys)
      here[j] = 0
      for _, k in ipairs(keys) do here[j] = here[j] + tables[j][k] end
    end
    return distributed.sum_numbers(table.unpack(here, 1, m))
  end
  -- K slots of m numbers, this rank's filled, gathered exactly as the gradients (sync_ordered)
  local mine = {}
  for i = 1, K * m do mine[i] = 0 end
  for k = self.first_shard, self.last_shard do
    for j = 1, m do mine[(k - 1) * m + j] = 0 + (tables[j][k] or 0) end
  end
  local t = attn.tensor(mine, "float64")
  mpi.allreduce(t, "sum")
  local all = t:totable()
  local sums = {}
  for j = 1, m do
    local s = 0
    for k = 1, K do s = s + all[(k - 1) * m + j] end
    sums[j] = s
  end
  return table.unpack(sums, 1, m)
end

return distributed
