-- Arguments that used to crash, hang, print or overflow: each now gives the
-- defined answer or a clean error (issue 10, defects 5 to 8).
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn

describe("hostile arguments", function()
  it("empty shapes whose other dims are huge do not overflow strides or numel", function()
    local maxint = math.maxinteger
    local z = attn.zeros({ 0, maxint, maxint })
    assert.are.equal(0, z:numel())
    assert.are.equal(0, attn.empty({ 1 << 62, 4, 0 }):numel())
    local h = attn.zeros({ 2 ^ 62, 4, 0 }) -- built, and usable like any empty tensor
    assert.are.same({ 1 << 62, 4, 0 }, (h + 1):shape())
    assert.are.same({ 1 << 62, 8, 0 }, attn.cat({ h, h }, 2):shape())
    assert.are.same({ 4, 0 }, h:sum(1):shape())
    assert.are.same({ 4, 1 << 62, 0 }, h:transpose(1, 2):contiguous():shape())
    -- softmax rows of length 2^62 when there are none (make fuzz, seed 4242: signed overflow)
    local rows = attn.zeros({ 0, 1 << 62 }, "float64")
    assert.are.same({ 0, 1 << 62 }, rows:log_softmax(-1):shape())
    assert.are.same({ 0, 1 << 62 }, rows:softmax(2):shape())
    -- repeating 2^62 empty rows 4 times would need 2^64 rows (make fuzz, seed 20261122: signed overflow)
    local core = require "attn.core"
    local ok, err = pcall(core.repeat_rows, attn.zeros({ 1 << 62, 0 }), 4)
    assert.is_false(ok)
    assert.matches("repeat_interleave: [4611686018427387904x0] repeated 4 times does not fit", err, 1, true)
    assert.are.same({ 1 << 61, 0 }, core.repeat_rows(attn.zeros({ 1 << 60, 0 }), 2):shape())
    -- and the head moves' B*H and H*dh (make fuzz, seed 20261122)
    ok, err = pcall(core.split_heads, attn.zeros({ 4, 4, 0 }), 1 << 62)
    assert.is_false(ok)
    assert.matches("split_heads: X [4x4x0] with num_heads 4611686018427387904 gives a dim past 2^63 - 1", err, 1, true)
    ok, err = pcall(core.merge_heads, attn.zeros({ 0, 3, 1 << 62 }), 4)
    assert.is_false(ok)
    assert.matches("merge_heads: X [0x3x4611686018427387904] with num_heads 4 gives a dim past 2^63 - 1", err, 1, true)
    assert.are.same({ 0, 1 << 62, 1 << 60 }, core.split_heads(attn.zeros({ 0, 1 << 62, 1 << 62 }), 4):shape())
  end)

  it("a reduction over a row of 2^63 - 1 entries sizes its work split without overflowing (make fuzz, seed 20261122)",
    function()
      -- attn_iter_run_cost multiplied the row length into the split's size: UBSan's signed overflow
      local huge = attn.ones(1):expand(math.maxinteger)
      assert.are.equal(2.0 ^ 63, huge:sum(-1):item())
      assert.are.equal(2.0 ^ 63, huge:sum(1, "int64"):item())
    end)

  it("split and chunk size their pieces first: a view of 2^63 - 1 entries is refused at once (make fuzz, seed 31337)",
    function()
      local huge = attn.zeros(1):expand(math.maxinteger)
      local ok, err = pcall(huge.chunk, huge, math.maxinteger)
      assert.is_false(ok)
      assert.matches("split: 9223372036854775807 pieces of dim 1 of [9223372036854775807] are more than memory", err, 1,
        true)
      assert.is_false((pcall(huge.split, huge, 1)))
      -- chunk's ceil(size / n) near 2^63: 2 pieces, no overflow
      local parts = huge:chunk(2)
      assert.are.equal(2, #parts)
      assert.are.same({ (math.maxinteger >> 1) + 1 }, parts[1]:shape())
      assert.are.same({ math.maxinteger >> 1 }, parts[2]:shape())
    end)

  it("negative indices into a dim of 2^63 - 1 entries count from the end without overflowing (make fuzz, seed 99)",
    function()
      local huge = attn.zeros(1):expand(math.maxinteger)
      assert.are.equal(0, huge:get(-2147483648))
      assert.are.equal(0, huge:get(-1))
      assert.are.same({}, huge:select(1, -math.maxinteger):shape()) -- the first entry
      assert.is_false((pcall(huge.select, huge, 1, math.mininteger))) -- one before it
      assert.are.same({ 2 }, huge:narrow(1, -2, 2):shape())
      assert.is_false((pcall(huge.get, huge, 0)))
    end)

  it("an id check against the largest limit names the range without overflowing (make fuzz, seed 31337)", function()
    local ok, err = pcall(attn.core.check_ids, attn.zeros(2, 2), math.maxinteger, "int64", "abc")
    assert.is_false(ok)
    assert.matches("abc 0 at position 1 is out of range 1..9223372036854775807", err, 1, true)
  end)

  it("the bytes of a huge expanded view are refused by the allocator's bound, not built (make fuzz)", function()
    local core = attn.core
    local old = core.max_request()
    core.set_max_request(8 << 20)
    local huge = attn.zeros(1):expand(1 << 31)
    local ok, err = pcall(core.tensor_to_bytes, huge)
    local path = os.tmpname()
    local ok_save, err_save = pcall(attn.save, path, { w = huge })
    os.remove(path)
    local small = core.tensor_to_bytes(attn.ones(3):expand(2, 3)) -- within the bound: built
    core.set_max_request(old)
    assert.is_false(ok)
    assert.matches("tensor_to_bytes: cannot allocate 8589934592 bytes for float32 [2147483648]", err, 1, true)
    assert.is_false(ok_save)
    assert.matches("cannot allocate 8589934592 bytes", err_save, 1, true)
    assert.are.equal(24, #small)
  end)

  it("empty tensors whose zero dim is not the first are ordinary, writable tensors", function()
    local e = attn.zeros({ 2, 0 })
    assert.are.same({ 2, 0 }, (e + 1):shape())
    assert.are.same({ 2, 0 }, e:clone():shape())
    assert.are.same({ 4, 0 }, attn.cat({ e, e }, 1):shape())
    local lin = nn.Linear(3, 4)
    assert.are.same({ 2, 0, 4 }, lin(attn.zeros({ 2, 0, 3 })):shape())
  end)

  it("attention with d = 0, and forward and backward over zero keys", function()
    local o, w = attn.dot_product_attention(attn.randn({ 2, 3, 0 }), attn.randn({ 2, 4, 0 }), attn.randn({ 2, 4, 5 }))
    assert.are.same({ 2, 3, 5 }, o:shape())
    helper.assert_close(w, attn.full({ 2, 3, 4 }, 0.25)) -- all scores 0: uniform weights
    local q = attn.randn({ 2, 3, 4 }, { requires_grad = true })
    local k = attn.randn({ 2, 0, 4 }, { requires_grad = true })
    local v = attn.randn({ 2, 0, 5 }, { requires_grad = true })
    local out = attn.dot_product_attention(q, k, v)
    helper.assert_close(out, attn.zeros({ 2, 3, 5 })) -- no key: zero output, as for a fully masked row
    out:sum():backward()
    helper.assert_close(q.grad, attn.zeros({ 2, 3, 4 }))
    assert.are.same({ 2, 0, 4 }, k.grad:shape())
  end)

  it("lstsq with zero right-hand sides returns (n x 0) and the rank, printing nothing", function()
    local ok, _, _, out = helper.run_lua([[
      local attn = require "attn"
      local a = attn.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, "float64")
      local x, rank = attn.linalg.lstsq(a, attn.zeros({ 3, 0 }, "float64"))
      io.stderr:write(attn.core.shape_str(x), " ", rank, "\n")
    ]])
    assert.is_true(ok, out)
    assert.are.equal("[2x0] 2\n", out) -- and nothing from LAPACK's xerbla
  end)

  it("uniform_ over the whole double range stays finite; float32 refuses bounds it cannot hold", function()
    local t = attn.empty({ 1000 }, "float64"):uniform_(-1e308, 1e308)
    assert.is_true(t:abs():max():item() < math.huge)
    assert.is_true(t:min():item() < 0 and t:max():item() > 0)
    assert.error_matches(function() attn.empty({ 4 }):uniform_(-1e308, 1e308) end, "exceed the float32 range")
  end)

  it("clip_grad_norm squares float32 gradients in double", function()
    local p = attn.zeros({ 2 }, { requires_grad = true })
    p.grad = attn.tensor({ 3e19, 4e19 })
    local norm = nn.clip_grad_norm_({ p }, 1)
    assert.is_true(math.abs(norm - 5e19) / 5e19 < 1e-6)
    helper.assert_close(p.grad, { 0.6, 0.8 }, { rtol = 1e-5 })
  end)

  it("LayerNorm refuses a negative, NaN or infinite eps", function()
    for _, eps in ipairs({ -1, 0 / 0, math.huge }) do
      assert.error_matches(function() nn.LayerNorm(4, { eps = eps }) end, "eps must be a finite number >= 0")
    end
    local y = nn.LayerNorm(4, { eps = 0 })(attn.tensor({ { 1, 2, 3, 4 } }))
    assert.is_true(y:abs():max():item() < math.huge)
  end)

  it("sizes are checked before building: repeat_interleave, totable of a huge view", function()
    assert.error_matches(function() attn.repeat_interleave({ 1, 2 }, 1 << 40) end, "more than memory can hold")
    assert.error_matches(function() attn.repeat_interleave(attn.tensor({ 1, 2 }), math.maxinteger) end,
      "more than memory can hold")
    local huge = attn.zeros({ 1 }):expand({ 1 << 40 })
    assert.error_matches(function() huge:totable() end, "more than memory allows")
    assert.error_matches(function() attn.zeros({ 1 << 40, 0 }):totable() end, "more than memory allows")
  end)

  it("pooling an empty input to a huge output size makes an empty output, no size product", function()
    -- make fuzz under UBSan: adaptive_avg_pool2d([0x2x3], {2^62, 2^62}) multiplied the output's
    -- 2^62 x 2^62 plane size (signed overflow) before finding there were no planes to pool
    local huge = 1 << 62
    local y = attn.nn.adaptive_avg_pool2d(attn.zeros({ 0, 2, 3 }), { huge, huge })
    assert.are.same({ 0, huge, huge }, y:shape())
    local x = attn.zeros({ 0, 2, 3, 3 }, "float64"):requires_grad_()
    y = attn.nn.adaptive_avg_pool2d(x, { huge, huge })
    assert.are.same({ 0, 2, huge, huge }, y:shape())
    y:sum():backward()
    assert.are.same({ 0, 2, 3, 3 }, x.grad:shape())
  end)

  it("an empty view far into its storage is usable: its data pointer is not built from the offset", function()
    -- make fuzz under UBSan: maximum([2^63-1 x 0], its last row) multiplied the row's offset,
    -- 2^63 - 2, by the element size (signed overflow) when the operands were set up
    local maxint = math.maxinteger
    for _, dtype in ipairs({ "float32", "float64", "int64" }) do
      local x = attn.zeros({ maxint, 0 }, dtype)
      local row = x:select(1, maxint)
      assert.are.equal(maxint - 1, row:storage_offset()) -- the view keeps its offset
      assert.are.same({ maxint, 0 }, x:maximum(row):shape())
      assert.are.same({ maxint, 0 }, (row + x):shape())
      assert.are.same({ 0 }, row:clone():shape())
      assert.are.same({ 0, 0 }, x:narrow(1, maxint, 0):contiguous():shape())
    end
  end)
end)
