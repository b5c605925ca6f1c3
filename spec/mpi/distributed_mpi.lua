-- attn.distributed under mpirun with 1, 2 and 4 processes (`make test-mpi`; more ranks than
-- this machine's cores, hence --oversubscribe). Each size starts one job of spec/mpi/worker.lua,
-- whose ranks check their values against closed forms and one-process results and print one
-- result line per check and rank; every check must pass on every rank, and the digests of the
-- ordered reduction's runs (losses and weights) must be the one-process job's. The fault cases start
-- their own jobs under `timeout`: a rank that raises or dies must end the job, never hang.
local MPIRUN = os.getenv("ATTN_MPIRUN") or "mpirun --oversubscribe"
local LUA = os.getenv("ATTN_LUA") or "lua5.4"
local TIMEOUT = 120

local function run(np, case)
  local cmd = string.format("timeout %d %s -np %d %s spec/mpi/worker.lua %s 2>&1", TIMEOUT, MPIRUN, np, LUA, case)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local _, _, code = p:close()
  return out, code
end

-- The names of the checks, in the worker's order (one `it` each per size).
local CHECKS = {
  "collectives raise before init",
  "rank and world_size",
  "allreduce_ sum and mean, every dtype",
  "allreduce_ of a non-contiguous view",
  "broadcast_ from each root, views too",
  "mismatched shapes and dtypes are named",
  "shard covers the batch in rank order",
  "averaged shard gradients equal the full-batch gradient (float64)",
  "uneven shards weighted by tokens give the per-token mean gradient",
  "replicas are bit-identical after k Adam steps",
  "run.fit with data_parallel takes one process's steps",
  "ordered: replicas equal the one-process reference bit for bit after k steps, uneven micro-shards",
  "ordered: train_seq2seq's losses and weights",
  "ordered: run.fit's step losses and weights (accumulation 2)",
}
-- The digests of the ordered runs (losses and weights), which must be one process's bits.
local DIGESTS = { "train_seq2seq", "run.fit" }

-- The "all" job of np processes, run once: its output, status, results[check][rank] and
-- digests[name][rank].
local jobs = {}
local function job(np)
  if not jobs[np] then
    local out, code = run(np, "all")
    local j = { out = out, code = code, results = {}, digests = {} }
    for name, rank, verdict in out:gmatch("result ([^|\n]+)|(%d+)|([^\n]*)") do
      j.results[name] = j.results[name] or {}
      j.results[name][tonumber(rank)] = verdict
    end
    for name, hex, rank in out:gmatch("digest ([^ \n]+) (%x+)|(%d+)") do
      j.digests[name] = j.digests[name] or {}
      j.digests[name][tonumber(rank)] = hex
    end
    jobs[np] = j
  end
  return jobs[np]
end

for _, np in ipairs { 1, 2, 4 } do
  describe("attn.distributed with " .. np .. " process" .. (np > 1 and "es" or ""), function()
    it("the job ends with status 0", function()
      local j = job(np)
      assert.are.equal(0, j.code, j.out)
    end)

    for _, name in ipairs(CHECKS) do
      it(name .. " (every rank)", function()
        local j = job(np)
        local per_rank = j.results[name] or {}
        for r = 1, np do
          assert(per_rank[r] == "ok", string.format("rank %d: %s\n%s", r, tostring(per_rank[r] or "no result"), j.out))
        end
      end)
    end

    if np > 1 then
      for _, name in ipairs(DIGESTS) do
        it("ordered " .. name .. ": every rank has the bits of the one-process run", function()
          local one = job(1).digests[name] or {}
          local many = job(np).digests[name] or {}
          assert(one[1], "no digest from the one-process job:\n" .. job(1).out)
          for r = 1, np do
            assert(many[r] == one[1], string.format("rank %d of %d: %s, one process: %s\n%s", r, np,
              tostring(many[r]), one[1], job(np).out))
          end
        end)
      end
    end
  end)
end

describe("a failing rank ends the whole job (never hangs)", function()
  for _, np in ipairs { 2, 4 } do
    it("an error inside distributed.run aborts every rank with the message, " .. np .. " processes", function()
      local out, code = run(np, "raise_in_run")
      assert.are_not.equal(124, code, "timed out (hang):\n" .. out)
      assert.are_not.equal(0, code, out)
      assert.truthy(out:find("attn.distributed: rank 2 of " .. np .. " failed, aborting every rank", 1, true), out)
      assert.truthy(out:find("boom on purpose", 1, true), out)
    end)
    it("an uncaught error on one rank ends the job, " .. np .. " processes", function()
      local out, code = run(np, "raise")
      assert.are_not.equal(124, code, "timed out (hang):\n" .. out)
      assert.are_not.equal(0, code, out)
      assert.truthy(out:find("plain boom on purpose", 1, true), out)
    end)
  end
  it("a rank that exits without finalize ends the job", function()
    local out, code = run(2, "exit")
    assert.are_not.equal(124, code, "timed out (hang):\n" .. out)
    assert.are.equal(3, code, out) -- mpirun passes on the dead rank's status
  end)
end)
