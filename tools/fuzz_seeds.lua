-- Seed inputs for tools/fuzz_files.c in the folder arg[1]: a valid file for
-- each reader, prefixed with the reader's selector byte.
local attn = require "attn"
local dir = assert(arg[1], "usage: fuzz_seeds.lua DIR")
local function prefixed(byte, src, dst)
  local f = assert(io.open(src, "rb"))
  local body = f:read("a")
  f:close()
  f = assert(io.open(dst, "wb"))
  f:write(string.char(byte), body)
  f:close()
  os.remove(src)
end
attn.manual_seed(1)
assert(attn.save(dir .. "/st.tmp", { ["w.weight"] = attn.randn({ 2, 3 }), b = attn.randn({ 3 }, "float64"),
  ids = attn.tensor({ 1, 2 }, "int64") }, { epoch = "1" }))
prefixed(0, dir .. "/st.tmp", dir .. "/safetensors")
assert(attn.save_npy(dir .. "/npy.tmp", attn.randn({ 2, 2 })))
prefixed(1, dir .. "/npy.tmp", dir .. "/npy")
local f = assert(io.open(dir .. "/fra.tmp", "wb"))
f:write("Go.\tVa !\tCC-BY\nHi.\tSalut !\tCC-BY\n")
f:close()
prefixed(2, dir .. "/fra.tmp", dir .. "/fra")
