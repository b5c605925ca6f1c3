-- A small self-attention model learns to reverse token sequences (data this
-- script generates), end to end: nn layers, Adam, the progress display, a
-- safetensors checkpoint reloaded into a fresh model, and per-head heatmaps of
-- the attention weights (the anti-diagonal is the reversal).
-- Usage: lua5.4 examples/reverse_task.lua [steps]   (writes out/reverser.safetensors)
local attn = require "attn"
local plot = require "attn.plot"
local nn = attn.nn

local smoke = os.getenv("ATTN_SMOKE") == "1"
local steps = tonumber(arg and arg[1]) or (smoke and 20 or 400)
local vocab, T, d, heads, batch = 10, 8, 32, 4, 32
attn.manual_seed(1)
math.randomseed(1)

local Reverser = nn.Module:extend("Reverser")
function Reverser:init()
  self.embedding = nn.Embedding(vocab, d)
  self.pos_encoding = nn.PositionalEncoding{ num_hiddens = d, dropout = 0 }
  self.attention = nn.MultiHeadAttention{ key_size = d, query_size = d, value_size = d, num_hiddens = d,
    num_heads = heads, dropout = 0 }
  self.dense = nn.Linear(d, vocab)
end
function Reverser:forward(ids)
  local X = self.pos_encoding(self.embedding(ids))
  return self.dense(self.attention(X, X, X))
end

local function batch_of(n)
  local x, y = {}, {}
  for b = 1, n do
    x[b], y[b] = {}, {}
    for t = 1, T do x[b][t] = math.random(vocab) end
    for t = 1, T do y[b][t] = x[b][T + 1 - t] end
  end
  return x, y
end

local model = Reverser()
print(model)
local loss_fn = nn.CrossEntropyLoss { class_dim = -1 } -- class-last: logits (B, T, V), labels (B, T)
local opt = attn.optim.Adam{ params = model:parameters(), lr = 0.01 }
local progress = attn.progress.new{ total = steps, label = "reverse", unit = "step" }
for step = 1, steps do
  local x, y = batch_of(batch)
  local loss = loss_fn(model(x), y)
  opt:zero_grad()
  loss:backward()
  opt:step()
  progress:update(step, { loss = loss:item(), tokens = batch * T })
end
progress:finish()

-- Held-out accuracy, then a checkpoint round trip.
local x, y = batch_of(256)
local function accuracy(m)
  m:eval()
  local pred = attn.no_grad(function() return m(x):argmax(-1) end)
  return pred:eq(attn.tensor(y, "int64")):to("float32"):mean():item()
end
local acc = accuracy(model)
print(string.format("held-out token accuracy: %.1f%%", 100 * acc))

os.execute("mkdir -p out")
local path = "out/reverser.safetensors"
assert(attn.save(path, model:state_dict(), { task = "reverse", steps = tostring(steps) }))
local fresh = Reverser()
local tensors, meta = assert(attn.load(path))
fresh:load_state_dict(tensors)
print(string.format("reloaded from %s (%s, %s steps): accuracy %.1f%%", path, meta.task, meta.steps,
  100 * accuracy(fresh)))

-- Attention weights of the first held-out sequence, one heatmap per head: in
-- the terminal, and as out/reverse_attention.png.
fresh({ x[1] })
local w = fresh.attention.attention_weights -- (1, heads, T, T)
local tokens, titles = {}, {}
for t = 1, T do tokens[t] = tostring(x[1][t]) end
for h = 1, heads do titles[h] = "head " .. h end
print("attention weights (rows: output position, columns: input tokens):")
print(plot.terminal_heatmap(w, { titles = titles, col_labels = tokens, vmin = 0, vmax = 1 }))
os.execute("mkdir -p out")
print("wrote " .. assert(plot.heatmaps(w, { path = "out/reverse_attention.png", titles = titles, col_labels = tokens,
  xlabel = "Input tokens", ylabel = "Output positions", vmin = 0, vmax = 1 })))
if not smoke and acc < 0.99 then
  io.stderr:write("reverse task did not reach 99% accuracy\n")
  os.exit(1)
end
