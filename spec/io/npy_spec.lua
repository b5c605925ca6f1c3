-- attn.save_npy / attn.load_npy: NumPy .npy files.
-- Files are generated at run time in a fresh temporary directory.
local attn = require "attn"
local helper = require "helper"
local cjson = require "cjson"
local lfs = require "lfs"

local core = attn.core

local write_bytes, read_bytes = helper.write_bytes, helper.read_bytes
local make_tmpdir, remove_tree, list_dir = helper.make_tmpdir, helper.remove_tree, helper.list_dir
local assert_same, flatten = helper.assert_identical, helper.flatten

-- A .npy file from a hand-written header dict literal. opts.major picks the
-- version (1: uint16 length, 2 and 3: uint32); opts.raw skips the padding.
local function npy(dict, data, opts)
  opts = opts or {}
  local major = opts.major or 1
  local pre = major == 1 and 10 or 12
  local header = dict
  if not opts.raw then header = dict .. string.rep(" ", -(pre + #dict + 1) % 64) .. "\n" end
  local len = major == 1 and string.pack("<I2", #header) or string.pack("<I4", #header)
  return "\x93NUMPY" .. string.char(major, opts.minor or 0) .. len .. header .. (data or "")
end

local function dict(descr, shape, fortran)
  return string.format("{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr, fortran and "True" or "False",
    shape)
end

describe(".npy", function()
  local dir
  before_each(function() dir = make_tmpdir() end)
  after_each(function() remove_tree(dir) end)

  describe("round trip", function()
    it("is bit-exact for float32 and float64 of several shapes, 0-d and empty included", function()
      attn.manual_seed(5)
      local cases = {
        attn.tensor(3.25), attn.tensor(-1e-300, "float64"),
        attn.zeros({ 0 }), attn.zeros({ 0, 5 }, "float64"), attn.zeros({ 3, 0, 2 }),
        attn.randn({ 7 }), attn.randn({ 2, 3 }, "float64"), attn.randn({ 2, 3, 4 }),
        attn.randn({ 1, 1, 1, 1, 1, 1, 1, 2 }, "float64"),
      }
      for i, t in ipairs(cases) do
        local path = string.format("%s/case%d.npy", dir, i)
        assert.are.same({ true }, { attn.save_npy(path, t) })
        assert_same(attn.load_npy(path), t)
      end
    end)

    it("keeps special values", function()
      local t32 = attn.tensor({ 0.0, -0.0, math.huge, -math.huge, 0 / 0, 1e-45, 3.4028234663852886e38 })
      local t64 = attn.tensor({ -0.0, 4.9406564584124654e-324, 1.7976931348623157e308, 0 / 0 }, "float64")
      assert.is_true(attn.save_npy(dir .. "/a.npy", t32))
      assert.is_true(attn.save_npy(dir .. "/b.npy", t64))
      assert_same(attn.load_npy(dir .. "/a.npy"), t32)
      assert_same(attn.load_npy(dir .. "/b.npy"), t64)
    end)

    it("writes non-contiguous tensors in row-major order", function()
      local tr = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, "float64"):transpose(1, 2)
      assert.is_true(attn.save_npy(dir .. "/t.npy", tr))
      local back = attn.load_npy(dir .. "/t.npy")
      assert.are.same({ { 1, 4 }, { 2, 5 }, { 3, 6 } }, back:totable())
      assert_same(back, tr)
    end)
  end)

  describe("format, checked independently", function()
    it("writes version 1.0 with a 64-byte aligned, newline-terminated dict header", function()
      attn.manual_seed(9)
      local t = attn.randn({ 2, 3 })
      local path = dir .. "/w.npy"
      assert.is_true(attn.save_npy(path, t))
      local raw = read_bytes(path)
      assert.are.equal("\x93NUMPY\1\0", raw:sub(1, 8))
      local hlen = string.unpack("<I2", raw, 9)
      assert.are.equal(0, (10 + hlen) % 64)
      local header = raw:sub(11, 10 + hlen)
      assert.are.equal("\n", header:sub(-1))
      assert.are.equal("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", header:match("^(.-) *\n$"))
      assert.are.equal(10 + hlen + 24, #raw)
      local v = flatten(t:totable())
      for i = 1, 6 do assert.are.equal(v[i], (string.unpack("<f", raw, 11 + hlen + 4 * (i - 1)))) end
    end)

    it("writes 1-d shapes as (n,), 0-d as () and float64 as <f8", function()
      local function header_of(t)
        local path = dir .. "/h.npy"
        assert.is_true(attn.save_npy(path, t))
        local raw = read_bytes(path)
        return raw:sub(11, 10 + string.unpack("<I2", raw, 9)):match("^(.-) *\n$"), raw
      end
      assert.are.equal("{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }",
        header_of(attn.zeros({ 5 }, "float64")))
      local h, raw = header_of(attn.tensor(-2.5, "float64"))
      assert.are.equal("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", h)
      assert.are.equal(-2.5, (string.unpack("<d", raw, #raw - 7)))
      assert.are.equal("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }", header_of(attn.zeros({ 0, 4 })))
    end)

    it("reads hand-built files of versions 1.0, 2.0 and 3.0", function()
      local data = string.pack("<dddd", 1.5, -2, 1e-310, 4)
      write_bytes(dir .. "/v1.npy", npy(dict("<f8", "(2, 2)"), data))
      write_bytes(dir .. "/v2.npy", npy(dict("<f8", "(2, 2)"), data, { major = 2 }))
      write_bytes(dir .. "/v3.npy", npy(dict("<f8", "(4,)"), data, { major = 3 }))
      for _, v in ipairs({ "v1", "v2" }) do
        local t = assert(attn.load_npy(dir .. "/" .. v .. ".npy"))
        assert.are.equal("float64", t:dtype())
        assert.are.same({ { 1.5, -2 }, { 1e-310, 4 } }, t:totable())
      end
      assert.are.same({ 1.5, -2, 1e-310, 4 }, attn.load_npy(dir .. "/v3.npy"):totable())
    end)

    it("reads 0-d and empty arrays", function()
      write_bytes(dir .. "/s.npy", npy(dict("<f4", "()"), string.pack("<f", 0.75)))
      local s = assert(attn.load_npy(dir .. "/s.npy"))
      assert.are.same({}, s:shape())
      assert.are.equal(0.75, s:item())
      write_bytes(dir .. "/e.npy", npy(dict("<f8", "(0, 3)"), ""))
      local e = assert(attn.load_npy(dir .. "/e.npy"))
      assert.are.same({ 0, 3 }, e:shape())
      assert.are.equal("float64", e:dtype())
    end)

    it("round-trips int64 as <i8 bit-exactly, past 2^53 and at the extremes", function()
      local t = attn.tensor({ { (1 << 53) + 1, -((1 << 53) + 3) }, { math.maxinteger, math.mininteger } }, "int64")
      local path = dir .. "/ids.npy"
      assert.is_true(attn.save_npy(path, t:transpose(1, 2)))
      assert.truthy(read_bytes(path):find("'descr': '<i8'", 1, true))
      local back = assert(attn.load_npy(path))
      assert_same(back, t:transpose(1, 2):contiguous())
      assert.are.equal(math.mininteger, back:get(2, 2))
    end)

    it("loads <i4 and <i8 into int64 (exactly, past 2^53) and <f2 into float32", function()
      write_bytes(dir .. "/i4.npy", npy(dict("<i4", "(3,)"), string.pack("<i4i4i4", -7, 0, 2147483647)))
      write_bytes(dir .. "/i8.npy", npy(dict("<i8", "(3,)"), string.pack("<i8i8i8", -(1 << 40), (1 << 53) + 1,
        math.mininteger)))
      write_bytes(dir .. "/f2.npy", npy(dict("<f2", "(3,)"), string.pack("<I2I2I2", 0x3c00, 0xbc00, 0x0400)))
      local i4, i8 = attn.load_npy(dir .. "/i4.npy"), attn.load_npy(dir .. "/i8.npy")
      local f2 = attn.load_npy(dir .. "/f2.npy")
      assert.are.equal("int64", i4:dtype())
      assert.are.same({ -7, 0, 2147483647 }, i4:totable())
      assert.are.equal("int64", i8:dtype())
      assert.are.same({ -(1 << 40), (1 << 53) + 1, math.mininteger }, i8:totable())
      assert.are.equal(math.type(i8:get(2)), "integer")
      assert.are.equal("float32", f2:dtype())
      assert.are.same({ 1, -1, 2 ^ -14 }, f2:totable())
    end)

    it("reads big-endian data", function()
      write_bytes(dir .. "/b4.npy", npy(dict(">f4", "(2,)"), string.pack(">ff", 1.5, -3.25)))
      write_bytes(dir .. "/b8.npy", npy(dict(">f8", "(2,)"), string.pack(">dd", 0.1, math.pi)))
      write_bytes(dir .. "/bi.npy", npy(dict(">i8", "(1,)"), string.pack(">i8", -123456789)))
      assert.are.same({ 1.5, -3.25 }, attn.load_npy(dir .. "/b4.npy"):totable())
      assert.are.same({ 0.1, math.pi }, attn.load_npy(dir .. "/b8.npy"):totable())
      assert.are.same({ -123456789 }, attn.load_npy(dir .. "/bi.npy"):totable())
    end)

    it("transposes fortran_order arrays into row-major tensors", function()
      write_bytes(dir .. "/f.npy", npy(dict("<f4", "(2, 3)", true), string.pack("<ffffff", 1, 4, 2, 5, 3, 6)))
      local t = assert(attn.load_npy(dir .. "/f.npy"))
      assert.are.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:totable())
      assert.is_true(core.is_contiguous(t))
      -- 3-d: element (i, j, k) = 100i + 10j + k sits at i + 2j + 6k
      local vals = {}
      for k = 0, 3 do
        for j = 0, 2 do
          for i = 0, 1 do vals[#vals + 1] = 100 * i + 10 * j + k end
        end
      end
      write_bytes(dir .. "/f3.npy", npy(dict("<f8", "(2, 3, 4)", true), string.pack("<" .. string.rep("d", 24),
        table.unpack(vals))))
      local t3 = assert(attn.load_npy(dir .. "/f3.npy"))
      assert.are.same({ 2, 3, 4 }, t3:shape())
      for i = 0, 1 do
        for j = 0, 2 do
          for k = 0, 3 do assert.are.equal(100 * i + 10 * j + k, t3:get(i + 1, j + 1, k + 1)) end
        end
      end
      write_bytes(dir .. "/f1.npy", npy(dict("<f4", "(3,)", true), string.pack("<fff", 1, 2, 3)))
      assert.are.same({ 1, 2, 3 }, attn.load_npy(dir .. "/f1.npy"):totable())
    end)

    it("accepts header variants: double quotes, key order, no trailing comma, Python 2 longs, no padding", function()
      local data = string.pack("<ffffff", 1, 2, 3, 4, 5, 6)
      local variants = {
        '{"descr": "<f4", "fortran_order": False, "shape": (2, 3)}',
        "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
        "{'descr':'<f4','fortran_order':False,'shape':(2L, 3L),}",
        "  { 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 2 , 3 , ) }  ",
      }
      for i, h in ipairs(variants) do
        write_bytes(dir .. "/v.npy", npy(h, data, { raw = i == 4 }))
        local t, msg = attn.load_npy(dir .. "/v.npy")
        assert.is_not_nil(t, msg)
        assert.are.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:totable())
      end
    end)
  end)

  describe("corrupt files return nil and a message", function()
    local function expect_fail(content, pattern)
      helper.assert_load_fails(attn.load_npy, "load_npy", dir .. "/bad.npy", content, pattern)
    end
    local six = string.pack("<ffffff", 1, 2, 3, 4, 5, 6)

    it("a missing file", function()
      local t, msg = attn.load_npy(dir .. "/nope.npy")
      assert.is_nil(t)
      assert.matches("^load_npy: .*nope%.npy: No such file or directory", msg)
    end)

    it("a bad magic string or a too short file", function()
      expect_fail("", "not a %.npy file %(bad magic%)")
      expect_fail("\x93NUMP", "not a %.npy file %(bad magic%)")
      expect_fail("PK\3\4" .. string.rep("\0", 60), "not a %.npy file %(bad magic%)")
      expect_fail("\x93NUMPY\2\0\5\0", "file is 10 bytes, too short for a version 2%.0 preamble")
    end)

    it("an unsupported version", function()
      expect_fail(npy(dict("<f4", "(1,)"), "\0\0\0\0", { minor = 1 }),
        "unsupported %.npy version 1%.1 %(supported: 1%.0, 2%.0, 3%.0%)")
      expect_fail("\x93NUMPY\4\0" .. string.rep(" ", 60), "unsupported %.npy version 4%.0")
    end)

    it("a header length beyond the file", function()
      expect_fail("\x93NUMPY\1\0" .. string.pack("<I2", 500) .. "{'descr'",
        "header length 500 exceeds the 8 bytes after the preamble %(truncated file%?%)")
      expect_fail("\x93NUMPY\2\0" .. string.pack("<I4", 0xffffffff) .. "{}",
        "header length 4294967295 exceeds the 2 bytes after the preamble")
    end)

    it("a header that is not a Python literal", function()
      expect_fail(npy("{'descr': <f4, 'fortran_order': False, 'shape': (2, 3), }", six),
        "header is not a Python literal: unexpected '<' at character 11 of the header")
      expect_fail(npy("{'descr': '<f4, 'fortran_order': False}", six), "header is not a Python literal: ")
      expect_fail(npy("{'descr': '<f4", six), "header is not a Python literal: unterminated string")
      expect_fail(npy(dict("<f4", "(2, 3)") .. " junk", six),
        "header is not a Python literal: unexpected 'j' after the dict")
      expect_fail(npy(dict("<f4", "(2.5, 3)"), six), "header is not a Python literal: expected ',' or '%)'")
      expect_fail(npy(dict("<f4", "(99999999999999999999,)"), six),
        "header is not a Python literal: integer 99999999999999999999 out of range")
      expect_fail(npy(dict("<f4", string.rep("(", 40) .. string.rep(")", 40)), six),
        "header is not a Python literal: nesting too deep")
      expect_fail(npy("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (2, 3)}", six),
        "header is not a Python literal: duplicate key 'descr'")
      expect_fail(npy("", six), "header is not a Python literal: unexpected end")
    end)

    it("a header that is not a dict", function()
      expect_fail(npy("[1, 2]", six), "header is a list, not a dict")
      expect_fail(npy("'descr'", six), "header is 'descr', not a dict")
    end)

    it("missing or unexpected keys", function()
      expect_fail(npy("{'descr': '<f4', 'fortran_order': False}", six), "header has no 'shape' key")
      expect_fail(npy("{'fortran_order': False, 'shape': (6,)}", six), "header has no 'descr' key")
      expect_fail(npy("{'descr': '<f4', 'shape': (6,)}", six), "header has no 'fortran_order' key")
      expect_fail(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'extra': 1}", six),
        "header has an unexpected key 'extra'")
    end)

    it("an unsupported or structured descr", function()
      expect_fail(npy(dict("<c8", "(3,)"), six), "unsupported descr '<c8' %(supported: <f4, <f8, <f2, <i4, <i8 and ")
      expect_fail(npy(dict("|u1", "(24,)"), six), "unsupported descr '|u1'")
      expect_fail(npy(dict("<U3", "(2,)"), six), "unsupported descr '<U3'")
      expect_fail(npy(dict("f4", "(6,)"), six), "unsupported descr 'f4'")
      expect_fail(npy("{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (6,), }", six),
        "descr is a list; structured dtypes are not supported")
    end)

    it("a bad fortran_order or shape", function()
      expect_fail(npy("{'descr': '<f4', 'fortran_order': 'no', 'shape': (6,), }", six),
        "fortran_order is 'no', not True or False")
      expect_fail(npy("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", six),
        "shape is a list, not a tuple")
      expect_fail(npy(dict("<f4", "(6)"), six), "shape is 6, not a tuple")
      expect_fail(npy(dict("<f4", "None"), six), "shape is None, not a tuple")
      expect_fail(npy(dict("<f4", "(2, -3)"), six), "shape entry 2 is %-3, not a non%-negative integer")
      expect_fail(npy(dict("<f4", "(True,)"), six), "shape entry 1 is True, not a non%-negative integer")
      expect_fail(npy(dict("<f4", "('2', 3)"), six), "shape entry 1 is '2', not a non%-negative integer")
      expect_fail(npy(dict("<f4", "(1, 1, 1, 1, 1, 1, 1, 1, 6)"), six),
        "shape %(1, 1, 1, 1, 1, 1, 1, 1, 6%) has 9 dims, at most 8 are supported")
      expect_fail(npy(dict("<f8", "(1099511627776, 1099511627776)"), six),
        "shape %(1099511627776, 1099511627776%) is too large")
    end)

    it("truncated data and trailing bytes (rejected by design)", function()
      expect_fail(npy(dict("<f4", "(2, 3)"), six:sub(1, 20)),
        "data are 20 bytes, shape %(2, 3%) of '<f4' needs 24 %(truncated file%?%)$")
      expect_fail(npy(dict("<f8", "()"), ""), "data are 0 bytes, shape %(%) of '<f8' needs 8")
      expect_fail(npy(dict("<f4", "(2, 3)"), six .. "\0\0\0\0"),
        "4 trailing bytes after the data of shape %(2, 3%) of '<f4'$")
      expect_fail(npy(dict("<f4", "(0,)"), "x"), "1 trailing bytes after the data of shape %(0,%)")
    end)

    it("every truncation of a valid file", function()
      local good = dir .. "/good.npy"
      assert.is_true(attn.save_npy(good, attn.randn({ 2, 3 }, "float64")))
      helper.assert_truncations_fail(good, dir .. "/cut.npy", attn.load_npy, "^load_npy: .*cut%.npy: ")
    end)

    it("random byte corruption never raises", function()
      local good = dir .. "/good.npy"
      assert.is_true(attn.save_npy(good, attn.randn({ 3, 2 })))
      helper.assert_byte_flips_never_raise(good, dir .. "/flip.npy", attn.load_npy, "^load_npy: ", 424242)
    end)
  end)

  describe("atomic writes", function()
    local temp_files = helper.temp_files

    it("returns nil, msg when the directory does not exist", function()
      local ok, msg = attn.save_npy(dir .. "/missing/a.npy", attn.ones({ 2 }))
      assert.is_nil(ok)
      assert.matches("^save_npy: .*/missing/a%.npy: cannot create temporary file .*No such file or directory", msg)
    end)

    it("leaves the previous file intact and no temporary file when the argument is bad", function()
      local path = dir .. "/a.npy"
      assert.is_true(attn.save_npy(path, attn.ones({ 3 })))
      local before = read_bytes(path)
      assert.error_matches(function() attn.save_npy(path, { 1, 2, 3 }) end, "save_npy: expected a tensor, got a table")
      assert.error_matches(function() attn.save_npy(path, nil) end, "save_npy: expected a tensor, got a nil")
      local freed = attn.ones({ 3 })
      core.free(freed)
      assert.error_matches(function() attn.save_npy(path, freed) end, "use of freed tensor")
      assert.are.equal(before, read_bytes(path))
      assert.are.same({ "a.npy" }, list_dir(dir))
    end)

    it("removes the temporary file when the final rename fails", function()
      local target = dir .. "/a.npy"
      assert(lfs.mkdir(target))
      local ok, msg = attn.save_npy(target, attn.randn({ 32, 32 }))
      assert.is_nil(ok)
      assert.matches("^save_npy: .*a%.npy: cannot rename temporary file '.*/a%.npy%.tmp%.%d+%.%x+': ", msg)
      assert.are.same({}, temp_files(dir))
      assert.are.equal("directory", lfs.attributes(target, "mode"))
    end)

    it("replaces an existing file completely", function()
      local path = dir .. "/a.npy"
      assert.is_true(attn.save_npy(path, attn.randn({ 50, 50 }, "float64")))
      local small = attn.tensor({ 1, 2, 3 })
      assert.is_true(attn.save_npy(path, small))
      assert.are.equal(128 + 12, #read_bytes(path)) -- 10-byte preamble + header padded to 128, 3 floats
      assert_same(attn.load_npy(path), small)
      assert.are.same({ "a.npy" }, list_dir(dir))
    end)
  end)

  describe("interop with numpy #interop", function()
    local python = os.getenv("ATTN_PYTHON") or "/usr/bin/python3" -- ATTN_PYTHON=/nonexistent tests the skip
    local function have_numpy()
      return os.execute(python .. ' -c "import numpy" >/dev/null 2>&1') == true
    end

    local function run_python(script_text, ...)
      local script = dir .. "/interop.py"
      write_bytes(script, script_text)
      local p = assert(io.popen(python .. " " .. script .. " " .. table.concat({ ... }, " ")))
      local out = p:read("a")
      assert.is_true(p:close(), "python failed")
      return cjson.decode(out)
    end

    it("numpy loads what attn.save_npy writes", function()
      if not have_numpy() then pending("numpy is not available to " .. python .. " (apt-get install python3-numpy)") end
      attn.manual_seed(13)
      local cases = {
        a = attn.randn({ 2, 3 }), b = attn.randn({ 3, 4 }, "float64"):transpose(1, 2), c = attn.tensor(0.5, "float64"),
        d = attn.zeros({ 0, 4 }), e = attn.randn({ 5 }),
      }
      for name, t in pairs(cases) do assert.is_true(attn.save_npy(dir .. "/" .. name .. ".npy", t)) end
      local got = run_python([=[
import json, sys
import numpy as np
out = {}
for name in "abcde":
    a = np.load(sys.argv[1] + "/" + name + ".npy")
    out[name] = {"dtype": str(a.dtype), "shape": list(a.shape), "values": [float(x) for x in a.ravel()]}
print(json.dumps(out))
]=], dir)
      for name, t in pairs(cases) do
        assert.are.equal(t:dtype(), got[name].dtype, name)
        assert.are.same(t:shape(), got[name].shape, name)
        assert.are.same(flatten({ t:totable() }), got[name].values, name)
      end
    end)

    it("attn.load_npy reads what numpy writes", function()
      if not have_numpy() then pending("numpy is not available to " .. python .. " (apt-get install python3-numpy)") end
      local expected = run_python([=[
import json, sys
import numpy as np
d = sys.argv[1]
arrays = {
    "f4": np.arange(6, dtype="<f4").reshape(2, 3) / 7,
    "f8": np.asfortranarray(np.arange(12, dtype="<f8").reshape(3, 4) * 0.1),
    "f8t": np.arange(24, dtype="<f8").reshape(2, 3, 4).transpose(2, 0, 1),
    "s": np.array(np.pi),
    "be": np.array([1.5, -2.25, 1e-3], dtype=">f4"),
    "i8": np.array([[-5, 7], [1 << 40, 0]], dtype="<i8"),
    "i4": np.array([-1, 2, 3], dtype="<i4"),
    "f2": np.array([0.5, 65504, -1e-4], dtype="<f2"),
    "e": np.zeros((0, 3), dtype="<f4"),
}
out = {}
for name, a in arrays.items():
    np.save(d + "/" + name + ".npy", a)
    out[name] = {"shape": list(a.shape), "values": [float(x) for x in a.ravel(order="C")]}
with open(d + "/v2.npy", "wb") as f:
    np.lib.format.write_array(f, arrays["f4"], version=(2, 0))
out["v2"] = out["f4"]
print(json.dumps(out))
]=], dir)
      local dtypes = { f4 = "float32", f8 = "float64", f8t = "float64", s = "float64", be = "float32", i8 = "int64",
        i4 = "int64", f2 = "float32", e = "float32", v2 = "float32" }
      for name, dt in pairs(dtypes) do
        local t, msg = attn.load_npy(dir .. "/" .. name .. ".npy")
        assert.is_not_nil(t, msg)
        assert.are.equal(dt, t:dtype(), name)
        assert.are.same(expected[name].shape, t:shape(), name)
        assert.are.same(expected[name].values, flatten({ t:totable() }), name)
      end
    end)
  end)
end)
