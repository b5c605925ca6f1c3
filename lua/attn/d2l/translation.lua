--- The book's translation experiment, shared by examples/bahdanau.lua,
-- seq2seq.lua and transformer.lua: data, training or loading a checkpoint,
-- the four test sentences with BLEU, the loss curve, and the report.
--
-- A script builds its model and calls `translation.run`; everything the book's
-- notebook prints (final loss, tokens/sec, the four translations with BLEU)
-- is printed, and the pictures and `report.html` go to the output folder.
-- The checkpoint is safetensors with the data settings in its metadata, so
-- `--load FILE` rebuilds the same vocabularies and translates without training.
-- @module attn.d2l.translation
local attn = require "attn"
local cli = require "attn.d2l.cli"
local data = require "attn.d2l.data"
local metrics = require "attn.d2l.metrics"
local plot = require "attn.plot"
local report = require "attn.d2l.report"
local seq2seq = require "attn.d2l.train"

local translation = {}

--- The book's test sentences (English sources).
translation.ENGLISH = { "go .", "i lost .", "he's calm .", "i'm home ." }
--- Their references (French), in the same order.
translation.FRENCH = { "va !", "j'ai perdu .", "il est calme .", "je suis chez moi ." }

--- The options every translation script takes, besides the seed, out and data
-- options every script has (attn.d2l.cli).
-- @tparam integer epochs the book's number of epochs for this model
-- @treturn table option list for `cli.parse`
function translation.options(epochs)
  return {
    { "epochs", "integer", epochs, "training epochs (the book's setting)" },
    { "lr", "number", 0.005, "Adam learning rate" },
    { "batch_size", "integer", 64, "batch size" },
    { "num_steps", "integer", 10, "time steps per sequence" },
    { "num_examples", "integer", 600, "sentence pairs read (the book reads 601 for 600)" },
    { "beam", "integer", 1, "beam width for the translations (1 = greedy, as the book)" },
    { "load", "string", nil, "translate with this checkpoint instead of training" },
    { "quiet", "boolean", false, "no progress line" },
    { "dropout", "number", 0.1, "dropout probability of the model (the book's 0.1; 0 for runs that must match)" },
    { "distributed", "boolean", false, "train data-parallel over MPI: run under mpirun -np N (needs attn.mpi: make " ..
      "mpi); rank 1 prints and writes the outputs" },
  }
end

--- Translates the test sentences, greedy or with a beam, and scores them with BLEU (k = 2).
-- @tparam Module net
-- @param src_vocab
-- @param tgt_vocab
-- @tparam integer num_steps
-- @tparam[opt] integer beam width (1: greedy predict_seq2seq)
-- @treturn table rows `{source =, translation =, reference =, bleu =, greedy =, weights =}`; weights are
--   the greedy decode's, per step, and `greedy` its translation (the same as `translation` at width 1)
function translation.evaluate(net, src_vocab, tgt_vocab, num_steps, beam)
  local rows = {}
  for i, eng in ipairs(translation.ENGLISH) do
    local fra = translation.FRENCH[i]
    local out, weights
    local greedy
    greedy, weights = seq2seq.predict_seq2seq(net, eng, src_vocab, tgt_vocab, num_steps, { save_attention_weights = true })
    out = greedy
    if (beam or 1) > 1 then
      -- the pictures keep the greedy decode's weights (a beam's best path has none of its own)
      out = seq2seq.beam_search(net, eng, src_vocab, tgt_vocab, num_steps, { beam = beam })
    end
    rows[i] = { source = eng, translation = out, reference = fra, bleu = metrics.bleu(out, fra, 2), weights = weights,
      greedy = greedy }
  end
  return rows
end

local run -- the body of translation.run, after the options

--- Runs one experiment end to end. With `--distributed` (under `mpirun -np N`), every
-- process trains its share of each batch (attn.distributed.DataParallel through
-- train_seq2seq's `data_parallel`); rank 1 alone prints, saves and translates.
-- @tparam table spec `name`, `title`, `description`, `epochs` (the book's), `book` (a line with the
--   book's printed results), `build(src_vocab, tgt_vocab, opts) -> net`, and optionally
--   `extra_options` (for cli.parse), `model_options(opts)` (a table of the options that shape the
--   weights, saved in the checkpoint and checked by --load), `figures(net, rows, r, opts,
--   src_vocab, tgt_vocab)` to add attention pictures, and `argv` (default the script's `arg`)
-- @raise a `cli.fail` failure for a file that cannot be read or a checkpoint that does not fit
-- @treturn table `{opts =, net =, history =, rows =}` (no rows on ranks other than 1)
function translation.run(spec)
  local options = translation.options(spec.epochs)
  for _, o in ipairs(spec.extra_options or {}) do options[#options + 1] = o end
  local opts = cli.start(spec.argv or arg, { name = spec.name, description = spec.description, options = options })
  if opts.smoke then
    opts.epochs = math.min(opts.epochs, 2)
  end
  if not opts.distributed then return run(spec, opts, nil) end
  -- Every rank runs the same script with the same seed; an error on one rank (a cli.fail
  -- included) aborts them all instead of leaving the others waiting in a collective.
  local found, dist = pcall(require, "attn.distributed")
  if not found then cli.fail(spec.name .. ": --distributed: " .. tostring(dist)) end
  dist.init()
  local res = dist.run(run, spec, opts, dist)
  dist.finalize()
  return res
end

run = function(spec, opts, dist)
  local root = not dist or dist.is_root()
  -- only rank 1 prints and writes files
  local say = root and print or function() end
  local data_iter, src_vocab, tgt_vocab = data.load_fra_eng(opts.batch_size, opts.num_steps,
    { num_examples = opts.num_examples, path = opts.data, seed = opts.seed })
  if not data_iter then cli.fail(spec.name .. ": " .. src_vocab) end
  say(string.format("%s: %d sentence pairs from %s; vocabularies %d (English) and %d (French)", spec.name,
    data_iter.num_examples, opts.data or "the shipped sample (data/fra-eng-sample.txt)", #src_vocab, #tgt_vocab))
  local net = spec.build(src_vocab, tgt_vocab, opts)
  local r = report.new(spec.title)
  r:paragraph(spec.description)
  local history
  local checkpoint = opts.out .. "/" .. spec.name .. ".safetensors"
  local meta = { num_examples = tostring(opts.num_examples), num_steps = tostring(opts.num_steps),
    src_vocab = tostring(#src_vocab), tgt_vocab = tostring(#tgt_vocab), seed = tostring(opts.seed),
    data = opts.data or "sample" }
  -- the options that shape the weights (e.g. bahdanau's --scoring), saved and checked on --load
  local model_meta = spec.model_options and spec.model_options(opts) or {}
  for k, v in pairs(model_meta) do meta[k] = tostring(v) end
  if opts.load then
    local state, saved = attn.load(opts.load)
    if not state then cli.fail(spec.name .. ": " .. saved) end
    for _, key in ipairs { "src_vocab", "tgt_vocab" } do
      if saved and saved[key] and saved[key] ~= meta[key] then
        cli.fail(string.format("%s: %s was trained with a %s vocabulary of %s tokens, this data gives %s (use the same " ..
          "--data and --num_examples)", spec.name, opts.load, key, saved[key], meta[key]))
      end
    end
    for key, value in pairs(model_meta) do
      if saved and saved[key] and saved[key] ~= tostring(value) then
        cli.fail(string.format("%s: %s was trained with --%s %s (this run has %s)", spec.name, opts.load, key, saved[key],
          tostring(value)))
      end
    end
    local loaded, err = pcall(net.load_state_dict, net, state)
    if not loaded then cli.fail(string.format("%s: %s does not fit this model: %s", spec.name, opts.load, tostring(err))) end
    say("loaded " .. opts.load)
    r:paragraph("Weights loaded from " .. opts.load .. " (no training).")
  else
    local losses = {}
    history = seq2seq.train_seq2seq(net, data_iter, {
      lr = opts.lr, epochs = opts.epochs, tgt_vocab = tgt_vocab,
      progress = root and not opts.quiet and { label = spec.name } or false,
      on_epoch = function(_, rec) losses[#losses + 1] = rec.loss end,
      data_parallel = dist and dist.DataParallel(net, { broadcast = false }) or nil,
    })
    if not root then return { opts = opts, net = net, history = history } end
    local last = history[#history]
    local line = string.format("loss %.3f (the book's scale: per-token cross-entropy / num_steps), per-token " ..
      "cross-entropy %.3f, %.1f tokens/sec on this CPU (%d thread%s%s), seed %d", last.loss, last.token_loss,
      last.tokens_per_sec or 0, attn.get_num_threads(), attn.get_num_threads() == 1 and "" or "s",
      dist and string.format(" x %d processes", dist.world_size()) or "", opts.seed)
    print(line)
    r:heading("Training")
    r:pre(line .. "\nbook: " .. spec.book)
    local epochs = {}
    for i = 1, #losses do epochs[i] = i end
    assert(r:plot("training loss per epoch (the book's scale)", opts.out .. "/loss.png", plot.lines, epochs, { losses },
      { legend = { "loss" }, xlabel = "epoch", ylabel = "loss", title = spec.title .. ": training loss" }))
    local ok, err = attn.save(checkpoint, net:state_dict(), meta)
    if not ok then cli.fail(spec.name .. ": " .. err) end
    print("saved " .. checkpoint)
  end

  if not root then return { opts = opts, net = net, history = history } end
  local rows = translation.evaluate(net, src_vocab, tgt_vocab, opts.num_steps, opts.beam)
  local table_rows, lines = {}, {}
  for i, row in ipairs(rows) do
    lines[i] = string.format("%s => %s, bleu %.3f", row.source, row.translation, row.bleu)
    table_rows[i] = { row.source, row.translation, row.reference, string.format("%.3f", row.bleu) }
    print(lines[i])
  end
  r:heading(opts.beam > 1 and string.format("Translations (beam search, width %d)", opts.beam) or
    "Translations (greedy, as the book)")
  r:table({ "English", "attn", "reference", "BLEU" }, table_rows)
  r:pre(table.concat(lines, "\n") .. "\nbook: " .. spec.book)
  if spec.figures then spec.figures(net, rows, r, opts, src_vocab, tgt_vocab) end
  assert(r:write(opts.out .. "/report.html"))
  print(string.format("wrote %s/report.html%s", opts.out, opts.load and "" or (" and " .. checkpoint)))
  return { opts = opts, net = net, history = history, rows = rows }
end

--- `translation.run` as a script's body: a missing file or a checkpoint that
-- does not fit ends the script with one line on stderr (exit status 1).
-- @tparam table spec as for `translation.run`
-- @treturn table as `translation.run`
function translation.main(spec) return cli.main(translation.run, spec) end

return translation
