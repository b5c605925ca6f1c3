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
local run = require "attn.d2l.run"

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
    { "num_examples", "count", 600, "sentence pairs read (the book reads 601 for 600; all: the whole file)" },
    { "beam", "integer", 1, "beam width for the translations (1 = greedy, as the book)" },
    { "load", "string", nil, "translate with this checkpoint instead of training" },
    { "quiet", "boolean", false, "no progress line" },
    { "dropout", "number", 0.1, "dropout probability of the model (the book's 0.1; 0 for runs that must match)" },
    { "distributed", "boolean", false, "train data-parallel over MPI: run under mpirun -np N (needs attn.mpi: make " ..
      "mpi); rank 1 prints and writes the outputs" },
    { "shards", "integer", 4, "with --distributed: micro-shards per batch of the ordered reduction (the same " ..
      "bits for any number of processes, up to this many); 0: each rank's rows and an allreduce" },
  }
end

-- The options of a real run, in one table (documented at translation.RUN_OPTIONS).
local RUN_OPTIONS = {
  { "test", "integer", 0, "held-out pairs translated and scored with corpus BLEU-4 at the end" },
  { "valid", "integer", 0, "held-out pairs for the validation loss (the best checkpoint is kept)" },
  { "valid_every", "integer", 0, "optimizer steps between validations (0: at each epoch's end)" },
  { "save_every", "integer", 0, "epochs between checkpoints (<out>/<name>-last.safetensors)" },
  { "resume", "string", nil, "continue the run saved in this checkpoint" },
  { "max_steps", "integer", 0, "stop after this many optimizer steps and save a checkpoint (0: no limit)" },
  { "label_smoothing", "number", 0, "label smoothing of the training loss" },
  { "accum", "integer", 1, "batches per optimizer step (gradient accumulation)" },
  { "schedule", "string", "none", "learning-rate schedule: none, noam (warmup; --lr is the factor), cosine, step" },
  { "warmup", "integer", 4000, "warmup steps of noam (step: steps between halvings)" },
  { "bucket", "boolean", true, "length-bucketed batches in a real run (--bucket=false: the book's batches)" },
  { "threads", "integer", nil, "threads of the tensor operations (attn.set_num_threads; default: all cores)" },
}
--- The options of a real run (attn.d2l.run), in one table: any of them but
-- `--bucket` and `--threads` (or `--num_examples all`) turns a
-- script's run into one: a held-out split, vocabularies from the training
-- pairs, length-bucketed batches, per-step progress, checkpoints.
translation.RUN_OPTIONS = RUN_OPTIONS

local function ckpt_step(ckpt) return ckpt and ckpt.position.step or 0 end

-- Whether the options ask for a real run rather than the book's experiment.
local function is_real_run(opts)
  return opts.test > 0 or opts.valid > 0 or opts.save_every > 0 or opts.resume ~= nil or opts.max_steps > 0 or
    opts.num_examples == math.huge or opts.label_smoothing > 0 or opts.accum > 1 or opts.schedule ~= "none"
end

-- The settings a checkpoint records and a resume (or a --load) must match.
local function run_config(opts, model_meta)
  local c = { data = opts.data or "sample", num_examples = tostring(opts.num_examples), seed = opts.seed,
    valid = opts.valid, test = opts.test, num_steps = opts.num_steps, batch_size = opts.batch_size,
    bucket = tostring(opts.bucket), accum = opts.accum, schedule = opts.schedule, warmup = opts.warmup,
    label_smoothing = opts.label_smoothing, dropout = tostring(opts.dropout) }
  for k, v in pairs(model_meta) do c["model." .. k] = tostring(v) end
  return c
end

-- The DataParallel of --distributed: ordered over --shards micro-shards, or (0) the allreduce.
local function data_parallel(dist, net, opts)
  if opts.shards < 0 then cli.fail("--shards must be >= 0, got " .. opts.shards) end
  local N = dist.world_size()
  if opts.shards > 0 and opts.shards < N and dist.is_root() then
    io.stderr:write(string.format("--shards %d < %d processes: ranks %d..%d get no micro-shard and wait; pass " ..
      "--shards %d (or a multiple of it)\n", opts.shards, N, opts.shards + 1, N, N))
  end
  return dist.DataParallel(net, { broadcast = false, shards = opts.shards > 0 and opts.shards or nil })
end

-- A real run (see RUN_OPTIONS): train or resume (or --load a run checkpoint),
-- then the book's four sentences and the held-out corpus BLEU as the last line.
-- With dist (--distributed), every rank trains its rows of each batch through
-- fit's data_parallel; rank 1 alone prints, saves and evaluates.
local function real_run(spec, opts, model_meta, dist)
  local name = spec.name
  local root = not dist or dist.is_root()
  local say = root and print or function() end
  local config = run_config(opts, model_meta)
  local ckpt
  local from = opts.resume or opts.load
  if from then
    local err
    ckpt, err = run.load_checkpoint(from)
    if not ckpt then cli.fail(name .. ": " .. err) end
    local why = run.config_mismatch(ckpt.config, config)
    if why then cli.fail(string.format("%s: refusing %s: %s", name, from, why)) end
  end
  local corpus, err = data.load_corpus(opts.batch_size, opts.num_steps, { path = opts.data,
    num_examples = opts.num_examples, seed = opts.seed, valid = opts.valid, test = opts.test, bucket = opts.bucket,
    log = function(text) say(name .. ": " .. text) end })
  if not corpus then cli.fail(name .. ": " .. err) end
  if ckpt then
    local why = run.vocab_mismatch(ckpt.src_vocab, corpus.src_vocab, "English") or
      run.vocab_mismatch(ckpt.tgt_vocab, corpus.tgt_vocab, "French")
    if why then cli.fail(string.format("%s: refusing %s: %s", name, from, why)) end
  end
  local src_vocab, tgt_vocab = corpus.src_vocab, corpus.tgt_vocab
  say(string.format("%s: %d training, %d validation and %d test pairs; %d batches per epoch%s", name,
    corpus.sizes.train, corpus.sizes.valid, corpus.sizes.test, #corpus.train, opts.bucket and " (length-bucketed)" or ""))
  local net = spec.build(src_vocab, tgt_vocab, opts)
  local r = report.new(spec.title)
  r:paragraph(spec.description)
  local checkpoint = opts.out .. "/" .. name .. ".safetensors"
  if opts.load then
    local ok, lerr = pcall(net.load_state_dict, net, ckpt.model)
    if not ok then cli.fail(string.format("%s: %s does not fit this model: %s", name, opts.load, tostring(lerr))) end
    say("loaded " .. opts.load)
  else
    if ckpt then say(string.format("%s: resuming %s at epoch %d, batch %d, step %d", name, from,
      ckpt.position.epoch, ckpt.position.batch, ckpt.position.step)) end
    local t0 = require("attn.progress").clock()
    local ok, result = pcall(run.fit, net, corpus, {
      lr = opts.lr, epochs = opts.epochs, label_smoothing = opts.label_smoothing, accum = opts.accum,
      schedule = opts.schedule, warmup = opts.warmup, d_model = spec.d_model and spec.d_model(opts) or 32,
      valid_every = opts.valid_every, save_every = opts.save_every,
      max_steps = opts.max_steps > 0 and opts.max_steps or nil, out = opts.out, name = name, config = config,
      resume = ckpt, progress = root and not opts.quiet, log = say,
      data_parallel = dist and data_parallel(dist, net, opts) or nil,
    })
    if not ok then
      if type(result) == "string" and result:find("does not fit", 1, true) then cli.fail(name .. ": " .. result) end
      error(result, 0)
    end
    if not root then return { opts = opts, net = net, result = result } end
    local seconds = require("attn.progress").clock() - t0
    local tokens = result.tokens -- every step's, a partial epoch's too (stopped by --max_steps)
    local line = string.format("%s: %d steps in %.1f s (%s), last step's per-token cross-entropy %.3f, %.0f tokens/sec " ..
      "on %d thread%s%s", name, #result.steps, seconds, require("attn.progress").format_time(seconds),
      result.steps[#result.steps] or 0 / 0, seconds > 0 and tokens / seconds or 0, attn.get_num_threads(),
      attn.get_num_threads() == 1 and "" or "s", dist and string.format(" x %d processes", dist.world_size()) or "")
    print(line)
    r:heading("Training")
    r:pre(line)
    if result.stopped then
      print(string.format("%s: stopped after step %d; resume with --resume %s", name, #result.steps + ckpt_step(ckpt),
        result.checkpoint or "(no --out)"))
      assert(r:write(opts.out .. "/report.html"))
      return { opts = opts, net = net, result = result }
    end
    local steps = {}
    for i = 1, #result.steps do steps[i] = i end
    if #steps > 1 then
      assert(r:plot("training loss per step", opts.out .. "/loss.png", plot.lines, steps, { result.steps },
        { legend = { "per-token cross-entropy" }, xlabel = "step", ylabel = "loss", title = spec.title }))
    end
    result.save(checkpoint)
    print("saved " .. checkpoint .. (result.best and string.format(" (best validation loss %.4f in %s/%s-best.safetensors)",
      result.best, opts.out, name) or ""))
  end
  if not root then return { opts = opts, net = net } end
  local rows = translation.evaluate(net, src_vocab, tgt_vocab, opts.num_steps, 1)
  for _, row in ipairs(rows) do print(string.format("%s => %s, bleu %.3f", row.source, row.translation, row.bleu)) end
  local bleu
  if opts.test > 0 then
    local t0 = require("attn.progress").clock()
    local preds
    bleu, preds = run.evaluate(net, corpus.test, src_vocab, tgt_vocab, opts.num_steps, { beam = opts.beam })
    local seconds = require("attn.progress").clock() - t0
    local samples = {}
    for i = 1, math.min(#preds, 5) do
      samples[i] = { table.concat(corpus.test.source[i], " "), preds[i], table.concat(corpus.test.target[i], " ") }
    end
    r:heading("Held-out test sentences")
    r:table({ "English", "attn", "reference" }, samples)
    local how = opts.beam > 1 and string.format("beam %d", opts.beam) or "greedy"
    r:pre(string.format("corpus BLEU-4 %.2f on %d sentences (%s), decoded in %.1f s", 100 * bleu, #preds, how, seconds))
    assert(r:write(opts.out .. "/report.html"))
    print(string.format("%s: decoded %d sentences in %.1f s", name, #preds, seconds))
    print(string.format("%s: test corpus BLEU-4 %.2f on %d held-out sentences (%s)", name, 100 * bleu, #preds, how))
  else
    assert(r:write(opts.out .. "/report.html"))
  end
  return { opts = opts, net = net, bleu = bleu }
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

local experiment -- the body of translation.run, after the options

--- Runs one experiment end to end. With `--distributed` (under `mpirun -np N`), every
-- process trains its share of each batch (attn.distributed.DataParallel through
-- train_seq2seq's or, in a real run, run.fit's `data_parallel`); rank 1 alone prints,
-- saves and translates.
-- @tparam table spec `name`, `title`, `description`, `epochs` (the book's), `book` (a line with the
--   book's printed results), `build(src_vocab, tgt_vocab, opts) -> net`, and optionally
--   `extra_options` (for cli.parse), `model_options(opts)` (a table of the options that shape the
--   weights, saved in the checkpoint and checked by --load), `figures(net, rows, r, opts,
--   src_vocab, tgt_vocab)` to add attention pictures, `d_model(opts)` (the model width, for
--   `--schedule noam`), and `argv` (default the script's `arg`). Any of `RUN_OPTIONS` makes it a real
--   run (attn.d2l.run): held-out split, checkpoints, `--resume`, and with `--test N` a last line
--   `<name>: test corpus BLEU-4 <score> on N held-out sentences (greedy)`
-- @raise a `cli.fail` failure for a file that cannot be read or a checkpoint that does not fit
-- @treturn table `{opts =, net =, history =, rows =}` (no rows on ranks other than 1)
function translation.run(spec)
  local options = translation.options(spec.epochs)
  for _, o in ipairs(translation.RUN_OPTIONS) do options[#options + 1] = o end
  for _, o in ipairs(spec.extra_options or {}) do options[#options + 1] = o end
  local opts = cli.start(spec.argv or arg, { name = spec.name, description = spec.description, options = options })
  if opts.smoke then
    opts.epochs = math.min(opts.epochs, 2)
  end
  if opts.threads then attn.set_num_threads(opts.threads) end
  if not opts.distributed then return experiment(spec, opts, nil) end
  -- Every rank runs the same script with the same seed; an error on one rank (a cli.fail
  -- included) aborts them all instead of leaving the others waiting in a collective.
  local found, dist = pcall(require, "attn.distributed")
  if not found then cli.fail(spec.name .. ": --distributed: " .. tostring(dist)) end
  dist.init()
  local res = dist.run(experiment, spec, opts, dist)
  dist.finalize()
  return res
end

experiment = function(spec, opts, dist)
  local model_meta = spec.model_options and spec.model_options(opts) or {}
  local real = is_real_run(opts)
  if not real and opts.load then
    local _, saved = attn.load(opts.load)
    real = type(saved) == "table" and saved.format == run.FORMAT
  end
  if real then return real_run(spec, opts, model_meta, dist) end
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
      data_parallel = dist and data_parallel(dist, net, opts) or nil,
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
