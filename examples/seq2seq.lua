-- Sequence to sequence without attention (d2l "Sequence to Sequence
-- Learning"), the baseline for the Bahdanau experiment: the decoder sees the
-- encoder only through one context vector. Book settings, 300 epochs.
--   lua5.4 examples/seq2seq.lua
--   lua5.4 examples/seq2seq.lua --fixed_context   (d2l 1.0's fix of pitfall 6)
local attn = require "attn"
local translation = require "attn.d2l.translation"
local nn = attn.nn

translation.main {
  name = "seq2seq",
  title = "Sequence to sequence without attention on English-French",
  description = "Seq2SeqEncoder + Seq2SeqDecoder (embed 32, hidden 32, 2 GRU layers, dropout 0.1), batch 64, " ..
    "10 steps, Adam lr 0.005, gradient clipping at 1, 300 epochs. The decoder's context is the last layer of the " ..
    "state it is given: in training the encoder's final state, at prediction the decoder's own previous state " ..
    "(d2l 0.17; --fixed_context keeps the encoder's, as d2l 1.0).",
  epochs = 300,
  book = "loss 0.019; EN 0.17: va ! feu 0.687, j'ai perdu gagné aller ? 0.447, il est riche bon ? 0.447, " ..
    "je suis chez en suis <unk> ! 0.497",
  extra_options = { { "fixed_context", "boolean", false, "keep the encoder's context at prediction (d2l 1.0)" } },
  build = function(src_vocab, tgt_vocab, opts)
    local encoder = nn.Seq2SeqEncoder(#src_vocab, 32, 32, 2, opts.dropout)
    local decoder = nn.Seq2SeqDecoder(#tgt_vocab, 32, 32, 2, opts.dropout, { fixed_context = opts.fixed_context })
    return nn.EncoderDecoder(encoder, decoder)
  end,
}
