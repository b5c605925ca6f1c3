-- attn.distributed on one machine: the allreduce of a model's gradients (MB/s) and the book's
-- Transformer training step (examples/transformer.lua's model, global batch 64 x 10 steps,
-- float32, dropout 0) at 1 process x 2 threads against 2 processes x 1 thread, each with the
-- allreduce of every rank's rows and with the ordered reduction over 4 micro-shards (DataParallel's
-- `shards`), their steps interleaved in one job so that the machine's load hits both alike.
-- Run:
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" lua5.4 bench/mpi_bench.lua
-- which starts the mpirun jobs itself (MPIRUN: the mpirun command, default "mpirun --oversubscribe";
-- BATCH: the global batch of the step rows, default 64 as the book; STEPS: timed steps, default 20).
-- Wall time (MPI_Wtime), median of the timed repetitions after warm-up; the machine may be shared,
-- so compare rows of one run.
local MPIRUN = os.getenv("MPIRUN") or "mpirun --oversubscribe"
local LUA = os.getenv("ATTN_LUA") or "lua5.4"
local STEPS = tonumber(os.getenv("STEPS") or 20)

local function median(xs)
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end

if arg[1] ~= "--worker" then
  local function job(np, threads, what)
    local cmd = string.format("%s -np %d env OPENBLAS_NUM_THREADS=1 %s bench/mpi_bench.lua --worker %s %d 2>&1", MPIRUN,
      np, LUA, what, threads)
    local p = assert(io.popen(cmd))
    local out = p:read("a")
    p:close()
    return out
  end
  print("attn.distributed bench (one machine; wall time, median; other work on the machine shows in the numbers)")
  io.write(job(2, 1, "allreduce"))
  local one = job(1, 2, "step")
  local two = job(2, 1, "step")
  io.write(one, two)
  local t1, t2 = tonumber(one:match("allreduce: ms ([%d.]+)")), tonumber(two:match("allreduce: ms ([%d.]+)"))
  if t1 and t2 then print(string.format("speed-up of 2 processes x 1 thread over 1 process x 2 threads: %.2fx", t1 / t2)) end
  os.exit(0)
end

local attn = require "attn"
local dist = require "attn.distributed"
local nn = attn.nn
local what, threads = arg[2], tonumber(arg[3])
attn.set_num_threads(threads)
dist.init()
local R, N = dist.rank(), dist.world_size()

-- examples/transformer.lua's model with the sample's vocabularies (184 and 201 tokens)
attn.manual_seed(0)
local enc = nn.TransformerEncoder(184, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0)
local dec = nn.TransformerDecoder(201, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0)
local net = nn.EncoderDecoder(enc, dec)
local dp = dist.DataParallel(net)

-- Median wall times of the functions, called in turn reps times after 3 warm-up rounds.
local function timed(reps, ...)
  local fns, ts = { ... }, {}
  for j = 1, #fns do ts[j] = {} end
  for i = 1, reps + 3 do
    for j, fn in ipairs(fns) do
      dist.barrier()
      local t0 = require("attn.mpi").wtime()
      fn()
      dist.barrier() -- the slowest rank's time is the step's
      local t = require("attn.mpi").wtime() - t0
      if i > 3 then ts[j][#ts[j] + 1] = t end
    end
  end
  for j = 1, #fns do ts[j] = median(ts[j]) end
  return table.unpack(ts, 1, #fns)
end

if what == "allreduce" then
  local numel = 0
  for _, p in ipairs(net:parameters()) do
    p.grad = attn.randn(p:shape())
    numel = numel + p:numel()
  end
  local mb = numel * 4 / 1e6
  local t = timed(50, function() dp:sync_gradients() end)
  local big = attn.randn({ 25 * 1024 * 1024 // 4 })
  local tb = timed(10, function() dist.allreduce_(big, "sum") end)
  if R == 1 then
    print(string.format("allreduce of the Transformer's gradients (%d floats, %.2f MB), %d ranks: %.3f ms, %.0f MB/s",
      numel, mb, N, t * 1e3, mb / t))
    print(string.format("allreduce of one 25 MiB float32 bucket, %d ranks: %.2f ms, %.0f MB/s", N, tb * 1e3,
      25 * 1.048576 / tb))
  end
else
  attn.manual_seed(1)
  local B, T = tonumber(os.getenv("BATCH") or 64), 10
  local X = attn.randint(1, 185, { B, T }, "int64")
  local Y = attn.randint(1, 202, { B, T }, "int64")
  local xl = attn.randint(1, T + 1, { B }, "int64")
  local yl = attn.randint(1, T + 1, { B }, "int64")
  local loss = nn.MaskedSoftmaxCELoss()
  local opt = attn.optim.Adam { params = net:parameters(), lr = 0.005 }
  -- one step of the wrapper w: this rank's pieces of the batch (its rows, or its micro-shards)
  local function step(w)
    local pieces = {}
    for i, pc in ipairs(w:micro_shards(B)) do
      local n = pc.last - pc.first + 1
      pieces[i] = { pc.index, X:narrow(1, pc.first, n), Y:narrow(1, pc.first, n), xl:narrow(1, pc.first, n),
        yl:narrow(1, pc.first, n) }
    end
    return function()
      opt:zero_grad()
      for _, pc in ipairs(pieces) do
        loss(net(pc[2], pc[3], pc[4]), pc[3], pc[5]):sum():backward()
        w:stash_gradients(pc[1])
      end
      w:sync_gradients({ op = "sum" })
      nn.clip_grad_norm(net:parameters(), 1)
      opt:step()
    end
  end
  local ordered = dist.DataParallel(net, { shards = 4, broadcast = false })
  local t, u = timed(STEPS, step(dp), step(ordered))
  if R == 1 then
    local who = string.format("%d process%s x %d thread%s", N, N > 1 and "es" or "", threads, threads > 1 and "s" or "")
    print(string.format("Transformer step (batch %d x 10), %s, allreduce: ms %.2f", B, who, t * 1e3))
    print(string.format("Transformer step (batch %d x 10), %s, ordered over 4 micro-shards: ms %.2f (%.2fx)", B, who,
      u * 1e3, u / t))
  end
end
dist.finalize()
