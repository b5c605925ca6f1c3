-- attn.save / attn.load: safetensors checkpoints.
-- Files are generated at run time in a fresh temporary directory.
local attn = require "attn"
local helper = require "helper"
local cjson = require "cjson"
local lfs = require "lfs"

local core = attn.core

local write_bytes, read_bytes = helper.write_bytes, helper.read_bytes
local make_tmpdir, remove_tree, list_dir = helper.make_tmpdir, helper.remove_tree, helper.list_dir
local assert_same, flatten = helper.assert_identical, helper.flatten

-- A safetensors file from a hand-written JSON header and a data buffer.
local function st_file(header, buffer) return string.pack("<I8", #header) .. header .. (buffer or "") end

local function floats(fmt, ...) return string.pack(fmt, ...) end

describe("safetensors", function()
  local dir
  before_each(function() dir = make_tmpdir() end)
  after_each(function() remove_tree(dir) end)

  describe("round trip", function()
    it("is bit-exact for float32 and float64 tensors of several shapes", function()
      attn.manual_seed(7)
      local tensors = {
        ["W_q.weight"] = attn.randn({ 3, 4 }),
        ["W_q.bias"] = attn.randn({ 4 }),
        ["encoder.rnn.weight_ih_l0"] = attn.randn({ 2, 3, 5 }, "float64"),
        ["scalar32"] = attn.tensor(1.25),
        ["scalar64"] = attn.tensor(-0.1, "float64"),
        ["empty"] = attn.zeros({ 0, 3 }),
        ["empty64"] = attn.zeros({ 2, 0, 5 }, "float64"),
        ["one"] = attn.randn({ 1, 1, 1, 1 }, "float64"),
      }
      local path = dir .. "/model.safetensors"
      assert.are.same({ true }, { attn.save(path, tensors) })
      local loaded, meta = attn.load(path)
      assert.are.same({}, meta)
      local n = 0
      for name, t in pairs(tensors) do
        assert_same(loaded[name], t)
        n = n + 1
      end
      for _ in pairs(loaded) do n = n - 1 end
      assert.are.equal(0, n)
    end)

    it("is bit-exact for int64 (I64), values past 2^53 and the extremes included", function()
      local ids = attn.tensor({ { 1, -2, (1 << 53) + 1 }, { math.maxinteger, math.mininteger, 0 } }, "int64")
      local path = dir .. "/ids.safetensors"
      assert.is_true(attn.save(path, { ids = ids, strided = ids:transpose(1, 2) }))
      local raw = read_bytes(path)
      local n = string.unpack("<I8", raw)
      local header = cjson.decode(raw:sub(9, 8 + n))
      assert.are.equal("I64", header.ids.dtype)
      assert.are.equal(48, header.ids.data_offsets[2] - header.ids.data_offsets[1])
      local loaded = assert(attn.load(path))
      assert_same(loaded.ids, ids)
      assert_same(loaded.strided, ids:transpose(1, 2):contiguous())
      assert.are.equal((1 << 53) + 1, loaded.ids:get(1, 3))
      assert.are.equal("integer", math.type(loaded.ids:get(2, 1)))
    end)

    it("loads I32 into int64", function()
      local path = dir .. "/i32.safetensors"
      write_bytes(path, st_file('{"t":{"dtype":"I32","shape":[3],"data_offsets":[0,12]}}    ',
        string.pack("<i4i4i4", -7, 0, 2147483647)))
      local loaded = assert(attn.load(path))
      assert.are.equal("int64", loaded.t:dtype())
      assert.are.same({ -7, 0, 2147483647 }, loaded.t:totable())
    end)

    it("keeps special values: signed zeros, infinities, NaN, subnormals, extremes", function()
      local specials = { 0.0, -0.0, math.huge, -math.huge, 0 / 0, 1e-45, -1.4e-45, 3.4028234663852886e38, 1e-40 }
      local doubles = { -0.0, 4.9406564584124654e-324, 1.7976931348623157e308, -math.huge, 0 / 0, math.pi }
      local t32, t64 = attn.tensor(specials), attn.tensor(doubles, "float64")
      local path = dir .. "/special.safetensors"
      assert.is_true(attn.save(path, { a = t32, b = t64 }))
      local loaded = assert(attn.load(path))
      assert_same(loaded.a, t32)
      assert_same(loaded.b, t64)
      assert.are.equal(-math.huge, 1 / loaded.a:totable()[2]) -- -0 stayed negative
    end)

    it("writes non-contiguous tensors as their contiguous copy", function()
      local base = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, "float64")
      local tr = base:transpose(1, 2)
      assert.is_false(core.is_contiguous(tr))
      local narrow = attn.randn({ 4, 6 }):narrow(2, 2, 3)
      local path = dir .. "/views.safetensors"
      assert.is_true(attn.save(path, { tr = tr, narrow = narrow }))
      local loaded = assert(attn.load(path))
      assert.are.same({ { 1, 4 }, { 2, 5 }, { 3, 6 } }, loaded.tr:totable())
      assert.is_true(core.is_contiguous(loaded.tr))
      assert_same(loaded.tr, tr)
      assert_same(loaded.narrow, narrow)
    end)

    it("keeps names with dots, unicode, quotes, backslashes and control characters", function()
      local names = { "encoder.layers.0.self_attn.in_proj_weight", "ünïcødé.权重.β", 'say "hi"', "back\\slash",
        "tab\there\nnewline", "slash/path", "", "emoji 🧠" }
      local tensors = {}
      for i, name in ipairs(names) do tensors[name] = attn.full({ i }, i) end
      local path = dir .. "/names.safetensors"
      assert.is_true(attn.save(path, tensors))
      local loaded = assert(attn.load(path))
      for _, name in ipairs(names) do assert_same(loaded[name], tensors[name]) end
      -- and the header really is JSON that another decoder reads
      local raw = read_bytes(path)
      local header = cjson.decode(raw:sub(9, 8 + string.unpack("<I8", raw)))
      for i, name in ipairs(names) do assert.are.same({ i }, header[name].shape) end
    end)

    it("round-trips metadata, and returns an empty table when there is none", function()
      local meta = { format = "pt", epoch = "12", note = "lr=3e-4, β₁=0.9\n\"quoted\"", [""] = "empty key" }
      local path = dir .. "/meta.safetensors"
      assert.is_true(attn.save(path, { w = attn.ones({ 2 }) }, meta))
      local loaded, got = attn.load(path)
      assert.are.same(meta, got)
      assert_same(loaded.w, attn.ones({ 2 }))
      assert.is_true(attn.save(path, { w = attn.ones({ 2 }) }, {}))
      local _, none = attn.load(path)
      assert.are.same({}, none)
      assert.is_nil(cjson.decode(read_bytes(path):sub(9, 8 + string.unpack("<I8", read_bytes(path)))).__metadata__)
    end)

    it("saves and loads an empty state dict", function()
      local path = dir .. "/empty.safetensors"
      assert.is_true(attn.save(path, {}))
      local loaded, meta = attn.load(path)
      assert.are.same({}, loaded)
      assert.are.same({}, meta)
    end)

    it("writes byte-identical files for equal inputs regardless of insertion order", function()
      local a, b, c = attn.randn({ 2, 2 }), attn.randn({ 3 }, "float64"), attn.randn({ 1 })
      local t1, t2 = {}, {}
      t1.zeta, t1.alpha, t1["Alpha.x"] = a, b, c
      t2["Alpha.x"], t2.alpha, t2.zeta = c, b, a
      assert.is_true(attn.save(dir .. "/1.safetensors", t1, { y = "1", x = "2" }))
      assert.is_true(attn.save(dir .. "/2.safetensors", t2, { x = "2", y = "1" }))
      assert.are.equal(read_bytes(dir .. "/1.safetensors"), read_bytes(dir .. "/2.safetensors"))
    end)
  end)

  describe("format, checked independently", function()
    it("reads a file built byte by byte", function()
      local header = '{"b":{"dtype":"F64","shape":[2],"data_offsets":[24,40]},' ..
        '"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"k":"v"},' ..
        '"s":{"dtype":"F32","shape":[],"data_offsets":[40,44]},"z":{"dtype":"F32","shape":[0],"data_offsets":[44,44]}}'
      local buffer = floats("<ffffff", 1, 2, 3, 4, 5, 6) .. floats("<dd", 0.1, -1e300) .. floats("<f", -2.5)
      local path = dir .. "/hand.safetensors"
      write_bytes(path, st_file(header, buffer))
      local t, meta = attn.load(path)
      assert.is_table(t)
      assert.is_table(meta)
      assert.are.same({ k = "v" }, meta)
      assert.are.equal("float32", t.a:dtype())
      assert.are.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t.a:totable())
      assert.are.equal("float64", t.b:dtype())
      assert.are.same({ 0.1, -1e300 }, t.b:totable())
      assert.are.same({}, t.s:shape())
      assert.are.equal(-2.5, t.s:item())
      assert.are.same({ 0 }, t.z:shape())
    end)

    it("converts F16 and BF16 to float32 exactly", function()
      local halves = { 0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x7c00, 0x8000, 0x3555 }
      local expect_h = { 1, -2, 0.5, 65504, 2 ^ -24, math.huge, -0.0, 0.333251953125 }
      local bhalves = { 0x3f80, 0xc040, 0x4049, 0xff80 }
      local expect_b = { 1, -3, 3.140625, -math.huge }
      local header = '{"h":{"dtype":"F16","shape":[8],"data_offsets":[0,16]},' ..
        '"bf":{"dtype":"BF16","shape":[2,2],"data_offsets":[16,24]}}'
      local path = dir .. "/half.safetensors"
      local all = { table.unpack(halves) }
      table.move(bhalves, 1, #bhalves, #all + 1, all)
      write_bytes(path, st_file(header, string.pack("<" .. string.rep("I2", 12), table.unpack(all))))
      local t = assert(attn.load(path))
      assert.are.equal("float32", t.h:dtype())
      assert.are.same(expect_h, t.h:totable())
      assert.are.equal(-math.huge, 1 / t.h:totable()[7])
      assert.are.same({ { expect_b[1], expect_b[2] }, { expect_b[3], expect_b[4] } }, t.bf:totable())
    end)

    it("accepts a padded header and integral numbers written as 3.0 or 1e1", function()
      local header = '{"a":{"dtype":"F32","shape":[1e1],"data_offsets":[0,40.0]}}    '
      local path = dir .. "/pad.safetensors"
      write_bytes(path, st_file(header, string.rep(floats("<f", 1.5), 10)))
      local t = assert(attn.load(path))
      assert.are.same({ 10 }, t.a:shape())
    end)

    it("writes a header that parses by hand: length, padding, sorted keys, offsets, data", function()
      attn.manual_seed(3)
      local w = attn.randn({ 3, 4 })
      local v = attn.randn({ 4, 2 }, "float64"):transpose(1, 2)
      local s = attn.tensor(7.5)
      local path = dir .. "/parse.safetensors"
      assert.is_true(attn.save(path, { ["W_q.weight"] = w, ["v.t"] = v, s = s }, { epoch = "3" }))
      local raw = read_bytes(path)
      local n = string.unpack("<I8", raw)
      assert.are.equal(0, n % 8)
      local text = raw:sub(9, 8 + n)
      assert.truthy(text:match("^{.*} *$"))
      local header = cjson.decode(text)
      assert.are.same({ epoch = "3" }, header.__metadata__)
      assert.are.same({ dtype = "F32", shape = { 3, 4 }, data_offsets = { 0, 48 } }, header["W_q.weight"])
      assert.are.same({ dtype = "F32", shape = {}, data_offsets = { 48, 52 } }, header.s)
      assert.are.same({ dtype = "F64", shape = { 2, 4 }, data_offsets = { 52, 116 } }, header["v.t"])
      assert.are.equal(8 + n + 116, #raw)
      -- keys appear in byte order, __metadata__ first
      local p0, p1 = text:find('"__metadata__"', 1, true), text:find('"W_q.weight"', 1, true)
      local p2, p3 = text:find('"s"', 1, true), text:find('"v.t"', 1, true)
      assert.is_true(p0 < p1 and p1 < p2 and p2 < p3)
      -- the data, read with string.unpack, in row-major order of the logical tensors
      local data = 8 + n
      local wv = flatten(w:totable())
      for i = 1, 12 do assert.are.equal(wv[i], (string.unpack("<f", raw, data + 1 + 4 * (i - 1)))) end
      assert.are.equal(7.5, (string.unpack("<f", raw, data + 49)))
      local vv = flatten(v:totable())
      for i = 1, 8 do assert.are.equal(vv[i], (string.unpack("<d", raw, data + 53 + 8 * (i - 1)))) end
    end)
  end)

  describe("corrupt files return nil and a message", function()
    local function expect_fail(content, pattern)
      helper.assert_load_fails(attn.load, "load", dir .. "/bad.safetensors", content, pattern)
    end
    local function entry(body) return '{"t":' .. body .. "}" end

    it("a missing file", function()
      local t, msg = attn.load(dir .. "/missing.safetensors")
      assert.is_nil(t)
      assert.matches("^load: .*missing%.safetensors: No such file or directory", msg)
    end)

    it("a file shorter than 8 bytes", function()
      expect_fail("", "file is 0 bytes, too short for the 8%-byte header length")
      expect_fail("\5\0\0", "file is 3 bytes, too short")
    end)

    it("a header length larger than the file", function()
      expect_fail(string.pack("<I8", 1000) .. "{}",
        "header length 1000 exceeds the 2 bytes after it %(truncated file%?%)")
    end)

    it("an absurd header length", function()
      expect_fail(string.pack("<I8", 1 << 40) .. "{}",
        "header length 1099511627776 is absurd %(limit 100000000 bytes%)")
      expect_fail(string.pack("<i8", -1) .. "{}", "header length 18446744073709551616 is absurd")
    end)

    it("a header that is not JSON or not an object", function()
      expect_fail(st_file('{"t": {"dtype": "F32",'), "header is not valid JSON: ")
      expect_fail(st_file("[1, 2]"), "header is not a JSON object")
      expect_fail(st_file("42"), "header is not a JSON object")
      expect_fail(st_file('{"t": NaN}'), "header is not valid JSON")
      expect_fail(st_file(""), "header is not a JSON object")
    end)

    it("an entry that is not an object", function()
      expect_fail(st_file(entry("5")), "tensor 't': entry is a number, not an object")
      expect_fail(st_file(entry("[1, 2]")), "tensor 't': entry is an array of length 2, not an object")
      expect_fail(st_file(entry("null")), "tensor 't': entry is null, not an object")
    end)

    it("an entry missing dtype, shape or data_offsets", function()
      expect_fail(st_file(entry('{"shape":[1],"data_offsets":[0,4]}')), "tensor 't': missing dtype")
      expect_fail(st_file(entry('{"dtype":"F32","data_offsets":[0,4]}')), "tensor 't': missing shape")
      expect_fail(st_file(entry('{"dtype":"F32","shape":[1]}')), "tensor 't': missing data_offsets")
    end)

    it("fields of the wrong type", function()
      expect_fail(st_file(entry('{"dtype":32,"shape":[1],"data_offsets":[0,4]}')),
        "tensor 't': dtype is a number, not a string")
      expect_fail(st_file(entry('{"dtype":"F32","shape":"1","data_offsets":[0,4]}')),
        "tensor 't': shape is a string, not an array of sizes")
      expect_fail(st_file(entry('{"dtype":"F32","shape":{"a":1},"data_offsets":[0,4]}')),
        "tensor 't': shape is an object, not an array of sizes")
      expect_fail(st_file(entry('{"dtype":"F32","shape":[1],"data_offsets":[4]}')),
        "tensor 't': data_offsets is an array of length 1, not %[begin, end%]")
      expect_fail(st_file(entry('{"dtype":"F32","shape":[1],"data_offsets":0}')),
        "tensor 't': data_offsets is a number, not %[begin, end%]")
      expect_fail(st_file(entry('{"dtype":"F32","shape":[1],"data_offsets":["0","4"]}')),
        "tensor 't': data_offsets %[\"0\", \"4\"%] are not non%-negative integers")
      expect_fail(st_file(entry('{"dtype":"F32","shape":[1],"data_offsets":[0,4.5]}')),
        "tensor 't': data_offsets %[0, 4.5%] are not non%-negative integers")
      expect_fail(st_file(entry('{"dtype":"F32","shape":[1],"data_offsets":[8,4]}'), "12345678"),
        "tensor 't': data_offsets %[8, 4%] end before they begin")
    end)

    it("an unsupported dtype, named", function()
      expect_fail(st_file(entry('{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'), string.rep("\0", 8)),
        "tensor 't': unsupported dtype 'U8' %(supported: F32, F64, F16, BF16, I64, I32%)")
      expect_fail(st_file(entry('{"dtype":"f32","shape":[1],"data_offsets":[0,4]}'), "\0\0\0\0"),
        "tensor 't': unsupported dtype 'f32'")
    end)

    it("negative, non-integer or too many shape entries", function()
      expect_fail(st_file(entry('{"dtype":"F32","shape":[2,-3],"data_offsets":[0,4]}')),
        "tensor 't': shape entry 2 is %-3, not a non%-negative integer")
      expect_fail(st_file(entry('{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}')),
        "tensor 't': shape entry 1 is 1.5, not a non%-negative integer")
      expect_fail(st_file(entry('{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}')),
        "tensor 't': shape entry 1 is a string, not a non%-negative integer")
      expect_fail(st_file(entry('{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}'), "\0\0\0\0"),
        "tensor 't': shape %[1x1x1x1x1x1x1x1x1%] has 9 dims, at most 8 are supported")
      expect_fail(st_file(entry('{"dtype":"F64","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}')),
        "tensor 't': shape %[1099511627776x1099511627776%] is too large")
    end)

    it("a size that does not match the data_offsets", function()
      local header = '{"W_q.weight":{"dtype":"F32","shape":[3,4],"data_offsets":[0,40]}}'
      expect_fail(st_file(header, string.rep("\0", 40)),
        "tensor 'W_q%.weight': shape %[3x4%] needs 48 bytes, data_offsets span 40$")
      expect_fail(st_file(entry('{"dtype":"F64","shape":[],"data_offsets":[0,4]}'), "\0\0\0\0"),
        "tensor 't': shape %[%] needs 8 bytes, data_offsets span 4$")
    end)

    it("ranges outside the data buffer (a truncated data section)", function()
      local header = '{"a":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]}}'
      expect_fail(st_file(header, string.rep("\0", 40)),
        "tensor 'a': data_offsets %[0, 48%] lie outside the data buffer of 40 bytes %(truncated file%?%)")
    end)

    it("overlapping ranges", function()
      local header = '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},' ..
        '"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}'
      expect_fail(st_file(header, string.rep("\0", 24)),
        "tensor 'b': data_offsets %[8, 24%] overlap tensor 'a' %[0, 16%]")
      local same = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' ..
        '"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
      expect_fail(st_file(same, string.rep("\0", 8)), "tensor 'b': data_offsets %[0, 8%] overlap tensor 'a' %[0, 8%]")
    end)

    it("gaps between tensors", function()
      local header = '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},' ..
        '"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}'
      expect_fail(st_file(header, string.rep("\0", 12)),
        "tensor 'b': data_offsets %[8, 12%] leave a gap of 4 bytes before them")
    end)

    it("trailing bytes after the last tensor (rejected by design)", function()
      local header = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
      expect_fail(st_file(header, string.rep("\0", 12)),
        "4 trailing bytes after the last tensor %(the data buffer has 12 bytes, tensors cover 8%)")
    end)

    it("bad __metadata__", function()
      local t = '"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
      expect_fail(st_file('{"__metadata__":{"epoch":3},' .. t .. "}", "\0\0\0\0"),
        "__metadata__ entry 'epoch' is a number, not a string")
      expect_fail(st_file('{"__metadata__":["x"],' .. t .. "}", "\0\0\0\0"),
        "__metadata__ is an array of length 1, not an object")
      expect_fail(st_file('{"__metadata__":"x",' .. t .. "}", "\0\0\0\0"), "__metadata__ is a string, not an object")
    end)

    it("every truncation of a valid file", function()
      local good = dir .. "/good.safetensors"
      local sd = { a = attn.randn({ 3, 2 }), b = attn.randn({ 2 }, "float64"), c = attn.zeros({ 0 }) }
      assert.is_true(attn.save(good, sd, { k = "v" }))
      helper.assert_truncations_fail(good, dir .. "/cut.safetensors", attn.load, "^load: .*cut%.safetensors: ")
    end)

    it("random byte corruption never raises", function()
      local good = dir .. "/good.safetensors"
      assert.is_true(attn.save(good, { ["x.w"] = attn.randn({ 2, 3 }), ["x.b"] = attn.randn({ 3 }, "float64") }))
      helper.assert_byte_flips_never_raise(good, dir .. "/flip.safetensors", attn.load, "^load: ", 20240611)
    end)
  end)

  describe("atomic writes", function()
    local temp_files = helper.temp_files

    it("returns nil, msg when the directory does not exist", function()
      local ok, msg = attn.save(dir .. "/no/such/dir/m.safetensors", { a = attn.ones({ 1 }) })
      assert.is_nil(ok)
      assert.matches("^save: .*/no/such/dir/m%.safetensors: cannot create temporary file .*No such file or directory",
        msg)
    end)

    it("leaves the previous file intact and no temporary file when the state dict is bad", function()
      local path = dir .. "/ckpt.safetensors"
      assert.is_true(attn.save(path, { a = attn.ones({ 4 }) }))
      local before = read_bytes(path)
      assert.error_matches(function() attn.save(path, { a = attn.zeros({ 4 }), b = 42 }) end,
        "save: 'b' is a number, not a tensor")
      assert.error_matches(function() attn.save(path, { a = attn.zeros({ 4 }), [3] = attn.zeros({ 1 }) }) end,
        "save: tensor names must be strings, got a number key")
      assert.error_matches(function() attn.save(path, { __metadata__ = attn.zeros({ 1 }) }) end,
        "save: '__metadata__' is reserved")
      assert.error_matches(function() attn.save(path, { ["\xff"] = attn.zeros({ 1 }) }) end, "not valid UTF%-8")
      assert.error_matches(function() attn.save(path, { a = attn.zeros({ 1 }) }, { epoch = 3 }) end,
        "save: metadata must map strings to strings, got string %-> number")
      local freed = attn.zeros({ 4 })
      core.free(freed)
      assert.error_matches(function() attn.save(path, { a = freed }) end, "use of freed tensor")
      assert.error_matches(function() attn.save(42, {}) end, "save: path must be a string")
      assert.are.equal(before, read_bytes(path))
      assert.are.same({}, temp_files(dir))
      assert_same(attn.load(path).a, attn.ones({ 4 }))
    end)

    it("removes the temporary file when the final rename fails", function()
      local target = dir .. "/ckpt.safetensors"
      assert(lfs.mkdir(target)) -- renaming a file over a directory fails after the data were written
      local ok, msg = attn.save(target, { a = attn.randn({ 64, 64 }) })
      assert.is_nil(ok)
      assert.matches("^save: .*ckpt%.safetensors: cannot rename temporary file '.*/ckpt%.safetensors%.tmp%.[%d]+%.%x+'",
        msg)
      assert.are.same({}, temp_files(dir))
      assert.are.equal("directory", lfs.attributes(target, "mode"))
    end)

    it("replaces an existing checkpoint completely", function()
      local path = dir .. "/ckpt.safetensors"
      assert.is_true(attn.save(path, { big = attn.randn({ 100, 100 }), other = attn.ones({ 3 }) }, { v = "1" }))
      local small = attn.tensor({ 1, 2 }, "float64")
      assert.is_true(attn.save(path, { small = small }))
      local raw = read_bytes(path)
      assert.are.equal(8 + string.unpack("<I8", raw) + 16, #raw)
      local loaded, meta = attn.load(path)
      assert.are.same({ "small" }, (function()
        local k = {}
        for name in pairs(loaded) do k[#k + 1] = name end
        return k
      end)())
      assert.are.same({}, meta)
      assert_same(loaded.small, small)
      assert.are.same({ "ckpt.safetensors" }, list_dir(dir))
    end)
  end)

  describe("interop with an independent Python reader #interop", function()
    local python = os.getenv("ATTN_PYTHON") or "/usr/bin/python3" -- ATTN_PYTHON=/nonexistent tests the skip
    local function have_numpy()
      return os.execute(python .. ' -c "import numpy" >/dev/null 2>&1') == true
    end

    it("Python (json + numpy) reads attn.save output and writes a file attn.load reads", function()
      if not have_numpy() then pending("numpy is not available to " .. python .. " (apt-get install python3-numpy)") end
      local ours, theirs = dir .. "/ours.safetensors", dir .. "/theirs.safetensors"
      attn.manual_seed(11)
      local w, v = attn.randn({ 3, 5 }), attn.randn({ 2, 4 }, "float64"):transpose(1, 2)
      assert.is_true(attn.save(ours, { ["layer.0.w"] = w, ["νu"] = v }, { who = "attn" }))
      local script = dir .. "/interop.py"
      write_bytes(script, [=[
import json, struct, sys
import numpy as np
ours, theirs = sys.argv[1], sys.argv[2]
raw = open(ours, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
out = {"__metadata__": header.pop("__metadata__", {})}
kinds = {"F32": "<f4", "F64": "<f8"}
for name, e in header.items():
    b, end = e["data_offsets"]
    a = np.frombuffer(raw[8 + n + b:8 + n + end], dtype=kinds[e["dtype"]]).reshape(e["shape"])
    out[name] = {"dtype": e["dtype"], "shape": list(a.shape), "values": [float(x) for x in a.ravel()]}
print(json.dumps(out))
x = (np.arange(6, dtype="<f4") / 4).reshape(2, 3)
y = np.array([np.pi, -0.0, 1e-300], dtype="<f8")
data = x.tobytes() + y.tobytes()
h = json.dumps({"x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                "y": {"dtype": "F64", "shape": [3], "data_offsets": [24, 48]}}).encode()
h += b" " * (-len(h) % 8)
open(theirs, "wb").write(struct.pack("<Q", len(h)) + h + data)
]=])
      local p = assert(io.popen(python .. " " .. script .. " " .. ours .. " " .. theirs))
      local out = p:read("a")
      assert.is_true(p:close())
      local got = cjson.decode(out)
      assert.are.same({ who = "attn" }, got.__metadata__)
      assert.are.same({ 3, 5 }, got["layer.0.w"].shape)
      assert.are.equal("F32", got["layer.0.w"].dtype)
      assert.are.same(flatten(w:totable()), got["layer.0.w"].values)
      assert.are.same({ 4, 2 }, got["νu"].shape)
      assert.are.same(flatten(v:totable()), got["νu"].values)
      local t = assert(attn.load(theirs))
      assert_same(t.x, attn.tensor({ { 0, 0.25, 0.5 }, { 0.75, 1, 1.25 } }))
      assert.are.same({ math.pi, -0.0, 1e-300 }, t.y:totable())
    end)
  end)
end)
