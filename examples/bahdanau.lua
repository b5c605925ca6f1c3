-- Bahdanau attention (d2l "Bahdanau Attention"): an encoder-decoder whose
-- decoder, at every step, attends over the encoder's outputs with the previous
-- step's hidden state as the query. Trained at the book's settings on the
-- book's 601 English-French pairs; prints the loss and the four translations
-- with BLEU, and draws the decoder's attention for the last one.
--   lua5.4 examples/bahdanau.lua                      (250 epochs, as the book)
--   lua5.4 examples/bahdanau.lua --load out/bahdanau/bahdanau.safetensors
--   lua5.4 examples/bahdanau.lua --scoring dot --beam 3
local attn = require "attn"
local plot = require "attn.plot"
local translation = require "attn.d2l.translation"
local nn = attn.nn

local embed_size, num_hiddens, num_layers = 32, 32, 2 -- dropout: --dropout (the book's 0.1)

translation.main {
  name = "bahdanau",
  title = "Bahdanau attention on English-French",
  description = "Seq2SeqEncoder + Seq2SeqAttentionDecoder (embed 32, hidden 32, 2 GRU layers, dropout 0.1), " ..
    "batch 64, 10 steps, Adam lr 0.005, gradient clipping at 1, masked softmax cross-entropy, teacher forcing.",
  epochs = 250,
  book = "loss 0.020 (EN 0.17) / 0.021 (ZH); va ! 1.000, j'ai perdu . 1.000, he's calm . varies " ..
    "(tu cours . 0.000 / il est paresseux . 0.658), je suis chez moi . 1.000",
  extra_options = { { "scoring", "string", "additive", "attention scoring: additive (the book) or dot (exercise 2)" } },
  model_options = function(opts) return { scoring = opts.scoring } end,
  build = function(src_vocab, tgt_vocab, opts)
    if opts.scoring ~= "additive" and opts.scoring ~= "dot" then
      require("attn.d2l.cli").fail("bahdanau: --scoring must be additive or dot, got " .. opts.scoring)
    end
    local encoder = nn.Seq2SeqEncoder(#src_vocab, embed_size, num_hiddens, num_layers, opts.dropout)
    local decoder = nn.Seq2SeqAttentionDecoder(#tgt_vocab, embed_size, num_hiddens, num_layers, opts.dropout,
      { scoring = opts.scoring })
    return nn.EncoderDecoder(encoder, decoder)
  end,
  figures = function(_, rows, r, opts)
    -- The last sentence's per-step weights: queries are the output tokens
    -- (with the <eos> step), keys the source tokens and <eos>, as the book shows.
    local last = rows[#rows]
    if not last.weights or #last.weights == 0 then return end
    local steps = {}
    for i, w in ipairs(last.weights) do
      if not attn.is_tensor(w) then w = w[#w] end -- a step's call keeps a list of its time steps' weights
      steps[i] = w:reshape({ -1 })
    end
    local src = {}
    for tok in last.source:gmatch("%S+") do src[#src + 1] = tok end
    src[#src + 1] = "<eos>"
    local out = {}
    for tok in last.greedy:gmatch("%S+") do out[#out + 1] = tok end
    if #out < #steps then out[#out + 1] = "<eos>" end
    local W = attn.stack(steps):narrow(2, 1, #src) -- (steps, source tokens + <eos>)
    print(plot.terminal_heatmap(W, { row_labels = out, col_labels = src }))
    r:heading("Decoder attention for \"" .. last.source .. "\"" .. (opts.beam > 1 and " (greedy decode)" or ""))
    assert(r:plot("queries: output tokens; keys: source tokens", opts.out .. "/attention.png", plot.heatmaps,
      W:unsqueeze(1):unsqueeze(1), { xlabel = "Key positions (source)", ylabel = "Query positions (output)",
        row_labels = out, col_labels = src }))
  end,
}
