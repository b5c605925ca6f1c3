-- Every layer and function with a fused C path and a composed Lua path (attn.nn.fused's rule),
-- run both ways from one table: values and every gradient (inputs and parameters) of the
-- fused path against the composed one, taken once through `attn.nn.set_fused(false)` and
-- once through the subject's own `fused = false`, in float32 (1e-5 relative) and float64
-- (1e-12), on 1 and 2 threads (the fused path's bits the same on both), for eligible cases
-- (the fused path must run) and ineligible ones (shapes, options, replaced children: the
-- composed path must run, which the dispatcher's trace shows).
--
-- A new fused layer joins by adding a row to ROWS:
--   name     what the tests are called
--   build    function(dtype, case) -> the subject: a module (its parameters' gradients are
--            compared), an optimizer, or nil for a function; the generator is seeded before
--   inputs   function(dtype, case) -> forward's arguments; tensors that require grad are
--            leaves whose gradients are compared (seeded before, fresh on every run)
--   call     function(subject, args) -> a list of output tensors (default: {subject(args...)});
--            those that require grad are backpropagated with a probe per entry
--   who      what the trace reports for a function (its name); default the subject
--   cases    { {label, eligible = true|false, ...fields build/inputs read} }
-- The specialised specs of each path (hostile arguments, dropout streams with fixed seeds,
-- finite differences, instruction-set paths) stay in their own files.
local attn = require "attn"
local helper = require "helper"
local fused = require "attn.nn.fused"
local linear = require "attn.nn.linear"
local transformer = require "attn.nn.transformer"

local nn = attn.nn

local TOL = { float32 = 1e-5, float64 = 1e-12 }

local leaves, randomize = helper.leaves, helper.randomize

local function mode(m, case) if case.train then return m:train() end return m:eval() end

-- (B, T) ids in 1..V, fixed.
local function ids(B, T, V)
  local t = {}
  for b = 1, B do
    t[b] = {}
    for s = 1, T do t[b][s] = (b * 7 + s * 3) % V + 1 end
  end
  return attn.tensor(t, "int64")
end

-- Three parameters with N(0, 1) gradients, the last one strided (for the clipping rows).
local function grad_params(dtype)
  local ps = { attn.zeros({ 7, 5 }, dtype), attn.zeros({ 33 }, dtype), attn.zeros({ 4, 6 }, dtype) }
  for _, p in ipairs(ps) do p.grad = attn.randn(p:shape(), dtype) end
  ps[3].grad = attn.randn({ 6, 4 }, dtype):transpose(1, 2) -- strided
  return ps
end

-- Three optimizer steps over three parameters with fixed gradients; the parameters after.
local function optimizer_row(name, kind, opts)
  return {
    name = name,
    build = function(dtype)
      local ps = { attn.randn({ 5, 7 }, dtype), attn.randn({ 13 }, dtype), attn.randn({ 3, 2, 4 }, dtype) }
      return attn.optim[kind](ps, opts)
    end,
    inputs = function() return {} end,
    call = function(opt)
      for _ = 1, 3 do
        for _, p in ipairs(opt.params) do p.grad = attn.randn(p:shape(), p:dtype()) * 3 end
        opt:step()
      end
      return opt.params
    end,
    cases = { { "contiguous parameters", eligible = true } },
  }
end

-- A row for a recurrent layer, cls(5, 6, layers, opts), bidirectional or not: one state h0 (GRU)
-- or two, {h0, c0} (with_cell: LSTM), both given or both zero (case.zero_state).
local function recurrent_row(name, cls, with_cell, bidirectional, cases)
  local D = bidirectional and 2 or 1
  return {
    name = name,
    build = function(dtype, case)
      return mode(cls(5, 6, case.layers or 2, { bidirectional = bidirectional, batch_first = case.batch_first,
        bias = case.bias, dropout = case.dropout, dtype = dtype }), case)
    end,
    inputs = function(dtype, case)
      local state = { D * (case.layers or 2), 3, 6 }
      local x = case.batch_first and { 3, 7, 5 } or { 7, 3, 5 }
      local a = with_cell and leaves(dtype, x, state, state) or leaves(dtype, x, state)
      if case.zero_state then a[2], a[3] = nil, nil end
      return a
    end,
    call = function(m, a)
      if not with_cell then return { m(a[1], a[2]) } end
      local out, state = m(a[1], a[2] and { a[2], a[3] })
      return { out, state[1], state[2] }
    end,
    cases = cases,
  }
end

local ROWS = {
  recurrent_row("nn.GRU", nn.GRU, false, false, {
    { "eval, 2 layers, given h0", eligible = true },
    { "eval, 1 layer, zero h0", layers = 1, zero_state = true, eligible = true },
    { "eval, 3 layers without biases, zero h0", layers = 3, bias = false, zero_state = true, eligible = true },
    { "training, dropout 0", train = true, dropout = 0, eligible = true },
    { "training, dropout 1 (the kernel refuses it)", train = true, dropout = 1, eligible = false },
  }),
  recurrent_row("nn.GRU, bidirectional (the kernel per layer and direction)", nn.GRU, false, true, {
    { "eval, 2 layers, given h0", eligible = true },
    { "eval, 1 layer, batch_first, zero h0", layers = 1, batch_first = true, zero_state = true, eligible = true },
    { "eval, 2 layers without biases", bias = false, eligible = true },
    { "training, dropout 1", train = true, dropout = 1, eligible = false },
  }),
  {
    name = "nn.GRUCell",
    build = function(dtype, case) return nn.GRUCell(5, 6, { bias = case.bias, dtype = dtype }) end,
    inputs = function(dtype, case)
      local a = leaves(dtype, { 3, 5 }, { 3, 6 })
      if case.zero_h then a[2] = nil end
      return a
    end,
    call = function(m, a) return { m(a[1], a[2]) } end,
    cases = {
      { "given h", eligible = true },
      { "zero h, no biases", bias = false, zero_h = true, eligible = true },
    },
  },
  recurrent_row("nn.LSTM", nn.LSTM, true, false, {
    { "eval, 2 layers, given state", eligible = true },
    { "eval, 1 layer, zero state", layers = 1, zero_state = true, eligible = true },
    { "eval, 3 layers without biases, zero state", layers = 3, bias = false, zero_state = true, eligible = true },
    { "training, dropout 0", train = true, dropout = 0, eligible = true },
    { "training, dropout 1 (the kernel refuses it)", train = true, dropout = 1, eligible = false },
  }),
  recurrent_row("nn.LSTM, bidirectional (the kernel per layer and direction)", nn.LSTM, true, true, {
    { "eval, 2 layers, given state", eligible = true },
    { "eval, 1 layer, batch_first, zero state", layers = 1, batch_first = true, zero_state = true, eligible = true },
    { "eval, 2 layers without biases", bias = false, eligible = true },
    { "training, dropout 1", train = true, dropout = 1, eligible = false },
  }),
  {
    name = "nn.LSTMCell",
    build = function(dtype, case) return nn.LSTMCell(5, 6, { bias = case.bias, dtype = dtype }) end,
    inputs = function(dtype, case)
      local a = leaves(dtype, { 3, 5 }, { 3, 6 }, { 3, 6 })
      if case.zero_state then a[2], a[3] = nil, nil end
      return a
    end,
    call = function(m, a) return { m(a[1], a[2] and { a[2], a[3] }) } end,
    cases = {
      { "given state", eligible = true },
      { "zero state, no biases", bias = false, zero_state = true, eligible = true },
    },
  },
  {
    name = "nn.Seq2SeqAttentionDecoder",
    build = function(dtype, case)
      local m = nn.Seq2SeqAttentionDecoder(11, 4, 6, 2, 0, { scoring = case.scoring }):to(dtype)
      if case.rnn_fused ~= nil then m.rnn.fused = case.rnn_fused end
      return mode(m, case)
    end,
    inputs = function(dtype, case)
      local enc, h = table.unpack(leaves(dtype, { 3, 5, 6 }, { 2, 3, 6 }))
      return { ids(3, 4, 11), enc, h, case.lens and attn.tensor(case.lens, dtype) }
    end,
    call = function(m, a)
      local out, state = m(a[1], { a[2], a[3], a[4] })
      return { out, state[2] }
    end,
    cases = {
      { "eval, lengths per sample", lens = { 5, 1, 3 }, eligible = true },
      { "training, no lengths", train = true, eligible = true },
      { "lengths per query step (B, 1)", lens = { { 5 }, { 1 }, { 3 } }, eligible = false },
      { "dot scoring", scoring = "dot", lens = { 5, 1, 3 }, eligible = false },
      { "a GRU with fused = false", rnn_fused = false, lens = { 5, 1, 3 }, eligible = false },
    },
  },
  {
    name = "nn.ShowAttendTell (the captioning decoder's step loop)",
    build = function(dtype, case)
      local m = nn.ShowAttendTell { vocab_size = 9, feature_size = 6, num_cells = 5, embed_size = 4, num_hiddens = 7,
        attention_size = 5, rnn = case.rnn, attention = case.attention }
      if case.no_bias then m.rnn = nn.LSTMCell(10, 7, { bias = false }) end
      if case.rnn_fused ~= nil then m.rnn.fused = case.rnn_fused end
      return mode(m:to(dtype), case)
    end,
    inputs = function(dtype) return { leaves(dtype, { 3, 5, 6 })[1], ids(3, 4, 9) } end,
    call = function(m, a)
      local logits, alphas, betas = m(a[1], a[2])
      if alphas == nil then return { logits, betas } end
      return { logits, alphas, betas }
    end,
    cases = {
      { "LSTM with attention, training", train = true, eligible = true },
      { "an LSTM cell without biases, eval", no_bias = true, eligible = true },
      { "GRU", rnn = "gru", eligible = false },
      { "the baseline without attention", attention = false, eligible = false },
      { "an LSTMCell with fused = false", rnn_fused = false, eligible = false },
    },
  },
  {
    name = "nn.AdditiveAttention",
    build = function(dtype, case)
      local m = nn.AdditiveAttention { key_size = 3, query_size = 5, num_hiddens = 7, dropout = 0.3 }
      if case.replace then m.W_q = nn.Sequential(nn.Linear(5, 7, { bias = false })) end
      if case.bias then m.W_k = nn.Linear(3, 7) end
      return mode(m:to(dtype), case)
    end,
    inputs = function(dtype, case)
      local a = leaves(dtype, { 2, 4, 5 }, { 2, 6, 3 }, { 2, 6, 2 })
      a[4] = case.lens and attn.tensor(case.lens, dtype)
      return a
    end,
    call = function(m, a) return { m(a[1], a[2], a[3], a[4]), m.attention_weights } end,
    cases = {
      { "eval, lengths per sample", lens = { 6, 2 }, eligible = true },
      { "training with dropout, lengths per query", train = true, lens = { { 1, 2, 0, 6 }, { 3, 3, 9, 1 } },
        eligible = true },
      { "a replaced W_q (a Sequential)", replace = true, lens = { 6, 2 }, eligible = false },
      { "a W_k with a bias (the kernel has none)", bias = true, eligible = false },
    },
  },
  {
    name = "nn.MultiHeadAttention",
    build = function(dtype, case)
      local m = nn.MultiHeadAttention { key_size = 3, query_size = 5, value_size = 4, num_hiddens = 6, num_heads = 3,
        dropout = 0.25, bias = case.bias, rope = case.rope, num_kv_heads = case.kv }
      if case.replace then m.W_q = nn.Sequential(nn.Linear(5, 6)) end
      return mode(m:to(dtype), case)
    end,
    inputs = function(dtype, case)
      local a = leaves(dtype, { 2, 4, 5 }, { 2, 5, 3 }, { 2, 5, 4 })
      a[4] = case.lens and attn.tensor(case.lens, dtype)
      return a
    end,
    call = function(m, a, case)
      return { m(a[1], a[2], a[3], a[4], case.causal and { causal = true } or nil), m.attention_weights }
    end,
    cases = {
      { "eval, lengths per sample, biases", lens = { 3, 5 }, bias = true, eligible = true },
      { "training with dropout, causal", train = true, causal = true, eligible = true },
      { "a replaced W_q (a Sequential)", replace = true, lens = { 3, 5 }, eligible = false },
      { "rope (the node has none)", rope = true, lens = { 3, 5 }, eligible = false },
      { "one key/value head (num_kv_heads = 1)", kv = 1, train = true, causal = true, eligible = false },
    },
  },
  {
    name = "nn.LayerNorm",
    build = function(dtype, case)
      local m = nn.LayerNorm({ 3, 4 }, { dtype = dtype, elementwise_affine = case.affine })
      return randomize(m, 1)
    end,
    inputs = function(dtype) return { (attn.randn({ 5, 3, 4 }, dtype) * 3 + 1):requires_grad_() } end,
    cases = {
      { "affine", eligible = true },
      { "without affine parameters", affine = false, eligible = true },
    },
  },
  {
    name = "nn.RMSNorm",
    build = function(dtype, case)
      local m = nn.RMSNorm(4, { dtype = dtype, eps = case.eps, elementwise_affine = case.affine })
      return randomize(m, 1)
    end,
    inputs = function(dtype) return { (attn.randn({ 5, 3, 4 }, dtype) * 3 + 1):requires_grad_() } end,
    cases = {
      { "affine, eps 1e-5", eps = 1e-5, eligible = true },
      { "without a weight, the dtype's eps", affine = false, eligible = true },
    },
  },
  {
    name = "nn.AddNorm",
    build = function(dtype, case)
      local m = randomize(transformer.AddNorm(4, 0.2):to(dtype), 1)
      if case.replace then m.dropout = nn.Identity() end
      return mode(m, case)
    end,
    inputs = function(dtype, case) return leaves(dtype, { 2, 3, 4 }, case.y or { 2, 3, 4 }) end,
    cases = {
      { "eval", eligible = true },
      { "training with dropout", train = true, eligible = true },
      { "Y broadcast over the batch", y = { 1, 3, 4 }, eligible = false },
      { "a replaced dropout child", replace = true, train = true, eligible = false },
    },
  },
  {
    name = "nn.PositionWiseFFN",
    build = function(dtype, case)
      local m = transformer.PositionWiseFFN(4, 8, 5):to(dtype)
      if case.gelu then m.relu = nn.GELU() end
      return m
    end,
    inputs = function(dtype) return leaves(dtype, { 2, 3, 4 }) end,
    cases = {
      { "stock layers", eligible = true },
      { "a replaced activation", gelu = true, eligible = false },
    },
  },
  {
    name = "nn.cross_entropy",
    who = "cross_entropy",
    inputs = function(dtype, case)
      local x = (attn.randn({ 4, 6, 11 }, dtype) * 3):requires_grad_()
      return { x, ids(4, 6, 11):to(case.ids) }
    end,
    call = function(_, a) return { nn.cross_entropy(a[1], a[2]) } end,
    cases = { { "int64 ids", ids = "int64", eligible = true }, { "float64 ids", ids = "float64", eligible = true } },
  },
  {
    name = "masked cross-entropy (MaskedSoftmaxCELoss, masked_token_mean)",
    who = "masked_ce",
    inputs = function(dtype)
      local x = (attn.randn({ 5, 4, 9 }, dtype) * 2):requires_grad_()
      -- none, some, all, more than T, and negative valid steps
      return { x, ids(5, 4, 9), attn.tensor({ 0, 2, 4, 7, -1 }, "int64") }
    end,
    call = function(_, a, case)
      local mean, book, count = nn.masked_token_mean(a[1], a[2], a[3])
      return { nn.MaskedSoftmaxCELoss { label_smoothing = case.smoothing }(a[1], a[2], a[3]), mean, book,
        attn.tensor({ count }, "float64") }
    end,
    cases = { { "lengths", eligible = true }, { "lengths, label smoothing", smoothing = 0.15, eligible = true } },
  },
  {
    name = "linear.layer_norm",
    who = "layer_norm",
    inputs = function(dtype) return leaves(dtype, { 5, 3, 4 }, { 3, 4 }, { 3, 4 }) end,
    call = function(_, a) return { linear.layer_norm(a[1], 12, a[2], a[3], 1e-5) } end,
    cases = { { "two normalised dims", eligible = true } },
  },
  {
    name = "linear.add_layer_norm",
    who = "add_layer_norm",
    inputs = function(dtype) return leaves(dtype, { 4, 3, 8 }, { 4, 3, 8 }, { 8 }, { 8 }) end,
    call = function(_, a, case) return { linear.add_layer_norm(a[1], a[2], 0.3, case.train, 8, a[3], a[4], 1e-5) } end,
    cases = { { "eval", eligible = true }, { "training with dropout", train = true, eligible = true } },
  },
  {
    name = "attn.rope",
    who = "rope",
    inputs = function(dtype) return leaves(dtype, { 2, 3, 5, 8 }) end,
    call = function(_, a, case)
      local x = case.strided and a[1]:transpose(3, 4):reshape({ 2, 3, 8, 5 }):transpose(3, 4) or a[1]
      return { attn.rope(x, { interleaved = case.interleaved, positions = case.positions, base = case.base }) }
    end,
    cases = {
      { "positions 0..N-1", eligible = true },
      { "interleaved, per-sample positions, base 500", interleaved = true, base = 500,
        positions = { { 9, 3, 0, 70, 2 }, { 1, 2, 3, 4, 5 } }, eligible = true },
      { "a strided x, positions past the cached tables", strided = true, positions = { 4000, 1, 2, 3, 65 },
        eligible = true },
    },
  },
  {
    name = "linear.linear_relu",
    who = "linear_relu",
    inputs = function(dtype) return leaves(dtype, { 2, 5, 4 }, { 6, 4 }, { 6 }) end,
    call = function(_, a) return { linear.linear_relu(a[1], a[2], a[3]) } end,
    cases = { { "with bias", eligible = true } },
  },
  {
    name = "nn.clip_grad_norm_",
    who = "clip_grad_norm_",
    inputs = grad_params,
    call = function(_, ps, case)
      local norm = nn.clip_grad_norm_(ps, 1, case.norm_type)
      return { attn.tensor({ norm }, "float64"), ps[1].grad, ps[2].grad, ps[3].grad }
    end,
    cases = {
      { "norm above max_norm", eligible = true },
      { "norm_type 1", norm_type = 1, eligible = true },
      { "norm_type inf", norm_type = math.huge, eligible = true },
    },
  },
  {
    name = "nn.clip_grad_value_",
    who = "clip_grad_value_",
    inputs = grad_params,
    call = function(_, ps)
      nn.clip_grad_value_(ps, 0.75)
      return { ps[1].grad, ps[2].grad, ps[3].grad }
    end,
    cases = { { "entries on both sides of the clip value", eligible = true } },
  },
  {
    name = "nn.CrossEntropyLoss with weight and ignore_index",
    who = "cross_entropy_loss",
    inputs = function(dtype, case)
      local x = (attn.randn({ 4, 11, 6 }, dtype) * 3):requires_grad_() -- PyTorch's (N, C, d)
      if case.class_dim == -1 then x = (attn.randn({ 4, 6, 11 }, dtype) * 3):requires_grad_() end
      local t = ids(4, 6, 11):totable()
      t[1][2], t[3][5], t[4][1] = -100, -100, -100 -- ignored rows (ignore_index's default)
      return { x, attn.tensor(t, "int64"), attn.rand({ 11 }, dtype) + 0.5 }
    end,
    call = function(_, a, case)
      return { nn.CrossEntropyLoss { weight = not case.unweighted and a[3] or nil, reduction = case.reduction,
        label_smoothing = case.smoothing, class_dim = case.class_dim }(a[1], a[2]) }
    end,
    cases = {
      { "mean, (N, C, d)", eligible = true },
      { "none, class-last", reduction = "none", class_dim = -1, eligible = true },
      { "label smoothing and ignore_index, no weight", smoothing = 0.1, unweighted = true, eligible = true },
      { "label smoothing with weights (composed only)", smoothing = 0.1, eligible = false },
    },
  },
  optimizer_row("optim.Adam", "Adam", { lr = 3e-2, betas = { 0.8, 0.99 }, eps = 1e-6, weight_decay = 0.1 }),
  optimizer_row("optim.AdamW", "AdamW", { lr = 5e-2, weight_decay = 0.3 }),
  optimizer_row("optim.SGD", "SGD", { lr = 0.05, momentum = 0.8, nesterov = true, weight_decay = 0.02 }),
  optimizer_row("optim.Adam, amsgrad and maximize", "Adam", { lr = 3e-2, betas = { 0.8, 0.99 }, eps = 1e-6,
    weight_decay = 0.1, amsgrad = true, maximize = true }),
  optimizer_row("optim.AdamW, amsgrad and maximize", "AdamW", { lr = 5e-2, weight_decay = 0.3, amsgrad = true,
    maximize = true }),
  optimizer_row("optim.SGD, maximize", "SGD", { lr = 0.05, momentum = 0.8, nesterov = true, weight_decay = 0.02,
    maximize = true }),
}

-- One run of a row's case: "on" (fused paths on), "off" (attn.nn.set_fused(false)) or
-- "option" (the subject's fused = false). Returns the named result tensors (outputs, then
-- gradients of the inputs and of a module's parameters) and the paths the trace reported
-- for the subject.
local function run(row, case, dtype, how)
  attn.manual_seed(1)
  local subject = row.build and row.build(dtype, case)
  attn.manual_seed(2)
  local args = row.inputs(dtype, case)
  if how == "option" then subject.fused = false end
  local who = row.who or subject
  local paths = {}
  local previous = fused.set_trace(function(w, path)
    if rawequal(w, who) then paths[#paths + 1] = path end
  end)
  if how == "off" then nn.set_fused(false) end
  attn.manual_seed(3) -- the dropout seeds either path draws
  local ok, outs = pcall(row.call or function(m, a) return { m(table.unpack(a)) } end, subject, args, case)
  nn.set_fused(true)
  fused.set_trace(previous)
  assert(ok, outs)
  local results, loss = {}, nil
  for i, o in ipairs(outs) do
    results[#results + 1] = { "output " .. i, o:detach() }
    if o.requires_grad then
      -- every entry weighted differently, so no gradient hides behind a sum
      local probe = attn.arange(1, o:numel() + 1, 1, o:dtype()):reshape(o:shape()):sin() * i
      local term = (o * probe):sum()
      loss = loss and loss + term or term
    end
  end
  if loss then loss:backward() end
  for i, a in ipairs(args) do
    if attn.is_tensor(a) and a.requires_grad then results[#results + 1] = { "input " .. i, a.grad } end
  end
  if nn.is_module(subject) then
    for _, e in ipairs(subject:named_parameters()) do results[#results + 1] = { e[1], e[2].grad } end
  end
  return results, paths
end

-- a against b, entry by entry: the same names, every gradient present, within tol relative
-- to each tensor's largest entry (gradients sum in other orders and small entries cancel).
local function assert_near(a, b, tol, what)
  assert.are.equal(#b, #a, what .. ": result count")
  for i, e in ipairs(b) do
    assert.are.equal(e[1], a[i][1], what)
    assert(e[2] ~= nil and a[i][2] ~= nil, what .. ": no gradient for " .. e[1])
    local scale = e[2]:numel() > 0 and e[2]:abs():max():item() or 0
    local ok, msg = helper.compare(a[i][2], e[2], { atol = tol * scale + 1e-30, rtol = tol })
    assert(ok, what .. ", " .. e[1] .. ": " .. tostring(msg))
  end
end

describe("fused and composed paths (attn.nn.fused)", function()
  local threads_before
  before_each(function() threads_before = attn.get_num_threads() end)
  after_each(function()
    attn.set_num_threads(threads_before)
    nn.set_fused(true)
  end)

  for _, row in ipairs(ROWS) do
    for _, case in ipairs(row.cases) do
      for _, dtype in ipairs({ "float32", "float64" }) do
        local label = string.format("%s, %s (%s, %s)", row.name, case[1], case.eligible and "fused" or "composed",
          dtype)
        it(label, function()
          local first
          for _, threads in ipairs({ 1, 2 }) do
            attn.set_num_threads(threads)
            local on, on_paths = run(row, case, dtype, "on")
            assert.are.equal(case.eligible and "fused" or "composed", on_paths[1], "path taken with fused paths on")
            local off, off_paths = run(row, case, dtype, "off")
            assert.are.equal("composed", off_paths[1], "path taken under set_fused(false)")
            for _, p in ipairs(off_paths) do assert.are.equal("composed", p) end
            assert_near(on, off, TOL[dtype], threads .. " thread(s), set_fused(false)")
            if row.who == nil then -- a module or optimizer: its own option
              local opt, opt_paths = run(row, case, dtype, "option")
              assert.are.equal("composed", opt_paths[1], "path taken with fused = false")
              assert_near(on, opt, TOL[dtype], threads .. " thread(s), fused = false")
            end
            if first == nil then
              first = on
            else -- the same bits on 1 and 2 threads
              for i, e in ipairs(first) do helper.assert_identical(on[i][2], e[2]) end
            end
          end
        end)
      end
    end
  end
end)

describe("attn.nn.set_fused", function()
  after_each(function() nn.set_fused(true) end)

  it("turns every fused path of a training step off at once, and back on", function()
    attn.manual_seed(4)
    local enc = nn.Seq2SeqEncoder(11, 4, 6, 2, 0.1)
    local dec = nn.Seq2SeqAttentionDecoder(11, 4, 6, 2, 0.1)
    local net = nn.EncoderDecoder(enc, dec)
    local block = nn.TransformerEncoderBlock(6, 6, 6, 6, 6, 6, 12, 2, 0.1)
    local params = net:parameters()
    for _, p in ipairs(block:parameters()) do params[#params + 1] = p end
    local opt = attn.optim.Adam(params, { lr = 1e-3 })
    local X, Y = ids(3, 5, 11), ids(3, 4, 11)
    local function step()
      local paths = { fused = 0, composed = 0 }
      local previous = fused.set_trace(function(_, path) paths[path] = paths[path] + 1 end)
      local out = net(X, Y, { 5, 3, 4 })
      local h = block(attn.randn({ 3, 5, 6 }), attn.tensor({ 5, 3, 4 }))
      local l = nn.MaskedSoftmaxCELoss()(out, Y, { 4, 2, 3 }):sum() + h:sum()
      l:backward()
      nn.clip_grad_norm_(params, 1)
      opt:step()
      opt:zero_grad()
      fused.set_trace(previous)
      return paths
    end
    assert.is_true(nn.fused_enabled())
    local on = step()
    assert.is_true(on.fused >= 8, "fused choices with the switch on: " .. on.fused)
    assert.are.equal(true, nn.set_fused(false))
    assert.is_false(nn.fused_enabled())
    local off = step()
    assert.are.equal(0, off.fused)
    assert.is_true(off.composed >= on.fused)
    assert.are.equal(false, nn.set_fused(true))
    assert.is_true(step().fused >= 8)
  end)

  it("refuses anything but a boolean", function()
    assert.has_error(function() nn.set_fused(0) end, "set_fused: expected a boolean, got a number")
    assert.has_error(function() nn.set_fused() end, "set_fused: expected a boolean, got a nil")
    assert.is_true(nn.fused_enabled())
  end)

  it("keeps the old *_reference names as aliases of the *_composed paths", function()
    local loss, clip = require "attn.nn.loss", require "attn.nn.clip"
    assert.are.equal(linear.layer_norm_composed, linear.layer_norm_reference)
    assert.are.equal(loss.cross_entropy_composed, loss.cross_entropy_reference)
    assert.are.equal(loss.masked_ce_composed, loss.masked_ce_reference)
    assert.are.equal(clip.clip_grad_norm_composed, clip.clip_grad_norm_reference)
  end)
end)
