--- Training and decoding for the book's encoder-decoder models (d2l v0.17's
-- train_seq2seq and predict_seq2seq), plus beam search, which the book describes
-- but does not implement.
--
-- **Data contract.** `data_iter()` returns a fresh iterator over one shuffled
-- epoch: `for X, X_valid_len, Y, Y_valid_len in data_iter() do`, with X, Y
-- (batch, num_steps) tensors of 1-based token ids (float or int64) and the
-- lengths (batch). A vocabulary gives `vocab[token]` (an id; unknown tokens map
-- to `<unk>`), `vocab:ids(list)`, `vocab:tokens(ids)` and `#vocab`.
--
-- **The two losses (pitfall 5).** The book prints the epoch's summed
-- per-sequence loss over the number of valid tokens, and a sequence's loss
-- divides by num_steps, pads included: the number it prints ("loss 0.020") is
-- the true per-token cross-entropy divided by num_steps. The history and the
-- progress line carry both: `loss` (the book's scale) and `token_loss`.
-- @module attn.d2l.train
-- @usage
-- local s2s = require "attn.d2l.train"
-- local data_iter, src_vocab, tgt_vocab = assert(require("attn.d2l.data").load_fra_eng(64, 10, {seed = 1}))
-- local history = s2s.train_seq2seq(net, data_iter, {lr = 0.005, epochs = 250, tgt_vocab = tgt_vocab})
-- local fr, weights = s2s.predict_seq2seq(net, "go .", src_vocab, tgt_vocab, 10, {save_attention_weights = true})
local attn = require "attn"
local nn = require "attn.nn"
local progress = require "attn.progress"
local check = require "attn.check"
local data = require "attn.d2l.data" -- data.lower: Python's Unicode lowercasing, as the book's .lower()

local M = {}

-- ---------------------------------------------------------------- init

--- The book's `xavier_init_weights`, applied over the whole model (children
-- before parents, PyTorch's apply order, so the draws come in the book's
-- order): Xavier-uniform for every Linear weight and every GRU weight matrix;
-- biases, embeddings and normalisation parameters keep their defaults.
-- @tparam Module net
-- @treturn Module net
function M.xavier_init_weights(net)
  return net:apply(function(m)
    local cls = m:class_name()
    if cls == "Linear" then
      nn.init.xavier_uniform_(m.weight)
    elseif cls == "GRU" then
      for _, p in ipairs(m:named_parameters()) do
        if p[1]:find("^weight") then nn.init.xavier_uniform_(p[2]) end
      end
    end
  end)
end

-- ---------------------------------------------------------------- training

local function total(t) return t:sum():item() end

--- Trains an encoder-decoder as the book's train_seq2seq: Xavier-uniform init,
-- Adam, teacher forcing (the decoder input is `<bos>` followed by Y without its
-- last column), MaskedSoftmaxCELoss, backward on the sum over the batch,
-- gradient clipping by global norm.
-- @tparam Module net an EncoderDecoder (called as net(X, dec_input, X_valid_len))
-- @tparam function data_iter returns an iterator over one epoch (see the module doc)
-- @tparam table opts `lr`, `epochs`, `tgt_vocab` (required); `clip` (1),
--   `device` ("cpu", the only one), `progress` (true: a progress line on stderr;
--   or a table of options for attn.progress.new), `on_epoch` (fn(epoch, record),
--   called after each epoch), `init` (true: the Xavier initialisation; false keeps
--   the weights, e.g. to continue training), `data_parallel` (an `attn.distributed.DataParallel` of
--   net: rank 1's initial weights are broadcast, every rank trains on its rows of each batch, or on
--   its micro-shards when the wrapper has `shards` (the ordered reduction: the same bits for any
--   number of processes), and the gradients are summed over ranks before clipping, so N processes
--   take the steps one would; the history's loss and tokens are totals over ranks)
-- @treturn table history: one record per epoch, `{epoch =, loss = book scale,
--   token_loss = per-token cross-entropy, tokens =, seconds =, tokens_per_sec =}`
-- @raise on missing or invalid options
function M.train_seq2seq(net, data_iter, opts)
  opts = check.options("train_seq2seq", opts,
    { lr = true, epochs = true, tgt_vocab = true, clip = true, device = true, progress = true, on_epoch = true,
      init = true, data_parallel = true })
  if not nn.is_module(net) then error("train_seq2seq: net must be a module", 2) end
  local callable = type(data_iter) == "function" or type((getmetatable(data_iter) or {}).__call) == "function"
  if not callable then error("train_seq2seq: data_iter must be callable, returning an iterator over one epoch", 2) end
  if type(opts.lr) ~= "number" or opts.lr < 0 then error("train_seq2seq: lr must be a number >= 0", 2) end
  if math.type(opts.epochs) ~= "integer" or opts.epochs < 1 then
    error("train_seq2seq: epochs must be a positive integer, got " .. tostring(opts.epochs), 2)
  end
  if opts.tgt_vocab == nil then error("train_seq2seq: tgt_vocab is required (for <bos>)", 2) end
  if opts.device ~= nil and opts.device ~= "cpu" then
    error("train_seq2seq: device must be 'cpu' (the only device), got " .. tostring(opts.device), 2)
  end
  local clip = opts.clip or 1
  local bos = opts.tgt_vocab["<bos>"]
  if bos == nil then error("train_seq2seq: tgt_vocab has no '<bos>'", 2) end
  if opts.init ~= false then M.xavier_init_weights(net) end
  local dp = opts.data_parallel
  if dp ~= nil and dp.module ~= net then error("train_seq2seq: data_parallel must wrap net", 2) end
  if dp then dp:broadcast_state() end
  local optimizer = attn.optim.Adam { params = net:parameters(), lr = opts.lr }
  local loss = nn.MaskedSoftmaxCELoss()
  net:train()
  local show
  if opts.progress ~= false then
    local popts = type(opts.progress) == "table" and opts.progress or {}
    local p = { total = opts.epochs, label = popts.label or "train" }
    for k, v in pairs(popts) do p[k] = v end
    show = progress.new(p)
  end
  local history = {}
  for epoch = 1, opts.epochs do
    local t0 = progress.clock()
    -- loss sums and token counts per piece of the batch (one piece without data_parallel)
    local loss_sums, token_counts, num_steps = {}, {}, nil
    for Xb, Xb_valid_len, Yb, Yb_valid_len in data_iter() do
      optimizer:zero_grad()
      num_steps = Yb:size(2)
      -- this rank's pieces of the batch (its rows, or its micro-shards under the ordered
      -- reduction); the loss is a sum over rows, so the gradients add up over pieces and ranks
      local pieces = dp and dp:micro_shards(Yb:size(1)) or { { index = 1, first = 1, last = Yb:size(1) } }
      for _, piece in ipairs(pieces) do
        local X, X_valid_len, Y, Y_valid_len = Xb, Xb_valid_len, Yb, Yb_valid_len
        local rows = piece.last - piece.first + 1
        if dp then
          X, X_valid_len = X:narrow(1, piece.first, rows), X_valid_len:narrow(1, piece.first, rows)
          Y, Y_valid_len = Y:narrow(1, piece.first, rows), Y_valid_len:narrow(1, piece.first, rows)
        end
        local T = num_steps
        local dec_input = attn.full({ rows, 1 }, bos, Y:dtype())
        if T > 1 then dec_input = attn.cat({ dec_input, Y:narrow(2, 1, T - 1) }, 2) end
        local Y_hat = net(X, dec_input, X_valid_len)
        local l = loss(Y_hat, Y, Y_valid_len)
        local lsum = l:sum()
        lsum:backward()
        local k = piece.index
        loss_sums[k] = (loss_sums[k] or 0) + lsum:item()
        token_counts[k] = (token_counts[k] or 0) + total(Y_valid_len)
        if dp then dp:stash_gradients(k) end
      end
      if dp then dp:sync_gradients({ op = "sum" }) end
      nn.clip_grad_norm(net:parameters(), clip)
      optimizer:step()
    end
    local loss_sum, tokens = loss_sums[1] or 0, token_counts[1] or 0
    if dp then loss_sum, tokens = dp:sum_numbers(loss_sums, token_counts) end
    local seconds = progress.clock() - t0
    local book = tokens > 0 and loss_sum / tokens or 0
    local record = {
      epoch = epoch,
      loss = book,
      token_loss = book * (num_steps or 0),
      tokens = tokens,
      seconds = seconds,
      tokens_per_sec = seconds > 0 and tokens / seconds or nil,
    }
    history[epoch] = record
    if show then show:update(epoch, { loss = book, token_loss = record.token_loss, tokens = tokens }) end
    if opts.on_epoch then opts.on_epoch(epoch, record) end
  end
  if show then show:finish() end
  return history
end

-- ---------------------------------------------------------------- decoding

-- The book's source preparation: lowercase, split on single spaces, ids, <eos>;
-- the valid length is taken before truncating or padding to num_steps.
local function encode_source(net, src_sentence, src_vocab, num_steps, who)
  if type(src_sentence) ~= "string" then error(who .. ": src_sentence must be a string", 3) end
  if math.type(num_steps) ~= "integer" or num_steps < 1 then
    error(who .. ": num_steps must be a positive integer, got " .. tostring(num_steps), 3)
  end
  local words = {}
  for w in (data.lower(src_sentence) .. " "):gmatch("(.-) ") do words[#words + 1] = w end
  local ids = src_vocab:ids(words)
  ids[#ids + 1] = src_vocab["<eos>"]
  local valid_len = #ids
  local pad = src_vocab["<pad>"]
  local row = {}
  for i = 1, num_steps do row[i] = ids[i] or pad end
  local enc_X = attn.tensor({ row })
  local enc_valid_len = attn.tensor({ valid_len })
  local enc_outputs = table.pack(net.encoder(enc_X, enc_valid_len))
  return net.decoder:init_state(enc_outputs, enc_valid_len)
end

local function id_of(t) return math.tointeger(t:item()) end

--- Greedy decoding as the book's predict_seq2seq: the net in eval mode, the
-- source lowercased and split on spaces with `<eos>` appended (its valid
-- length taken before truncation to num_steps), then from `<bos>` the argmax
-- token at each step for at most num_steps steps, stopping at `<eos>` (which
-- is not emitted).
-- @tparam Module net an EncoderDecoder
-- @tparam string src_sentence
-- @param src_vocab
-- @param tgt_vocab
-- @tparam integer num_steps
-- @tparam[opt] table opts `save_attention_weights` (false): keep the decoder's
--   `attention_weights` after each step
-- @treturn string the translation (tokens joined by spaces)
-- @treturn table the attention weights per step (empty unless asked for)
-- @treturn table the output token ids
function M.predict_seq2seq(net, src_sentence, src_vocab, tgt_vocab, num_steps, opts)
  opts = check.options("predict_seq2seq", opts, { save_attention_weights = true, device = true })
  net:eval()
  local state = encode_source(net, src_sentence, src_vocab, num_steps, "predict_seq2seq")
  local eos = tgt_vocab["<eos>"]
  local dec_X = attn.tensor({ { tgt_vocab["<bos>"] } })
  local output, weights = {}, {}
  for _ = 1, num_steps do
    local Y
    Y, state = net.decoder(dec_X, state)
    dec_X = Y:argmax(3)
    local pred = id_of(dec_X)
    if opts.save_attention_weights then weights[#weights + 1] = net.decoder.attention_weights end
    if pred == eos then break end
    output[#output + 1] = pred
  end
  return table.concat(tgt_vocab:tokens(output), " "), weights, output
end

-- Sources first..last (strings, prepared as encode_source, or token lists) padded into one
-- (B, num_steps) batch and encoded: the decoder's initial state and the ids' dtype.
local function encode_sources(net, sources, first, last, src_vocab, num_steps, who)
  local pad = src_vocab["<pad>"]
  local flat, lens = {}, {}
  for b = 1, last - first + 1 do
    local src = sources[first + b - 1]
    local words = src
    if type(src) == "string" then
      words = {}
      for w in (data.lower(src) .. " "):gmatch("(.-) ") do words[#words + 1] = w end
    elseif type(src) ~= "table" then
      error(string.format("%s: source %d is a %s, not a string or token list", who, first + b - 1, type(src)), 4)
    end
    local ids = src_vocab:ids(words)
    ids[#ids + 1] = src_vocab["<eos>"]
    lens[b] = #ids
    for t = 1, num_steps do flat[(b - 1) * num_steps + t] = ids[t] or pad end
  end
  local enc_X = attn.tensor(flat):reshape({ #lens, num_steps })
  local enc_valid_len = attn.tensor(lens)
  return net.decoder:init_state(table.pack(net.encoder(enc_X, enc_valid_len)), enc_valid_len), enc_X:dtype()
end

--- Greedy decoding of many sentences at once: the sources are padded into one
-- (B, num_steps) batch (each with `<eos>`, its valid length taken before
-- truncation, as `predict_seq2seq`), and every step decodes the whole batch;
-- a sentence that has emitted `<eos>` keeps riding along but its output is
-- finished, and the loop stops when all are. Gives predict_seq2seq's
-- translations (up to float rounding in the batched products), many times
-- faster: each step is one set of batched tensor operations, which attn runs
-- on every thread (`attn.set_num_threads`).
-- @tparam Module net an EncoderDecoder
-- @tparam table sources strings (lowercased and split on spaces, as predict_seq2seq) or token lists
-- @param src_vocab
-- @param tgt_vocab
-- @tparam integer num_steps
-- @tparam[opt] table opts `batch_size` (sentences decoded together, default 256)
-- @treturn table the translations (strings), in the order of `sources`
-- @treturn table the output ids of each
function M.predict_batch(net, sources, src_vocab, tgt_vocab, num_steps, opts)
  opts = check.options("predict_batch", opts, { batch_size = true })
  check.lua_type("predict_batch", "sources", sources, "table")
  check.positive_int("predict_batch", "num_steps", num_steps)
  local chunk = opts.batch_size or 256
  check.positive_int("predict_batch", "batch_size", chunk)
  net:eval()
  local eos, bos = tgt_vocab["<eos>"], tgt_vocab["<bos>"]
  local texts, all_ids = {}, {}
  attn.no_grad(function()
    for first = 1, #sources, chunk do
      local last = math.min(first + chunk - 1, #sources)
      local B = last - first + 1
      local state, dtype = encode_sources(net, sources, first, last, src_vocab, num_steps, "predict_batch")
      local dec_X = attn.full({ B, 1 }, bos, dtype)
      local out, done, left = {}, {}, B
      for b = 1, B do out[b] = {} end
      for _ = 1, num_steps do
        local Y
        Y, state = net.decoder(dec_X, state)
        dec_X = Y:argmax(3)
        local pred = dec_X:reshape({ B }):totable()
        for b = 1, B do
          if not done[b] then
            local id = math.tointeger(pred[b])
            if id == eos then
              done[b], left = true, left - 1
            else
              out[b][#out[b] + 1] = id
            end
          end
        end
        if left == 0 then break end
      end
      for b = 1, B do
        all_ids[first + b - 1] = out[b]
        texts[first + b - 1] = table.concat(tgt_vocab:tokens(out[b]), " ")
      end
    end
  end)
  return texts, all_ids
end

-- A copy of a decoder state: its tables are copied (a Transformer's cache is
-- written in place), its tensors shared (operations never modify them).
local function copy_state(s)
  if type(s) ~= "table" or attn.is_tensor(s) then return s end
  local c = {}
  for k, v in pairs(s) do c[k] = copy_state(v) end
  return c
end

-- Beam candidates ranked by summed log P; ties by hypothesis, then by the token's rank.
local function by_logp(a, b)
  if a.logp ~= b.logp then return a.logp > b.logp end
  if a.h ~= b.h then return a.h < b.h end
  return a.r < b.r
end

-- One step's survivors of a sentence: its k best candidates, those ending in <eos> moved to
-- done (their length the step), the others returned as live hypotheses {ids, logp, last, from}
-- (from: the candidate, for what the caller carries over).
local function keep_best(cands, k, eos, step, done)
  table.sort(cands, by_logp)
  local kept = {}
  for i = 1, math.min(k, #cands) do
    local c = cands[i]
    local ids = { table.unpack(c.parent.ids) }
    if c.tok == eos then
      done[#done + 1] = { ids = ids, logp = c.logp, length = step }
    else
      ids[#ids + 1] = c.tok
      kept[#kept + 1] = { ids = ids, logp = c.logp, last = c.tok, from = c }
    end
  end
  return kept
end

-- A sentence's beam result: the live hypotheses join the finished ones (their length the
-- tokens emitted, no <eos>), each scored log P / L^alpha, best first.
local function finish_beam(done, live, alpha, tgt_vocab)
  for _, hyp in ipairs(live) do done[#done + 1] = { ids = hyp.ids, logp = hyp.logp, length = #hyp.ids } end
  for _, c in ipairs(done) do
    c.score = c.logp / math.max(c.length, 1) ^ alpha
    c.translation = table.concat(tgt_vocab:tokens(c.ids), " ")
    c.length = nil
  end
  table.sort(done, function(a, b) return a.score > b.score end)
end

--- Beam search: keeps the `beam` best partial translations by summed log
-- probability; a candidate that emits `<eos>` is finished. The result is the
-- finished or last live candidate with the best score log P / L^length_penalty
-- (L counts the tokens emitted, `<eos>` included; the book's 1/L^alpha with
-- alpha = 0.75 when length_penalty is not given). At width 1 only the greedy
-- path is ever kept, so the output is predict_seq2seq's.
-- @tparam Module net an EncoderDecoder
-- @tparam string src_sentence
-- @param src_vocab
-- @param tgt_vocab
-- @tparam integer num_steps
-- @tparam[opt] table opts `beam` (the width, default 2), `length_penalty` (0.75)
-- @treturn string the translation
-- @treturn table every finished or final candidate, best first:
--   {translation =, ids =, logp =, score =}
function M.beam_search(net, src_sentence, src_vocab, tgt_vocab, num_steps, opts)
  opts = check.options("beam_search", opts, { beam = true, length_penalty = true, device = true })
  local k = opts.beam or 2
  if math.type(k) ~= "integer" or k < 1 then error("beam_search: beam must be a positive integer, got " .. tostring(k), 2) end
  local alpha = opts.length_penalty or 0.75
  net:eval()
  local state = encode_source(net, src_sentence, src_vocab, num_steps, "beam_search")
  local eos = tgt_vocab["<eos>"]
  local live = { { ids = {}, logp = 0, state = state, last = tgt_vocab["<bos>"] } }
  local done = {}
  for step = 1, num_steps do
    local cands = {}
    for h, hyp in ipairs(live) do
      local Y, st = net.decoder(attn.tensor({ { hyp.last } }), copy_state(hyp.state))
      local scores = Y:reshape({ -1 })
      local logits, logp = scores:totable(), scores:log_softmax(1):totable()
      -- this hypothesis' k best tokens, ranked by the logits as argmax ranks
      -- them (lowest id first among ties), so width 1 follows the greedy path
      local order = {}
      for i = 1, #logp do order[i] = i end
      table.sort(order, function(a, b)
        if logits[a] ~= logits[b] then return logits[a] > logits[b] end
        return a < b
      end)
      for r = 1, math.min(k, #order) do
        local tok = order[r]
        cands[#cands + 1] = { h = h, r = r, tok = tok, logp = hyp.logp + logp[tok], parent = hyp, state = st }
      end
    end
    live = keep_best(cands, k, eos, step, done)
    for _, hyp in ipairs(live) do hyp.state, hyp.from = hyp.from.state, nil end
    if #live == 0 then break end
  end
  finish_beam(done, live, alpha, tgt_vocab)
  return done[1].translation, done
end

--- Beam search over many sentences at once: beam_search's rules (the same
-- candidates, ranking, `<eos>` and length penalty), so each sentence gets
-- beam_search's result (up to float rounding in the batched products), many
-- times faster. Sources are padded and encoded together `batch_size` at a
-- time, as `predict_batch`; then each step runs the decoder once over every
-- live hypothesis of every sentence (at most batch_size * beam rows: a
-- sentence drops its finished hypotheses, and leaves the batch when it has
-- none), keeps each row's `beam` best tokens (`topk`, which ranks ties as
-- argmax does) and regathers the decoder state's rows for the survivors
-- (`decoder:reorder_state`). Each step is one set of batched tensor
-- operations, run on every thread (`attn.set_num_threads`). At width 1 the
-- translations are `predict_batch`'s.
-- @tparam Module net an EncoderDecoder whose decoder has `reorder_state`
-- @tparam table sources strings (lowercased and split on spaces, as predict_seq2seq) or token lists
-- @param src_vocab
-- @param tgt_vocab
-- @tparam integer num_steps
-- @tparam[opt] table opts `beam` (the width, default 2), `length_penalty` (0.75), `batch_size`
--   (sentences decoded together, default 256)
-- @treturn table the translations (strings), in the order of `sources`
-- @treturn table per sentence, beam_search's candidates: every finished or final one, best first,
--   {translation =, ids =, logp =, score =}
-- @usage local texts = s2s.beam_search_batch(net, {"go .", "i lost ."}, src_vocab, tgt_vocab, 10, {beam = 4})
function M.beam_search_batch(net, sources, src_vocab, tgt_vocab, num_steps, opts)
  opts = check.options("beam_search_batch", opts, { beam = true, length_penalty = true, batch_size = true })
  check.lua_type("beam_search_batch", "sources", sources, "table")
  check.positive_int("beam_search_batch", "num_steps", num_steps)
  local k = opts.beam or 2
  check.positive_int("beam_search_batch", "beam", k)
  local alpha = opts.length_penalty or 0.75
  local chunk = opts.batch_size or 256
  check.positive_int("beam_search_batch", "batch_size", chunk)
  net:eval()
  local eos, bos = tgt_vocab["<eos>"], tgt_vocab["<bos>"]
  local width = math.min(k, #tgt_vocab)
  local texts, all = {}, {}
  attn.no_grad(function()
    for first = 1, #sources, chunk do
      local B = math.min(first + chunk - 1, #sources) - first + 1
      local state, dtype = encode_sources(net, sources, first, first + B - 1, src_vocab, num_steps,
        "beam_search_batch")
      -- rows: the live hypotheses of every sentence, sentence by sentence and each sentence's in its
      -- live order (beam_search's hypothesis order, which breaks its ties); row i is the decoder's row i
      local rows, live, done = {}, {}, {}
      for b = 1, B do
        rows[b] = { sent = b, ids = {}, logp = 0, last = bos }
        live[b], done[b] = { rows[b] }, {}
      end
      for step = 1, num_steps do
        local N = #rows
        local last_ids = {}
        for i, hyp in ipairs(rows) do last_ids[i] = hyp.last end
        local Y
        Y, state = net.decoder(attn.tensor(last_ids, dtype):reshape({ N, 1 }), state)
        local logits = Y:reshape({ N, -1 })
        local _, top = logits:topk(width, 2)
        local logp = logits:log_softmax(2):gather(2, top):totable()
        top = top:totable()
        local next_rows, parents = {}, {}
        local i = 1
        while i <= N do
          -- one sentence's rows: its candidates as beam_search makes them
          local sent, cands, h = rows[i].sent, {}, 0
          while i <= N and rows[i].sent == sent do
            h = h + 1
            for r = 1, width do
              cands[#cands + 1] = { h = h, r = r, tok = math.tointeger(top[i][r]), logp = rows[i].logp + logp[i][r],
                parent = rows[i], row = i }
            end
            i = i + 1
          end
          local kept = keep_best(cands, k, eos, step, done[sent])
          for _, hyp in ipairs(kept) do
            next_rows[#next_rows + 1], parents[#parents + 1] = hyp, hyp.from.row
            hyp.sent, hyp.from = sent, nil
          end
          live[sent] = kept
        end
        rows = next_rows
        if #rows == 0 then break end
        state = net.decoder:reorder_state(state, parents)
      end
      for b = 1, B do
        finish_beam(done[b], live[b], alpha, tgt_vocab)
        all[first + b - 1], texts[first + b - 1] = done[b], done[b][1].translation
      end
    end
  end)
  return texts, all
end

return M
