--- The book's Transformer (d2l v0.17, PyTorch tab): PositionWiseFFN, AddNorm,
-- TransformerEncoderBlock, TransformerEncoder, TransformerDecoderBlock and
-- TransformerDecoder, with the book's constructor signatures and state-dict keys.
--
-- Blocks sit in `blks`, a Sequential whose children are named "block0",
-- "block1", ... as the book's `add_module("block" + str(i), ...)` names them, so
-- the keys are `blks.block0.attention.W_q.weight`, `blks.block0.addnorm1.ln.weight`,
-- `blks.block0.ffn.dense1.weight`, ...; in Lua the blocks are `blks[1]`, `blks[2]`.
--
-- **Decoder state** (as the book): {enc_outputs, enc_valid_lens, cache}, where
-- cache[i] holds block i's past inputs (B, t, h), used as keys and values of its
-- self-attention when the decoder is fed one step at a time. A block's query
-- row j (0-based) sees cached + j + 1 keys: causal over a whole sequence in
-- training (the book's valid lengths 1..T) and every key at a one-step call.
--
-- **Positions at prediction.** The book adds the encoding of position 0 at
-- every one-step call (its decoder sees one token, and adds P[:, :1]); training
-- uses positions 0..T-1. `positions = "book"` (the default) keeps that;
-- `positions = "absolute"` offsets a call by the number of cached steps, so a
-- step-by-step decode equals the causal forward over the whole prefix.
-- @module attn.nn.transformer
local attn = require "attn"
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local check = require "attn.check"
local attention = require "attn.nn.attention"
local containers = require "attn.nn.containers"
local seq2seq = require "attn.nn.seq2seq"
local fused = require "attn.nn.fused"
local modern = require "attn.nn.modern"

local Module = module.Module
local Linear, ReLU, Dropout, LayerNorm, Embedding = linear.Linear, linear.ReLU, linear.Dropout, linear.LayerNorm,
  linear.Embedding
local MultiHeadAttention = attention.MultiHeadAttention

local M = {}

-- ---------------------------------------------------------------- PositionWiseFFN

--- `nn.PositionWiseFFN(ffn_num_input, ffn_num_hiddens, ffn_num_outputs)`:
-- dense2(relu(dense1(X))) on the last dim. Keys dense1.*, dense2.*.
-- @type PositionWiseFFN
local PositionWiseFFN = Module:extend("PositionWiseFFN")
M.PositionWiseFFN = PositionWiseFFN

function PositionWiseFFN:init(ffn_num_input, ffn_num_hiddens, ffn_num_outputs)
  self.dense1 = Linear(ffn_num_input, ffn_num_hiddens)
  self.relu = ReLU()
  self.dense2 = Linear(ffn_num_hiddens, ffn_num_outputs)
end

-- forward is the dispatcher itself (attn.nn.fused): one call less on a short path.
PositionWiseFFN.forward = fused.forward

--- Whether dense1 and relu can run as one node (attn.nn.fused): both are the stock layers
-- (a replaced one is not eligible).
function PositionWiseFFN:can_fuse()
  local a = rawget(self, "_attrs")
  return getmetatable(a.dense1) == Linear and getmetatable(a.relu) == ReLU
end

--- The fused path: dense1 and relu as one node (`linear_relu`), then dense2.
function PositionWiseFFN:fused_forward(X) return self.dense2(self.dense1:forward_relu(X)) end

--- The composed path: dense2(relu(dense1(X))), each child as it is.
function PositionWiseFFN:composed_forward(X) return self.dense2(self.relu(self.dense1(X))) end

-- ---------------------------------------------------------------- AddNorm

--- `nn.AddNorm(normalized_shape, dropout)`: ln(dropout(Y) + X), the residual
-- connection and layer normalisation. Key ln.weight, ln.bias.
-- @type AddNorm
local AddNorm = Module:extend("AddNorm")
M.AddNorm = AddNorm

function AddNorm:init(normalized_shape, dropout)
  self.dropout = Dropout(dropout or 0)
  self.ln = LayerNorm(normalized_shape)
end

-- forward is the dispatcher itself (attn.nn.fused): one call less on a short path.
AddNorm.forward = fused.forward

--- Whether dropout, the residual add and ln can run as one node (attn.nn.fused): the stock
-- Dropout and LayerNorm children (a replaced one is not eligible), X and Y tensors of one
-- shape.
function AddNorm:can_fuse(X, Y)
  local a = rawget(self, "_attrs")
  return getmetatable(a.dropout) == Dropout and getmetatable(a.ln) == LayerNorm and attn.is_tensor(X)
    and attn.is_tensor(Y) and X:dim() > 0 and attn.core.same_shape(X, Y)
end

--- The fused path: ln(dropout(Y) + X) as one node (`add_layer_norm`), the same numbers as
-- the three.
function AddNorm:fused_forward(X, Y)
  local a = rawget(self, "_attrs")
  local dropout = a.dropout -- (p is an attribute, training a raw field of every module)
  return a.ln:forward_add(X, Y, rawget(dropout, "_attrs").p, rawget(dropout, "training"))
end

--- The composed path: ln(dropout(Y) + X), each child as it is.
function AddNorm:composed_forward(X, Y) return self.ln(self.dropout(Y) + X) end

-- ---------------------------------------------------------------- encoder

--- `nn.TransformerEncoderBlock(key_size, query_size, value_size, num_hiddens,
-- norm_shape, ffn_num_input, ffn_num_hiddens, num_heads, dropout [, use_bias])`:
-- multi-head self-attention, AddNorm, position-wise FFN, AddNorm.
-- forward(X (B, T, num_hiddens), valid_lens) -> (B, T, num_hiddens). A last optional table
-- `{norm_first = false, ffn = "relu"}`: `norm_first = true` makes each sublayer pre-norm,
-- X + dropout(f(ln(X))) (Xiong et al., arXiv:2002.04745; the same ln children and keys; the
-- default false is the book's post-norm); `ffn = "swiglu"` replaces the FFN by nn.SwiGLU
-- (children ffn.w1, ffn.w2, ffn.w3); `attention` selects the self-attention mechanism
-- (nn.MultiHeadAttention's option: "linear", {"performer", num_features = 64}, ...).
-- @type TransformerEncoderBlock
local TransformerEncoderBlock = Module:extend("TransformerEncoderBlock")
M.TransformerEncoderBlock = TransformerEncoderBlock

-- The block options of attn.nn.transformer's blocks: norm_first (pre-norm) and ffn.
local function block_options(who, opts)
  opts = check.options(who, opts, { norm_first = true, ffn = true, attention = true }, 5)
  local ffn = opts.ffn or "relu"
  if ffn ~= "relu" and ffn ~= "swiglu" then
    error(string.format("%s: ffn must be 'relu' or 'swiglu', got '%s'", who, tostring(ffn)), 4)
  end
  return opts.norm_first == true, ffn, opts.attention
end

-- The block's FFN: the book's PositionWiseFFN, or SwiGLU (children w1, w2, w3).
local function make_ffn(kind, ffn_num_input, ffn_num_hiddens, num_hiddens)
  if kind == "swiglu" then return modern.SwiGLU(ffn_num_input, ffn_num_hiddens, num_hiddens) end
  return PositionWiseFFN(ffn_num_input, ffn_num_hiddens, num_hiddens)
end

-- The sublayer X -> f(X) with its AddNorm: post-norm ln(X + dropout(f(X))) (the book), or
-- pre-norm X + dropout(f(ln(X))) with the same ln and dropout children (the same keys).
local function sublayer(norm_first, addnorm, X, f)
  if not norm_first then return addnorm(X, f(X)) end
  return X + addnorm.dropout(f(addnorm.ln(X)))
end

function TransformerEncoderBlock:init(key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
                                      ffn_num_hiddens, num_heads, dropout, use_bias, opts)
  local ffn, mechanism
  self.norm_first, ffn, mechanism = block_options("TransformerEncoderBlock", opts)
  self.attention = MultiHeadAttention { key_size = key_size, query_size = query_size, value_size = value_size,
    num_hiddens = num_hiddens, num_heads = num_heads, dropout = dropout, bias = use_bias == true,
    attention = mechanism }
  self.addnorm1 = AddNorm(norm_shape, dropout)
  self.ffn = make_ffn(ffn, ffn_num_input, ffn_num_hiddens, num_hiddens)
  self.addnorm2 = AddNorm(norm_shape, dropout)
end

function TransformerEncoderBlock:forward(X, valid_lens)
  local nf = self.norm_first
  local Y = sublayer(nf, self.addnorm1, X, function(Z) return self.attention(Z, Z, Z, valid_lens) end)
  return sublayer(nf, self.addnorm2, Y, self.ffn)
end

--- `nn.TransformerEncoder(vocab_size, key_size, query_size, value_size,
-- num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens, num_heads,
-- num_layers, dropout [, use_bias])`: embedding scaled by sqrt(num_hiddens),
-- sinusoidal positions, num_layers blocks. forward(X (B, T) ids, valid_lens) ->
-- (B, T, num_hiddens); afterwards `attention_weights[i]` is block i's
-- (B, num_heads, T, T) (eval mode), and `stacked_attention_weights(b)` gives
-- sample b's as (num_layers, num_heads, T, T), the book's heatmap tensor.
-- @type TransformerEncoder
local TransformerEncoder = seq2seq.Encoder:extend("TransformerEncoder")
M.TransformerEncoder = TransformerEncoder

-- The embedding, positional encoding and blocks shared by the encoder and the
-- decoder: blks.block0, ... made by make_block(i) for i = 0 .. num_layers - 1.
local function embed_and_blocks(self, vocab_size, num_hiddens, dropout, num_layers, make_block)
  -- (named here, not by Embedding: PyTorch's call, a layer module first, lands here through nn.D2L*)
  if math.type(vocab_size) ~= "integer" or vocab_size < 1 then
    error(string.format("%s (the book's): vocab_size must be a positive integer, got %s (PyTorch's %s(layer, " ..
      "num_layers) is nn.Torch%s)", self:class_name(), module.is_module(vocab_size) and "a module" or
      tostring(vocab_size), self:class_name(), self:class_name()), 5)
  end
  self.num_hiddens, self.num_layers = num_hiddens, num_layers
  self.embedding = Embedding(vocab_size, num_hiddens)
  self.pos_encoding = attention.PositionalEncoding(num_hiddens, dropout)
  self.blks = containers.Sequential()
  for i = 0, num_layers - 1 do self.blks:add_module("block" .. i, make_block(i)) end
end

function TransformerEncoder:init(vocab_size, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
                                 ffn_num_hiddens, num_heads, num_layers, dropout, use_bias)
  embed_and_blocks(self, vocab_size, num_hiddens, dropout, num_layers, function()
    return TransformerEncoderBlock(key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
      ffn_num_hiddens, num_heads, dropout, use_bias)
  end)
end

function TransformerEncoder:forward(X, valid_lens)
  X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
  local weights = {}
  for i, blk in ipairs(self.blks) do
    X = blk(X, valid_lens)
    weights[i] = blk.attention.attention_weights
  end
  self.attention_weights = weights
  return X
end

--- Sample b's (default 1) attention weights of the last call, stacked over
-- the blocks: (num_layers, num_heads, Nq, Nk); nil when they were not kept
-- (training mode).
function TransformerEncoder:stacked_attention_weights(b)
  local per_layer = {}
  for i, w in ipairs(self.attention_weights or {}) do per_layer[i] = w:select(1, b or 1) end
  if #per_layer == 0 or #per_layer < #self.blks then return nil end
  return attn.stack(per_layer, 1)
end

-- ---------------------------------------------------------------- decoder

--- `nn.TransformerDecoderBlock(key_size, query_size, value_size, num_hiddens,
-- norm_shape, ffn_num_input, ffn_num_hiddens, num_heads, dropout, i)`: masked
-- self-attention, AddNorm, encoder-decoder attention (masked by the source
-- lengths), AddNorm, FFN, AddNorm. `i` is the block's 0-based index into the
-- state's cache. forward(X (B, T, h), state) -> (B, T, h), state (cache updated). A last
-- optional table `{norm_first, ffn}` as TransformerEncoderBlock's (pre-norm caches the
-- normalised inputs, which its self-attention reads).
-- @type TransformerDecoderBlock
local TransformerDecoderBlock = Module:extend("TransformerDecoderBlock")
M.TransformerDecoderBlock = TransformerDecoderBlock

function TransformerDecoderBlock:init(key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
                                      ffn_num_hiddens, num_heads, dropout, i, opts)
  local ffn, mechanism
  self.norm_first, ffn, mechanism = block_options("TransformerDecoderBlock", opts)
  if mechanism ~= nil then error("TransformerDecoderBlock: the attention option is for encoder blocks", 3) end
  self.i = i
  self.attention1 = MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout)
  self.addnorm1 = AddNorm(norm_shape, dropout)
  self.attention2 = MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout)
  self.addnorm2 = AddNorm(norm_shape, dropout)
  self.ffn = make_ffn(ffn, ffn_num_input, ffn_num_hiddens, num_hiddens)
  self.addnorm3 = AddNorm(norm_shape, dropout)
end

function TransformerDecoderBlock:forward(X, state)
  local enc_outputs, enc_valid_lens, cache = state[1], state[2], state[3]
  local slot = self.i + 1
  local past = cache[slot]
  -- the cache holds what the self-attention reads: the block's inputs, normalised when pre-norm
  local nf = self.norm_first
  local Xn = nf and self.addnorm1.ln(X) or X
  local key_values = past and attn.cat({ past, Xn }, 2) or Xn
  cache[slot] = key_values
  -- row j of the new steps sees the cached steps and itself: lengths
  -- cached + 1 .. cached + T for every sample (the book's causal lengths)
  local B, T = X:size(1), X:size(2)
  local cached = past and past:size(2) or 0
  local lens = attn.arange(cached + 1, cached + T + 1, X:dtype()):reshape({ 1, T }):expand({ B, T })
  local Y
  if nf then
    Y = X + self.addnorm1.dropout(self.attention1(Xn, key_values, key_values, lens))
  else
    Y = self.addnorm1(X, self.attention1(X, key_values, key_values, lens))
  end
  local Z = sublayer(nf, self.addnorm2, Y, function(W)
    return self.attention2(W, enc_outputs, enc_outputs, enc_valid_lens)
  end)
  return sublayer(nf, self.addnorm3, Z, self.ffn), state
end

--- `nn.TransformerDecoder(vocab_size, key_size, query_size, value_size,
-- num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens, num_heads,
-- num_layers, dropout [, {positions = "book"|"absolute"}])`: embedding scaled by
-- sqrt(num_hiddens), positions, num_layers decoder blocks, dense to the
-- vocabulary. init_state({enc_outputs}, enc_valid_lens) -> {enc_outputs,
-- enc_valid_lens, cache = {}}. forward(X (B, T) ids, state) -> (B, T,
-- vocab_size), state. Afterwards `attention_weights[1][i]` (self-attention) and
-- `attention_weights[2][i]` (encoder-decoder attention) are block i's
-- (B, num_heads, Nq, Nk), as the book's `_attention_weights` (eval mode).
-- @type TransformerDecoder
local TransformerDecoder = seq2seq.AttentionDecoder:extend("TransformerDecoder")
M.TransformerDecoder = TransformerDecoder

function TransformerDecoder:init(vocab_size, key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
                                 ffn_num_hiddens, num_heads, num_layers, dropout, opts)
  opts = check.options("TransformerDecoder", opts, { positions = true }, 4)
  local positions = opts.positions or "book"
  if positions ~= "book" and positions ~= "absolute" then
    error(string.format("TransformerDecoder: positions must be 'book' or 'absolute', got '%s'", tostring(positions)),
      3)
  end
  self.positions = positions
  embed_and_blocks(self, vocab_size, num_hiddens, dropout, num_layers, function(i)
    return TransformerDecoderBlock(key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
      ffn_num_hiddens, num_heads, dropout, i)
  end)
  self.dense = Linear(num_hiddens, vocab_size)
end

function TransformerDecoder.init_state(_, enc_outputs, enc_valid_lens)
  return { enc_outputs[1], enc_valid_lens, {} }
end

--- {enc_outputs (B, T, h), enc_valid_lens (B), cache}: every tensor batch-first, the cache's
-- per-block keys (B, steps, h) included (a new cache table: the blocks write theirs in place).
function TransformerDecoder.reorder_state(_, state, rows)
  local cache = {}
  for slot, kv in pairs(state[3]) do cache[slot] = seq2seq.pick_rows(kv, 1, rows) end
  return { seq2seq.pick_rows(state[1], 1, rows), seq2seq.pick_rows(state[2], 1, rows), cache }
end

function TransformerDecoder:forward(X, state)
  local offset = 0
  if self.positions == "absolute" and state[3][1] then offset = state[3][1]:size(2) end
  X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens), offset)
  local self_w, cross_w = {}, {}
  for i, blk in ipairs(self.blks) do
    X, state = blk(X, state)
    self_w[i] = blk.attention1.attention_weights
    cross_w[i] = blk.attention2.attention_weights
  end
  self.attention_weights = { self_w, cross_w }
  return self.dense(X), state
end

return M
