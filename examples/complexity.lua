-- Comparing CNNs, RNNs and self-attention (d2l "Self-Attention and Positional
-- Encoding"): the measured forward time of a self-attention layer, a GRU layer
-- and a 1-D convolution (built from tensor ops: shifted slices and one matmul)
-- as the sequence grows, beside the chapter's cost table O(n^2 d), O(n d^2),
-- O(k n d^2). Each layer's cost model is fitted by one constant (least squares
-- over all lengths), and the measured growth exponent is reported.
local attn = require "attn"
local cli = require "attn.d2l.cli"
local plot = require "attn.plot"
local report = require "attn.d2l.report"
local nn = attn.nn

local opts = cli.start(arg, {
  name = "complexity",
  description = "Measured time of self-attention, GRU and convolution layers against sequence length.",
  options = {
    { "width", "integer", 64, "feature width d" },
    { "kernel", "integer", 3, "convolution kernel size k" },
    { "max_len", "integer", 2048, "longest sequence" },
  },
})
local out = opts.out
attn.set_num_threads(1) -- a single thread shows the cost of the work itself
local d, k = opts.width, opts.kernel
local max_len = opts.smoke and 128 or opts.max_len
local clock = attn.core.clock

local attention = nn.MultiHeadAttention { key_size = d, query_size = d, value_size = d, num_hiddens = d, num_heads = 4,
  dropout = 0 }
attention:eval()
local gru = nn.GRU(d, d)
gru:eval()
local conv_weight = attn.randn({ k * d, d }) * (1 / math.sqrt(k * d))

-- A 'same' 1-D convolution: pad k-1 zero rows, lay the k shifted copies side by
-- side (n, k*d), and multiply by the (k*d, d) kernel: O(k n d^2).
local function conv1d(X) -- X (n, d)
  local n = X:size(1)
  local padded = attn.cat({ attn.zeros({ k - 1, d }), X }, 1)
  local cols = {}
  for s = 1, k do cols[s] = padded:narrow(1, s, n) end
  return attn.cat(cols, 2):matmul(conv_weight)
end

local layers = {
  { name = "self-attention", cost = function(n) return n * n * d end, model = "O(n^2 d)",
    run = function(X) return attention(X, X, X) end, input = function(n) return attn.randn({ 1, n, d }) end },
  { name = "GRU", cost = function(n) return n * d * d end, model = "O(n d^2)",
    run = function(X) return gru(X) end, input = function(n) return attn.randn({ n, 1, d }) end },
  { name = "convolution", cost = function(n) return k * n * d * d end, model = "O(k n d^2)",
    run = conv1d, input = function(n) return attn.randn({ n, d }) end },
}

local function time_it(fn)
  fn()
  local reps, t0 = 0, clock()
  repeat
    fn()
    reps = reps + 1
  until clock() - t0 >= (opts.smoke and 0.01 or 0.2)
  return (clock() - t0) / reps
end

local lengths = {}
local n = 16
while n <= max_len do
  lengths[#lengths + 1] = n
  n = n * 2
end

local rows, measured = {}, {}
attn.no_grad(function()
  for li, layer in ipairs(layers) do
    measured[li] = {}
    for i, len in ipairs(lengths) do
      local X = layer.input(len)
      measured[li][i] = time_it(function() return layer.run(X) end) * 1e3
    end
  end
end)

local header = { "n" }
for _, layer in ipairs(layers) do header[#header + 1] = layer.name .. " (ms)" end
for i, len in ipairs(lengths) do
  local row = { tostring(len) }
  for li = 1, #layers do row[#row + 1] = string.format("%.3f", measured[li][i]) end
  rows[#rows + 1] = row
end
local lines = { table.concat(header, "  ") }
for _, row in ipairs(rows) do lines[#lines + 1] = table.concat(row, "  ") end

-- Fit time = c * cost(n) per layer, and the growth exponent over the last doubling.
local series, names, xs = {}, {}, attn.tensor(lengths, "float64")
local summary = {}
for li, layer in ipairs(layers) do
  local num, den = 0, 0
  for i, len in ipairs(lengths) do
    local c = layer.cost(len)
    num, den = num + c * measured[li][i], den + c * c
  end
  local scale = num / den
  local fitted = {}
  for i, len in ipairs(lengths) do fitted[i] = scale * layer.cost(len) end
  local m = #lengths
  local exponent = math.log(measured[li][m] / measured[li][m - 1], 2)
  summary[#summary + 1] = string.format("%-15s cost model %-10s growth from n=%d to n=%d: n^%.2f", layer.name,
    layer.model, lengths[m - 1], lengths[m], exponent)
  series[#series + 1] = attn.tensor(measured[li], "float64")
  names[#names + 1] = layer.name .. " (measured)"
  series[#series + 1] = attn.tensor(fitted, "float64")
  names[#names + 1] = layer.name .. " " .. layer.model .. " fit"
end
local text = table.concat(lines, "\n") .. "\n\n" .. table.concat(summary, "\n")
print(text)

local r = report.new("Comparing CNNs, RNNs and self-attention")
r:paragraph(string.format("Forward time of one layer, width d = %d, kernel k = %d, one thread, batch 1. The chapter's " ..
  "table: self-attention costs O(n^2 d) with O(1) sequential steps; an RNN O(n d^2) with O(n) sequential steps; a " ..
  "CNN O(k n d^2) with O(1). At small n the quadratic term is hidden by the fixed costs; it dominates as n grows.", d, k))
r:pre(text)
assert(r:plot("time per forward pass against sequence length, with each cost model fitted by one constant",
  out .. "/complexity.png", plot.lines, xs, series,
  { legend = names, xlabel = "sequence length n", ylabel = "ms per forward", title = "Layer cost vs length (log-log)",
    xscale = "log", yscale = "log" }))
assert(r:write(out .. "/report.html"))
print("wrote " .. out .. "/complexity.png and " .. out .. "/report.html")
