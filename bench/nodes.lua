-- Autograd nodes one training step records, for the book's Bahdanau and
-- Transformer models at the bench's settings (batch 64 x 10 steps, vocab 200,
-- 32 hidden, 2 layers), counted by walking the graph from the loss before
-- backward, with the count per operation name.
-- Run: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="lua/?.so;;" lua5.4 bench/nodes.lua
local attn = require "attn"
local autograd = require "attn.autograd"
local nn = attn.nn

attn.manual_seed(0)
local BATCH, STEPS, VOCAB = 64, 10, 200
local ids = attn.randint(4, VOCAB, { BATCH, STEPS })
local lens = attn.randint(2, STEPS + 1, { BATCH })

-- Nodes reachable from root: the total and a count per name.
local function count(root)
  local seen, per_name, total = {}, {}, 0
  local stack = { root.grad_fn }
  while #stack > 0 do
    local node = table.remove(stack)
    if not seen[node] then
      seen[node] = true
      total = total + 1
      per_name[node.name] = (per_name[node.name] or 0) + 1
      for _, input in ipairs(node.inputs) do
        if autograd.is_tensor(input) and input.grad_fn then stack[#stack + 1] = input.grad_fn end
      end
    end
  end
  return total, per_name
end

local models = {
  { "Bahdanau (d2l 11.4)", nn.EncoderDecoder(nn.Seq2SeqEncoder(VOCAB, 32, 32, 2, 0.2),
    nn.Seq2SeqAttentionDecoder(VOCAB, 32, 32, 2, 0.2)) },
  { "Transformer (d2l 11.7)", nn.EncoderDecoder(nn.TransformerEncoder(VOCAB, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0.2),
    nn.TransformerDecoder(VOCAB, 32, 32, 32, 32, { 32 }, 32, 64, 4, 2, 0.2)) },
}
local loss = nn.MaskedSoftmaxCELoss()
for _, m in ipairs(models) do
  local net = m[2]
  net:train()
  local total, per_name = count(loss(net(ids, ids, lens), ids, lens):sum())
  local names = {}
  for name in pairs(per_name) do names[#names + 1] = name end
  table.sort(names, function(a, b) return per_name[a] > per_name[b] or (per_name[a] == per_name[b] and a < b) end)
  local parts = {}
  for i, name in ipairs(names) do parts[i] = string.format("%s %d", name, per_name[name]) end
  print(string.format("%s: %d nodes a training step (%s)", m[1], total, table.concat(parts, ", ")))
end
