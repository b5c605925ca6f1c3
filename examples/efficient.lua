-- The efficient-attention family (d2l's closing note on "the many new self-attention
-- mechanisms", issue 21), measured: what each mechanism costs as the sequence grows, and what a
-- small model built on it can learn.
--
-- 1. Cost: forward + backward time and extra memory (attn.core.peak_memory beyond what was live
--    before the call: activations, saved state, gradients) of one causal attention head
--    (B 1, d 64) for N = 512 ... 65536: full softmax attention, a sliding window of r = 128
--    (attn.dot_product_attention's `window`), linear attention and Performer (m = 64),
--    Linformer (k = 64, not causal) and Nystromformer (m = 64 landmarks, not causal); a
--    mechanism stops once one call takes longer than the budget. A log-log plot and the growth
--    exponent fitted from N = 4096 on.
-- 2. Learning: two synthetic long-range tasks generated here: multi-query associative recall
--    (Arora et al. 2023, "Zoology": key-value pairs, then keys to recall) and copy (a random
--    string, a separator, then the string again). The same 2-layer causal pre-norm Transformer
--    (d 64, 4 heads) and budget per mechanism, switched by one option (TransformerEncoderBlock's
--    `attention`); accuracy on the predicted tokens and learning curves. Nystromformer cannot be
--    causal: it learns the same recall task (no later input holds an answer) and a copy whose
--    second half is separators (the label at S + i is symbol i, as in the causal copy), so no
--    answer is visible to its bidirectional attention.
--
-- Ends with one line per mechanism:
--   efficient: linear | N 4096 fwd+bwd 12.3 ms | extra 3.1 MiB | recall accuracy 0.41
local attn = require "attn"
local cli = require "attn.d2l.cli"
local plot = require "attn.plot"
local report = require "attn.d2l.report"
local nn = attn.nn

local opts = cli.start(arg, {
  name = "efficient",
  description = "Cost against length and accuracy on long-range tasks of efficient attention mechanisms.",
  options = {
    { "max_len", "integer", 65536, "longest sequence of the cost part" },
    { "budget", "number", 4, "seconds one call may take before a mechanism stops growing N" },
    { "steps", "integer", 400, "training steps per mechanism and task" },
  },
})
local out = opts.out
local smoke = opts.smoke
local clock = attn.core.clock
local d, r, m, kproj = 64, 128, 64, 64

-- ------------------------------------------------------------------ 1. cost against length

local mechanisms = {
  { name = "full", run = function(q, k, v)
    return (attn.dot_product_attention(q, k, v, { causal = true, need_weights = false }))
  end },
  { name = "window", run = function(q, k, v)
    return (attn.dot_product_attention(q, k, v, { causal = true, window = r, need_weights = false }))
  end },
  { name = "linear", run = function(q, k, v) return attn.linear_attention(q, k, v, { causal = true }) end },
  { name = "performer", run = function(q, k, v, c)
    return attn.performer_attention(q, k, v, { causal = true, features = c.W })
  end },
  { name = "linformer", run = function(q, k, v, c)
    return (attn.dot_product_attention(q, c.E:matmul(k), c.E:matmul(v), { need_weights = false }))
  end },
  { name = "nystrom", run = function(q, k, v) return attn.nystrom_attention(q, k, v, { landmarks = m }) end },
}

local lengths = {}
local n = smoke and 256 or 512
while n <= (smoke and 2048 or opts.max_len) do
  lengths[#lengths + 1] = n
  n = n * 2
end

-- fwd+bwd seconds and extra bytes of one call (the best of a few runs for the time)
local function measure(mech, N)
  local q, k, v = attn.randn({ 1, N, d }), attn.randn({ 1, N, d }), attn.randn({ 1, N, d })
  local g = attn.randn({ 1, N, d })
  local ctx = { W = attn.performer_features(m, d, { seed = 1 }),
    E = attn.randn({ math.min(kproj, N), N }) * (1 / math.sqrt(N)) }
  for _, t in ipairs { q, k, v } do t:requires_grad_() end
  local best, extra = math.huge, 0
  for rep = 1, 2 do
    q.grad, k.grad, v.grad = nil, nil, nil
    collectgarbage()
    collectgarbage()
    local live = attn.memory()
    attn.core.peak_memory(true)
    local t0 = clock()
    mech.run(q, k, v, ctx):backward(g)
    local t = clock() - t0
    best = math.min(best, t)
    extra = math.max(extra, attn.core.peak_memory() - live)
    if t > opts.budget / 2 and rep == 1 then break end
  end
  return best, extra
end

local ms, mib = {}, {}
for mi, mech in ipairs(mechanisms) do
  ms[mi], mib[mi] = {}, {}
  local stopped = false
  for i, N in ipairs(lengths) do
    if stopped then
      ms[mi][i], mib[mi][i] = 0 / 0, 0 / 0
    else
      local t, bytes = measure(mech, N)
      ms[mi][i], mib[mi][i] = t * 1e3, bytes / 2 ^ 20
      stopped = t > opts.budget / 4 and i < #lengths -- the next doubling would take >= 4x as long
    end
  end
end

-- growth exponent: least-squares slope of log time against log N over the measured N >= 4096
-- (all lengths in a smoke run)
local function exponent(mi)
  local xs, ys = {}, {}
  for i, N in ipairs(lengths) do
    if ms[mi][i] == ms[mi][i] and (smoke or N >= 4096) then
      xs[#xs + 1], ys[#ys + 1] = math.log(N), math.log(ms[mi][i])
    end
  end
  if #xs < 2 then return 0 / 0 end
  local mx, my = 0, 0
  for i = 1, #xs do mx, my = mx + xs[i] / #xs, my + ys[i] / #xs end
  local num, den = 0, 0
  for i = 1, #xs do num, den = num + (xs[i] - mx) * (ys[i] - my), den + (xs[i] - mx) ^ 2 end
  return num / den
end

local cost_lines = { string.format("%-8s %s", "N", table.concat((function()
  local h = {}
  for _, mech in ipairs(mechanisms) do h[#h + 1] = string.format("%22s", mech.name .. " ms / MiB") end
  return h
end)(), "")) }
for i, N in ipairs(lengths) do
  local cells = {}
  for mi = 1, #mechanisms do
    cells[mi] = ms[mi][i] == ms[mi][i] and string.format("%13.1f / %6.1f", ms[mi][i], mib[mi][i]) or string.format("%22s", "-")
  end
  cost_lines[#cost_lines + 1] = string.format("%-8d %s", N, table.concat(cells, ""))
end
local growth = {}
for mi, mech in ipairs(mechanisms) do growth[mi] = string.format("%s N^%.2f", mech.name, exponent(mi)) end
cost_lines[#cost_lines + 1] = "fitted growth of fwd+bwd time" .. (smoke and "" or " from N 4096") .. ": " ..
  table.concat(growth, ", ")
print(table.concat(cost_lines, "\n"))

-- ------------------------------------------------------------------ 2. what they can learn

attn.manual_seed(7)
local task_len = smoke and 24 or 64

-- Multi-query associative recall: P pairs (key, value) then P queried keys in random order;
-- tokens 1..K keys, K+1..2K values; the label at a queried key's position is its value.
local K = 32
local function recall_batch(B)
  local P = task_len // 4
  local x, y = {}, {}
  for b = 1, B do
    local keys, xs, ys = {}, {}, {}
    local pool = {}
    for t = 1, K do pool[t] = t end
    for i = 1, P do -- distinct keys
      local j = math.random(i, K)
      pool[i], pool[j] = pool[j], pool[i]
      keys[i] = { pool[i], K + math.random(1, K) }
    end
    for i = 1, P do
      xs[#xs + 1], ys[#ys + 1] = keys[i][1], -100
      xs[#xs + 1], ys[#ys + 1] = keys[i][2], -100
    end
    for i = P, 2, -1 do
      local j = math.random(1, i)
      keys[i], keys[j] = keys[j], keys[i]
    end
    for i = 1, P do
      xs[#xs + 1], ys[#ys + 1] = keys[i][1], keys[i][2]
      xs[#xs + 1], ys[#ys + 1] = 2 * K + 1, -100 -- a pad after each query keeps the length 4P
    end
    x[b], y[b] = xs, ys
  end
  return attn.tensor(x, "int64"), attn.tensor(y, "int64")
end

-- Copy: S random symbols 1..K, the separator 2K+1, then the symbols again (labels: the next one).
-- For a bidirectional mechanism the second half is separators only (the label at S + i is s[i]):
-- the same targets at the same distances, none of them among the inputs after it.
local function copy_batch(B, bidirectional)
  local S = task_len // 2
  local x, y = {}, {}
  for b = 1, B do
    local s, xs, ys = {}, {}, {}
    for i = 1, S do s[i] = math.random(1, K) end
    for i = 1, S do xs[i], ys[i] = s[i], -100 end
    xs[S + 1], ys[S + 1] = 2 * K + 1, s[1]
    for i = 1, S - 1 do
      xs[S + 1 + i], ys[S + 1 + i] = bidirectional and 2 * K + 1 or s[i], s[i + 1]
    end
    x[b], y[b] = xs, ys
  end
  return attn.tensor(x, "int64"), attn.tensor(y, "int64")
end

local vocab, width, heads = 2 * K + 2, 64, 4
local Model = nn.Module:extend("EfficientModel")
function Model:init(spec)
  self.embed = nn.Embedding(vocab, width)
  self.pos = nn.LearnedPositionalEncoding(width, task_len, 0)
  self.blocks = nn.ModuleList()
  for _ = 1, 2 do
    self.blocks:append(nn.TransformerEncoderBlock(width, width, width, width, { width }, width, 2 * width, heads, 0,
      false, { norm_first = true, attention = spec }))
  end
  self.head = nn.Linear(width, vocab)
end
function Model:forward(x)
  local h = self.pos(self.embed(x))
  for _, blk in ipairs(self.blocks) do h = blk(h) end
  return self.head(h)
end

local task_window = smoke and 4 or 8
local learners = {
  { name = "full", spec = { "full", causal = true } },
  { name = "window", spec = { "window", window = task_window, causal = true } },
  { name = "linear", spec = { "linear", causal = true } },
  { name = "performer", spec = { "performer", num_features = 64, causal = true } },
  { name = "nystrom", spec = { "nystrom", landmarks = 8 }, bidirectional = true }, -- segments of task_len / 8
}
local tasks = { { name = "recall", batch = recall_batch }, { name = "copy", batch = copy_batch } }
local steps = smoke and 15 or opts.steps
local loss_fn = nn.CrossEntropyLoss { ignore_index = -100, class_dim = -1 }

local function accuracy(model, batch, bidirectional)
  return attn.no_grad(function()
    local x, y = batch(256, bidirectional)
    local pred = model(x):argmax(3)
    local keep = y:ne(-100)
    return (pred:eq(y):to("float64") * keep:to("float64")):sum():item() / keep:to("float64"):sum():item()
  end)
end

local acc, curves = {}, {}
for _, task in ipairs(tasks) do
  acc[task.name], curves[task.name] = {}, {}
  for li, l in ipairs(learners) do
    attn.manual_seed(100 + li)
    local model = Model(l.spec)
    local opt = attn.optim.Adam { params = model:parameters(), lr = 3e-3 }
    local curve = {}
    for step = 1, steps do
      local x, y = task.batch(32, l.bidirectional)
      local loss = loss_fn(model(x), y)
      opt:zero_grad()
      loss:backward()
      opt:step()
      if step % math.max(1, steps // 20) == 0 then curve[#curve + 1] = loss:item() end
    end
    model:eval()
    acc[task.name][li] = accuracy(model, task.batch, l.bidirectional)
    curves[task.name][li] = curve
  end
end

local acc_lines = { string.format("%-10s %8s %8s   (length %d, window %d, %d steps of batch 32)", "mechanism", "recall",
  "copy", task_len, task_window, steps) }
for li, l in ipairs(learners) do
  acc_lines[#acc_lines + 1] = string.format("%-10s %8.3f %8.3f%s", l.name, acc.recall[li], acc.copy[li],
    l.bidirectional and "   (bidirectional; copy without the symbols after the separator)" or "")
end
print(table.concat(acc_lines, "\n"))

-- the summary lines: cost at N 4096 (the longest measured in a smoke run), accuracy on recall
local at = #lengths
for i, N in ipairs(lengths) do
  if N == 4096 then at = i end
end
for mi, mech in ipairs(mechanisms) do
  local li
  for j, l in ipairs(learners) do
    if l.name == mech.name then li = j end
  end
  local t = ms[mi][at] == ms[mi][at] and string.format("%.1f ms", ms[mi][at]) or "too slow"
  local e = mib[mi][at] == mib[mi][at] and string.format("%.1f MiB", mib[mi][at]) or "-"
  print(string.format("efficient: %s | N %d fwd+bwd %s | extra %s | recall accuracy %s", mech.name, lengths[at], t, e,
    li and string.format("%.2f%s", acc.recall[li], learners[li].bidirectional and " (bidirectional)" or "")
      or "n/a (not causal)"))
end

-- ------------------------------------------------------------------ report and plots

local rep = report.new("The efficient-attention family")
rep:paragraph(string.format("One causal head, batch 1, d = %d, forward + backward; window r = %d, Performer m = %d, " ..
  "Linformer k = %d and Nystromformer with %d landmarks (both not causal). Extra memory is the allocator's peak " ..
  "beyond what was live before the call (outputs and gradients included). A mechanism stops once a call takes " ..
  "longer than %.1f s / 4.", d, r, m, kproj, m, opts.budget))
rep:pre(table.concat(cost_lines, "\n"))
local xs = attn.tensor(lengths, "float64")
local series, names = {}, {}
for mi, mech in ipairs(mechanisms) do
  series[mi], names[mi] = attn.tensor(ms[mi], "float64"), mech.name
end
assert(rep:plot("forward + backward time against length (log-log)", out .. "/efficient_time.png", plot.lines, xs,
  series, { legend = names, xlabel = "sequence length N", ylabel = "ms", xscale = "log", yscale = "log", markers = true }))
local mem = {}
for mi = 1, #mechanisms do mem[mi] = attn.tensor(mib[mi], "float64") end
assert(rep:plot("extra memory against length (log-log)", out .. "/efficient_memory.png", plot.lines, xs, mem,
  { legend = names, xlabel = "sequence length N", ylabel = "MiB", xscale = "log", yscale = "log", markers = true }))
rep:pre(table.concat(acc_lines, "\n"))
for _, task in ipairs(tasks) do
  local lnames = {}
  for li, l in ipairs(learners) do lnames[li] = l.name end
  assert(rep:plot(task.name .. ": training loss", out .. "/efficient_" .. task.name .. ".png", plot.lines, nil,
    curves[task.name], { legend = lnames, xlabel = "step / " .. math.max(1, steps // 20), ylabel = "loss" }))
end
assert(rep:write(out .. "/report.html"))
print("wrote " .. out .. "/report.html")
