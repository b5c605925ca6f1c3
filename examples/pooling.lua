-- Attention pooling: f(q) = sum_i softmax(a(q, k_i)) v_i on d2l's
-- Nadaraya-Watson regression task (data the script generates), first with the
-- fixed Gaussian kernel, then with a learnable width trained by autograd, and a
-- heatmap of the attention weights.
local attn = require "attn"
local plot = require "attn.plot"

local smoke = os.getenv("ATTN_SMOKE") == "1"
attn.manual_seed(0)

local n_train = 50
local function f(x) return 2 * x:sin() + x ^ 0.8 end

-- Training keys: sorted uniform points on [0, 5); values with noise.
local x_train = (attn.rand({ n_train }, "float64") * 5)
do -- sort ascending with a Lua sort (the engine has no sort op yet)
  local t = x_train:totable()
  table.sort(t)
  x_train = attn.tensor(t, "float64")
end
local y_train = f(x_train) + attn.randn({ n_train }, "float64") * 0.5
local x_test = attn.arange(0, 5, 0.1, "float64")
local y_truth = f(x_test)
local n_test = x_test:numel()

-- Attention weights of every test query over every training key: (n_test, n_train).
local function weights(w)
  local diff = x_test:unsqueeze(2) - x_train:unsqueeze(1)
  local scaled = w and diff * w or diff
  return (-(scaled ^ 2) / 2):softmax(2)
end

local function mse(pred) return ((pred - y_truth) ^ 2):mean():item() end

local w0 = weights()
local pred0 = w0:matmul(y_train)
print(string.format("attn %s demo: attention pooling on %d noisy samples of y = 2 sin(x) + x^0.8",
  attn._VERSION, n_train))
print(string.format("nonparametric (Gaussian kernel, width 1): test MSE %.4f", mse(pred0)))

-- Parametric pooling: the kernel width w is learned, keys/values are the training
-- set with each query's own sample left out (as the book does).
local w = attn.tensor({ 1.0 }, { dtype = "float64", requires_grad = true })
local eye = attn.eye(n_train, "float64")
local keys = x_train:unsqueeze(1):expand(n_train, n_train)
local values = y_train:unsqueeze(1):expand(n_train, n_train)
local keep = 1 - eye -- leave-one-out keep-mask
local lr = 0.5
local epochs = smoke and 5 or 60
for epoch = 1, epochs do
  local scores = -(((x_train:unsqueeze(2) - keys) * w) ^ 2) / 2
  local att = scores:masked_fill(eye, -1e9):softmax(2) * keep
  local pred = (att * values):sum(2)
  local loss = ((pred - y_train) ^ 2):sum() / 2
  loss:backward()
  attn.no_grad(function() w:sub_(w.grad * (lr / n_train)) end)
  w:zero_grad()
  if epoch % 10 == 0 or epoch == 1 or epoch == epochs then
    print(string.format("epoch %3d  loss %.4f  w %.3f", epoch, loss:item(), w:item()))
  end
end

local w1 = attn.no_grad(weights, w:detach())
print(string.format("parametric (learned width %.3f): test MSE %.4f", w:item(), mse(w1:matmul(y_train))))

-- Heatmaps: every fifth test query (rows) over the sorted training keys
-- (columns), darker = more weight; in the terminal and as out/pooling/attention.png.
local rows, row_labels = {}, {}
for i = 1, n_test, 5 do
  rows[#rows + 1] = i
  row_labels[#row_labels + 1] = string.format("x=%.1f", x_test:get(i))
end
local shown = { w0:index_select(1, rows), w1:index_select(1, rows) }
print("attention weights, Gaussian kernel (query rows, sorted training keys as columns):")
print(plot.terminal_heatmap(shown[1], { row_labels = row_labels, cell_width = 1, vmin = 0 }))
print("attention weights, learned kernel (sharper: a smaller neighbourhood per query):")
print(plot.terminal_heatmap(shown[2], { row_labels = row_labels, cell_width = 1, vmin = 0 }))
assert(require("attn.d2l.cli").mkdir("out/pooling"))
local png = assert(plot.heatmaps(attn.stack({ w0, w1 }):unsqueeze(1), { path = "out/pooling/attention.png",
  xlabel = "Sorted training inputs", ylabel = "Testing inputs", titles = { "Gaussian kernel", "Learned width" } }))
print("wrote " .. png)
