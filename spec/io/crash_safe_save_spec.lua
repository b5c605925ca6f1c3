-- Saves that are killed, refused or run out of space: the target is always a
-- complete file (old or new, bit-exact), and no temporary file outlives them.
local attn = require "attn"
local helper = require "helper"

local SIDE = 512 -- a 1 MiB float32 tensor per save, so a kill often lands mid-write

-- Every element of the loaded tensor equals the version named in the metadata.
local function assert_whole_version(path)
  local t, meta = attn.load(path)
  assert.is_table(t, tostring(meta))
  local v = tonumber(meta.version)
  assert.are.same({ SIDE, SIDE }, t.w:shape())
  assert.are.equal("float32", t.w:dtype())
  -- bit-exact (the bytes, not 262,144 element assertions)
  assert.is_true(attn.core.tensor_to_bytes(t.w) == attn.core.tensor_to_bytes(attn.full({ SIDE, SIDE }, v)),
    "version " .. v .. " is not whole")
  return v
end

local function save_version(path, v)
  return attn.save(path, { w = attn.full({ SIDE, SIDE }, v) }, { version = tostring(v) })
end

local function sh(cmd) return os.execute(cmd) == true end

describe("crash-safe saves", function()
  local dir
  before_each(function() dir = helper.make_tmpdir() end)
  after_each(function() helper.remove_tree(dir) end)

  it("a save killed with SIGKILL at random points leaves the old or the new file, and no temporary", function()
    local path = dir .. "/m.safetensors"
    assert.is_true(save_version(path, 0))
    local child = dir .. "/child.lua"
    helper.write_bytes(child, string.format([[
      local attn = require "attn"
      for v = 1, 1e9 do
        assert(attn.save(%q, { w = attn.full({ %d, %d }, v) }, { version = tostring(v) }))
      end
    ]], path, SIDE, SIDE))
    math.randomseed(7)
    local seen = {}
    for trial = 1, 24 do
      local delay = math.random(30, 300) / 1000
      assert.is_true(sh(string.format("%s & pid=$!; sleep %.3f; kill -9 $pid; wait $pid 2>/dev/null; true",
        helper.lua_command(child), delay)))
      seen[#seen + 1] = assert_whole_version(path)
      -- an unnamed temporary leaves nothing; a named one is removed by the next save
      assert.is_true(#helper.temp_files(dir) <= 1, "trial " .. trial .. ": " .. table.concat(helper.temp_files(dir), " "))
    end
    local last = assert_whole_version(path)
    assert.is_true(save_version(path, last))
    assert.are.same({}, helper.temp_files(dir))
    assert.is_true(#seen >= 20)
  end)

  it("removes temporaries left by processes that are gone, and only those", function()
    local path = dir .. "/m.safetensors"
    local p = assert(io.popen("sh -c 'echo $$'"))
    local dead = assert(tonumber(p:read("a")))
    p:close()
    local stale = string.format("%s.tmp.%d.0badf00d", path, dead)
    local alive = string.format("%s.tmp.1.0badf00d", path) -- pid 1 always exists
    local other = dir .. "/other.safetensors.tmp." .. dead .. ".0badf00d" -- another target's
    for _, f in ipairs({ stale, alive, other }) do helper.write_bytes(f, "partial") end
    assert.is_true(save_version(path, 3))
    assert.is_nil(io.open(stale))
    assert.is_not_nil(io.open(alive))
    assert.is_not_nil(io.open(other))
    assert_whole_version(path)
  end)

  it("a write error (file size limit) gives nil, a message and the old file intact", function()
    local path = dir .. "/m.safetensors"
    assert.is_true(save_version(path, 1))
    local before = helper.read_bytes(path)
    -- RLIMIT_FSIZE of 512 KiB with SIGXFSZ ignored: write() fails with EFBIG
    local ok, _, _, out = helper.run_lua(string.format([[
      local attn = require "attn"
      print(attn.save(%q, { w = attn.full({ %d, %d }, 2) }, { version = "2" }))
    ]], path, SIDE, SIDE), { shell = "trap '' XFSZ; ulimit -f 1024" })
    assert.is_true(ok)
    assert.matches("^nil\tsave: .*m%.safetensors: cannot write temporary file.*File too large", out)
    assert.are.equal(before, helper.read_bytes(path))
    assert.are.same({}, helper.temp_files(dir))
  end)

  -- A small tmpfs at dir/mnt, when this process may mount one (root in a
  -- container that allows it); nil otherwise.
  local function tmpfs(size)
    local mnt = dir .. "/mnt"
    assert(require("lfs").mkdir(mnt))
    if not sh(string.format("mount -t tmpfs -o size=%s tmpfs %s 2>/dev/null", size, mnt)) then return nil end
    finally(function() sh("umount " .. mnt) end)
    return mnt
  end

  it("a full disk gives nil, a message, the old file intact and no temporary", function()
    local mnt = tmpfs("1m")
    if not mnt then
      pending("cannot mount a small tmpfs here; the write-error path is covered by the file size limit case")
      return
    end
    local path = mnt .. "/m.safetensors"
    assert.is_true(attn.save(path, { w = attn.ones({ 16 }) }, { version = "1" }))
    local before = helper.read_bytes(path)
    local ok, msg = save_version(path, 2) -- 1 MiB of data does not fit next to the old file
    assert.is_nil(ok)
    assert.matches("^save: .*m%.safetensors: cannot write temporary file.*No space left on device", msg)
    assert.are.equal(before, helper.read_bytes(path))
    assert.are.same({}, helper.temp_files(mnt))
  end)

  it("an unwritable folder gives nil, a message and the old file intact", function()
    local folder, path
    if sh("[ $(id -u) -ne 0 ]") then -- permissions bind everyone but root
      folder = dir .. "/ro"
      assert(require("lfs").mkdir(folder))
      path = folder .. "/m.safetensors"
      assert.is_true(save_version(path, 1))
      assert.is_true(sh("chmod 555 " .. folder))
      finally(function() sh("chmod 755 " .. folder) end)
    else -- root: a read-only file system is what refuses writes
      folder = tmpfs("4m")
      if not folder then
        pending("running as root without the right to mount a read-only tmpfs")
        return
      end
      path = folder .. "/m.safetensors"
      assert.is_true(save_version(path, 1))
      assert.is_true(sh("mount -o remount,ro " .. folder))
    end
    local before = helper.read_bytes(path)
    local ok, msg = save_version(path, 2)
    assert.is_nil(ok)
    assert.matches("^save: .*m%.safetensors: cannot .*temporary file.*", msg)
    assert.is_truthy(msg:find("Read-only file system", 1, true) or msg:find("Permission denied", 1, true), msg)
    assert.are.equal(before, helper.read_bytes(path))
    assert.are.same({}, helper.temp_files(folder))
    assert.are.equal(1, assert_whole_version(path))
  end)
end)

