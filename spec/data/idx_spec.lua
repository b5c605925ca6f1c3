-- attn.data.read_idx against idx files built by hand (string.pack) in a
-- temporary directory: every type code, gzip data, and broken files.
local attn = require "attn"
local data = require "attn.data"
local helper = require "helper"

local write_bytes = helper.write_bytes

-- An idx file: magic 00 00 <code> <ndim>, big-endian uint32 sizes, then data.
local function idx(code, dims, body)
  local head = string.char(0, 0, code, #dims)
  for _, d in ipairs(dims) do head = head .. string.pack(">I4", d) end
  return head .. body
end

-- values packed big-endian with the string.pack format fmt ("B", "b", ">i2", ...)
local function packed(fmt, values)
  local out = {}
  for i, v in ipairs(values) do out[i] = string.pack(fmt, v) end
  return table.concat(out)
end

describe("attn.data.read_idx", function()
  local dir
  before_each(function() dir = helper.make_tmpdir() end)
  after_each(function() helper.remove_tree(dir) end)

  local function roundtrip(code, fmt, dims, values, dtype)
    local path = dir .. "/x.idx"
    write_bytes(path, idx(code, dims, packed(fmt, values)))
    local t = assert(data.read_idx(path))
    assert.equal(dtype, t:dtype())
    assert.same(dims, t:shape())
    assert.same(values, helper.flatten(t:totable()))
    return t
  end

  it("reads every type code with its sizes and values (big-endian)", function()
    roundtrip(0x08, "B", { 2, 3 }, { 0, 1, 127, 128, 254, 255 }, "float32")
    roundtrip(0x09, "b", { 4 }, { -128, -1, 0, 127 }, "float32")
    roundtrip(0x0B, ">i2", { 2, 2 }, { -32768, -2, 258, 32767 }, "float32")
    roundtrip(0x0C, ">i4", { 3 }, { -2147483648, 16909060, 2147483647 }, "int64")
    roundtrip(0x0D, ">f", { 1, 2, 2 }, { 0.5, -1.25, 2.0 ^ 127, -0.0 }, "float32")
    roundtrip(0x0E, ">d", { 2 }, { 1 / 3, -2.5e-300 }, "float64")
    roundtrip(0x08, "B", { 0, 5 }, {}, "float32") -- an empty file of sizes is fine
  end)

  it("reads gzip-compressed files (through gzip -dc) like plain ones", function()
    local plain = dir .. "/img-idx3-ubyte"
    local values = {}
    for i = 1, 2 * 3 * 4 do values[i] = (i * 37) % 256 end
    write_bytes(plain, idx(0x08, { 2, 3, 4 }, packed("B", values)))
    assert.is_true(os.execute("gzip -k -- " .. plain))
    local a, b = assert(data.read_idx(plain)), assert(data.read_idx(plain .. ".gz"))
    helper.assert_identical(b, a)
    assert.same(values, helper.flatten(b:totable()))
    -- limit reads only the first rows, of plain and gzip data
    local first = assert(data.read_idx(plain .. ".gz", { limit = 1 }))
    assert.same({ 1, 3, 4 }, first:shape())
    helper.assert_identical(first, a:narrow(1, 1, 1):contiguous())
    assert.same({ 2, 3, 4 }, assert(data.read_idx(plain, { limit = 9 })):shape())
  end)

  it("returns nil and a message for a missing file, bad magic, an unknown type code or wrong sizes", function()
    local function fails(bytes, pattern) helper.assert_load_fails(data.read_idx, "read_idx", dir .. "/bad", bytes, pattern) end
    local t, msg = data.read_idx(dir .. "/absent")
    assert.is_nil(t)
    assert.matches("read_idx: .*absent: No such file", msg)
    fails(string.char(1, 0, 8, 1) .. string.pack(">I4", 1) .. "x", "not an idx file: the magic number starts 01 00")
    fails(idx(0x07, { 1 }, "x"), "unknown idx type code 0x07")
    fails(string.char(0, 0, 8, 0), "0 dimensions")
    fails(string.char(0, 0, 8, 9) .. string.rep("\0\0\0\1", 9) .. "x", "9 dimensions")
    fails(idx(0x08, { 2, 3 }, "abcde"), "truncated: uint8 %[2x3%] needs 6 data bytes, the file has 5")
    fails(idx(0x0C, { 2 }, "abcdefghij"), "more bytes than int32 %[2%] needs %(8; wrong dims%?%)")
    fails(idx(0x08, { 0xFFFFFFFF, 2 }, "ab"), "size 1 is 4294967295 %(wrong dims%?%)")
    fails(idx(0x0E, { 0x7FFFFFFF, 0x7FFFFFFF }, "ab"), "sizes %[2147483647x2147483647%] describe")
    fails("", "truncated: 0 bytes")
  end)

  it("refuses every truncation and never raises for changed bytes", function()
    local good = dir .. "/good"
    write_bytes(good, idx(0x0B, { 2, 3 }, packed(">i2", { 1, -2, 3, -4, 5, -6 })))
    helper.assert_truncations_fail(good, dir .. "/cut", data.read_idx, "^read_idx: ")
    helper.assert_byte_flips_never_raise(good, dir .. "/flip", data.read_idx, "^read_idx: ", 20)
  end)

  it("reports corrupt and truncated gzip data as nil, message", function()
    local plain = dir .. "/lab"
    write_bytes(plain, idx(0x08, { 3000 }, string.rep("\1\2\3", 1000)))
    assert.is_true(os.execute("gzip -k -- " .. plain))
    local gz = helper.read_bytes(plain .. ".gz")
    write_bytes(dir .. "/cut.gz", gz:sub(1, #gz - 12))
    local t, msg = data.read_idx(dir .. "/cut.gz")
    assert.is_nil(t)
    assert.matches("^read_idx: .*cut%.gz: gzip %-dc failed .*corrupt or truncated gzip data", msg)
    -- a changed checksum: the data is whole, gzip's verdict still counts
    write_bytes(dir .. "/crc.gz", gz:sub(1, #gz - 8) .. string.char((gz:byte(#gz - 7) + 1) % 256) .. gz:sub(#gz - 6))
    t, msg = data.read_idx(dir .. "/crc.gz")
    assert.is_nil(t)
    assert.matches("gzip %-dc failed", msg)
  end)

  it("raises for wrong arguments", function()
    assert.has_error(function() data.read_idx(42) end, "read_idx: path must be a string, got a number")
    assert.has_error(function() data.read_idx("x", { limit = -1 }) end, "read_idx: limit must be an integer >= 0, got -1")
    assert.has_error(function() data.read_idx("x", { lmit = 1 }) end)
  end)

  it("decodes the byte encodings of tensor_from_bytes exactly", function()
    local core = attn.core
    local bytes = string.char(0, 1, 127, 128, 255, 0x80, 0x01)
    assert.same({ 0, 1, 127, 128, 255, 128, 1 }, core.tensor_from_bytes(bytes, 0, "uint8", { 7 }):totable())
    assert.same({ 0, 1, 127, -128, -1, -128, 1 }, core.tensor_from_bytes(bytes, 0, "int8", { 7 }):totable())
    -- the pairs (01 7f) and (80 ff): 0x7f01 and 0xff80 little-endian, 0x017f and 0x80ff big-endian
    assert.same({ 0x7f01, 0xff80 - 65536 }, core.tensor_from_bytes(bytes, 1, "int16", { 2 }):totable())
    assert.same({ 0x017f, 0x80ff - 65536 }, core.tensor_from_bytes(bytes, 1, "int16", { 2 }, true):totable())
  end)
end)
