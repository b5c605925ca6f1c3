-- Attention scoring functions (d2l "Attention Scoring Functions"): additive
-- and scaled dot-product attention on the book's toy example, where identical
-- keys make both give [[2, 3, 4, 5]] and [[10, 11, 12, 13]]; the same with random
-- keys (the book's first exercise: they no longer agree); and a bilinear score
-- q^T W k for queries and keys of different widths (the second exercise).
local attn = require "attn"
local cli = require "attn.d2l.cli"
local plot = require "attn.plot"
local report = require "attn.d2l.report"
local nn = attn.nn

local opts = cli.start(arg, {
  name = "scoring",
  description = "Additive vs scaled dot-product attention on the book's toy example and with random keys.",
  options = {},
})
local out = opts.out
local r = report.new("Attention scoring functions")

-- The book's toy: keys all ones (2, 10, 2); values 0..39 as (10, 4) for both
-- batch items; valid lengths 2 and 6.
local keys = attn.ones({ 2, 10, 2 })
local values = attn.arange(0, 40, 1):reshape({ 1, 10, 4 }):expand(2, 10, 4):contiguous()
local valid_lens = attn.tensor({ 2, 6 })

local additive = nn.AdditiveAttention { key_size = 2, query_size = 20, num_hiddens = 8, dropout = 0.1 }
additive:eval()
local dot = nn.DotProductAttention { dropout = 0.5 }
dot:eval()

local function run(k, label)
  local a = additive(attn.randn({ 2, 1, 20 }), k, values, valid_lens)
  local d = dot(attn.randn({ 2, 1, 2 }), k, values, valid_lens)
  local lines = { label .. ":" }
  for b = 1, 2 do
    local function row(t)
      local v = t:select(1, b):select(1, 1):totable()
      for i = 1, #v do v[i] = string.format("%7.3f", v[i]) end
      return "[" .. table.concat(v, ", ") .. "]"
    end
    lines[#lines + 1] = string.format("  sample %d (valid length %d): additive %s  dot-product %s", b,
      valid_lens:get(b), row(a), row(d))
  end
  local text = table.concat(lines, "\n")
  print(text)
  return a, d, text, additive.attention_weights, dot.attention_weights
end

local a1, d1, text1, wa1, wd1 = run(keys, "identical keys (the book's toy; expected [[2, 3, 4, 5]] and [[10, 11, 12, 13]])")
local expected = attn.tensor({ { { 2, 3, 4, 5 } }, { { 10, 11, 12, 13 } } })
local err = math.max((a1 - expected):abs():max():item(), (d1 - expected):abs():max():item())
local random_keys = attn.randn({ 2, 10, 2 })
local a2, d2, text2, wa2, wd2 = run(random_keys, "random keys (exercise 1)")
local differ = (a2 - d2):abs():max():item()
local verdict = string.format("identical keys: both within %.2e of the book's numbers; random keys: the two differ by " ..
  "up to %.3f, since additive scores come from learned projections and dot products from the raw keys.", err, differ)
print(verdict)
r:heading("The book's toy example and random keys")
r:pre(text1 .. "\n" .. text2 .. "\n" .. verdict)

local col_labels = {}
for j = 1, 10 do col_labels[j] = "k" .. j end
r:heading("Attention weights side by side")
r:paragraph("Rows: additive and scaled dot-product; columns: identical keys and random keys. Each panel is the " ..
  "(batch, key) weight matrix of the single query; keys past the valid length get no weight.")
local panels = attn.stack({ attn.stack({ wa1:squeeze(2), wa2:squeeze(2) }), attn.stack({ wd1:squeeze(2), wd2:squeeze(2) }) })
assert(r:plot("attention weights: additive (top), dot-product (bottom); identical keys (left), random keys (right)",
  out .. "/weights.png", plot.heatmaps, panels, {
    xlabel = "Keys", ylabel = "Sample", col_labels = col_labels, row_labels = { "1", "2" },
    titles = { "additive, ones", "additive, random", "dot, ones", "dot, random" },
  }))

-- A bilinear score for queries of width 5 and keys of width 3: q^T W k with a
-- learnable (5, 3) matrix, then the book's masked softmax.
local Q, K = attn.randn({ 2, 4, 5 }), attn.randn({ 2, 6, 3 })
local W = attn.randn({ 5, 3 }) * 0.5
local scores = attn.bilinear_scores(Q, W, K)
local weights = attn.masked_softmax(scores, attn.tensor({ 3, 6 }))
-- An independent check of one entry with plain Lua loops.
local q, w, k = Q:totable(), W:totable(), K:totable()
local s = 0
for i = 1, 5 do
  for j = 1, 3 do s = s + q[2][3][i] * w[i][j] * k[2][4][j] end
end
local bil = string.format("bilinear scores Q (2, 4, 5), W (5, 3), K (2, 6, 3) -> (%s); entry [2, 3, 4] %.6f, " ..
  "by loops %.6f", table.concat(scores:shape(), ", "), scores:get(2, 3, 4), s)
print(bil)
r:heading("Queries and keys of different widths: a bilinear score")
r:pre(bil)
assert(r:plot("bilinear attention weights with valid lengths 3 and 6", out .. "/bilinear.png", plot.heatmaps,
  weights:unsqueeze(1), { xlabel = "Keys", ylabel = "Queries", titles = { "sample 1", "sample 2" } }))
assert(r:write(out .. "/report.html"))
print("wrote " .. out .. "/weights.png, " .. out .. "/bilinear.png and " .. out .. "/report.html")
if err > 1e-4 or math.abs(scores:get(2, 3, 4) - s) > 1e-4 then error("scoring: a check failed (see above)") end
