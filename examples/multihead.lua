-- Multi-head attention and self-attention (d2l "Multi-Head Attention" and
-- "Self-Attention and Positional Encoding"): the book's shape checks, a measured
-- check that self-attention without positional encoding is permutation
-- equivariant (and that adding the encoding breaks it), and per-head heatmaps.
local attn = require "attn"
local cli = require "attn.d2l.cli"
local plot = require "attn.plot"
local report = require "attn.d2l.report"
local nn = attn.nn

local opts = cli.start(arg, {
  name = "multihead",
  description = "Multi-head attention: the book's shape checks, permutation equivariance, per-head heatmaps.",
  options = {
    { "hidden", "integer", 100, "num_hiddens" },
    { "heads", "integer", 5, "num_heads" },
  },
})
local out = opts.out
local r = report.new("Multi-head attention and self-attention")
local h, heads = opts.hidden, opts.heads

-- The book's example: num_hiddens 100, 5 heads, dropout 0.5, eval mode; batch 2,
-- 4 queries, 6 key-value pairs, valid_lens {3, 2}.
local attention = nn.MultiHeadAttention { key_size = h, query_size = h, value_size = h, num_hiddens = h,
  num_heads = heads, dropout = 0.5 }
attention:eval()
local batch_size, num_queries, num_kvpairs = 2, 4, 6
local valid_lens = attn.tensor({ 3, 2 })
local X = attn.ones({ batch_size, num_queries, h })
local Y = attn.ones({ batch_size, num_kvpairs, h })
local out_cross = attention(X, Y, Y, valid_lens)
local out_self = attention(X, X, X, valid_lens)
local book_weights = attention.attention_weights -- (2, heads, 4, 4), kept before the calls below
local function shape(t) return "(" .. table.concat(t:shape(), ", ") .. ")" end
local lines = {
  string.format("attention(X (2, 4, %d), Y (2, 6, %d), Y, valid_lens {3, 2}) -> %s   (book: torch.Size([2, 4, 100]))",
    h, h, shape(out_cross)),
  string.format("self-attention(X, X, X, valid_lens {3, 2})                -> %s   (book: torch.Size([2, 4, 100]))",
    shape(out_self)),
  string.format("attention_weights per head: %s", shape(book_weights)),
}

-- Permutation equivariance: with random inputs and no positional encoding,
-- self-attention commutes with any reordering of the positions.
local n = 8
local Z = attn.randn({ 1, n, h })
local perm = {}
for i = 1, n do perm[i] = i end
for i = n, 2, -1 do -- a seeded Fisher-Yates shuffle from the engine's generator
  local j = math.floor(attn.rand({ 1 }):item() * i) + 1
  perm[i], perm[j] = perm[j], perm[i]
end
local function permute_rows(t) return t:index_select(2, perm) end
local function self_attend(t) return attention(t, t, t) end
local equi = (self_attend(permute_rows(Z)) - permute_rows(self_attend(Z))):abs():max():item()
local pe = nn.PositionalEncoding { num_hiddens = h, dropout = 0 }
pe:eval()
local function with_pe(t) return self_attend(pe(t)) end
local broken = (with_pe(permute_rows(Z)) - permute_rows(with_pe(Z))):abs():max():item()
local scale = self_attend(Z):abs():max():item()
lines[#lines + 1] = string.format("permutation %s of %d positions:", table.concat(perm, " "), n)
lines[#lines + 1] = string.format("  max |f(PX) - P f(X)| without positional encoding: %.3e (outputs up to %.3f)", equi,
  scale)
lines[#lines + 1] = string.format("  max |f(PX) - P f(X)| with positional encoding:    %.3e", broken)
local text = table.concat(lines, "\n")
print(text)
r:heading("Shapes and permutation equivariance")
r:pre(text)
if out_cross:size(3) ~= h or out_self:size(2) ~= num_queries or equi > 1e-5 * math.max(1, scale) or broken < 1e-3 then
  error("multihead: a check failed (see above)")
end

-- Per-head heatmaps on the book's example (the book's exercise): with all-ones
-- inputs every valid key gets the same weight, so the masking is what shows.
r:heading("Per-head attention weights")
r:paragraph("Rows are samples (valid lengths 3 and 2), columns heads. All-ones inputs make the weights uniform over " ..
  "the valid keys; the random-input panels below show heads that differ.")
local keys, head_titles = {}, {}
for j = 1, num_queries do keys[j] = "k" .. j end
for j = 1, heads do head_titles[j] = "head " .. j end
assert(r:plot("book example, self-attention: weights per sample and head", out .. "/heads_book.png", plot.heatmaps, book_weights,
  { xlabel = "Keys", ylabel = "Queries", col_labels = keys, titles = head_titles }))
attention(Z, Z, Z)
assert(r:plot("random inputs (8 positions): the heads attend differently", out .. "/heads_random.png", plot.heatmaps,
  attention.attention_weights, { xlabel = "Keys", ylabel = "Queries", titles = head_titles }))
print(plot.terminal_heatmap(attention.attention_weights:select(1, 1):select(1, 1)))
assert(r:write(out .. "/report.html"))
print("wrote " .. out .. "/heads_book.png, " .. out .. "/heads_random.png and " .. out .. "/report.html")
