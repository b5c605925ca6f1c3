-- Which build of the C module the suite runs against: `make test-asan` sets
-- ATTN_SANITIZED=1 and must load build/asan/attn/core.so, never the plain
-- lua/attn/core.so that busted's own cpath would find first.
describe("the loaded C module", function()
  local core = require "attn.core"
  local found = package.searchpath("attn.core", package.cpath)

  if os.getenv("ATTN_SANITIZED") == "1" then
    it("is the ASan+UBSan build under make test-asan", function()
      assert.equals("build/asan/attn/core.so", found)
      assert.is_true(core.sanitized)
    end)
  else
    it("is the plain build under make test", function()
      -- a cross build (make check-aarch64) names its own
      assert.equals(os.getenv("ATTN_SPEC_MODULE") or "lua/attn/core.so", found)
      assert.is_false(core.sanitized)
    end)
  end
end)
