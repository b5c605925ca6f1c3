--- The book's machine-translation data pipeline (d2l `read_data_nmt`,
-- `preprocess_nmt`, `tokenize_nmt`, `Vocab`, `truncate_pad`, `build_array_nmt`,
-- `load_data_nmt`), reproduced exactly so its numbers come out the same.
--
-- **Ids are 1-based.** The Lua API counts from 1, so the book's 0-based id k is
-- k + 1 here. With the book's reserved tokens:
--
--     token     book   attn
--     <unk>       0      1
--     <pad>       1      2
--     <bos>       2      3
--     <eos>       3      4
--     go . (full corpus)   [47, 4]   {48, 5}
--
-- **601 pairs for 600.** The book stops reading only when the line index
-- (0-based) is strictly greater than `num_examples`, so `num_examples = 600`
-- reads lines 0..600: 601 pairs from a clean file. This module keeps that loop,
-- so the vocabularies (184 source / 201 target tokens) and batch counts match.
--
-- Malformed lines (no tab, more than one tab, an empty side, invalid UTF-8)
-- are skipped and listed in a report with their line numbers; they still count
-- as lines for `num_examples`, as in the book's loop.
-- @module attn.d2l.data
local attn = require "attn"
local check = require "attn.check"
local core = require "attn.core"

--- The dtype of id and length tensors (one place, so the whole pipeline follows it).
local ID_DTYPE = "int64"

local data = { ID_DTYPE = ID_DTYPE }

-- ---------------------------------------------------------------- lowercasing

-- Upper-case code points and their lower-case forms, as Python's str.lower()
-- maps them (the book lowercases with it). Each range is {first, last, step,
-- delta}: the code points first, first + step, ..., last map to cp + delta.
local upper_ranges = {
  { 0x41, 0x5A, 1, 32 },    -- ASCII A..Z
  { 0xC0, 0xD6, 1, 32 },    -- Latin-1 À..Ö
  { 0xD8, 0xDE, 1, 32 },    -- Latin-1 Ø..Þ (× at D7 is not a letter)
  { 0x100, 0x12E, 2, 1 },   -- Latin Extended-A Ā..Į: even upper, odd lower
  { 0x132, 0x136, 2, 1 },   -- Ĳ..Ķ
  { 0x139, 0x147, 2, 1 },   -- Ĺ..Ň: odd upper, even lower (ĸ at 138 has no upper)
  { 0x14A, 0x176, 2, 1 },   -- Ŋ..Ŷ
  { 0x179, 0x17D, 2, 1 },   -- Ź..Ž
  { 0x388, 0x38A, 1, 37 },  -- Greek Έ..Ί
  { 0x391, 0x3A1, 1, 32 },  -- Greek Α..Ρ
  { 0x3A3, 0x3AB, 1, 32 },  -- Greek Σ..Ϋ (final-sigma ς is not produced)
  { 0x3D8, 0x3EE, 2, 1 },   -- Greek archaic and Coptic Ϙ..Ϯ
  { 0x400, 0x40F, 1, 80 },  -- Cyrillic Ѐ..Џ
  { 0x410, 0x42F, 1, 32 },  -- Cyrillic А..Я
  { 0x460, 0x480, 2, 1 },   -- Cyrillic Ѡ..Ҁ
  { 0x48A, 0x4BE, 2, 1 },   -- Cyrillic Ҋ..Ҿ
  { 0x4C1, 0x4CD, 2, 1 },   -- Cyrillic Ӂ..Ӎ
  { 0x4D0, 0x52E, 2, 1 },   -- Cyrillic Ӑ..Ԯ
}
-- Single code points outside the regular ranges.
local upper_singles = {
  [0x130] = "i\u{307}",     -- İ: Python gives i + combining dot above (not Turkish dotless rules)
  [0x178] = utf8.char(0xFF), -- Ÿ -> ÿ
  [0x4C0] = utf8.char(0x4CF), -- Cyrillic palochka
  [0x386] = utf8.char(0x3AC), [0x38C] = utf8.char(0x3CC), [0x38E] = utf8.char(0x3CD), [0x38F] = utf8.char(0x3CE),
  [0x1E9E] = utf8.char(0xDF), -- capital sharp s -> ß
}

local lower_map = {}
for _, r in ipairs(upper_ranges) do
  for cp = r[1], r[2], r[3] do lower_map[utf8.char(cp)] = utf8.char(cp + r[4]) end
end
for cp, low in pairs(upper_singles) do lower_map[utf8.char(cp)] = low end

-- One pattern for every key of the table: its first byte, then any continuation
-- bytes. Invalid UTF-8 yields matches that are not keys, which gsub leaves alone.
-- The first bytes go in as ranges, because a class is scanned linearly per byte.
local lower_pattern = (function()
  local lead, class, b = {}, {}, 0
  for k in pairs(lower_map) do lead[k:byte(1)] = true end
  while b < 256 do
    if lead[b] then
      local e = b
      while lead[e + 1] do e = e + 1 end
      class[#class + 1] = string.char(b) .. (e > b and "-" .. string.char(e) or "")
      b = e
    end
    b = b + 1
  end
  return "[" .. table.concat(class) .. "][\x80-\xBF]*"
end)()

--- Lowercases a UTF-8 string the way Python's `str.lower` does for ASCII,
-- Latin-1 Supplement, Latin Extended-A, basic Greek and Cyrillic.
-- Independent of the C locale. Bytes that are not valid UTF-8 pass through unchanged.
-- @tparam string s
-- @treturn string
-- @usage data.lower("Ça ALORS !") --> "ça alors !"
function data.lower(s)
  check.lua_type("lower", "s", s, "string")
  return (s:gsub(lower_pattern, lower_map))
end

-- s with every occurrence of `from` replaced by `to`, by plain search (much faster
-- than a pattern over a long text when `from` is rare).
local function replace_plain(s, from, to)
  local parts, pos = {}, 1
  while true do
    local i, j = s:find(from, pos, true)
    if not i then break end
    parts[#parts + 1] = s:sub(pos, i - 1)
    pos = j + 1
  end
  if pos == 1 then return s end
  parts[#parts + 1] = s:sub(pos)
  return table.concat(parts, to)
end

-- ---------------------------------------------------------------- preprocessing

--- The book's `preprocess_nmt` on a whole text: U+202F and U+00A0 become spaces,
-- the text is lowercased (`data.lower`), and a space goes before each `, . ! ?`
-- that is not at the start of the text and not already after a space (a mark
-- after a tab or a newline gets one too, as in the book).
-- @tparam string text
-- @treturn string
-- @usage data.preprocess("Go.\tVa !") --> "go .\tva !"
function data.preprocess(text)
  check.lua_type("preprocess", "text", text, "string")
  text = data.lower(replace_plain(replace_plain(text, "\u{202F}", " "), "\u{A0}", " "))
  return (text:gsub("()([,.!?])", function(pos, mark)
    if pos > 1 and text:byte(pos - 1) ~= 32 then return " " .. mark end
  end))
end

-- Splits on single spaces, keeping empty tokens as Python's str.split(' ') does.
local function split_spaces(s)
  local tokens, pos = {}, 1
  while true do
    local sp = s:find(" ", pos, true)
    tokens[#tokens + 1] = s:sub(pos, (sp or 0) - 1)
    if not sp then return tokens end
    pos = sp + 1
  end
end
--- Splits a string on single spaces, keeping empty tokens, as Python's
-- `str.split(' ')` does (so the book's token counts reproduce).
-- @tparam string s
-- @treturn {string,...} the tokens, "" between two adjacent spaces
-- @usage data.split("go  .") --> {"go", "", "."}
function data.split(s)
  check.lua_type("split", "s", s, "string")
  return split_spaces(s)
end

-- ---------------------------------------------------------------- reading

local report_mt = {}
report_mt.__index = report_mt
function report_mt.__tostring(r)
  local s = string.format("%d pairs from %d lines, %d malformed", r.pairs, r.lines, r.malformed)
  local shown = {}
  for i = 1, math.min(#r.problems, 10) do
    shown[i] = string.format("line %d: %s", r.problems[i].line, r.problems[i].reason)
  end
  if #shown > 0 then s = s .. " (" .. table.concat(shown, "; ") .. (r.malformed > #shown and "; ..." or "") .. ")" end
  return s
end

local MAX_LISTED = 1000 -- a badly broken file is counted in full but listed only this far

local function check_num_examples(n, who)
  if n == nil then return math.huge end
  if type(n) ~= "number" or n < 1 or (n ~= math.huge and math.type(n) ~= "integer") then
    error(string.format("%s: num_examples must be a positive integer or math.huge (the whole file), got %s", who,
      tostring(n)), 3)
  end
  return n
end

local function read_file(path, who)
  if type(path) ~= "string" then error(string.format("%s: path must be a string, got a %s", who, type(path)), 3) end
  local f, err = io.open(path, "rb")
  if not f then return nil, string.format("%s: cannot open %s", who, err) end
  local text, rerr = f:read("a")
  f:close()
  if not text then return nil, string.format("%s: cannot read %s: %s", who, path, tostring(rerr)) end
  return text
end

--- Reads and tokenizes an English-French file of "english<TAB>french" lines
-- (the book's `read_data_nmt` + `preprocess_nmt` + `tokenize_nmt`).
-- With `num_examples = n` the lines 1..n+1 are read (the book's loop; see the
-- module comment); without it, the whole file. A "\r" before "\n" is dropped
-- (Python's text mode does the same).
-- @tparam string path
-- @tparam[opt] table opts `num_examples`
-- @treturn table source: one array of tokens per pair (English)
-- @treturn table target: the same for French
-- @treturn table report: `lines` (lines read), `pairs`, `malformed` (count), `counts`
--   (`no_tab`, `extra_tab`, `empty_side`, `invalid_utf8`), `problems` (`{line =, reason =}`,
--   at most 1000 listed); `tostring(report)` summarises it
-- @return nil and a message when the file cannot be read
-- @raise on a bad argument
-- @usage local src, tgt, report = data.read_fra_eng("data/fra-eng-sample.txt", {num_examples = 600})
function data.read_fra_eng(path, opts)
  local who = "read_fra_eng"
  opts = check.options(who, opts, { num_examples = true })
  local limit = check_num_examples(opts.num_examples, who)
  local text, err = read_file(path, who)
  if not text then return nil, err end
  local source, target = {}, {}
  local counts = { no_tab = 0, extra_tab = 0, empty_side = 0, invalid_utf8 = 0 }
  local problems, malformed = {}, 0
  local function bad(lineno, kind, reason)
    counts[kind] = counts[kind] + 1
    malformed = malformed + 1
    if #problems < MAX_LISTED then problems[#problems + 1] = { line = lineno, reason = reason } end
  end
  -- The lines to read, preprocessed in one pass (no rule crosses a newline, and invalid
  -- UTF-8 passes through unchanged, so each line comes out as if done alone).
  local block_end, lines_in = #text, 0
  if limit < math.huge then
    block_end = 0
    while lines_in <= limit do
      local nl = text:find("\n", block_end + 1, true)
      lines_in = lines_in + 1
      if not nl then block_end = #text break end
      block_end = nl
    end
  end
  local raw = block_end == #text and text or text:sub(1, block_end)
  local done = data.preprocess(raw)
  local check_utf8 = not utf8.len(raw) -- only a text with a bad byte needs the per-line check
  local raw_pos, pos, lineno = 1, 1, 0
  while pos <= #done do
    local nl, raw_nl = done:find("\n", pos, true), raw:find("\n", raw_pos, true)
    local line = done:sub(pos, nl and nl - 1 or #done)
    if line:byte(-1) == 13 then line = line:sub(1, -2) end
    lineno = lineno + 1
    local valid, at = true, nil
    if check_utf8 then valid, at = utf8.len(raw, raw_pos, raw_nl or #raw) end
    local tab = line:find("\t", 1, true)
    if not valid then
      bad(lineno, "invalid_utf8", string.format("invalid UTF-8 at byte %d of the line", at - raw_pos + 1))
    elseif not tab then
      bad(lineno, "no_tab", "no tab")
    elseif line:find("\t", tab + 1, true) then
      bad(lineno, "extra_tab", "more than one tab")
    else
      local en, fr = line:sub(1, tab - 1), line:sub(tab + 1)
      if not en:find("[^ ]") or not fr:find("[^ ]") then
        bad(lineno, "empty_side", not en:find("[^ ]") and "empty English side" or "empty French side")
      else
        source[#source + 1] = split_spaces(en)
        target[#target + 1] = split_spaces(fr)
      end
    end
    if not nl then break end
    pos, raw_pos = nl + 1, raw_nl + 1
  end
  local report = setmetatable({ lines = lineno, pairs = #source, malformed = malformed, counts = counts,
    problems = problems }, report_mt)
  return source, target, report
end

-- ---------------------------------------------------------------- Vocab

local Vocab = {}
local vocab_methods = {}

-- A vocabulary's token counts until `token_freqs` is first read: the tokens by descending count
-- and their counts packed in one string. The list of `{token, count}` pairs is one table per
-- distinct token (44,000 for the whole fra-eng file, and the tokens under min_freq are strings
-- kept only by it), and every full collection traverses them: a training loop whose tensors
-- trigger collections paid ~17 ms for each. Built on demand, only a program that reads the field
-- keeps them. Weak keys: the entry goes with its vocabulary.
local pending_freqs = setmetatable({}, { __mode = "k" })

-- Methods first (so vocab:ids works), then the fields built when first read, then the token
-- lookup: vocab["go"], or vocab[{"go", "."}] for a list, as the book's `vocab[tokens]`.
-- The tokens live in one token index (attn.core.token_index, src/bind/ltokens.c), not in Lua
-- tables: a table of 30,000 strings is 30,000 objects every full collection marks and sweeps
-- (~8 ms for a whole-file vocabulary pair, in a training loop whose tensors trigger about one
-- full collection per step). `idx_to_token` and `token_to_idx` are built from it when read.
Vocab.__index = function(self, key)
  local m = vocab_methods[key]
  if m ~= nil then return m end
  if key == "idx_to_token" or key == "token_to_idx" then
    local list = core.token_list(self.index)
    if key == "token_to_idx" then
      local t2i = {}
      for i, tok in ipairs(list) do t2i[tok] = i end
      list = t2i
    end
    rawset(self, key, list)
    return list
  end
  if key == "token_freqs" and pending_freqs[self] then
    local packed, list, pos = pending_freqs[self], {}, 1
    while pos <= #packed do
      local tok, count
      tok, count, pos = string.unpack("<s4j", packed, pos)
      list[#list + 1] = { tok, count }
    end
    pending_freqs[self] = nil
    rawset(self, "token_freqs", list)
    return list
  end
  if type(key) == "string" then return core.token_id(self.index, key) or self.unk end
  if type(key) == "table" then return vocab_methods.ids(self, key) end
  return nil
end
Vocab.__len = function(self) return core.token_count(self.index) end
Vocab.__tostring = function(self)
  local n, head = core.token_count(self.index), {}
  for i = 1, math.min(n, 10) do head[i] = core.token_at(self.index, i) end
  return string.format("Vocab(%d tokens: %s%s)", n, table.concat(head, " "), n > 10 and " ..." or "")
end

local function count_token(counts, order, tok, who)
  if type(tok) ~= "string" then error(string.format("%s: tokens must be strings, got a %s", who, type(tok)), 4) end
  local c = counts[tok]
  if c then
    counts[tok] = c + 1
  else
    counts[tok] = 1
    order[#order + 1] = tok
  end
end

local function new_vocab(_, tokens, opts)
  local who = "Vocab"
  opts = check.options(who, opts, { min_freq = true, reserved = true, reserved_tokens = true })
  if opts.reserved and opts.reserved_tokens then
    error("Vocab: give reserved or reserved_tokens (the book's name), not both", 2)
  end
  local reserved = opts.reserved or opts.reserved_tokens or {}
  local min_freq = opts.min_freq or 0
  if type(min_freq) ~= "number" then error("Vocab: min_freq must be a number, got a " .. type(min_freq), 2) end
  tokens = tokens or {}
  if type(tokens) ~= "table" then error("Vocab: tokens must be a list (of strings or of lists)", 2) end
  -- Counted in first-appearance order, as Python's Counter (an insertion-ordered dict).
  local counts, order = {}, {}
  for _, t in ipairs(tokens) do
    if type(t) == "table" then
      for _, tok in ipairs(t) do count_token(counts, order, tok, who) end
    else
      count_token(counts, order, t, who)
    end
  end
  local first = {}
  for i, tok in ipairs(order) do first[tok] = i end
  -- Descending frequency, ties in first-appearance order (Python's stable sort).
  table.sort(order, function(a, b)
    if counts[a] ~= counts[b] then return counts[a] > counts[b] end
    return first[a] < first[b]
  end)
  local idx_to_token, token_to_idx = { "<unk>" }, { ["<unk>"] = 1 }
  local function add(tok)
    if not token_to_idx[tok] then
      idx_to_token[#idx_to_token + 1] = tok
      token_to_idx[tok] = #idx_to_token
    end
  end
  for _, tok in ipairs(reserved) do add(tok) end
  local packed = {}
  for i, tok in ipairs(order) do
    packed[i] = string.pack("<s4j", tok, counts[tok])
    if counts[tok] >= min_freq then add(tok) end
  end
  local vocab = setmetatable({ index = core.token_index(idx_to_token), unk = 1 }, Vocab)
  pending_freqs[vocab] = table.concat(packed)
  return vocab
end

--- A vocabulary (the book's `d2l.Vocab`): `<unk>` has id 1, the reserved tokens
-- follow in order, then every token seen at least `min_freq` times, by descending
-- frequency with ties in first-appearance order.
-- `vocab[token]` is the token's id (`vocab.unk` = 1 for an unknown token),
-- `vocab[list]` a table of ids, `#vocab` the size. Fields: `unk`, and built when first read (so a
-- training loop's collections do not traverse them unless the program reads them; the lookups
-- and `vocab:token_list()` do not build them): `idx_to_token`, `token_to_idx`, `token_freqs`
-- (`{token, count}` by descending count, every token counted).
-- A token spelled like a method or field (`ids`, `tokens`, `unk`, ...) is
-- shadowed in `vocab[token]`; `vocab:id(token)` always looks the token up.
-- @function Vocab
-- @tparam table tokens a list of strings, or a list of lists of strings
-- @tparam[opt] table opts `min_freq` (default 0), `reserved` (alias `reserved_tokens`, default {})
-- @treturn Vocab
-- @usage local v = data.Vocab(source, {min_freq = 2, reserved = {"<pad>", "<bos>", "<eos>"}})
data.Vocab = setmetatable({}, { __call = new_vocab })

--- The id of one token (`vocab.unk` when unknown).
function vocab_methods.id(self, token) return core.token_id(self.index, token) or self.unk end

--- A table of ids for a list of tokens.
function vocab_methods.ids(self, list)
  if type(list) ~= "table" then error("Vocab:ids: expected a list of tokens, got a " .. type(list), 2) end
  return core.token_ids(self.index, list, self.unk)
end

--- A new list of every token, in id order (as `idx_to_token`, without keeping it).
-- @treturn {string,...}
function vocab_methods.token_list(self) return core.token_list(self.index) end

-- An id as a Lua integer in 1..#vocab, or a raised error naming the position.
local function check_id(self, v, i, who)
  local id, n = math.tointeger(v), core.token_count(self.index)
  if not id or id < 1 or id > n then
    error(string.format("%s: id %s%s is not in 1..%d", who, tostring(v), i and (" at position " .. i) or "", n), 3)
  end
  return id
end

--- The token of one id.
-- @raise when the id is not in 1..#vocab
function vocab_methods.token(self, id) return core.token_at(self.index, check_id(self, id, nil, "Vocab:token")) end

--- The tokens of a table or 1-D tensor of ids (the book's `to_tokens`).
-- @raise when an id is not in 1..#vocab
function vocab_methods.tokens(self, ids)
  if attn.is_tensor(ids) then
    if ids:dim() ~= 1 then
      error("Vocab:tokens: expected a 1-D tensor of ids, got " .. attn.core.shape_str(ids:shape()), 2)
    end
    ids = ids:totable()
  elseif type(ids) ~= "table" then
    error("Vocab:tokens: expected a table or a 1-D tensor of ids, got a " .. type(ids), 2)
  end
  local out = {}
  for i, v in ipairs(ids) do out[i] = core.token_at(self.index, check_id(self, v, i, "Vocab:tokens")) end
  return out
end
vocab_methods.to_tokens = vocab_methods.tokens

-- ---------------------------------------------------------------- arrays

--- The first `num_steps` ids of a sequence, or the sequence padded on the right
-- with `pad_id` up to `num_steps` (the book's `truncate_pad`). Returns a new table.
-- @tparam table ids
-- @tparam integer num_steps
-- @param pad_id
-- @treturn table
-- @usage data.truncate_pad({48, 5}, 4, 2) --> {48, 5, 2, 2}
function data.truncate_pad(ids, num_steps, pad_id)
  check.lua_type("truncate_pad", "ids", ids, "table")
  check.positive_int("truncate_pad", "num_steps", num_steps)
  if num_steps > require("attn.core").max_request() // 16 then -- sized before building, as the allocator does
    error(string.format("truncate_pad: num_steps = %d is more than memory can hold", num_steps), 2)
  end
  local out = {}
  for i = 1, num_steps do
    local v = ids[i]
    if v == nil then v = pad_id end
    out[i] = v
  end
  return out
end

--- The book's `build_array_nmt`: each sentence's ids, then `<eos>`, cut or padded
-- with `<pad>` to `num_steps`.
-- @tparam table lines a list of token lists
-- @tparam Vocab vocab it must hold `<eos>` and `<pad>`
-- @tparam integer num_steps
-- @treturn Tensor ids (n, num_steps)
-- @treturn Tensor valid_len (n): the entries that are not `<pad>`, so `<eos>` counts
function data.build_array(lines, vocab, num_steps)
  check.lua_type("build_array", "lines", lines, "table")
  check.lua_type("build_array", "vocab", vocab, "table")
  check.positive_int("build_array", "num_steps", num_steps)
  if num_steps > require("attn.core").max_request() // 8 // math.max(#lines, 1) then -- the (n, num_steps) int64 ids
    error(string.format("build_array: %d lines of num_steps = %d are more than memory can hold", #lines, num_steps), 2)
  end
  local eos, pad = vocab:id("<eos>"), vocab:id("<pad>")
  if eos == vocab.unk or pad == vocab.unk then error("build_array: the vocabulary has no <eos> or no <pad>", 2) end
  local flat, lens, index, unk = {}, {}, vocab.index, vocab.unk
  local k = 0
  for i, line in ipairs(lines) do
    local n = 0
    for j, id in ipairs(core.token_ids(index, line, unk, num_steps)) do
      flat[k + j] = id
      if id ~= pad then n = n + 1 end
    end
    local used = math.min(#line, num_steps)
    if used < num_steps then
      used = used + 1
      flat[k + used] = eos
      n = n + 1
    end
    for j = used + 1, num_steps do flat[k + j] = pad end
    lens[i] = n
    k = k + num_steps
  end
  local n = #lines
  if n == 0 then return attn.zeros({ 0, num_steps }, ID_DTYPE), attn.zeros({ 0 }, ID_DTYPE) end
  return attn.tensor(flat, ID_DTYPE):reshape({ n, num_steps }), attn.tensor(lens, ID_DTYPE)
end

-- ---------------------------------------------------------------- batches

-- PCG32 (O'Neill's pcg32_random_r): a small generator of the loader's own, so
-- shuffling neither depends on nor disturbs attn's global generator.
local PCG_MULT = 6364136223846793005

local function pcg_next(g)
  local old = g.state
  g.state = old * PCG_MULT + g.inc -- integer arithmetic wraps modulo 2^64
  local xorshifted = (((old >> 18) ~ old) >> 27) & 0xFFFFFFFF
  local rot = old >> 59
  return ((xorshifted >> rot) | (xorshifted << ((32 - rot) & 31))) & 0xFFFFFFFF
end

-- PCG32's seeding of `stream` (default the loaders' 0x5851F42D) from seed.
local function pcg_new(seed, stream)
  local g = { state = 0, inc = ((stream or 0x5851F42D) << 1) | 1 }
  pcg_next(g)
  g.state = g.state + seed
  pcg_next(g)
  return g
end

-- Uniform integer in 1..n (n <= 2^32) without modulo bias.
local function pcg_below(g, n)
  local threshold = ((1 << 32) - n) % n
  while true do
    local r = pcg_next(g)
    if r >= threshold then return r % n + 1 end
  end
end

local Loader = {}
Loader.__index = Loader
Loader.__len = function(self) return self.num_batches end

-- 1..n shuffled by Fisher-Yates with g's draws (1..n in order without g).
local function permutation(g, n)
  local order = {}
  for i = 1, n do order[i] = i end
  if g then
    for i = n, 2, -1 do
      local j = pcg_below(g, i)
      order[i], order[j] = order[j], order[i]
    end
  end
  return order
end

-- A list of row numbers as an id tensor (the empty list too).
local function id_tensor(list)
  if #list == 0 then return attn.zeros({ 0 }, ID_DTYPE) end
  return attn.tensor(list, ID_DTYPE)
end

-- One epoch: a fresh permutation (Fisher-Yates) unless shuffle is off. The permutation is held as
-- an id tensor, not a Lua table: a table of every row stays in the Lua heap for the epoch, and
-- every full collection the step's tensors trigger traverses it.
Loader.__call = function(self)
  local n, bs = self.num_examples, self.batch_size
  local order = id_tensor(permutation(self.shuffle and self.rng or nil, n))
  local X, X_len, Y, Y_len = table.unpack(self.dataset)
  local b = 0
  return function()
    b = b + 1
    if b > self.num_batches then return nil end
    local first = (b - 1) * bs + 1
    local rows = order:narrow(1, first, math.min(bs, n - first + 1))
    return X:index_select(1, rows), X_len:index_select(1, rows), Y:index_select(1, rows), Y_len:index_select(1, rows)
  end
end

-- The directory holding this file, to find data/ two levels up.
local function module_dir()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) ~= "@" then return "./" end
  return src:sub(2):match("^(.*[/\\])") or "./"
end

--- Path of the shipped corpus sample (the first 1,000 lines of fra.txt), found
-- relative to this module's file (lua/attn/d2l/): `data/` three folders up in a
-- checkout, or `attn/data/` one up after `make install`.
-- @treturn string path, or nil and a message when it is missing
function data.sample_path()
  local dir = module_dir()
  local tried = {}
  for i, rel in ipairs { "../../../data/fra-eng-sample.txt", "../data/fra-eng-sample.txt" } do
    local path = dir .. rel
    local f = io.open(path, "rb")
    if f then
      f:close()
      return path
    end
    tried[i] = path
  end
  return nil, "attn.d2l.data: the shipped sample fra-eng-sample.txt is missing (looked for " ..
    table.concat(tried, " and ") .. "); pass {path = '.../fra.txt'}"
end

-- The four id tensors and both vocabularies of a corpus file (book settings).
-- The corpus file: path when given, else the shipped sample (or nil, message).
local function path_or_sample(path)
  if path ~= nil then return path end
  return data.sample_path()
end

local function read_arrays(path, num_examples, num_steps)
  local source, target, report = data.read_fra_eng(path, { num_examples = num_examples })
  if not source then return nil, target end
  local reserved = { "<pad>", "<bos>", "<eos>" }
  local src_vocab = data.Vocab(source, { min_freq = 2, reserved = reserved })
  local tgt_vocab = data.Vocab(target, { min_freq = 2, reserved = reserved })
  local X, X_len = data.build_array(source, src_vocab, num_steps)
  local Y, Y_len = data.build_array(target, tgt_vocab, num_steps)
  return { X, X_len, Y, Y_len }, src_vocab, tgt_vocab, report
end

--- The book's `load_data_nmt`: reads the corpus, builds both vocabularies
-- (`min_freq = 2`, reserved `<pad> <bos> <eos>`) and the id arrays, and returns a
-- loader of shuffled batches.
--
-- `data_iter()` starts an epoch: `for X, X_valid_len, Y, Y_valid_len in data_iter() do`,
-- with X and Y (batch, num_steps) id tensors and the lengths (batch); the last batch
-- may be smaller (PyTorch's `drop_last = False`). Each epoch draws a new order from
-- the loader's own PCG32 generator, seeded by `seed`, so a seed gives the same
-- batches on every thread count. Without `seed`, one is drawn from attn's generator
-- (`attn.manual_seed` then fixes it). `#data_iter` is the number of batches,
-- `data_iter.num_examples` the number of pairs, `data_iter.dataset` the four full
-- tensors, `data_iter.report` the reading report.
-- @tparam integer batch_size
-- @tparam integer num_steps
-- @tparam[opt] table opts `num_examples` (default 600; `math.huge` for the whole file),
--   `path` (default: the shipped sample), `seed`, `shuffle` (default true)
-- @treturn table data_iter
-- @treturn Vocab src_vocab
-- @treturn Vocab tgt_vocab
-- @return nil and a message when the file cannot be read
-- @usage local data_iter, src_vocab, tgt_vocab = assert(data.load_fra_eng(64, 10, {seed = 1}))
function data.load_fra_eng(batch_size, num_steps, opts)
  local who = "load_fra_eng"
  check.positive_int(who, "batch_size", batch_size)
  check.positive_int(who, "num_steps", num_steps)
  opts = check.options(who, opts, { num_examples = true, path = true, seed = true, shuffle = true })
  local seed = opts.seed
  if seed ~= nil and math.type(seed) ~= "integer" then
    error(string.format("%s: seed must be an integer, got %s", who, tostring(seed)), 2)
  end
  local path, err = path_or_sample(opts.path)
  if not path then return nil, err end
  local num_examples = opts.num_examples
  if num_examples == nil then num_examples = 600 end
  local dataset, src_vocab, tgt_vocab, report = read_arrays(path, num_examples, num_steps)
  if not dataset then return nil, src_vocab end
  -- The token lists (about 100 MB of Lua heap for the whole corpus) are garbage now;
  -- collect them here rather than let them sit through the first epochs of training.
  collectgarbage()
  if seed == nil then
    local u = attn.rand({ 2 }, "float64"):totable()
    seed = (math.floor(u[1] * 2 ^ 32) << 32) | math.floor(u[2] * 2 ^ 32)
  end
  local n = dataset[1]:size(1)
  local loader = setmetatable({
    batch_size = batch_size, num_steps = num_steps, num_examples = n,
    num_batches = (n + batch_size - 1) // batch_size, shuffle = opts.shuffle ~= false,
    dataset = dataset, report = report, rng = pcg_new(seed),
  }, Loader)
  return loader, src_vocab, tgt_vocab
end


-- ---------------------------------------------------------------- real runs

-- A PCG32 stream of its own for the split (the loader's stream is seeded the same
-- way, so the split must differ from it by the stream, not by the seed).
local SPLIT_STREAM = 0x53504C4954 -- "SPLIT"

--- A deterministic split of `n` items into test, validation and training
-- index lists: one permutation of 1..n drawn from a PCG32 stream seeded by
-- `seed` (its own stream, independent of the batch order), the first `test`
-- entries for the test set, the next `valid` for validation, the rest for
-- training; each list is sorted back into file order.
-- @tparam integer n
-- @tparam integer seed
-- @tparam integer valid
-- @tparam integer test
-- @treturn table `{train = {...}, valid = {...}, test = {...}}`
-- @raise when valid + test leaves no training item
-- @usage local s = data.split_indices(1000, 0, 100, 100) -- #s.train == 800
function data.split_indices(n, seed, valid, test)
  check.lua_type("split_indices", "n", n, "number")
  if math.type(seed) ~= "integer" then error("split_indices: seed must be an integer, got " .. tostring(seed), 2) end
  for name, v in pairs { valid = valid, test = test } do
    if math.type(v) ~= "integer" or v < 0 then
      error(string.format("split_indices: %s must be an integer >= 0, got %s", name, tostring(v)), 2)
    end
  end
  if valid + test >= n then
    error(string.format("split_indices: %d validation + %d test pairs leave none of the %d for training", valid,
      test, n), 2)
  end
  local order = permutation(pcg_new(seed, SPLIT_STREAM), n)
  local out = { test = table.move(order, 1, test, 1, {}), valid = table.move(order, test + 1, test + valid, 1, {}),
    train = table.move(order, test + valid + 1, n, 1, {}) }
  for _, list in pairs(out) do table.sort(list) end
  return out
end

local function pick(list, idx)
  local out = {}
  for i, k in ipairs(idx) do out[i] = list[k] end
  return out
end

local BucketLoader = {}
BucketLoader.__index = BucketLoader
BucketLoader.__len = function(self) return self.num_batches end

--- A batch loader for real runs (`data.load_corpus`): each epoch shuffles the
-- training pairs with the loader's PCG32 generator; with `bucket`, the shuffled
-- pairs are taken in pools of 50 batches, sorted by length within a pool and cut
-- into batches, the batches shuffled again, and each batch's columns cut to its
-- longest sequence, so little time goes into padding. Without `bucket` the
-- batches are `load_fra_eng`'s.
-- `loader:plan()` draws one epoch's batches (a `Plan`) and advances
-- the generator; `loader:batch(rows)` gives `X, X_valid_len, Y, Y_valid_len`;
-- `loader:get_state()` / `loader:set_state(s)` save and restore the generator
-- (a resumed run re-draws its epoch's plan from the state at the epoch's start).
-- `loader.lengths` is an id tensor: each pair's longer valid length (the bucketing key).
-- @type BucketLoader
data.BucketLoader = BucketLoader

-- One epoch's batches: every row number in batch order in one id tensor, and where each batch
-- starts in it. Not a table of row lists: the plan lives through the epoch, and its thousands of
-- tables (a whole-file epoch's) made every full collection of the training steps slower.
local Plan = {}
local plan_methods = {}
Plan.__len = function(self) return #self.starts - 1 end
Plan.__index = function(self, key)
  if math.type(key) == "integer" then
    local starts = self.starts
    if key < 1 or key >= #starts then return nil end
    return self.rows:narrow(1, starts[key], starts[key + 1] - starts[key])
  end
  return plan_methods[key]
end

--- The plan's batches as lists of row numbers.
-- @treturn {{integer,...},...}
function plan_methods.totable(self)
  local all, out = self.rows:totable(), {}
  for b = 1, #self.starts - 1 do out[b] = table.move(all, self.starts[b], self.starts[b + 1] - 1, 1, {}) end
  return out
end

--- One epoch's batches (advances the generator): a `Plan`, whose `#plan` is the number of
-- batches and `plan[b]` batch b's row numbers as a 1-D id tensor (for `loader:batch`);
-- `plan:totable()` gives them as lists.
-- @treturn Plan
function BucketLoader:plan()
  local n, bs = self.num_examples, self.batch_size
  local order = permutation(self.rng, n)
  local batches = {}
  if not self.bucket then
    for first = 1, n, bs do batches[#batches + 1] = table.move(order, first, math.min(first + bs - 1, n), 1, {}) end
  else
    local len, pool = self.lengths:totable(), bs * 50
    for p = 1, n, pool do
      local rows = table.move(order, p, math.min(p + pool - 1, n), 1, {})
      local pos = {}
      for i, r in ipairs(rows) do pos[r] = i end
      table.sort(rows, function(a, b)
        if len[a] ~= len[b] then return len[a] < len[b] end
        return pos[a] < pos[b]
      end)
      for first = 1, #rows, bs do
        batches[#batches + 1] = table.move(rows, first, math.min(first + bs - 1, #rows), 1, {})
      end
    end
    for i = #batches, 2, -1 do
      local j = pcg_below(self.rng, i)
      batches[i], batches[j] = batches[j], batches[i]
    end
  end
  local flat, starts = {}, {}
  for b, rows in ipairs(batches) do
    starts[b] = #flat + 1
    table.move(rows, 1, #rows, #flat + 1, flat)
  end
  starts[#batches + 1] = #flat + 1
  return setmetatable({ rows = id_tensor(flat), starts = starts }, Plan)
end

--- The tensors of one batch: `X, X_valid_len, Y, Y_valid_len`, the columns cut
-- to the longest valid length in the batch when bucketing.
-- @param rows row numbers: `plan[b]` (a 1-D id tensor) or a list
function BucketLoader:batch(rows)
  local X, X_len, Y, Y_len = table.unpack(self.dataset)
  local idx = attn.is_tensor(rows) and rows or attn.tensor(rows, ID_DTYPE)
  local x, xl, y, yl = X:index_select(1, idx), X_len:index_select(1, idx), Y:index_select(1, idx),
    Y_len:index_select(1, idx)
  if self.bucket then
    local tx, ty = math.tointeger(xl:max():item()), math.tointeger(yl:max():item())
    if tx < x:size(2) then x = x:narrow(2, 1, tx) end
    if ty < y:size(2) then y = y:narrow(2, 1, ty) end
  end
  return x, xl, y, yl
end

--- The generator's state `{state, inc}` (two integers).
function BucketLoader:get_state() return { self.rng.state, self.rng.inc } end

--- Restores a state from `get_state`.
-- @raise when s is not two integers
function BucketLoader:set_state(s)
  if type(s) ~= "table" or math.type(s[1]) ~= "integer" or math.type(s[2]) ~= "integer" then
    error("BucketLoader:set_state: expected {state, inc} (two integers)", 2)
  end
  self.rng.state, self.rng.inc = s[1], s[2]
end

-- A vocabulary from its token list (ids in list order), as saved with a checkpoint.
local function vocab_from_tokens(tokens)
  return setmetatable({ index = core.token_index(tokens), unk = 1, token_freqs = {} }, Vocab)
end

--- A vocabulary whose ids are the positions of `tokens` (`<unk>` first), e.g. one
-- saved with a checkpoint as `vocab.idx_to_token`.
-- @tparam {string,...} tokens
-- @treturn Vocab
-- @raise when the list does not start with `<unk>` or repeats a token
function data.vocab_from_tokens(tokens)
  check.lua_type("vocab_from_tokens", "tokens", tokens, "table")
  if tokens[1] ~= "<unk>" then error("vocab_from_tokens: the first token must be <unk>", 2) end
  local seen = {}
  for i, tok in ipairs(tokens) do
    if type(tok) ~= "string" then error(string.format("vocab_from_tokens: token %d is a %s", i, type(tok)), 2) end
    if seen[tok] then error(string.format("vocab_from_tokens: token %q repeats (ids %d and %d)", tok, seen[tok], i), 2) end
    seen[tok] = i
  end
  return vocab_from_tokens(tokens)
end

-- load_corpus's reading, split, vocabularies and id arrays. Its token lists (about 100 MB of Lua
-- heap for the whole corpus) are garbage once it returns, so the caller's collection frees them
-- instead of leaving them for the first training steps' collections to sweep.
local function corpus_arrays(path, num_steps, opts, log, who)
  local clock = require("attn.progress").clock
  local t0 = clock()
  log(string.format("reading and tokenising %s ...", path))
  local source, target, report = data.read_fra_eng(path, { num_examples = opts.num_examples or math.huge })
  if not source then return nil, target end
  local t1 = clock()
  log(string.format("read %s in %.1f s", tostring(report), t1 - t0))
  local valid, test = opts.valid or 0, opts.test or 0
  if valid + test >= #source then
    return nil, string.format("%s: %d validation + %d test pairs leave none of the %d pairs of %s for training", who,
      valid, test, #source, path)
  end
  local split = data.split_indices(#source, opts.seed or 0, valid, test)
  local train_src, train_tgt = pick(source, split.train), pick(target, split.train)
  local src_vocab, tgt_vocab
  if opts.vocabs then
    src_vocab, tgt_vocab = data.vocab_from_tokens(opts.vocabs.src), data.vocab_from_tokens(opts.vocabs.tgt)
  else
    local reserved = { "<pad>", "<bos>", "<eos>" }
    src_vocab = data.Vocab(train_src, { min_freq = 2, reserved = reserved })
    tgt_vocab = data.Vocab(train_tgt, { min_freq = 2, reserved = reserved })
  end
  local t2 = clock()
  log(string.format("vocabularies of the %d training pairs: %d (English) and %d (French) tokens, %.1f s", #train_src,
    #src_vocab, #tgt_vocab, t2 - t1))
  local X, X_len = data.build_array(train_src, src_vocab, num_steps)
  local Y, Y_len = data.build_array(train_tgt, tgt_vocab, num_steps)
  local lengths = X_len:maximum(Y_len) -- a tensor: a table of every pair would stay in the Lua heap
  local t3 = clock()
  log(string.format("id arrays (%d x %d) in %.1f s", X:size(1), num_steps, t3 - t2))
  return { dataset = { X, X_len, Y, Y_len }, lengths = lengths, src_vocab = src_vocab, tgt_vocab = tgt_vocab,
    report = report, valid = { source = pick(source, split.valid), target = pick(target, split.valid) },
    test = { source = pick(source, split.test), target = pick(target, split.test) },
    sizes = { valid = valid, test = test }, seconds = { read = t1 - t0, vocab = t2 - t1, arrays = t3 - t2 } }
end

--- Loads a corpus for a real run: reads and tokenises the file (reporting each
-- stage and its time through `log`), splits the pairs with `split_indices`,
-- builds the vocabularies from the training pairs only (`min_freq = 2`, the
-- book's reserved tokens) unless given, and returns a `BucketLoader` over the
-- training pairs plus the held-out token lists.
-- @tparam integer batch_size
-- @tparam integer num_steps
-- @tparam[opt] table opts `path` (default the shipped sample), `num_examples` (math.huge: every line),
--   `seed` (0; the split and the batch order), `valid` (0), `test` (0), `bucket` (true),
--   `vocabs` (`{src = tokens, tgt = tokens}`: use these, e.g. from a checkpoint),
--   `log` (fn(text) for the stage lines; default none)
-- @treturn table `{train = BucketLoader, valid = {source =, target =}, test = {source =, target =},
--   src_vocab =, tgt_vocab =, report =, seconds = {read =, vocab =, arrays =}, sizes = {train =, valid =, test =}}`
-- @return nil and a message when the file cannot be read or the split leaves no training pair
function data.load_corpus(batch_size, num_steps, opts)
  local who = "load_corpus"
  check.positive_int(who, "batch_size", batch_size)
  check.positive_int(who, "num_steps", num_steps)
  opts = check.options(who, opts, { path = true, num_examples = true, seed = true, valid = true, test = true,
    bucket = true, vocabs = true, log = true })
  local path, err = path_or_sample(opts.path)
  if not path then return nil, err end
  local c, cerr = corpus_arrays(path, num_steps, opts, opts.log or function() end, who)
  if not c then return nil, cerr end
  local n = c.dataset[1]:size(1)
  local loader = setmetatable({ batch_size = batch_size, num_steps = num_steps, num_examples = n,
    num_batches = 0, bucket = opts.bucket ~= false, dataset = c.dataset, lengths = c.lengths,
    rng = pcg_new(opts.seed or 0) }, BucketLoader)
  -- the batch count of a bucketed epoch depends only on the pool sizes, not the draw
  local count, pool = 0, batch_size * 50
  for p = 1, n, pool do count = count + (math.min(pool, n - p + 1) + batch_size - 1) // batch_size end
  loader.num_batches = loader.bucket and count or (n + batch_size - 1) // batch_size
  collectgarbage()
  return { train = loader, src_vocab = c.src_vocab, tgt_vocab = c.tgt_vocab, report = c.report, valid = c.valid,
    test = c.test, sizes = { train = n, valid = c.sizes.valid, test = c.sizes.test }, path = path,
    seconds = c.seconds }
end

return data
