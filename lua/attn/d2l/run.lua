--- Real training runs for the encoder-decoder models: a step-based loop with
-- per-step progress (loss, tokens/s, ETA), learning-rate schedules, label
-- smoothing, gradient accumulation, validation with the best checkpoint kept,
-- periodic checkpoints that resume exactly, and held-out evaluation with
-- corpus BLEU. The book's `train_seq2seq` (attn.d2l.train) is untouched.
--
-- **The loss.** Each optimizer step minimises the mean per-token
-- cross-entropy of its batches (label-smoothed when asked), the sum over the
-- step's batches divided by the step's valid tokens; the number reported per
-- step is that mean without smoothing weights only when smoothing is 0.
--
-- **Checkpoints** are one safetensors file (written atomically: a kill leaves
-- the previous file whole): the weights under `model.`, the optimizer's buffers
-- under `optim.`, and in the metadata the optimizer's and the scheduler's
-- state, attn's generator state (dropout), the loader's generator state at the
-- start of the epoch and the batches done in it, both vocabularies, and the
-- run's settings (`config.*`), which a resume must match.
-- @module attn.d2l.run
-- @usage
-- local corpus = assert(data.load_corpus(64, 10, {test = 100}))
-- local result = run.fit(net, corpus, {lr = 0.005, epochs = 2, out = "out/t", name = "t"})
-- local bleu = run.evaluate(net, corpus.test, corpus.src_vocab, corpus.tgt_vocab, 10)
local attn = require "attn"
local nn = require "attn.nn"
local check = require "attn.check"
local progress = require "attn.progress"
local data = require "attn.d2l.data"
local metrics = require "attn.d2l.metrics"
local train = require "attn.d2l.train"
local lr_scheduler = require "attn.lr_scheduler"

local run = {}

--- The format tag every checkpoint of this module carries (`format` in its metadata).
run.FORMAT = "attn.d2l.run/1"

-- ---------------------------------------------------------------- values in metadata

local function encode(v)
  if type(v) == "boolean" then return tostring(v) end
  if math.type(v) == "integer" then return string.format("%d", v) end
  if type(v) == "number" then return string.format("%a", v) end -- exact
  if type(v) == "string" then return "s:" .. v end
  error("run: cannot store a " .. type(v) .. " in a checkpoint", 3)
end

local function decode(s)
  if s == "true" then return true end
  if s == "false" then return false end
  if s:sub(1, 2) == "s:" then return s:sub(3) end
  return math.tointeger(s) or tonumber(s)
end

-- A plain table (scalars and lists of scalars) as metadata entries under prefix.
local function flatten(prefix, t, meta)
  for k, v in pairs(t) do
    if type(v) == "table" then
      for i, x in ipairs(v) do meta[prefix .. k .. "." .. i] = encode(x) end
      meta[prefix .. k .. ".n"] = encode(#v)
    elseif type(v) ~= "function" then
      meta[prefix .. k] = encode(v)
    end
  end
end

local function unflatten(prefix, meta)
  local t, lists = {}, {}
  for key, v in pairs(meta) do
    if key:sub(1, #prefix) == prefix then
      local rest = key:sub(#prefix + 1)
      local name, i = rest:match("^([%w_]+)%.(%w+)$")
      if name then
        lists[name] = lists[name] or {}
        if i ~= "n" then lists[name][math.tointeger(tonumber(i))] = decode(v) end
      else
        t[rest] = decode(v)
      end
    end
  end
  for name, list in pairs(lists) do t[name] = list end
  return t
end

local function integers(s, n)
  local out = {}
  for x in tostring(s):gmatch("[^,]+") do out[#out + 1] = math.tointeger(tonumber(x)) end
  if #out ~= n then return nil end
  return out
end

-- ---------------------------------------------------------------- checkpoints

--- Writes a checkpoint (one file, atomically).
-- @tparam string path
-- @tparam table c `net`, `optimizer`, `scheduler` (optional), `src_vocab`, `tgt_vocab`, `loader_state`
--   (`{state, inc}` at the start of the epoch), `position` (`{epoch =, batch =, step =}`: the next epoch,
--   batches done in it, optimizer steps done), `config` (string values the resume must match), `best`
--   (best validation loss, optional)
-- @treturn[1] boolean true
-- @treturn[2] nil
-- @treturn[2] string message
function run.save_checkpoint(path, c)
  local tensors = {}
  for k, t in pairs(c.net:state_dict()) do tensors["model." .. k] = t end
  local otensors, meta = attn.optim.flatten_state(c.optimizer:state_dict())
  for k, t in pairs(otensors) do tensors["optim." .. k] = t end
  meta.format = run.FORMAT
  if c.scheduler then flatten("sched.", c.scheduler:state_dict(), meta) end
  local rng = attn.get_rng_state()
  meta.rng = string.format("%d,%d,%d,%d", rng[1], rng[2], rng[3], rng[4])
  meta.loader = string.format("%d,%d", c.loader_state[1], c.loader_state[2])
  meta.position = string.format("%d,%d,%d", c.position.epoch, c.position.batch, c.position.step)
  meta.src_vocab = table.concat(c.src_vocab:token_list(), "\n") -- tokens hold no newline (lines are split on it)
  meta.tgt_vocab = table.concat(c.tgt_vocab:token_list(), "\n")
  if c.best then meta.best = encode(c.best) end
  for k, v in pairs(c.config or {}) do meta["config." .. k] = tostring(v) end
  return attn.save(path, tensors, meta)
end

--- Reads a checkpoint of `save_checkpoint`.
-- @tparam string path
-- @treturn[1] table `{model = state dict, optimizer = state dict, scheduler = state or nil, rng = {4 integers},
--   loader_state = {2}, position = {epoch =, batch =, step =}, src_vocab = Vocab, tgt_vocab = Vocab,
--   config = {string}, best = number or nil, path =}`
-- @treturn[2] nil
-- @treturn[2] string message: an unreadable, truncated or foreign file
function run.load_checkpoint(path)
  local tensors, meta = attn.load(path)
  if not tensors then return nil, meta end
  if meta.format ~= run.FORMAT then
    return nil, string.format("%s is not a training checkpoint of attn.d2l.run (format %s, expected %s)", path,
      tostring(meta.format or "none"), run.FORMAT)
  end
  local function bad(what) return nil, string.format("%s: damaged checkpoint: %s", path, what) end
  local rng, loader = integers(meta.rng, 4), integers(meta.loader, 2)
  local pos = integers(meta.position, 3)
  if not rng then return bad("no generator state") end
  if not loader or not pos then return bad("no data position") end
  if type(meta.src_vocab) ~= "string" or type(meta.tgt_vocab) ~= "string" then return bad("no vocabularies") end
  local vocabs = {}
  for _, side in ipairs { "src_vocab", "tgt_vocab" } do
    local tokens = {}
    for tok in (meta[side] .. "\n"):gmatch("(.-)\n") do tokens[#tokens + 1] = tok end
    local ok, v = pcall(data.vocab_from_tokens, tokens)
    if not ok then return bad(side .. ": " .. tostring(v)) end
    vocabs[side] = v
  end
  local model, otensors = {}, {}
  for k, t in pairs(tensors) do
    local name = k:match("^model%.(.+)$")
    if name then
      model[name] = t
    else
      local oname = k:match("^optim%.(.+)$")
      if oname then otensors[oname] = t end
    end
  end
  if not meta["optim.optimizer"] then return bad("no optimizer state") end
  local config = {}
  for k, v in pairs(meta) do
    local name = k:match("^config%.(.+)$")
    if name then config[name] = v end
  end
  local sched = unflatten("sched.", meta)
  return {
    model = model, optimizer = attn.optim.unflatten_state(otensors, meta), scheduler = next(sched) and sched or nil,
    rng = rng, loader_state = loader, position = { epoch = pos[1], batch = pos[2], step = pos[3] },
    src_vocab = vocabs.src_vocab, tgt_vocab = vocabs.tgt_vocab, config = config,
    best = meta.best and decode(meta.best) or nil, path = path,
  }
end

--- Compares a checkpoint's settings with a run's: nil when they agree, else
-- the reason (the first setting that differs, both values).
-- @tparam table saved the checkpoint's `config`
-- @tparam table config the run's (values compared as strings)
-- @treturn nil|string
function run.config_mismatch(saved, config)
  local keys = {}
  for k in pairs(config) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local want = tostring(config[k])
    if saved[k] ~= want then
      return string.format("it was made with %s = %s, this run has %s = %s", k, tostring(saved[k]), k, want)
    end
  end
  return nil
end

--- Compares two vocabularies: nil when equal, else the reason.
-- @param saved Vocab
-- @param built Vocab
-- @tparam string side the vocabulary's name in the message ("English")
-- @treturn nil|string
function run.vocab_mismatch(saved, built, side)
  local a, b = saved:token_list(), built:token_list() -- not the fields: reading them keeps them
  for i = 1, math.max(#a, #b) do
    if a[i] ~= b[i] then
      return string.format("the %s vocabulary differs (%d tokens saved, %d from this data; first difference at id %d: " ..
        "%s vs %s)", side, #a, #b, i, tostring(a[i]), tostring(b[i]))
    end
  end
  return nil
end

-- ---------------------------------------------------------------- schedules

--- Makes the learning-rate schedule of a run.
-- @param optimizer
-- @tparam string kind "none", "noam" (the Transformer's warmup, `attn.optim.lr_scheduler.NoamLR`; the
--   rate is `lr * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)`, lr the factor), "cosine" (to 0 over
--   `total` steps) or "step" (halved every `warmup` steps)
-- @tparam table opts `lr`, `warmup`, `d_model`, `total`
-- @treturn LRScheduler|nil
-- @raise on an unknown kind
function run.make_schedule(optimizer, kind, opts)
  if kind == nil or kind == "none" then return nil end
  if kind == "noam" then
    return lr_scheduler.NoamLR(optimizer, { d_model = opts.d_model, warmup_steps = opts.warmup, factor = opts.lr })
  elseif kind == "cosine" then
    return lr_scheduler.CosineAnnealingLR(optimizer, { T_max = math.max(opts.total, 1) })
  elseif kind == "step" then
    return lr_scheduler.StepLR(optimizer, { step_size = opts.warmup, gamma = 0.5 })
  end
  error("run: schedule must be none, noam, cosine or step, got " .. tostring(kind), 2)
end

-- ---------------------------------------------------------------- evaluation

-- The (n, num_steps) arrays of held-out token lists, in batches, for the loss.
local function held_batches(held, src_vocab, tgt_vocab, num_steps, batch_size)
  local X, X_len = data.build_array(held.source, src_vocab, num_steps)
  local Y, Y_len = data.build_array(held.target, tgt_vocab, num_steps)
  local out, n = {}, X:size(1)
  for first = 1, n, batch_size do
    local k = math.min(batch_size, n - first + 1)
    out[#out + 1] = { X:narrow(1, first, k), X_len:narrow(1, first, k), Y:narrow(1, first, k), Y_len:narrow(1, first, k) }
  end
  return out
end

-- Forward pass with teacher forcing; returns the summed token cross-entropy
-- (a tensor with a graph when grad is on), the book's per-sequence losses, and T.
local function forward_loss(net, loss, bos, X, X_len, Y, Y_len)
  local B, T = Y:size(1), Y:size(2)
  local dec_input = attn.full({ B, 1 }, bos, Y:dtype())
  if T > 1 then dec_input = attn.cat({ dec_input, Y:narrow(2, 1, T - 1) }, 2) end
  local l = loss(net(X, dec_input, X_len), Y, Y_len)
  return l:sum() * T
end

--- The mean per-token cross-entropy of held-out pairs (eval mode, no graph).
-- @tparam Module net
-- @tparam table held `{source = token lists, target = token lists}`
-- @param src_vocab
-- @param tgt_vocab
-- @tparam integer num_steps
-- @tparam[opt] integer batch_size (256)
-- @treturn number (NaN for no pairs)
function run.validation_loss(net, held, src_vocab, tgt_vocab, num_steps, batch_size)
  if #held.source == 0 then return 0 / 0 end
  local was_training = net.training
  net:eval()
  local loss, bos = nn.MaskedSoftmaxCELoss(), tgt_vocab["<bos>"]
  local sum, tokens = 0, 0
  attn.no_grad(function()
    for _, b in ipairs(held_batches(held, src_vocab, tgt_vocab, num_steps, batch_size or 256)) do
      sum = sum + forward_loss(net, loss, bos, b[1], b[2], b[3], b[4]):item()
      tokens = tokens + b[4]:sum():item()
    end
  end)
  if was_training then net:train() end
  return sum / tokens
end

--- Translates held-out pairs and scores them with corpus BLEU-4.
-- @tparam Module net
-- @tparam table held `{source = token lists, target = token lists}`
-- @param src_vocab
-- @param tgt_vocab
-- @tparam integer num_steps
-- @tparam[opt] table opts `beam` (1: batched greedy decoding; more: batched beam search of that width),
--   `batch_size` (sentences decoded together, 256), `limit` (the first n pairs only)
-- @treturn number corpus BLEU-4 in [0, 1]
-- @treturn table the translations
-- @treturn table corpus_bleu's details
function run.evaluate(net, held, src_vocab, tgt_vocab, num_steps, opts)
  opts = check.options("evaluate", opts, { beam = true, batch_size = true, limit = true })
  local n = math.min(opts.limit or #held.source, #held.source)
  local sources, refs = table.move(held.source, 1, n, 1, {}), table.move(held.target, 1, n, 1, {})
  local preds
  if (opts.beam or 1) > 1 then
    preds = train.beam_search_batch(net, sources, src_vocab, tgt_vocab, num_steps,
      { beam = opts.beam, batch_size = opts.batch_size })
  else
    preds = train.predict_batch(net, sources, src_vocab, tgt_vocab, num_steps, { batch_size = opts.batch_size })
  end
  local bleu, detail = metrics.corpus_bleu(preds, refs, 4)
  return bleu, preds, detail
end

-- ---------------------------------------------------------------- training

--- Trains for real: see the module comment. A fresh run initialises the weights
-- as the book (Xavier); a resumed one restores everything from the checkpoint
-- and continues where it stopped, so its step losses are an unbroken run's.
-- @tparam Module net an EncoderDecoder
-- @tparam table corpus from `data.load_corpus`
-- @tparam table opts `lr`, `epochs` (required); `clip` (1), `label_smoothing` (0), `accum` (1: batches per
--   optimizer step), `schedule` ("none"; see `make_schedule`), `warmup` (4000), `d_model` (noam),
--   `valid_every` (steps between validations; 0: at each epoch's end when there is a validation set),
--   `save_every` (epochs between checkpoints, 0: none), `max_steps` (stop after this many steps
--   and save a checkpoint), `out` and `name` (checkpoints go to `out/name-last.safetensors` and
--   `out/name-best.safetensors`), `config` (settings saved and checked on resume), `resume` (a table from
--   `load_checkpoint`), `progress` (true, false or attn.progress options), `on_step` (fn(step, loss, lr)),
--   `log` (fn(text); default print), `data_parallel` (an `attn.distributed.DataParallel` of net: rank 1's
--   weights are broadcast after the initialisation or the resume, every rank trains on its rows of each
--   batch (on its micro-shards when the wrapper has `shards`: the ordered reduction, the same bits for
--   any number of processes) and the gradients are summed over ranks before clipping, so N processes
--   take the steps one would; the losses are totals over ranks; only rank 1 validates, writes
--   checkpoints and logs)
-- @treturn table `{steps = {loss per step}, epochs = {{epoch =, loss =, tokens =, seconds =, tokens_per_sec =}},
--   tokens = the target tokens of every step this call ran (a partial epoch's too), best =, stopped = boolean,
--   checkpoint = path of the last checkpoint written}`
-- @raise on bad options or a checkpoint that does not fit the model
function run.fit(net, corpus, opts)
  opts = check.options("fit", opts, { lr = true, epochs = true, clip = true, label_smoothing = true, accum = true,
    schedule = true, warmup = true, d_model = true, valid_every = true, save_every = true, max_steps = true,
    out = true, name = true, config = true, resume = true, progress = true, on_step = true, log = true,
    data_parallel = true })
  local dp = opts.data_parallel
  if dp ~= nil and dp.module ~= net then error("fit: data_parallel must wrap net", 2) end
  local dist = dp and require("attn.distributed")
  local root = not dp or dist.is_root()
  local log = root and (opts.log or print) or function() end
  local loader, tgt_vocab = corpus.train, corpus.tgt_vocab
  local accum, clip = opts.accum or 1, opts.clip or 1
  check.positive_int("fit", "accum", accum)
  check.positive_int("fit", "epochs", opts.epochs)
  local per_epoch = (#loader + accum - 1) // accum
  local total = per_epoch * opts.epochs
  local bos = tgt_vocab["<bos>"]
  local optimizer = attn.optim.Adam { params = net:parameters(), lr = opts.lr }
  local scheduler = run.make_schedule(optimizer, opts.schedule, { lr = opts.lr, warmup = opts.warmup or 4000,
    d_model = opts.d_model, total = total })
  local loss = nn.MaskedSoftmaxCELoss { label_smoothing = opts.label_smoothing or 0 }
  local name, out = opts.name or "run", opts.out
  local position, epoch_state = { epoch = 1, batch = 0, step = 0 }, loader:get_state()
  local best = nil
  local ckpt = opts.resume
  if ckpt then
    local ok, err = pcall(net.load_state_dict, net, ckpt.model)
    if not ok then error("fit: " .. tostring(ckpt.path) .. " does not fit this model: " .. tostring(err), 2) end
    optimizer:load_state_dict(ckpt.optimizer)
    if scheduler then
      if not ckpt.scheduler then error("fit: " .. tostring(ckpt.path) .. " was trained without a schedule", 2) end
      scheduler:load_state_dict(ckpt.scheduler)
    end
    attn.set_rng_state(ckpt.rng)
    epoch_state, position, best = ckpt.loader_state, ckpt.position, ckpt.best
  else
    train.xavier_init_weights(net)
  end
  if dp then dp:broadcast_state() end
  local function save(path, pos, state)
    if not root then return nil end
    local ok, err = run.save_checkpoint(path, { net = net, optimizer = optimizer, scheduler = scheduler,
      src_vocab = corpus.src_vocab, tgt_vocab = tgt_vocab, loader_state = state, position = pos,
      config = opts.config, best = best })
    if not ok then error("fit: " .. err, 0) end
    return path
  end
  local show
  if root and opts.progress ~= false and position.step < total then
    local p = { total = total, label = name, unit = "step" }
    for k, v in pairs(type(opts.progress) == "table" and opts.progress or {}) do p[k] = v end
    show = progress.new(p)
  end
  local result = { steps = {}, epochs = {}, tokens = 0, stopped = false }
  local step = position.step
  local valid_every = opts.valid_every or 0
  local has_valid = root and corpus.valid and #corpus.valid.source > 0
  local function validate()
    local v = run.validation_loss(net, corpus.valid, corpus.src_vocab, tgt_vocab, loader.num_steps)
    local better = best == nil or v < best
    if better then best = v end
    return v, better
  end
  net:train()
  for epoch = position.epoch, opts.epochs do
    loader:set_state(epoch_state)
    local plan = loader:plan()
    local next_state = loader:get_state()
    local b = epoch == position.epoch and position.batch or 0
    local t0, ep_loss, ep_tokens = progress.clock(), 0, 0
    while b < #plan do
      optimizer:zero_grad()
      local group = {}
      for _ = 1, accum do
        if b >= #plan then break end
        b = b + 1
        group[#group + 1] = plan[b]
      end
      local batches, tokens = {}, 0
      for i, rows in ipairs(group) do
        batches[i] = table.pack(loader:batch(rows))
        tokens = tokens + batches[i][4]:sum():item()
      end
      local sums = {} -- the loss sum per piece of the batches (one piece without data_parallel)
      for _, bt in ipairs(batches) do
        -- this rank's pieces (its rows, or its micro-shards under the ordered reduction); the loss
        -- is a sum over rows (over the step's tokens), so the gradients add up over pieces and ranks
        local pieces = dp and dp:micro_shards(bt[1]:size(1)) or { { index = 1, first = 1, last = bt[1]:size(1) } }
        for _, piece in ipairs(pieces) do
          local part, rows = bt, piece.last - piece.first + 1
          if dp then
            part = {}
            for i = 1, 4 do part[i] = bt[i]:narrow(1, piece.first, rows) end
          end
          local l = forward_loss(net, loss, bos, part[1], part[2], part[3], part[4])
          sums[piece.index] = (sums[piece.index] or 0) + l:item()
          ;(l * (1 / tokens)):backward()
          if dp then dp:stash_gradients(piece.index) end
        end
      end
      local sum = sums[1] or 0
      if dp then
        dp:sync_gradients({ op = "sum" })
        sum = dp:sum_numbers(sums)
      end
      nn.clip_grad_norm(net:parameters(), clip)
      local lr = optimizer.lr
      optimizer:step()
      if scheduler then scheduler:step() end
      step = step + 1
      local step_loss = sum / tokens
      result.steps[#result.steps + 1] = step_loss
      ep_loss, ep_tokens = ep_loss + sum, ep_tokens + tokens
      result.tokens = result.tokens + tokens
      if opts.on_step then opts.on_step(step, step_loss, lr) end
      local shown = { loss = step_loss, tokens = tokens, lr = lr }
      if has_valid and valid_every > 0 and step % valid_every == 0 then
        local v, better = validate()
        shown.valid = v
        if better and out then save(out .. "/" .. name .. "-best.safetensors", { epoch = epoch, batch = b, step = step },
          epoch_state) end
      end
      if show then show:update(step, shown) end
      if opts.max_steps and step >= opts.max_steps then
        if out then result.checkpoint = save(out .. "/" .. name .. "-last.safetensors",
          { epoch = epoch, batch = b, step = step }, epoch_state) end
        result.stopped = true
        break
      end
    end
    if result.stopped then break end
    local seconds = progress.clock() - t0
    local rec = { epoch = epoch, loss = ep_tokens > 0 and ep_loss / ep_tokens or 0 / 0, tokens = ep_tokens,
      seconds = seconds, tokens_per_sec = seconds > 0 and ep_tokens / seconds or nil }
    epoch_state = next_state
    if has_valid and valid_every == 0 then
      local v, better = validate()
      rec.valid = v
      if better and out then save(out .. "/" .. name .. "-best.safetensors", { epoch = epoch + 1, batch = 0, step = step },
        epoch_state) end
    end
    result.epochs[#result.epochs + 1] = rec
    log(string.format("%s: epoch %d/%d: per-token cross-entropy %.4f%s, %d tokens in %.1f s (%.0f tokens/s)", name,
      epoch, opts.epochs, rec.loss, rec.valid and string.format(", validation %.4f", rec.valid) or "", ep_tokens,
      seconds, rec.tokens_per_sec or 0))
    if out and (opts.save_every or 0) > 0 and epoch % opts.save_every == 0 then
      result.checkpoint = save(out .. "/" .. name .. "-last.safetensors", { epoch = epoch + 1, batch = 0, step = step },
        epoch_state)
    end
  end
  if show then show:finish() end
  result.best = best
  result.position = { step = step }
  -- the state at the end, for a final checkpoint written by the caller (save_final)
  result.save = function(path)
    return save(path, { epoch = opts.epochs + 1, batch = 0, step = step }, epoch_state)
  end
  return result
end

return run
