-- The Transformer (d2l "Transformer"): encoder and decoder blocks of multi-head
-- attention, AddNorm and position-wise FFNs, trained at the book's settings on
-- the book's 601 English-French pairs; prints the loss and the four
-- translations with BLEU, and draws the encoder's and the decoder's attention
-- per layer and head for the last sentence.
--   lua5.4 examples/transformer.lua            (200 epochs, as the book)
--   lua5.4 examples/transformer.lua --positions absolute
--   mpirun -np 2 lua5.4 examples/transformer.lua --distributed   (data parallel, docs/DISTRIBUTED.md)
local attn = require "attn"
local plot = require "attn.plot"
local translation = require "attn.d2l.translation"
local nn = attn.nn

-- The book's sizes; --num_hiddens, --num_layers, --num_heads, --ffn_hiddens and --dropout change them.
local num_heads = 4

-- Weights of one decoding step padded into a (layers, heads, steps, width) tensor.
local function stack_steps(steps, which, width)
  local layers = #steps[1][which]
  local per_layer = {}
  for l = 1, layers do
    local rows = {}
    for s, w in ipairs(steps) do
      local row = w[which][l]:reshape({ num_heads, -1 }) -- (heads, keys seen at this step)
      local n = math.min(row:size(2), width)
      local padded = attn.zeros({ num_heads, width })
      padded:narrow(2, 1, n):copy_(row:narrow(2, 1, n))
      rows[s] = padded
    end
    per_layer[l] = attn.stack(rows, 2) -- (heads, steps, width)
  end
  return attn.stack(per_layer, 1)
end

local function head_titles()
  local t = {}
  for h = 1, num_heads do t[h] = "Head " .. h end
  return t
end

translation.main {
  name = "transformer",
  title = "Transformer on English-French",
  description = "TransformerEncoder + TransformerDecoder (hidden 32, 2 layers, 4 heads, FFN 64, dropout 0.1), " ..
    "batch 64, 10 steps, Adam lr 0.005, gradient clipping at 1, masked softmax cross-entropy, teacher forcing.",
  epochs = 200,
  book = "loss 0.032 (EN 0.17) / 0.030 (ZH); va !, j'ai perdu ., il est calme ., je suis chez moi . — bleu 1.000 each",
  extra_options = {
    { "positions", "string", "book", "decoder positions at prediction: book (P[0] every step) or absolute" },
    { "num_hiddens", "integer", 32, "model width d_model (keys, queries and values have it too)" },
    { "num_layers", "integer", 2, "encoder and decoder blocks each" },
    { "num_heads", "integer", 4, "attention heads" },
    { "ffn_hiddens", "integer", 64, "hidden width of the position-wise FFN" },
  },
  model_options = function(opts)
    return { num_hiddens = opts.num_hiddens, num_layers = opts.num_layers, num_heads = opts.num_heads,
      ffn_hiddens = opts.ffn_hiddens }
  end,
  d_model = function(opts) return opts.num_hiddens end,
  build = function(src_vocab, tgt_vocab, opts)
    local h, dropout = opts.num_hiddens, opts.dropout
    num_heads = opts.num_heads
    local encoder = nn.TransformerEncoder(#src_vocab, h, h, h, h, { h }, h, opts.ffn_hiddens, num_heads,
      opts.num_layers, dropout)
    local decoder = nn.TransformerDecoder(#tgt_vocab, h, h, h, h, { h }, h, opts.ffn_hiddens, num_heads,
      opts.num_layers, dropout, { positions = opts.positions })
    return nn.EncoderDecoder(encoder, decoder)
  end,
  figures = function(net, rows, r, opts)
    local last = rows[#rows]
    if not last.weights or #last.weights == 0 then return end
    local num_steps = opts.num_steps
    -- The encoder ran on the last sentence: (layers, heads, num_steps, num_steps).
    local enc = net.encoder:stacked_attention_weights(1)
    local titles = head_titles()
    local function labelled(n)
      local t = {}
      for i = 1, n do t[i] = tostring(i) end
      return t
    end
    r:heading("Attention for \"" .. last.source .. "\" (rows: layers, columns: heads)")
    print(string.format("encoder attention weights %s; decoder self- and cross-attention over %d steps",
      "(" .. table.concat(enc:shape(), ", ") .. ")", #last.weights))
    assert(r:plot("encoder self-attention", opts.out .. "/encoder.png", plot.heatmaps, enc,
      { xlabel = "Key positions", ylabel = "Query positions", titles = titles, col_labels = labelled(num_steps) }))
    local steps = #last.weights
    local dec_self = stack_steps(last.weights, 1, steps)
    local dec_cross = stack_steps(last.weights, 2, num_steps)
    assert(r:plot("decoder self-attention (each step sees the steps before it)", opts.out .. "/decoder_self.png",
      plot.heatmaps, dec_self, { xlabel = "Key positions", ylabel = "Query positions", titles = titles }))
    assert(r:plot("decoder encoder-decoder attention", opts.out .. "/decoder_cross.png", plot.heatmaps, dec_cross,
      { xlabel = "Key positions", ylabel = "Query positions", titles = titles }))
  end,
}
