--- The book's experiment kit, named after the book's own package `d2l`, whose
-- names it follows (`train_seq2seq`, `predict_seq2seq`, `bleu`, `Vocab`, ...):
-- everything an experiment of Dive into Deep Learning's attention chapter
-- needs beyond the engine (tensors, autograd, `attn.nn` layers, `attn.optim`).
--
-- - `attn.d2l.data`: the fra-eng machine-translation pipeline (`load_fra_eng`,
--   the book's `load_data_nmt`)
-- - `attn.d2l.metrics`: BLEU, token accuracy and perplexity
-- - `attn.d2l.train`: `train_seq2seq`, `predict_seq2seq`, beam search
-- - `attn.d2l.run`: real training runs (checkpoints, resume, held-out BLEU)
-- - `attn.d2l.translation`: the translation experiment runner of the examples
-- - `attn.d2l.cli`: the examples' command-line options
-- - `attn.d2l.report`: self-contained HTML reports
--
-- Each is loaded on first use (`require "attn.d2l"` loads none of them); any
-- other key is nil.
-- @module attn.d2l
-- @usage
-- local d2l = require "attn.d2l" -- or attn.d2l
-- print(d2l.metrics.bleu("il est paresseux .", "il est calme .", 2)) --> 0.658
local MODULES = { data = "attn.d2l.data", metrics = "attn.d2l.metrics", train = "attn.d2l.train",
  translation = "attn.d2l.translation", cli = "attn.d2l.cli", report = "attn.d2l.report", run = "attn.d2l.run" }

local d2l = {}

return setmetatable(d2l, {
  __index = function(t, key)
    local modname = MODULES[key]
    if modname == nil then return nil end
    local m = require(modname)
    rawset(t, key, m)
    return m
  end,
})
