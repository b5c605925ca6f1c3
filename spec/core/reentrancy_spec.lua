-- No Lua code (finalizers, metamethods) may run between a binding call taking
-- its operands' pointers and the end of its kernel; a free requested by a
-- finalizer that runs inside a call waits until the call has returned. Each
-- case runs in a child process, so a crash fails the spec, not the suite.
local helper = require "helper"

local function assert_runs(source)
  local ok, kind, code, out = helper.run_lua(source)
  assert.is_true(ok, string.format("child ended by %s %s:\n%s", tostring(kind), tostring(code), out))
  assert.matches("done", out)
end

describe("Lua code inside binding calls", function()
  it("a pending finalizer that frees an operand of a matmul waits for the kernel", function()
    assert_runs([[
      local attn = require "attn"
      local h = require "helper"
      local ran_inside = 0
      for trial = 1, 8 do
        -- the 20 MiB result takes the tensor bytes held past the pacing's
        -- bound (8 MiB above the few live ones), so the call ends with a
        -- full collection, which runs the pending finalizers
        local a, b = attn.randn({2560, 32}), attn.randn({32, 2048})
        local head = a:narrow(1, 1, 8):clone():matmul(b:clone())
        local tail = a:narrow(1, 2553, 8):clone():matmul(b:clone())
        local inside, ran = false, 0
        for _ = 1, 2000 do
          setmetatable({}, {__gc = function()
            ran = ran + 1
            if inside then ran_inside = ran_inside + 1; a:free() end
          end})
        end
        inside = true
        local c = attn.core.matmul(a, b)
        inside = false
        assert(h.compare(c:narrow(1, 1, 8), head, {atol = 1e-3}), "wrong product in trial " .. trial)
        assert(h.compare(c:narrow(1, 2553, 8), tail, {atol = 1e-3}), "wrong product in trial " .. trial)
      end
      assert(ran_inside > 0, "no finalizer ran inside matmul: the case was not exercised")
      print("done")
    ]])
  end)

  it("a free requested by a finalizer takes effect when the next binding call returns", function()
    assert_runs([[
      local attn = require "attn"
      local a = attn.randn({512, 512})
      setmetatable({}, {__gc = function() a:free() end})
      collectgarbage()
      local live = attn.memory()
      assert(live >= 512 * 512 * 4, "freed too early")
      assert(attn.memory() == live - 512 * 512 * 4, "not freed after the call")
      local ok, err = pcall(function() return a + 1 end)
      assert(not ok and err:find("use of freed tensor"), tostring(err))
      print("done")
    ]])
  end)

  it("options are read without metamethods: an __index that frees q is never called", function()
    assert_runs([[
      local attn = require "attn"
      local h = require "helper"
      local core = attn.core
      local q, k, v = attn.randn({2, 3, 4}), attn.randn({2, 5, 4}), attn.randn({2, 5, 6})
      local expected = core.sdpa_forward(q, k, v, {})
      local called = false
      local opts = setmetatable({}, {__index = function() called = true; q:free() end})
      local out = core.sdpa_forward(q, k, v, opts)
      assert(not called, "__index ran")
      assert(h.compare(out, expected), "different output")
      print("done")
    ]])
  end)

  it("set_ refuses to run inside a finalizer", function()
    assert_runs([[
      local attn = require "attn"
      local a, b = attn.randn({64, 64}), attn.randn({2, 2})
      local err
      setmetatable({}, {__gc = function() err = select(2, pcall(a.set_, a, b)) end})
      collectgarbage()
      assert(err and err:find("finalizer"), tostring(err))
      assert(a:shape()[1] == 64)
      print("done")
    ]])
  end)
end)
