-- The examples' training path against a hand-written loop (issue 25, item 4):
--   OPENBLAS_NUM_THREADS=1 lua5.4 bench/loop_overhead.lua [steps] [reps] [fra.txt]
-- For the book's Transformer and Bahdanau model (book sizes, dropout 0.1) it times `steps`
-- training steps through (a) the examples' path, attn.d2l.train.train_seq2seq over
-- data.load_fra_eng's loader and attn.d2l.run.fit over data.load_corpus's, and (b) a loop written
-- by hand making the same model calls (teacher forcing, forward, MaskedSoftmaxCELoss, backward,
-- clipping at 1, Adam) on the same batches, taken from the same loaders beforehand. Both start
-- from the same seed, so their losses must agree bit for bit; the script checks it. A step's time
-- is process CPU time (os.clock) from one batch's request to the next's, so the loader's work is
-- in the examples' steps; the paths alternate, `reps` times, and the rows give per-step medians.
-- With a path to the whole fra.txt, the whole-vocabulary cases run too (the book's Transformer
-- with every line's vocabularies; the loading takes a while).
local attn = require "attn"
local nn = attn.nn
local data = require "attn.d2l.data"
local train = require "attn.d2l.train"
local run = require "attn.d2l.run"

local CHILD = arg[1] == "--child" -- a child process: --child path model data steps
local STEPS = math.tointeger(tonumber(arg[CHILD and 5 or 1] or "")) or 40
local REPS = math.tointeger(tonumber(arg[2] or "")) or 3
local FULL = not CHILD and arg[3] or nil
local LR, SEED = 0.005, 7
local LUA, SCRIPT = arg[-1], arg[0]
local CHILD_HAND, FULL_PATH = false, nil -- a child's path and the corpus file

attn.set_num_threads(1)

local function median(t)
  local s = table.move(t, 1, #t, 1, {})
  table.sort(s)
  local n = #s
  if n == 0 then return 0 / 0 end
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

local models = {
  transformer = function(src_n, tgt_n)
    local h = 32
    return nn.EncoderDecoder(nn.TransformerEncoder(src_n, h, h, h, h, { h }, h, 64, 4, 2, 0.1),
      nn.TransformerDecoder(tgt_n, h, h, h, h, { h }, h, 64, 4, 2, 0.1))
  end,
  bahdanau = function(src_n, tgt_n)
    return nn.EncoderDecoder(nn.Seq2SeqEncoder(src_n, 32, 32, 2, 0.1), nn.Seq2SeqAttentionDecoder(tgt_n, 32, 32, 2, 0.1))
  end,
}

-- A fresh model from the same seed (the same weights after the Xavier init, the same dropout draws).
local function fresh(build, src_vocab, tgt_vocab)
  attn.manual_seed(SEED)
  return build(#src_vocab, #tgt_vocab)
end

-- Step times from the moments a loop asks for its next batch: times[i] = moments[i + 1] - moments[i].
local function diffs(moments)
  local t = {}
  for i = 1, #moments - 1 do t[i] = moments[i + 1] - moments[i] end
  return t
end

-- ---------------------------------------------------------------- train_seq2seq

-- load_fra_eng's loader, vocabularies and the generator's start, read once per data set.
local function book_data(opts)
  local loader, src_vocab, tgt_vocab = assert(data.load_fra_eng(64, 10, opts))
  return { loader = loader, src_vocab = src_vocab, tgt_vocab = tgt_vocab,
    start = { loader.rng.state, loader.rng.inc } }
end

-- The epochs of `steps` batches (at most one epoch's), and the batches per epoch.
local function book_epochs(d, steps)
  local per_epoch = math.min(steps, #d.loader)
  return math.ceil(steps / per_epoch), per_epoch
end

local function examples_book(build, d, steps)
  d.loader.rng.state, d.loader.rng.inc = d.start[1], d.start[2]
  local epochs, per_epoch = book_epochs(d, steps)
  local net = fresh(build, d.src_vocab, d.tgt_vocab)
  local times, losses = {}, {}
  -- train_seq2seq's data_iter: the loader's epochs cut to per_epoch batches; a step's time runs
  -- from its batch's request to the next request
  local iter = setmetatable({}, { __call = function()
    local it, n, prev = d.loader(), 0, nil
    return function()
      local now = os.clock()
      if prev then times[#times + 1] = now - prev end
      prev, n = now, n + 1
      if n > per_epoch then return nil end
      return it()
    end
  end })
  local history = train.train_seq2seq(net, iter, { lr = LR, epochs = epochs, tgt_vocab = d.tgt_vocab,
    progress = false })
  for i, rec in ipairs(history) do losses[i] = rec.loss end
  return times, losses
end

local function hand_book(build, d, steps)
  d.loader.rng.state, d.loader.rng.inc = d.start[1], d.start[2]
  local epochs, per_epoch = book_epochs(d, steps)
  local batches = {}
  for e = 1, epochs do
    local it = d.loader()
    batches[e] = {}
    for b = 1, per_epoch do batches[e][b] = table.pack(it()) end
  end
  local net = fresh(build, d.src_vocab, d.tgt_vocab)
  local bos = d.tgt_vocab["<bos>"]
  d.loader, d.src_vocab, d.tgt_vocab = nil, nil, nil -- the loop keeps its tensors only
  collectgarbage()
  train.xavier_init_weights(net)
  local opt = attn.optim.Adam { params = net:parameters(), lr = LR }
  local loss = nn.MaskedSoftmaxCELoss()
  net:train()
  local times, losses = {}, {}
  for e = 1, epochs do
    local sum, tokens = 0, 0
    for _, b in ipairs(batches[e]) do
      local t0 = os.clock()
      local X, X_len, Y, Y_len = b[1], b[2], b[3], b[4]
      opt:zero_grad()
      local T = Y:size(2)
      local dec = attn.full({ Y:size(1), 1 }, bos, Y:dtype())
      if T > 1 then dec = attn.cat({ dec, Y:narrow(2, 1, T - 1) }, 2) end
      local l = loss(net(X, dec, X_len), Y, Y_len):sum()
      l:backward()
      sum, tokens = sum + l:item(), tokens + Y_len:sum():item()
      nn.clip_grad_norm(net:parameters(), 1)
      opt:step()
      times[#times + 1] = os.clock() - t0
    end
    losses[e] = sum / tokens
  end
  return times, losses
end

-- ---------------------------------------------------------------- run.fit

local function examples_fit(build, corpus, steps)
  local net = fresh(build, corpus.src_vocab, corpus.tgt_vocab)
  local moments = {}
  local per_epoch = #corpus.train
  local epochs = math.ceil(steps / per_epoch)
  local result = run.fit(net, corpus, { lr = LR, epochs = epochs, max_steps = steps, progress = false,
    log = function() end, on_step = function() moments[#moments + 1] = os.clock() end })
  return diffs(moments), result.steps
end

local function hand_fit(build, corpus, steps)
  local batches = {}
  while #batches < steps do
    for _, rows in ipairs(corpus.train:plan()) do
      if #batches < steps then batches[#batches + 1] = table.pack(corpus.train:batch(rows)) end
    end
  end
  local net = fresh(build, corpus.src_vocab, corpus.tgt_vocab)
  local bos = corpus.tgt_vocab["<bos>"]
  for k in pairs(corpus) do corpus[k] = nil end -- the loop keeps its tensors only
  collectgarbage()
  train.xavier_init_weights(net)
  local opt = attn.optim.Adam { params = net:parameters(), lr = LR }
  local loss = nn.MaskedSoftmaxCELoss { label_smoothing = 0 }
  net:train()
  local moments, losses = {}, {}
  for i, b in ipairs(batches) do
    local X, X_len, Y, Y_len = b[1], b[2], b[3], b[4]
    local tokens = Y_len:sum():item()
    opt:zero_grad()
    local T = Y:size(2)
    local dec = attn.full({ Y:size(1), 1 }, bos, Y:dtype())
    if T > 1 then dec = attn.cat({ dec, Y:narrow(2, 1, T - 1) }, 2) end
    local l = loss(net(X, dec, X_len), Y, Y_len):sum() * T
    local sum = l:item()
    ;(l * (1 / tokens)):backward()
    nn.clip_grad_norm(net:parameters(), 1)
    opt:step()
    losses[i] = sum / tokens
    moments[#moments + 1] = os.clock()
  end
  return diffs(moments), losses
end

-- ---------------------------------------------------------------- the comparison

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i] ~= b[i] and math.abs(a[i] - b[i]) > 1e-6 * math.max(math.abs(a[i]), 1e-30) then return false end
  end
  return true
end

local function mean(t)
  local sum = 0
  for _, v in ipairs(t) do sum = sum + v end
  return sum / #t
end

-- One run in this process: prints the step times and the losses as two lines of numbers.
local function child(path, model, which, steps)
  attn.set_num_threads(1)
  local build = models[model]
  local times, losses
  if path == "book" then
    local opts = which == "whole" and { seed = 1, path = FULL_PATH, num_examples = math.huge } or { seed = 1 }
    local d = book_data(opts)
    times, losses = (CHILD_HAND and hand_book or examples_book)(build, d, steps)
  else
    local opts = which == "whole" and { seed = 1, path = FULL_PATH } or { seed = 1, num_examples = 600 }
    local corpus = assert(data.load_corpus(64, 10, opts))
    times, losses = (CHILD_HAND and hand_fit or examples_fit)(build, corpus, steps)
  end
  print(table.concat(times, " "))
  print(table.concat((function()
    local s = {}
    for i, l in ipairs(losses) do s[i] = string.format("%.17g", l) end
    return s
  end)(), " "))
end

local function numbers(line)
  local t = {}
  for x in (line or ""):gmatch("%S+") do t[#t + 1] = tonumber(x) end
  return t
end

-- Runs one path in a fresh process; returns its step times and losses.
local function spawn(kind, path, model, which, steps)
  local cmd = string.format("%s %s --child %s-%s %s %s %d %s", LUA, SCRIPT, kind, path, model, which, steps,
    which == "whole" and FULL or "")
  local p = assert(io.popen(cmd))
  local times, losses = numbers(p:read("l")), numbers(p:read("l"))
  assert(p:close(), "the child failed: " .. cmd)
  return times, losses
end

-- Runs both paths `REPS` times, alternating which goes first, and prints one row.
local function compare(label, path, model, which, steps)
  local function examples() return spawn("examples", path, model, which, steps) end
  local function hand() return spawn("hand", path, model, which, steps) end
  local ex_all, hand_all, ratios, agree = {}, {}, {}, true
  for rep = 1, REPS do
    local first, second = examples, hand
    if rep % 2 == 0 then first, second = hand, examples end
    local t1, l1 = first()
    local t2, l2 = second()
    local te, le, th, lh = t1, l1, t2, l2
    if rep % 2 == 0 then te, le, th, lh = t2, l2, t1, l1 end
    agree = agree and same(le, lh)
    for _, v in ipairs(te) do ex_all[#ex_all + 1] = v end
    for _, v in ipairs(th) do hand_all[#hand_all + 1] = v end
    ratios[rep] = median(te) / median(th)
  end
  local me, mh = median(ex_all), median(hand_all)
  print(string.format("%-34s examples %7.2f ms  hand %7.2f ms  ratio %.3f (per run: %s); means %7.2f / %7.2f ms, " ..
    "ratio %.3f; losses %s", label, 1e3 * me, 1e3 * mh, me / mh, table.concat((function()
      local s = {}
      for i, r in ipairs(ratios) do s[i] = string.format("%.3f", r) end
      return s
    end)(), " "), 1e3 * mean(ex_all), 1e3 * mean(hand_all), mean(ex_all) / mean(hand_all),
    agree and "agree" or "DIFFER"))
  io.stdout:flush()
end

if CHILD then
  local kind, path = arg[2]:match("^(%a+)%-(%a+)$")
  CHILD_HAND, FULL_PATH = kind == "hand", arg[6]
  child(path, arg[3], arg[4], STEPS)
  return
end

print(string.format("%d steps per run, %d runs per path, 1 thread, CPU ms per step", STEPS, REPS))
for _, model in ipairs { "transformer", "bahdanau" } do
  compare(model .. " train_seq2seq (book data)", "book", model, "sample", STEPS)
  compare(model .. " run.fit (book data)", "fit", model, "sample", STEPS)
end
if FULL then
  local steps = math.min(STEPS, 20)
  compare("transformer train_seq2seq (whole)", "book", "transformer", "whole", steps)
  compare("transformer run.fit (whole)", "fit", "transformer", "whole", steps)
end
