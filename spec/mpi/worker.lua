-- One rank of the attn.distributed checks, run by spec/mpi/distributed_mpi.lua under
-- `mpirun -np N lua5.4 spec/mpi/worker.lua CASE`. CASE "all" runs every check and prints
-- one line per check and rank: "result <check> <rank> ok" or "result <check> <rank> fail <why>";
-- the other cases are the faults (a rank that raises or exits) the spec expects to end the job.
local attn = require "attn"
local dist = require "attn.distributed"
local nn = attn.nn
local train = require "attn.d2l.train"

local case = arg[1] or "all"

-- Largest absolute difference of two tensors (as float64).
local function maxdiff(a, b) return (a:to("float64") - b:to("float64")):abs():max():item() end

local function check(cond, fmt, ...)
  if not cond then error(string.format(fmt, ...), 2) end
end

local checks, order = {}, {}
local function add(name, fn)
  checks[name] = fn
  order[#order + 1] = name
end

-- Before init every collective raises (run first, before dist.init()).
local before = {}
for _, name in ipairs { "rank", "world_size", "barrier", "allreduce_", "broadcast_" } do
  local ok, err = pcall(dist[name], attn.zeros(2))
  before[#before + 1] = (not ok and tostring(err):find(name .. ": MPI is not initialised", 1, true)) and "" or name
end

dist.init()
local R, N = dist.rank(), dist.world_size()

add("collectives raise before init", function()
  check(table.concat(before) == "", "no error naming the call from: %s", table.concat(before, " "))
end)

add("rank and world_size", function()
  check(R >= 1 and R <= N, "rank %d outside 1..%d", R, N)
  check(N == tonumber(os.getenv("OMPI_COMM_WORLD_SIZE") or N), "world_size %d", N)
  check(dist.is_root() == (R == 1), "is_root")
  local total = dist.sum_numbers(R)
  check(total == N * (N + 1) / 2, "sum of ranks %s", total)
end)

-- t[i][j] = rank * (10 i + j): the sum is (10 i + j) N (N + 1) / 2, the mean (10 i + j) (N + 1) / 2.
local function ramp(rows, cols, dtype, scale)
  local t = {}
  for i = 1, rows do
    t[i] = {}
    for j = 1, cols do t[i][j] = scale * (10 * i + j) end
  end
  return attn.tensor(t, dtype)
end

add("allreduce_ sum and mean, every dtype", function()
  for _, dt in ipairs { "float32", "float64", "int64" } do
    local t = ramp(3, 4, dt, R)
    dist.allreduce_(t, "sum")
    check(maxdiff(t, ramp(3, 4, "float64", N * (N + 1) // 2)) == 0, "%s sum", dt)
    check(t:dtype() == dt, "dtype kept")
    if dt ~= "int64" then
      local m = ramp(3, 4, dt, R)
      dist.allreduce_(m, "mean")
      check(maxdiff(m, ramp(3, 4, "float64", (N + 1) / 2)) < 1e-5, "%s mean", dt)
    end
  end
  local ok, err = pcall(dist.allreduce_, attn.zeros({ 2 }, "int64"), "mean")
  check(not ok and err:find("int64", 1, true), "int64 mean must raise")
end)

add("allreduce_ of a non-contiguous view", function()
  for _, dt in ipairs { "float64", "int64" } do
    local base = ramp(4, 6, dt, R)
    local view = base:narrow(2, 2, 3):transpose(1, 2) -- (3, 4), strided
    dist.allreduce_(view, "sum")
    local v = base:totable()
    for i = 1, 4 do
      for j = 1, 6 do
        local want = (j >= 2 and j <= 4) and (10 * i + j) * N * (N + 1) // 2 or R * (10 * i + j)
        check(v[i][j] == want, "%s view: [%d][%d] = %s, want %s", dt, i, j, v[i][j], want)
      end
    end
  end
end)

add("broadcast_ from each root, views too", function()
  for root = 1, N do
    local t = ramp(2, 3, "float32", R)
    dist.broadcast_(t, root)
    check(maxdiff(t, ramp(2, 3, "float32", root)) == 0, "root %d", root)
    local base = ramp(3, 3, "float64", R)
    dist.broadcast_(base:t(), root)
    check(maxdiff(base, ramp(3, 3, "float64", root)) == 0, "root %d, transposed view", root)
  end
  local ok, err = pcall(dist.broadcast_, attn.zeros(2), N + 1)
  check(not ok and err:find("root must be a rank in 1..", 1, true), "root out of range: %s", tostring(err))
end)

add("mismatched shapes and dtypes are named", function()
  local ok, err = pcall(dist.allreduce_, attn.zeros({ 2, R }, "float64"))
  if N == 1 then
    check(ok, "one rank cannot mismatch: %s", tostring(err))
  else
    check(not ok and err:find("allreduce_: tensors differ across ranks", 1, true), "shape: %s", tostring(err))
    check(err:find("rank 1 float64 (2, 1)", 1, true) and err:find("rank 2 float64 (2, 2)", 1, true), "%s", err)
  end
  ok, err = pcall(dist.broadcast_, attn.zeros({ 3 }, R == 1 and "float32" or "float64"))
  if N > 1 then
    check(not ok and err:find("rank 1 float32 (3), rank 2 float64 (3)", 1, true), "dtype: %s", tostring(err))
  end
  -- every rank raised alike, so the next collective still works
  check(dist.sum_numbers(1) == N, "collectives after a mismatch")
end)

add("shard covers the batch in rank order", function()
  for _, n in ipairs { 0, 1, 3, 7, 8, 10, 64 } do
    local nextrow, sizes = 1, {}
    for r = 1, N do
      local first, last = dist.shard(n, r, N)
      check(first == nextrow, "n %d rank %d starts at %d", n, r, first)
      sizes[r] = last - first + 1
      nextrow = last + 1
    end
    check(nextrow == n + 1, "n %d covered up to %d", n, nextrow - 1)
    for r = 1, N do check(sizes[r] == n // N + (r <= n % N and 1 or 0), "n %d rank %d size %d", n, r, sizes[r]) end
    local f, l = dist.shard(n)
    check(select(1, dist.shard(n, R, N)) == f and select(2, dist.shard(n, R, N)) == l, "default rank")
  end
end)

-- A float64 Transformer encoder-decoder (dropout 0), seeded differently per rank so the
-- broadcast has work to do; the data is the same on every rank (seed 7).
local VOCAB, STEPS = 11, 5
local function transformer()
  attn.manual_seed(100 + R)
  local enc = nn.TransformerEncoder(VOCAB, 8, 8, 8, 8, { 8 }, 8, 16, 2, 1, 0)
  local dec = nn.TransformerDecoder(VOCAB, 8, 8, 8, 8, { 8 }, 8, 16, 2, 1, 0)
  return nn.EncoderDecoder(enc, dec):to("float64")
end

local function batch(B)
  attn.manual_seed(7)
  local X = attn.randint(1, VOCAB + 1, { B, STEPS }, "int64")
  local Y = attn.randint(1, VOCAB + 1, { B, STEPS }, "int64")
  local xl = attn.randint(1, STEPS + 1, { B }, "int64")
  local yl = attn.randint(1, STEPS + 1, { B }, "int64")
  return X, xl, Y, yl
end

-- Sum over rows first..last of the per-sequence masked cross-entropy.
local ce = nn.MaskedSoftmaxCELoss()
local function seq_loss(net, X, xl, Y, yl, first, last)
  local n = last - first + 1
  X, xl, Y, yl = X:narrow(1, first, n), xl:narrow(1, first, n), Y:narrow(1, first, n), yl:narrow(1, first, n)
  return ce(net(X, Y, xl), Y, yl):sum()
end

local function grads(net)
  local g = {}
  for i, p in ipairs(net:parameters()) do g[i] = p.grad and p.grad:clone() or attn.zeros_like(p) end
  return g
end

local function worst(ga, gb)
  local w = 0
  for i = 1, #ga do w = math.max(w, maxdiff(ga[i], gb[i])) end
  return w
end

add("averaged shard gradients equal the full-batch gradient (float64)", function()
  local B = 8 -- divisible by 1, 2 and 4: equal shards, plain mean
  local net = transformer()
  local dp = dist.DataParallel(net, { bucket_mb = 0.002 }) -- small buckets: several allreduces
  local X, xl, Y, yl = batch(B)
  net:zero_grad()
  seq_loss(net, X, xl, Y, yl, 1, B):div(B):backward() -- full batch, on every rank
  local full = grads(net)
  net:zero_grad()
  local first, last = dp:shard(B)
  seq_loss(net, X, xl, Y, yl, first, last):div(last - first + 1):backward()
  dp:sync_gradients()
  check(#dp.buckets > 1, "expected several buckets, got %d", #dp.buckets)
  local w = worst(grads(net), full)
  check(w < 1e-12, "max gradient difference %g", w)
end)

add("uneven shards weighted by tokens give the per-token mean gradient", function()
  for _, B in ipairs { 7, 3 } do -- 7 over 4 ranks: 2, 2, 2, 1; 3 over 4: one rank has none
    local net = transformer()
    local dp = dist.DataParallel(net)
    local X, xl, Y, yl = batch(B)
    local tokens = yl:sum():item()
    net:zero_grad()
    seq_loss(net, X, xl, Y, yl, 1, B):div(tokens):backward()
    local full = grads(net)
    net:zero_grad()
    local first, last = dp:shard(B)
    local local_tokens = 0
    if last >= first then
      local_tokens = yl:narrow(1, first, last - first + 1):sum():item()
      seq_loss(net, X, xl, Y, yl, first, last):div(local_tokens):backward()
    end
    dp:sync_gradients({ weight = local_tokens })
    local w = worst(grads(net), full)
    check(w < 1e-12, "B %d: max gradient difference %g", B, w)
  end
end)

add("replicas are bit-identical after k Adam steps", function()
  local net = transformer():to("float32")
  local dp = dist.DataParallel(net)
  local opt = attn.optim.Adam { params = net:parameters(), lr = 0.01 }
  local X, xl, Y, yl = batch(6)
  for _ = 1, 4 do
    opt:zero_grad()
    local first, last = dp:shard(6)
    if last >= first then seq_loss(net, X, xl, Y, yl, first, last):backward() end
    dp:sync_gradients({ op = "sum" })
    nn.clip_grad_norm(net:parameters(), 1)
    opt:step()
  end
  for _, list in ipairs { net:named_parameters(), net:named_buffers() } do
    for _, e in ipairs(list) do
      local root = e[2]:clone()
      dist.broadcast_(root, 1)
      check(maxdiff(root, e[2]) == 0, "%s differs from rank 1's", e[1])
    end
  end
end)

-- attn.d2l.run's fit with data_parallel: the step losses and the weights of N ranks are one
-- process's (float64, dropout 0; batches of 16 rows over 1, 2 or 4 ranks, accumulation 2).
add("run.fit with data_parallel takes one process's steps", function()
  local data = require "attn.d2l.data"
  local run = require "attn.d2l.run"
  local function fit(dp_on)
    local c = assert(data.load_corpus(16, 6, { num_examples = 80, seed = 3, valid = 8 }))
    attn.manual_seed(11)
    local h = 8
    local net = nn.EncoderDecoder(nn.TransformerEncoder(#c.src_vocab, h, h, h, h, { h }, h, 16, 2, 1, 0),
      nn.TransformerDecoder(#c.tgt_vocab, h, h, h, h, { h }, h, 16, 2, 1, 0)):to("float64")
    local r = run.fit(net, c, { lr = 0.01, epochs = 2, accum = 2, progress = false, log = function() end,
      data_parallel = dp_on and dist.DataParallel(net, { broadcast = false }) or nil })
    return r, net
  end
  local one, net1 = fit(false)
  local many, netn = fit(true)
  check(#one.steps == #many.steps and #one.steps > 2, "%d steps, %d with data_parallel", #one.steps, #many.steps)
  for i = 1, #one.steps do
    check(math.abs(one.steps[i] - many.steps[i]) < 1e-9, "step %d: %.17g vs %.17g", i, one.steps[i], many.steps[i])
  end
  check(one.epochs[2].tokens == many.epochs[2].tokens, "tokens %d vs %d", one.epochs[2].tokens, many.epochs[2].tokens)
  local p1, pn = net1:parameters(), netn:parameters()
  local w = 0
  for i = 1, #p1 do w = math.max(w, maxdiff(p1[i], pn[i])) end
  check(w < 1e-9, "max weight difference %g", w)
  check((many.best ~= nil) == (R == 1), "only rank 1 validates (best %s)", tostring(many.best))
end)

-- ---------------------------------------------------------------- the ordered reduction

-- One Adam + clipping step computed as one process would under the ordered reduction, written
-- out independently of DataParallel: micro-shard k's gradient (rows shard(B, k, K)) alone,
-- added into a zero accumulator in the order 1..K.
local function reference_step(net, opt, X, xl, Y, yl, K)
  local params = net:parameters()
  local acc = {}
  for i, p in ipairs(params) do acc[i] = attn.zeros_like(p) end
  for k = 1, K do
    local first, last = dist.shard(X:size(1), k, K)
    if last >= first then
      net:zero_grad()
      seq_loss(net, X, xl, Y, yl, first, last):backward()
      for i, p in ipairs(params) do
        if p.grad then attn.no_grad(function() acc[i]:add_(p.grad) end) end
      end
    end
  end
  for i, p in ipairs(params) do p.grad = acc[i] end
  nn.clip_grad_norm(params, 1)
  opt:step()
end

-- The same step through DataParallel with shards = K, on this rank's micro-shards.
local function ordered_step(dp, opt, X, xl, Y, yl)
  opt:zero_grad()
  for _, pc in ipairs(dp:micro_shards(X:size(1))) do
    seq_loss(dp.module, X, xl, Y, yl, pc.first, pc.last):backward()
    dp:stash_gradients(pc.index)
  end
  dp:sync_gradients({ op = "sum" })
  nn.clip_grad_norm(dp.module:parameters(), 1)
  opt:step()
end

add("ordered: replicas equal the one-process reference bit for bit after k steps, uneven micro-shards", function()
  -- 7 rows in 3 micro-shards (3, 2, 2 rows; on 2 ranks 2 + 1 micro-shards, on 4 one rank idle);
  -- 2 rows in 3 micro-shards (one empty)
  for _, c in ipairs { { B = 7, K = 3 }, { B = 2, K = 3 }, { B = 8, K = 4 } } do
    local X, xl, Y, yl = batch(c.B)
    local ref = transformer():to("float32")
    dist.DataParallel(ref) -- rank 1's weights on every rank
    local net = transformer():to("float32")
    net:load_state_dict(ref:state_dict())
    local dp = dist.DataParallel(net, { shards = c.K, bucket_mb = 0.002 })
    local opt_ref = attn.optim.Adam { params = ref:parameters(), lr = 0.01 }
    local opt = attn.optim.Adam { params = net:parameters(), lr = 0.01 }
    for _ = 1, 3 do
      reference_step(ref, opt_ref, X, xl, Y, yl, c.K)
      ordered_step(dp, opt, X, xl, Y, yl)
    end
    -- every rank runs every collective before any raises (a rank raising alone would hang the rest)
    local pr, pn = ref:parameters(), net:parameters()
    local to_ref, to_root = 0, 0
    for i = 1, #pr do
      to_ref = math.max(to_ref, maxdiff(pr[i], pn[i]))
      local root = pn[i]:clone()
      dist.broadcast_(root, 1)
      to_root = math.max(to_root, maxdiff(root, pn[i]))
    end
    local worst_anywhere = dist.sum_numbers(to_ref + to_root) -- so that every rank raises alike
    check(worst_anywhere == 0, "B %d K %d: weights differ from the one-process reference by %g, from " ..
      "rank 1's by %g", c.B, c.K, to_ref, to_root)
  end
  local dp = dist.DataParallel(transformer(), { shards = 2 * N })
  local ok, err = pcall(dp.stash_gradients, dp, 2 * N + 1)
  check(not ok and err:find("is not one of this rank's", 1, true), "a foreign micro-shard: %s", tostring(err))
  ok, err = pcall(dp.sync_gradients, dp)
  check(not ok and err:find("the ordered reduction (shards) sums", 1, true), "op mean: %s", tostring(err))
end)

-- Digests, compared across the 1-, 2- and 4-process jobs by the spec: FNV-1a over the bytes of
-- every number (losses as float64, weights in their dtype), so equal digests mean equal bits.
local function fnv(h, bytes)
  for i = 1, #bytes do h = ((h ~ bytes:byte(i)) * 16777619) & 0xffffffff end
  return h
end
local function digest(numbers, net)
  local h = 2166136261
  for _, x in ipairs(numbers) do h = fnv(h, string.pack("<d", x)) end
  for _, p in ipairs(net:parameters()) do
    local fmt = p:dtype() == "float32" and "<f" or "<d"
    for _, x in ipairs(p:reshape({ -1 }):totable()) do h = fnv(h, string.pack(fmt, x)) end
  end
  return string.format("%08x", h)
end
local digests = {}

add("ordered: train_seq2seq's losses and weights", function()
  local batches = { table.pack(batch(7)), table.pack(batch(5)) }
  local function data_iter()
    local i = 0
    return function()
      i = i + 1
      local b = batches[i]
      if b then return b[1], b[2], b[3], b[4] end -- X, X_valid_len, Y, Y_valid_len
    end
  end
  local net = transformer():to("float32")
  attn.manual_seed(9)
  local history = train.train_seq2seq(net, data_iter, { lr = 0.01, epochs = 3, tgt_vocab = { ["<bos>"] = 1 },
    progress = false, data_parallel = dist.DataParallel(net, { shards = 3, broadcast = false }) })
  local losses = {}
  for i, rec in ipairs(history) do losses[2 * i - 1], losses[2 * i] = rec.loss, rec.tokens end
  digests[#digests + 1] = "train_seq2seq " .. digest(losses, net)
end)

add("ordered: run.fit's step losses and weights (accumulation 2)", function()
  local data = require "attn.d2l.data"
  local run = require "attn.d2l.run"
  local c = assert(data.load_corpus(10, 6, { num_examples = 60, seed = 3 }))
  attn.manual_seed(11)
  local h = 8
  local net = nn.EncoderDecoder(nn.TransformerEncoder(#c.src_vocab, h, h, h, h, { h }, h, 16, 2, 1, 0),
    nn.TransformerDecoder(#c.tgt_vocab, h, h, h, h, { h }, h, 16, 2, 1, 0))
  local r = run.fit(net, c, { lr = 0.01, epochs = 2, accum = 2, progress = false, log = function() end,
    data_parallel = dist.DataParallel(net, { shards = 4, broadcast = false }) })
  check(#r.steps > 2, "%d steps", #r.steps)
  digests[#digests + 1] = "run.fit " .. digest(r.steps, net)
end)

if case == "all" then
  for _, name in ipairs(order) do
    local ok, err = pcall(checks[name])
    local line = ok and "ok" or ("fail " .. tostring(err):gsub("\n", " "))
    io.write(string.format("result %s|%d|%s\n", name, R, line))
    io.stdout:flush()
  end
  for _, d in ipairs(digests) do io.write(string.format("digest %s|%d\n", d, R)) end
  dist.finalize()
elseif case == "raise_in_run" then
  -- rank 2 (or the only rank) raises while the others wait in an allreduce
  dist.run(function()
    if R == math.min(2, N) then error("boom on purpose") end
    dist.allreduce_(attn.zeros(4))
  end)
  dist.finalize()
elseif case == "raise" then
  -- the same without dist.run: Lua exits with status 1 and mpirun ends the job
  if R == math.min(2, N) then error("plain boom on purpose") end
  dist.allreduce_(attn.zeros(4))
  dist.finalize()
elseif case == "exit" then
  if R == N then os.exit(3) end -- dies without finalize
  dist.allreduce_(attn.zeros(4))
  dist.finalize()
end
