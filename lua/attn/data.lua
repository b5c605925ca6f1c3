--- General data: idx files (the MNIST family's format), PNG images,
-- Fashion-MNIST, and captioned scenes made of its items.
--
-- **Files.** `read_idx` reads plain idx files and gzip-compressed ones (as
-- Debian ships Fashion-MNIST); gzip data goes through `gzip -dc` (Debian's
-- essential `gzip`, so no library is linked for it). PNG goes through cairo
-- (`attn.cairo`, the plotting module). File and format problems (missing,
-- truncated or corrupt files, an unknown type code) return `nil, message`;
-- wrong arguments raise.
--
-- **Fashion-MNIST** (Zalando, MIT licence) comes from Debian's package
-- `dataset-fashion-mnist` (`make deps` installs it, `make deps-images` installs
-- only it), under `/usr/share/datasets/fashion-mnist/`; another folder with the
-- four idx files (gzip-compressed or not) can be given.
--
-- **Deprecated alias.** Until the next release this module also holds every
-- name of the book's kit `attn.d2l.data` (the same functions and tables), as
-- `attn.data` used to be the kit's name; use `attn.d2l.data` for those.
-- @module attn.data
local attn = require "attn"
local core = require "attn.core"
local check = require "attn.check"
local kit = require "attn.d2l.data"

local data = {}

-- ---------------------------------------------------------------- byte sources

local GZIP_MAGIC = "\31\139"

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Up to n bytes of the open file f, read in chunks: Lua's f:read(n) allocates n
-- bytes first, and n comes from a file header (a corrupt one may claim terabytes).
local CHUNK = 1 << 24
local function read_upto(f, n)
  local parts = {}
  while n > 0 do
    local s = f:read(math.min(n, CHUNK))
    if not s then break end
    parts[#parts + 1] = s
    n = n - #s
  end
  return table.concat(parts)
end

-- A byte source over the file at path: read(n) -> up to n bytes, close() ->
-- true or nil, message. A gzip file (by its magic bytes) is read through
-- `gzip -dc`, whose failure (corrupt or truncated gzip data) close() reports.
local function open_bytes(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local magic = f:read(2)
  if magic ~= GZIP_MAGIC then
    f:seek("set", 0)
    return { read = function(n) return read_upto(f, n) end, close = function() f:close() return true end }
  end
  f:close()
  local p = io.popen("gzip -dc -- " .. shell_quote(path) .. " 2>/dev/null", "r")
  if not p then return nil, path .. ": cannot start gzip -dc" end
  return {
    gzip = true,
    read = function(n) return read_upto(p, n) end,
    close = function()
      local ok, how, code = p:close()
      if ok then return true end
      return nil, string.format("%s: gzip -dc failed (%s %s): corrupt or truncated gzip data%s", path, how, code,
        code == 127 and " (or gzip is not installed)" or "")
    end,
  }
end

-- ---------------------------------------------------------------- idx

-- idx type code -> encoding of core.tensor_from_bytes, bytes per element
local IDX_TYPES = { [0x08] = { "uint8", 1 }, [0x09] = { "int8", 1 }, [0x0B] = { "int16", 2 },
  [0x0C] = { "int32", 4 }, [0x0D] = { "float32", 4 }, [0x0E] = { "float64", 8 } }

-- Reads the idx data from src; returns the tensor, or nil, message (without the path).
local function parse_idx(src, limit)
  local head = src.read(4)
  if #head < 4 then return nil, string.format("truncated: %d bytes, an idx header has 4 or more", #head) end
  local z1, z2, code, ndim = head:byte(1, 4)
  if z1 ~= 0 or z2 ~= 0 then
    return nil, string.format("not an idx file: the magic number starts %02x %02x, not 00 00", z1, z2)
  end
  local enc = IDX_TYPES[code]
  if not enc then
    return nil, string.format("unknown idx type code 0x%02x (known: 08 uint8, 09 int8, 0B int16, 0C int32, " ..
      "0D float32, 0E float64)", code)
  end
  if ndim < 1 or ndim > 8 then return nil, string.format("%d dimensions (1 to 8 are read)", ndim) end
  local dims_bytes = src.read(4 * ndim)
  if #dims_bytes < 4 * ndim then
    return nil, string.format("truncated: the header has %d of its %d size bytes", #dims_bytes, 4 * ndim)
  end
  local shape = { string.unpack(">" .. string.rep("I4", ndim), dims_bytes) }
  shape[ndim + 1] = nil -- (unpack's next position)
  local limited = limit and limit < shape[1]
  if limited then shape[1] = limit end
  local bytes = enc[2] + 0.0 -- counted in floats first: 8 sizes of 2^32 overflow an integer
  for d = 1, ndim do
    if shape[d] >= 2 ^ 31 then return nil, string.format("size %d is %d (wrong dims?)", d, shape[d]) end
    bytes = bytes * shape[d]
  end
  local dims = core.shape_str(shape)
  if bytes > 2 ^ 40 then return nil, string.format("sizes %s describe %.0f bytes (wrong dims?)", dims, bytes) end
  local need = math.tointeger(bytes)
  local body = src.read(need)
  if #body < need then
    return nil, string.format("truncated: %s %s needs %d data bytes, the file has %d", enc[1], dims, need, #body)
  end
  if not limited and src.read(1) ~= "" then
    return nil, string.format("more bytes than %s %s needs (%d; wrong dims?)", enc[1], dims, need)
  end
  return core.tensor_from_bytes(body, 0, enc[1], shape, true), limited
end

--- Reads an idx file (the format of MNIST and Fashion-MNIST), plain or
-- gzip-compressed. Big-endian sizes from the header; elements by type code:
-- 0x08 unsigned bytes, 0x09 signed bytes and 0x0B shorts load as float32
-- (exact, half int64's memory), 0x0C ints as int64, 0x0D floats as float32 and
-- 0x0E doubles as float64.
-- @tparam string path
-- @tparam[opt] table opts `limit`: read only the first `limit` entries along
--   dim 1 (the rest of the file is not read, nor, for gzip data, its checksum)
-- @treturn[1] Tensor with the file's sizes (dim 1 cut to `limit`)
-- @treturn[2] nil
-- @treturn[2] string "read_idx: <path>: ..." for a missing, truncated or corrupt
--   file, bad magic bytes, an unknown type code, or sizes that do not match the data
-- @raise when path is not a string or an option is wrong
-- @usage local labels = assert(data.read_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"))
function data.read_idx(path, opts)
  check.lua_type("read_idx", "path", path, "string")
  opts = check.options("read_idx", opts, { "limit" })
  local limit = opts.limit
  if limit ~= nil and (math.type(limit) ~= "integer" or limit < 0) then
    error("read_idx: limit must be an integer >= 0, got " .. tostring(limit), 2)
  end
  local src, err = open_bytes(path)
  if not src then return nil, "read_idx: " .. err end
  local t, info = parse_idx(src, limit)
  -- a limited read stops the pipe early, so gzip's status says nothing then
  local closed, cerr = src.close()
  if src.gzip and not closed and not (t and info) then return nil, "read_idx: " .. cerr end
  if not t then return nil, string.format("read_idx: %s: %s", path, info) end
  return t
end

-- ---------------------------------------------------------------- PNG

local cairo_module
local function cairo()
  cairo_module = cairo_module or require "attn.cairo"
  return cairo_module
end

--- Writes an image as a PNG file (through cairo): 8 bits per channel, RGB for
-- gray and colour images (each value rounded to the nearest of 256 levels), RGBA
-- for 4 channels. Values outside [0, 1] are clamped.
-- @tparam string path
-- @tparam Tensor image float32 or float64: (H, W) or (1, H, W) gray, (3, H, W)
--   RGB, (4, H, W) RGBA (not premultiplied); H and W at most 16384
-- @treturn[1] boolean true
-- @treturn[2] nil
-- @treturn[2] string "write_png: <path>: ..." when the file cannot be written
-- @raise on a wrong shape or dtype, or NaN values
-- @usage data.write_png("item.png", images[1])
function data.write_png(path, image)
  check.lua_type("write_png", "path", path, "string")
  check.tensor("write_png", "image", image)
  local shape = core.shape(image)
  local channels = #shape == 3 and shape[1] or 1
  if not (#shape == 2 or (#shape == 3 and (channels == 1 or channels == 3 or channels == 4))) or
    core.dtype(image) == "int64" then
    error(string.format("write_png: image must be a float (H, W) or (C, H, W) tensor with C = 1, 3 or 4, got %s %s",
      core.dtype(image), core.shape_str(image)), 2)
  end
  if core.numel(image) > 0 and image:ne(image):sum():item() > 0 then error("write_png: image has NaN values", 2) end
  local bytes = core.tensor_to_bytes(core.contiguous(core.to(image, "float32")))
  local s, err = cairo().image(shape[#shape], shape[#shape - 1], channels, bytes, path)
  if not s then return nil, "write_png: " .. err end
  local ok, ferr = s:finish()
  if not ok then return nil, string.format("write_png: %s: %s", path, ferr) end
  return true
end

--- Reads a PNG file (through cairo; 16-bit and palette images are read as 8 bits).
-- @tparam string path
-- @tparam[opt] table opts `channels`: 1 (gray: a colour image becomes its
--   luma 0.299 R + 0.587 G + 0.114 B), 3 (RGB; alpha is dropped) or 4 (RGBA);
--   by default 1 when the image is opaque and gray (R = G = B everywhere), 4
--   when it has an alpha channel, else 3
-- @treturn[1] Tensor float32 in [0, 1]: (H, W) for 1 channel, else (C, H, W)
-- @treturn[2] nil
-- @treturn[2] string "read_png: <path>: ..." for a missing or corrupt file
-- @raise on a wrong option
-- @usage local img = assert(data.read_png("item.png")) -- (28, 28) for a gray item
function data.read_png(path, opts)
  check.lua_type("read_png", "path", path, "string")
  opts = check.options("read_png", opts, { "channels" })
  local channels = opts.channels
  if channels ~= nil and channels ~= 1 and channels ~= 3 and channels ~= 4 then
    error("read_png: channels must be 1, 3 or 4, got " .. tostring(channels), 2)
  end
  local s <close>, err = cairo().read_png(path)
  if not s then return nil, "read_png: " .. err end
  local width, height = s:size()
  local bytes, has_alpha = s:rgba()
  local rgba = core.contiguous(core.permute(core.tensor_from_bytes(bytes, 0, "uint8", { height, width, 4 }), { 3, 1, 2 }))
  rgba:div_(255)
  local function plane(k) return core.select(rgba, 1, k) end
  local gray = not has_alpha and plane(1):eq(plane(2)):sum():item() == width * height and
    plane(2):eq(plane(3)):sum():item() == width * height
  channels = channels or (has_alpha and 4) or (gray and 1) or 3
  if channels == 4 then return rgba end
  if channels == 3 then return core.contiguous(core.narrow(rgba, 1, 1, 3)) end
  if gray then return core.contiguous(plane(1)) end
  return plane(1) * 0.299 + plane(2) * 0.587 + plane(3) * 0.114
end

-- ---------------------------------------------------------------- Fashion-MNIST

local FASHION_DIR = "/usr/share/datasets/fashion-mnist"
local FASHION_NAMES = { "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
  "Ankle boot" }
local FASHION_WORDS = { "tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot" }

--- Fashion-MNIST's ten class names and one-word names (the captions' words),
-- in label order (label 1 is T-shirt/top, "tshirt").
-- @treturn {string,...} names: T-shirt/top, Trouser, Pullover, Dress, Coat,
--   Sandal, Shirt, Sneaker, Bag, Ankle boot
-- @treturn {string,...} words: tshirt trouser pullover dress coat sandal shirt
--   sneaker bag boot
-- @usage local names, words = data.fashion_classes()
function data.fashion_classes()
  return table.move(FASHION_NAMES, 1, 10, 1, {}), table.move(FASHION_WORDS, 1, 10, 1, {})
end

local function find_file(dir, stem)
  for _, name in ipairs { stem .. ".gz", stem } do
    local f = io.open(dir .. "/" .. name, "rb")
    if f then
      f:close()
      return dir .. "/" .. name
    end
  end
end

--- Loads Fashion-MNIST's training set (60,000 images) or test set (10,000).
-- @tparam[opt] table opts `split` "train" (default) or "test"; `dir` the folder
--   of the idx files (default `/usr/share/datasets/fashion-mnist`, from Debian's
--   `dataset-fashion-mnist`); `n`: only the first n images and labels
-- @treturn[1] Tensor images (N, 28, 28) float32 in [0, 1]
-- @treturn[1] Tensor labels (N) int64 in 1..10 (the file's label + 1)
-- @treturn[1] {string,...} the class names (as `fashion_classes`)
-- @treturn[2] nil
-- @treturn[2] string when the files are missing (the message names the Debian
--   package and the examples' `--data` option), truncated or corrupt
-- @raise on a wrong option
-- @usage local images, labels, names = assert(data.fashion_mnist({split = "test"}))
function data.fashion_mnist(opts)
  opts = check.options("fashion_mnist", opts, { "split", "dir", "n" })
  local split, dir = opts.split or "train", opts.dir or FASHION_DIR
  if split ~= "train" and split ~= "test" then
    error("fashion_mnist: split must be \"train\" or \"test\", got " .. tostring(split), 2)
  end
  check.lua_type("fashion_mnist", "dir", dir, "string")
  if opts.n ~= nil then check.positive_int("fashion_mnist", "n", opts.n) end
  local prefix = split == "train" and "train" or "t10k"
  local ipath = find_file(dir, prefix .. "-images-idx3-ubyte")
  local lpath = find_file(dir, prefix .. "-labels-idx1-ubyte")
  if not ipath or not lpath then
    return nil, string.format("fashion_mnist: no Fashion-MNIST %s files (%s-images-idx3-ubyte[.gz] and " ..
      "%s-labels-idx1-ubyte[.gz]) in %s: install Debian's package dataset-fashion-mnist (make deps-images) " ..
      "or pass --data DIR with the folder that holds them", split, prefix, prefix, dir)
  end
  local images, err = data.read_idx(ipath, { limit = opts.n })
  if not images then return nil, err end
  local labels
  labels, err = data.read_idx(lpath, { limit = opts.n })
  if not labels then return nil, err end
  local ishape, lshape = core.shape(images), core.shape(labels)
  if #ishape ~= 3 or ishape[2] ~= 28 or ishape[3] ~= 28 or #lshape ~= 1 or lshape[1] ~= ishape[1] then
    return nil, string.format("fashion_mnist: %s and %s hold images %s and labels %s, not (N, 28, 28) and (N)", ipath,
      lpath, core.shape_str(images), core.shape_str(labels))
  end
  if lshape[1] > 0 and (labels:min():item() < 0 or labels:max():item() > 9) then
    return nil, string.format("fashion_mnist: %s: labels outside 0..9", lpath)
  end
  images:div_(255)
  return images, core.to(labels, "int64") + 1, (data.fashion_classes())
end

-- ---------------------------------------------------------------- scenes

-- Uniform integer in lo..hi from u in [0, 1).
local function pick(u, lo, hi) return lo + math.min(math.floor(u * (hi - lo + 1)), hi - lo) end

local SPLITS = { train = "train", val = "train", test = "test" }

-- The option values of scenes, checked; raises naming the option.
local function scene_options(opts)
  opts = check.options("scenes", opts, { "n", "split", "seed", "items", "grid", "clutter", "dir", "source" }, 4)
  local o = { n = opts.n, split = opts.split or "train", seed = opts.seed or 0, grid = opts.grid or 3,
    clutter = opts.clutter or 0, items = opts.items or { 1, 4 } }
  check.positive_int("scenes", "n", o.n, 4)
  if not SPLITS[o.split] then error("scenes: split must be \"train\", \"val\" or \"test\", got " .. tostring(o.split), 3) end
  if math.type(o.seed) ~= "integer" then error("scenes: seed must be an integer, got " .. tostring(o.seed), 3) end
  check.positive_int("scenes", "grid", o.grid, 4)
  if type(o.clutter) ~= "number" or not (o.clutter >= 0 and o.clutter <= 1) then
    error("scenes: clutter must be a number in [0, 1], got " .. tostring(o.clutter), 3)
  end
  local lo, hi = o.items[1], o.items[2]
  if type(o.items) ~= "table" or math.type(lo) ~= "integer" or math.type(hi) ~= "integer" or lo < 1 or hi < lo or
    hi > o.grid * o.grid then
    error(string.format("scenes: items must be {min, max} with 1 <= min <= max <= grid^2 = %d", o.grid * o.grid), 3)
  end
  return o, opts
end

--- Captioned scenes: each canvas holds 1 to 4 (`items`) Fashion-MNIST items at
-- distinct random cells of a grid (3 x 3 cells of 28 x 28 on 84 x 84 by
-- default), and its caption names them in reading order (by rows, then
-- columns), then `<eos>`: "sneaker bag shirt <eos>". Reproducible: drawn from
-- attn's generator seeded with `seed`, whose state is restored afterwards.
-- Train and validation scenes take items from Fashion-MNIST's training images
-- (validation: the last sixth, images 50,001..60,000; train: the rest), test
-- scenes from its test images only.
-- @tparam table opts `n` (scenes, required); `split` "train" (default), "val"
--   or "test"; `seed` (default 0); `items` `{min, max}` items per scene (default
--   `{1, 4}`); `grid` cells per side (default 3); `clutter` in [0, 1] (default 0):
--   the empty cells get uniform noise in [0, clutter); `dir` the dataset folder
--   (as `fashion_mnist`); `source` `{images = (N, h, w), labels = (N) in 1..10}`
--   to use instead of loading the dataset (the training set for "train" and
--   "val", the test set for "test")
-- @treturn[1] table scenes: `canvases` (n, 1, grid*h, grid*w) float32; `captions`
--   (n, max + 1) int64 token ids, padded with `<pad>`; `valid_len` (n) int64 (words
--   + 1 for `<eos>`); `boxes[i][j]` = `{top, bottom, left, right}`, the 1-based
--   inclusive pixel rows and columns of item j of scene i (its cell: inside it the
--   canvas equals the item's image); `classes[i][j]` its label (1..10);
--   `sources[i][j]` its index in the Fashion-MNIST split; `word_item[i][t]` the
--   item that word t of the caption names; `vocab` (the kit's `Vocab`: `<unk>`,
--   `<pad>`, `<bos>`, `<eos>`, then the ten words); `words` the ten words; `split`
-- @treturn[2] nil
-- @treturn[2] string when the dataset is missing or unreadable (as `fashion_mnist`)
-- @raise on wrong options, or a source too small for the split
-- @usage local s = assert(data.scenes({n = 1000, split = "train", seed = 1}))
-- print(table.concat(s.vocab:tokens(s.captions[1]), " ")) -- e.g. "sneaker bag shirt <eos> <pad>"
function data.scenes(opts)
  local o, raw = scene_options(opts)
  local source = raw.source
  local images, labels
  if source ~= nil then
    check.lua_type("scenes", "source", source, "table")
    images, labels = source.images, source.labels
    check.tensor("scenes", "source.images", images, 3, "(N, h, w)")
    check.tensor("scenes", "source.labels", labels, 1, "(N)")
  else
    images, labels = data.fashion_mnist({ split = SPLITS[o.split], dir = raw.dir })
    if not images then return nil, labels end
  end
  local count, h, w = table.unpack(core.shape(images))
  local val = count // 6
  local first, last = 1, count
  if o.split == "train" then last = count - val elseif o.split == "val" then first = count - val + 1 end
  if last < first then error(string.format("scenes: %d source images leave none for split %s", count, o.split), 2) end
  local label_of = core.to(labels, "int64"):totable()

  local n, grid, lo, hi = o.n, o.grid, o.items[1], o.items[2]
  local saved = core.rng_state()
  attn.manual_seed(o.seed)
  local u = attn.rand({ n, 1 + 2 * hi }, "float64"):totable()
  local noise = o.clutter > 0 and attn.rand({ n, 1, grid * h, grid * w }) or nil
  core.rng_state(saved)

  local canvases = attn.zeros(n, 1, grid * h, grid * w)
  local empty = noise and attn.ones(n, 1, grid * h, grid * w) or nil
  local vocab = kit.Vocab(FASHION_WORDS, { reserved = { "<pad>", "<bos>", "<eos>" } })
  local pad, eos = vocab:id("<pad>"), vocab:id("<eos>")
  local rows, valid, boxes, classes, sources, word_item = {}, {}, {}, {}, {}, {}
  for i = 1, n do
    local ui = u[i]
    local k = pick(ui[1], lo, hi)
    local cells = {}
    for c = 1, grid * grid do cells[c] = c end
    for j = 1, k do -- a partial Fisher-Yates shuffle: k distinct cells
      local r = pick(ui[1 + j], j, grid * grid)
      cells[j], cells[r] = cells[r], cells[j]
    end
    local canvas = core.select(core.select(canvases, 1, i), 1, 1)
    boxes[i], classes[i], sources[i], word_item[i] = {}, {}, {}, {}
    for j = 1, k do
      local src = pick(ui[1 + hi + j], first, last)
      local row, col = (cells[j] - 1) // grid, (cells[j] - 1) % grid
      local box = { row * h + 1, row * h + h, col * w + 1, col * w + w }
      core.copy_(core.narrow(core.narrow(canvas, 1, box[1], h), 2, box[3], w), core.select(images, 1, src))
      if empty then core.fill_(core.narrow(core.narrow(core.select(core.select(empty, 1, i), 1, 1), 1, box[1], h), 2,
        box[3], w), 0) end
      boxes[i][j], classes[i][j], sources[i][j] = box, label_of[src], src
    end
    local order = {}
    for j = 1, k do order[j] = j end
    table.sort(order, function(a, b) return cells[a] < cells[b] end)
    local ids = {}
    for t, j in ipairs(order) do
      ids[t] = vocab:id(FASHION_WORDS[classes[i][j]])
      word_item[i][t] = j
    end
    ids[k + 1] = eos
    for t = k + 2, hi + 1 do ids[t] = pad end
    rows[i], valid[i] = ids, k + 1
  end
  if noise then canvases = canvases + noise * empty * o.clutter end
  return { canvases = canvases, captions = attn.tensor(rows, "int64"), valid_len = attn.tensor(valid, "int64"),
    boxes = boxes, classes = classes, sources = sources, word_item = word_item, vocab = vocab,
    words = table.move(FASHION_WORDS, 1, 10, 1, {}), split = o.split }
end

-- ---------------------------------------------------------------- the kit's names

-- The deprecated alias: every name of attn.d2l.data, the same values.
for k, v in pairs(kit) do
  assert(data[k] == nil, "attn.data: a name of its own shadows the kit's " .. k)
  data[k] = v
end

return data
