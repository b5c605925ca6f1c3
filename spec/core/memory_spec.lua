local attn = require "attn"
local helper = require "helper"

-- Memory is known to the Lua GC, and storage comes from a caching allocator.
describe("memory", function()
  it("stays bounded over 20,000 temporary 1 MB tensors", function()
    collectgarbage()
    local live0 = attn.memory()
    local rss0 = helper.rss_bytes()
    local peak_live, peak_rss = 0, 0
    local side = 512 -- 512 x 512 float32 = 1 MiB
    for i = 1, 20000 do
      local t = attn.empty({ side, side })
      t:fill_(i)
      if i % 500 == 0 then
        local live = attn.memory()
        if live > peak_live then peak_live = live end
        local rss = helper.rss_bytes()
        if rss > peak_rss then peak_rss = rss end
      end
    end
    collectgarbage()
    local live_growth = (peak_live - live0) / 2 ^ 20
    local rss_growth = (peak_rss - rss0) / 2 ^ 20
    print(string.format("\n    memory spec: 20000 x 1 MiB tensors: peak live growth %.0f MiB, peak RSS growth %.0f MiB",
      live_growth, rss_growth))
    -- without GC pressure this loop would hold ~20 GB; the collector keeps it to a few hundred MiB at most
    assert.is_true(live_growth < 512, "live tensor memory grew by " .. live_growth .. " MiB")
    assert.is_true(rss_growth < 1024, "RSS grew by " .. rss_growth .. " MiB")
    assert.is_true(attn.memory() - live0 < 2 ^ 20 * 4)
  end)

  it("reuses freed blocks so a repeated operation stops paying page faults", function()
    if helper.sanitized then
      pending("AddressSanitizer's allocator replaces the cache's reuse behaviour")
      return
    end
    local a = attn.randn({ 256, 256 })
    local function step()
      local x = a:matmul(a) -- 256 KiB outputs
      local y = (x * 2):softmax(2)
      return y:sum():item()
    end
    for _ = 1, 3 do step() end
    collectgarbage()
    collectgarbage()
    local before = helper.minor_faults()
    for _ = 1, 50 do
      step()
      collectgarbage("step", 0)
    end
    local faults = helper.minor_faults() - before
    print(string.format("\n    page-fault spec: 50 repeats after warm-up: %d minor faults (%d KiB fresh if each were new)",
      faults, 50 * 3 * 256))
    -- each repeat allocates 3 x 256 KiB = 192 pages; fresh memory would fault ~9,600 times
    assert.is_true(faults < 500, faults .. " minor faults")
  end)

  it("gives cached memory back on empty_cache", function()
    -- the cache holds at most twice the most bytes ever live at once, so a
    -- second 4 MiB block stays live while the first is freed: its bytes fit the bound
    local keep = attn.empty({ 1024, 1024 })
    do
      local _ = attn.empty({ 1024, 1024 })
    end
    collectgarbage()
    collectgarbage()
    local _, cached = attn.memory()
    assert.is_true(cached >= 4 * 2 ^ 20, cached .. " bytes cached")
    keep:free()
    attn.empty_cache()
    local _, after = attn.memory()
    assert.are.equal(0, after)
  end)

  it("gives the Lua state's cached blocks back when the state closes (valgrind: nothing lost)", function()
    -- the binding caches the blocks Lua frees (src/bind/lcore.c, cached_alloc); closing the state must
    -- return every one to the allocator it wrapped. Not under the sanitizers (no cache there, and
    -- valgrind cannot run an ASan build) or an emulated interpreter.
    if helper.sanitized or os.getenv("ATTN_LUA") or not os.execute("command -v valgrind > /dev/null") then
      pending("needs valgrind and the plain build")
      return
    end
    local ok, kind, code, out = helper.run_lua([[
      local attn = require "attn"
      local x = attn.randn({ 4, 4 }, { requires_grad = true })
      for _ = 1, 2000 do (x:tanh() * 2):sum():backward() end
      collectgarbage()
      for _ = 1, 2000 do local _ = { x * 1, {}, function() return x end } end
      os.exit(0, true) -- closes the state
    ]], { prefix = "OPENBLAS_NUM_THREADS=1 valgrind -q --leak-check=full --errors-for-leak-kinds=definite "
      .. "--error-exitcode=3" })
    assert.is_true(ok, string.format("%s %s:\n%s", tostring(kind), tostring(code), out))
  end)

  -- fused Adam allocates nothing and the composed one frees its temporaries
  -- at once: the pacing counts held bytes, so neither mix changes the bound
  for _, fused in ipairs { true, false } do
    it("is the same whatever the size of the Lua heap (0, 40, 100 MiB of Lua data), fused = " .. tostring(fused),
      function()
      if helper.sanitized then
        pending("AddressSanitizer's quarantine keeps freed blocks resident")
        return
      end
      -- a training loop in a child process with `mib` MiB of unrelated Lua
      -- strings alive; the RSS it adds must not depend on them
      local function growth(mib)
        local ok, _, _, out = helper.run_lua(string.format([[
          local attn = require "attn"
          local helper = require "helper"
          local data, chunk = {}, string.rep("x", 1000)
          for i = 1, %d * 1024 do data[i] = chunk .. i end
          collectgarbage()
          local base = helper.rss_bytes()
          attn.manual_seed(1)
          local model = attn.nn.Sequential(attn.nn.Linear(256, 512), attn.nn.ReLU(), attn.nn.Linear(512, 256))
          local opt = attn.optim.Adam({params = model:parameters(), lr = 1e-3, fused = %s})
          local x, y = attn.randn({128, 256}), attn.randn({128, 256})
          local peak = base
          for i = 1, 60 do
            opt:zero_grad()
            local loss = ((model(x) - y) ^ 2):mean()
            loss:backward()
            opt:step()
            if i %% 5 == 0 then peak = math.max(peak, helper.rss_bytes()) end
          end
          print("growth", peak - base, #data)
        ]], mib, fused))
        assert.is_true(ok, out)
        return tonumber(out:match("growth%s+(%d+)")) / 2 ^ 20
      end
      local g = { growth(0), growth(40), growth(100) }
      print(string.format("\n    memory spec: RSS growth of a training loop (fused %s) with 0/40/100 MiB of Lua data: "
        .. "%.1f/%.1f/%.1f MiB", fused, g[1], g[2], g[3]))
      local lo, hi = math.min(g[1], g[2], g[3]), math.max(g[1], g[2], g[3])
      assert.is_true(hi - lo < 6, "growths differ by " .. (hi - lo) .. " MiB")
      assert.is_true(hi < 48, "a loop with ~3 MiB of live tensors grew by " .. hi .. " MiB")
    end)
  end
end)
