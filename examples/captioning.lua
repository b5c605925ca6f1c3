-- Image captioning with attention (Show, Attend and Tell, Xu et al. 2015) on scenes of
-- Fashion-MNIST items: a small CNN learns to classify single items, then, frozen, gives a
-- 3 x 3 grid of features over each 84 x 84 scene; an LSTM decoder with additive attention over
-- the grid names the items in reading order ("sneaker bag shirt <eos>"), beside the same
-- decoder without attention. Test scenes use only Fashion-MNIST's test images. Ends with one
-- summary line; report.html holds the captions, metrics, loss curves and attention pictures.
--   lua5.4 examples/captioning.lua                  (about 5-15 minutes on 2 cores)
--   lua5.4 examples/captioning.lua --beam 1 --rnn gru --fine-tune
local attn = require "attn"
local cli = require "attn.d2l.cli"
local report = require "attn.d2l.report"
local cap = require "attn.d2l.captioning"
local data = require "attn.data"
local plot = require "attn.plot"
local nn = attn.nn

local opts = cli.start(arg, {
  name = "captioning",
  description = "Show, Attend and Tell on captioned Fashion-MNIST scenes (--data: the Fashion-MNIST folder)",
  options = {
    { "epochs", "integer", 30, "captioner and baseline epochs" },
    { "classifier_epochs", "integer", 4, "epochs of the item classifier (lr 0.002, halved every epoch)" },
    { "beam", "integer", 3, "beam width of the summary's decoding (1 = greedy)" },
    { "threads", "integer", 2, "engine threads" },
    { "scenes", "integer", 20000, "training scenes" },
    { "test_scenes", "integer", 2000, "test scenes" },
    { "batch", "integer", 64, "batch size" },
    { "lr", "number", 0.003, "Adam learning rate of the decoders" },
    { "hidden", "integer", 64, "decoder hidden size" },
    -- 0: the regulariser asks sum_t alpha_ti = 1 of all 9 cells while a caption has 2 to 5 steps,
    -- which only spread attention can come near; at this size (20,000 scenes, 30 epochs) lambda 0
    -- captioned best (BLEU-4 0.736, exact 0.753, attention on the item 0.94; 0.1: 0.723, 0.746,
    -- 0.41; 1: 0.706, 0.725, 0.25; docs/CAPTIONING.md). Short runs (6,000 scenes, 8 epochs) do
    -- better with 0.3, as a smoother start.
    { "lambda", "number", 0, "weight of the doubly stochastic regulariser (Xu et al.: 1)" },
    { "rnn", "string", "lstm", "decoder cell: lstm or gru" },
    { "clutter", "number", 0, "noise in the empty cells, in [0, 1]" },
    { "fine_tune", "boolean", false, "train the CNN with the captioner (default: frozen)" },
  },
})

cli.main(function()
  attn.set_num_threads(opts.threads)
  if opts.rnn ~= "lstm" and opts.rnn ~= "gru" then cli.fail("captioning: --rnn must be lstm or gru, got " .. opts.rnn) end
  local smoke = opts.smoke
  local t_start = attn.clock()
  local function stamp() return string.format("%.0f s", attn.clock() - t_start) end
  local function say(fmt, ...)
    print(string.format(fmt, ...))
    io.stdout:flush()
  end

  math.randomseed(opts.seed)
  local function permutation(n) -- batch order, from Lua's generator seeded with --seed
    local p = {}
    for i = 1, n do p[i] = i end
    for i = n, 2, -1 do
      local j = math.random(i)
      p[i], p[j] = p[j], p[i]
    end
    return p
  end

  -- ------------------------------------------------------------ data
  local n_items = smoke and 3000 or nil
  local train_images, train_labels = data.fashion_mnist({ dir = opts.data, n = n_items })
  local test_images, test_labels
  local source_note = "Fashion-MNIST"
  if train_images then
    test_images, test_labels = assert(data.fashion_mnist({ split = "test", dir = opts.data, n = smoke and 1000 or nil }))
  elseif smoke then
    -- CI without the dataset: ten striped patterns with noise stand in for the ten classes
    source_note = "a synthetic stand-in (Fashion-MNIST is not installed: make deps-images)"
    say("captioning: %s", train_labels)
    local function synthetic(n, seed)
      attn.manual_seed(seed)
      local ids = {}
      for i = 1, n do ids[i] = math.random(10) end
      local labels = attn.tensor(ids, "int64")
      local rows = attn.arange(0, 28, 1, "float32"):reshape({ 1, 28, 1 })
      local stripe = (rows - labels:to("float32"):reshape({ n, 1, 1 }) * 2.5):abs():lt(2):to("float32")
      return (stripe:expand({ n, 28, 28 }) * 0.8 + attn.rand(n, 28, 28) * 0.2):contiguous(), labels
    end
    train_images, train_labels = synthetic(3000, 1)
    test_images, test_labels = synthetic(1000, 2)
  else
    cli.fail(train_labels)
  end
  say("captioning: %s, %d training and %d test items", source_note, train_images:size(1), test_images:size(1))

  -- ------------------------------------------------------------ the classifier
  local cnn = nn.CaptionCNN()
  local function item_batch(images, idx) return attn.core.index_select(images, 1, idx):unsqueeze(2) end
  local function classifier_accuracy()
    cnn:eval()
    local right = 0
    attn.no_grad(function()
      for s = 1, test_images:size(1), 500 do
        local n = math.min(500, test_images:size(1) - s + 1)
        local pred = cnn(test_images:narrow(1, s, n):unsqueeze(2)):argmax(2)
        right = right + pred:eq(test_labels:narrow(1, s, n)):sum():item()
      end
    end)
    return right / test_images:size(1)
  end
  do
    local optimizer = attn.optim.Adam { params = cnn:parameters(), lr = 0.002 }
    local N, B = train_images:size(1), 128
    local epochs = smoke and 1 or opts.classifier_epochs
    for epoch = 1, epochs do
      optimizer.lr = 0.002 * 0.5 ^ (epoch - 1) -- halved every epoch
      cnn:train()
      local perm, total, batches = permutation(N), 0, 0
      for s = 1, N, B do
        local idx = table.move(perm, s, math.min(s + B - 1, N), 1, {})
        optimizer:zero_grad()
        local loss = nn.cross_entropy(cnn(item_batch(train_images, idx)),
          attn.core.index_select(train_labels, 1, idx)):mean()
        loss:backward()
        optimizer:step()
        total, batches = total + loss:item(), batches + 1
      end
      say("classifier epoch %d/%d: loss %.3f, test accuracy %.3f (%s)", epoch, epochs, total / batches,
        classifier_accuracy(), stamp())
    end
  end
  local cnn_accuracy = classifier_accuracy()

  -- ------------------------------------------------------------ scenes and their features
  local grid_opts = { clutter = opts.clutter }
  local function make_scenes(split, n, seed, images, labels)
    return assert(data.scenes({ n = n, split = split, seed = seed, clutter = grid_opts.clutter,
      source = { images = images, labels = labels } }))
  end
  local train = make_scenes("train", smoke and 300 or opts.scenes, opts.seed + 1, train_images, train_labels)
  local test = make_scenes("test", smoke and 60 or opts.test_scenes, opts.seed + 2, test_images, test_labels)
  local vocab = train.vocab
  local bos, eos = vocab:id("<bos>"), vocab:id("<eos>")
  local max_len = train.captions:size(2)
  local function features(canvases)
    cnn:eval()
    local parts = {}
    attn.no_grad(function()
      for s = 1, canvases:size(1), 64 do -- small chunks, collected at once: the unfolded images are large
        parts[#parts + 1] = cnn:grid(canvases:narrow(1, s, math.min(64, canvases:size(1) - s + 1)))
        collectgarbage()
      end
    end)
    return attn.cat(parts, 1)
  end
  local train_feats, test_feats = features(train.canvases), features(test.canvases)
  local D, L = train_feats:size(3), train_feats:size(2)
  say("captioning: %d training and %d test scenes, features %d cells x %d (%s)", train.canvases:size(1),
    test.canvases:size(1), L, D, stamp())

  -- ------------------------------------------------------------ the decoders
  local function train_decoder(name, attend)
    local dec = nn.ShowAttendTell { vocab_size = #vocab, feature_size = D, num_cells = L, rnn = opts.rnn,
      num_hiddens = opts.hidden, attention = attend }
    local params = dec:parameters()
    if opts.fine_tune then
      for _, p in ipairs(cnn:parameters()) do params[#params + 1] = p end
    end
    local optimizer = attn.optim.Adam { params = params, lr = opts.lr }
    local N, B = train.canvases:size(1), opts.batch
    local epochs = smoke and 2 or opts.epochs
    local curve = {}
    for epoch = 1, epochs do
      dec:train()
      if opts.fine_tune then cnn:train() end
      local perm, total, reg_total, batches = permutation(N), 0, 0, 0
      for s = 1, N, B do
        local idx = table.move(perm, s, math.min(s + B - 1, N), 1, {})
        local feats = opts.fine_tune and cnn:grid(attn.core.index_select(train.canvases, 1, idx)) or
          attn.core.index_select(train_feats, 1, idx)
        optimizer:zero_grad()
        local loss, ce, reg = dec:loss(feats, attn.core.index_select(train.captions, 1, idx),
          attn.core.index_select(train.valid_len, 1, idx), { bos = bos, lambda = opts.lambda })
        loss:backward()
        nn.clip_grad_norm_(params, 5)
        optimizer:step()
        total, reg_total, batches = total + ce, reg_total + reg, batches + 1
      end
      curve[epoch] = total / batches
      if epoch == 1 or epoch % 5 == 0 or epoch == epochs then
        say("%s epoch %d/%d: cross-entropy %.4f%s (%s)", name, epoch, epochs, curve[epoch],
          attend and string.format(", regulariser %.3f", reg_total / batches) or "", stamp())
      end
    end
    if opts.fine_tune then test_feats = features(test.canvases) end
    return dec, curve
  end
  local frozen = {} -- with --fine_tune each decoder starts from the classifier's own CNN
  for k, v in pairs(cnn:state_dict()) do frozen[k] = v:clone() end
  local model, curve = train_decoder("attention", true)
  local model_feats = test_feats
  if opts.fine_tune then cnn:load_state_dict(frozen) end
  local baseline, base_curve = train_decoder("no attention", false)
  local base_feats = test_feats

  -- ------------------------------------------------------------ evaluation
  local dopts = { bos = bos, eos = eos, max_len = max_len }
  local function decode(dec, feats, width)
    if width == 1 then return cap.greedy(dec, feats, dopts) end
    return cap.beam(dec, feats, { bos = bos, eos = eos, max_len = max_len, beam = width })
  end
  local results = {}
  for _, row in ipairs { { "attention", model, model_feats }, { "no attention", baseline, base_feats } } do
    for _, width in ipairs(opts.beam > 1 and { 1, opts.beam } or { 1 }) do
      local decoded = decode(row[2], row[3], width)
      local m = cap.evaluate(decoded, test)
      m.name, m.width, m.decoded = row[1], width, decoded
      results[#results + 1] = m
    end
  end
  local function pick(name, width)
    for _, m in ipairs(results) do if m.name == name and m.width == width then return m end end
  end
  local main, base = pick("attention", opts.beam), pick("no attention", opts.beam)
  local rows = {}
  for _, m in ipairs(results) do
    rows[#rows + 1] = { m.name, m.width == 1 and "greedy" or ("beam " .. m.width), string.format("%.3f", m.bleu[1]),
      string.format("%.3f", m.bleu[2]), string.format("%.3f", m.bleu[3]), string.format("%.3f", m.bleu[4]),
      string.format("%.3f", m.exact), m.attention and string.format("%.2f (uniform %.2f)", m.attention, m.uniform)
      or "-" }
  end
  local header = { "decoder", "decoding", "BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "exact", "attention on item" }
  say("%-13s %-8s %7s %7s %7s %7s %6s  %s", table.unpack(header))
  for _, r in ipairs(rows) do say("%-13s %-8s %7s %7s %7s %7s %6s  %s", table.unpack(r)) end

  -- ------------------------------------------------------------ report and pictures
  local r = report.new("Show, Attend and Tell on Fashion-MNIST scenes")
  r:paragraph(string.format("Encoder: nn.CaptionCNN (two conv layers and a 7 x 7 cell layer, %d features) trained on " ..
    "single %s items, " ..
    "test accuracy %.3f, then %s over 84 x 84 scenes (%d cells x %d features). Decoder: nn.ShowAttendTell " ..
    "(%s %d, additive attention, gate beta, lambda %g), %d training scenes, %d epochs, Adam lr %g; the baseline is " ..
    "the same decoder with the mean feature as its context. %d test scenes from test images only, decoded " ..
    "without teacher forcing.", D, source_note, cnn_accuracy, opts.fine_tune and "fine-tuned" or "frozen", L, D,
    opts.rnn, opts.hidden, opts.lambda, train.canvases:size(1), #curve, opts.lr, test.canvases:size(1)))
  r:table(header, rows)
  r:heading("Training loss")
  local xs = {}
  for i = 1, #curve do xs[i] = i end
  assert(r:plot("cross-entropy per token (teacher forcing)", opts.out .. "/loss.png", plot.lines, xs,
    { curve, base_curve }, { legend = { "attention", "no attention" }, xlabel = "epoch", ylabel = "cross-entropy" }))
  r:heading("Attention while captioning test scenes")
  -- a few test scenes, those with two or more words first (any, so that a tiny run draws too)
  local chosen = {}
  for pass = 1, 2 do
    for i = 1, #main.decoded.ids do
      if #chosen < 4 and ((#main.decoded.ids[i] >= 2) == (pass == 1)) then chosen[#chosen + 1] = i end
    end
  end
  for shown, i in ipairs(chosen) do
    local ws = vocab:tokens(main.decoded.ids[i])
    local weights = main.decoded.alphas[i]
    if #weights > #ws then ws[#ws + 1] = "<eos>" end
    local image = test.canvases:select(1, i):select(1, 1)
    local caption = string.format("scene %d: \"%s\" (reference \"%s\")", i, main.preds[i], main.refs[i])
    assert(r:plot(caption, string.format("%s/attention-%d.png", opts.out, shown), plot.attention_overlay, image,
      attn.tensor(weights), ws, {}))
  end
  r:heading("Captions of the first test scenes")
  local caps = {}
  for i = 1, math.min(12, #main.preds) do caps[i] = { i, main.refs[i], main.preds[i], base.preds[i] } end
  r:table({ "scene", "reference", "attention", "no attention" }, caps)
  assert(r:write(opts.out .. "/report.html"))
  say("captioning: classifier test accuracy %.3f; report %s/report.html (%s)", cnn_accuracy, opts.out, stamp())
  say("captioning: test BLEU-4 %.3f (no attention %.3f), exact %.3f, attention on the named item %.2f (uniform %.2f)",
    main.bleu[4], base.bleu[4], main.exact, main.attention or 0, main.uniform or 0)
end)
