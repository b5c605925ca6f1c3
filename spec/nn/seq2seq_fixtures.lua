-- A tiny synthetic translation task with the data contract of attn.d2l.train
-- (a vocabulary object and a data iterator), independent of the data module.
local attn = require "attn"

local fixtures = {}

local Vocab = {}
function Vocab.__index(v, k)
  if Vocab[k] then return Vocab[k] end
  return rawget(v, "_ids")[k] or rawget(v, "_ids")["<unk>"]
end
function Vocab.__len(v) return #rawget(v, "_tokens") end
function Vocab:ids(list)
  local out = {}
  for i, t in ipairs(list) do out[i] = self[t] end
  return out
end
function Vocab:tokens(ids)
  local out = {}
  for i, id in ipairs(ids) do out[i] = rawget(self, "_tokens")[id] end
  return out
end

--- A vocabulary: <unk>=1, <pad>=2, <bos>=3, <eos>=4 (the book's 0..3, 1-based), then `words`.
function fixtures.vocab(words)
  local tokens = { "<unk>", "<pad>", "<bos>", "<eos>" }
  for _, w in ipairs(words) do tokens[#tokens + 1] = w end
  local ids = {}
  for i, t in ipairs(tokens) do ids[t] = i end
  return setmetatable({ _ids = ids, _tokens = tokens }, Vocab)
end

local SRC = { "a", "b", "c", "d", "e" }
local TGT = { "A", "B", "C", "D", "E" }

--- n sentence pairs: 1-3 source words and ".", the target the words mapped
-- to upper case and reversed, then "!". Deterministic from `seed`.
function fixtures.pairs(n, seed)
  local state = seed or 1
  local function rand(m) -- a small LCG, so the data does not touch the engine's generator
    state = (state * 1103515245 + 12345) % 2147483648
    return state % m + 1
  end
  local out = {}
  for i = 1, n do
    local len = rand(3)
    local src, tgt = {}, {}
    for j = 1, len do
      local w = rand(#SRC)
      src[j] = SRC[w]
      tgt[len - j + 1] = TGT[w]
    end
    src[#src + 1] = "."
    tgt[#tgt + 1] = "!"
    out[i] = { table.concat(src, " "), table.concat(tgt, " ") }
  end
  return out
end

local function row(vocab, sentence, num_steps)
  local ids = {}
  for w in sentence:gmatch("%S+") do ids[#ids + 1] = vocab[w] end
  ids[#ids + 1] = vocab["<eos>"]
  local valid = math.min(#ids, num_steps)
  local r = {}
  for i = 1, num_steps do r[i] = ids[i] or vocab["<pad>"] end
  return r, valid
end

--- The task's vocabularies and a data iterator over `pairs` (batches in a
-- fixed order: the specs need no shuffling), dtype float32 or int64.
function fixtures.task(n, batch, num_steps, dtype)
  local src_vocab = fixtures.vocab({ "a", "b", "c", "d", "e", "." })
  local tgt_vocab = fixtures.vocab({ "A", "B", "C", "D", "E", "!" })
  local ps = fixtures.pairs(n, 7)
  local batches = {}
  for s = 1, n, batch do
    local X, XL, Y, YL = {}, {}, {}, {}
    for i = s, math.min(s + batch - 1, n) do
      local x, xl = row(src_vocab, ps[i][1], num_steps)
      local y, yl = row(tgt_vocab, ps[i][2], num_steps)
      X[#X + 1], XL[#XL + 1], Y[#Y + 1], YL[#YL + 1] = x, xl, y, yl
    end
    batches[#batches + 1] = { attn.tensor(X, dtype), attn.tensor(XL, dtype), attn.tensor(Y, dtype),
      attn.tensor(YL, dtype) }
  end
  local function data_iter()
    local i = 0
    return function()
      i = i + 1
      local b = batches[i]
      if b then return b[1], b[2], b[3], b[4] end
    end
  end
  return data_iter, src_vocab, tgt_vocab, ps
end

return fixtures
