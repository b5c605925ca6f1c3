--- The book's encoder-decoder scaffolding (d2l v0.17, PyTorch tab): Encoder,
-- Decoder, AttentionDecoder, EncoderDecoder, Seq2SeqEncoder, Seq2SeqDecoder and
-- Seq2SeqAttentionDecoder (Bahdanau), with the book's state-dict keys.
--
-- **Conventions.** Token ids are (B, T) tensors of 1-based ids (float or int64).
-- An encoder returns its outputs as several values (`output, state =
-- encoder(X)`); `decoder:init_state(enc_outputs, ...)` takes them packed in a
-- list (`table.pack(encoder(X, ...))`), as the book's tuple. A decoder returns
-- `output (B, T, vocab), state`; the state is the decoder's own (a tensor or a
-- list), passed back at the next call.
--
-- **State-dict keys** (checked against the book's modules in spec/nn/seq2seq_spec.lua):
-- Seq2SeqEncoder `embedding.weight`, `rnn.weight_ih_l0`, `rnn.weight_hh_l0`,
-- `rnn.bias_ih_l0`, `rnn.bias_hh_l0`, ... per layer; Seq2SeqDecoder the same plus
-- `dense.weight`, `dense.bias`; Seq2SeqAttentionDecoder `attention.W_k.weight`,
-- `attention.W_q.weight`, `attention.w_v.weight`, then those of Seq2SeqDecoder;
-- EncoderDecoder prefixes `encoder.` and `decoder.`.
-- @module attn.nn.seq2seq
-- @usage
-- local enc = nn.Seq2SeqEncoder(#src_vocab, 32, 32, 2, 0.1)
-- local dec = nn.Seq2SeqAttentionDecoder(#tgt_vocab, 32, 32, 2, 0.1)
-- local net = nn.EncoderDecoder(enc, dec)
-- local Y_hat, state = net(X, dec_input, X_valid_len)   -- (B, T, #tgt_vocab)
local attn = require "attn"
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local check = require "attn.check"
local gru = require "attn.nn.gru"
local attention = require "attn.nn.attention"

local Module = module.Module
local Linear, Embedding = linear.Linear, linear.Embedding

local M = {}

local shape_str = attn.core.shape_str

local function check_ids(who, X)
  if not attn.is_tensor(X) or X:dim() ~= 2 then
    error(string.format("%s: input must be a (batch, num_steps) tensor of token ids, got %s", who,
      attn.is_tensor(X) and shape_str(X:shape()) or "a " .. type(X)), 3)
  end
end

local function need_size(who, what, v)
  check.positive_int(who, what, v)
  return v
end

-- (vocab_size, embed_size, num_hiddens, num_layers, dropout), checked.
local function sizes(who, vocab_size, embed_size, num_hiddens, num_layers, dropout)
  return need_size(who, "vocab_size", vocab_size), need_size(who, "embed_size", embed_size),
    need_size(who, "num_hiddens", num_hiddens), need_size(who, "num_layers", num_layers or 1), dropout or 0
end

-- ---------------------------------------------------------------- base classes

--- `nn.Encoder`: base class of encoders (forward(X, ...) -> outputs...).
-- @type Encoder
local Encoder = Module:extend("Encoder")
M.Encoder = Encoder

--- `nn.Decoder`: base class of decoders: `init_state(enc_outputs, ...)` and
-- forward(X, state) -> output, state.
-- @type Decoder
local Decoder = Module:extend("Decoder")
M.Decoder = Decoder

function Decoder:init_state()
  error(self:class_name() .. ": has no init_state method (define " .. self:class_name() .. ":init_state)", 2)
end

--- `nn.AttentionDecoder`: base class of decoders that keep `attention_weights`
-- (a field set by forward).
-- @type AttentionDecoder
local AttentionDecoder = Decoder:extend("AttentionDecoder")
M.AttentionDecoder = AttentionDecoder

--- `nn.EncoderDecoder(encoder, decoder)`: forward(enc_X, dec_X, ...) runs
-- `encoder(enc_X, ...)`, `decoder:init_state(outputs, ...)` and returns
-- `decoder(dec_X, state)`: output, state. Keys `encoder.*`, `decoder.*`.
-- @type EncoderDecoder
local EncoderDecoder = Module:extend("EncoderDecoder")
M.EncoderDecoder = EncoderDecoder

function EncoderDecoder:init(encoder, decoder)
  if not module.is_module(encoder) or not module.is_module(decoder) then
    error("EncoderDecoder: expected (encoder, decoder) modules", 3)
  end
  self.encoder = encoder -- registered first, as in the book
  self.decoder = decoder
end

function EncoderDecoder:forward(enc_X, dec_X, ...)
  local enc_outputs = table.pack(self.encoder(enc_X, ...))
  local dec_state = self.decoder:init_state(enc_outputs, ...)
  return self.decoder(dec_X, dec_state)
end

-- ---------------------------------------------------------------- Seq2SeqEncoder

--- `nn.Seq2SeqEncoder(vocab_size, embed_size, num_hiddens, num_layers [, dropout])`:
-- an embedding and a multi-layer GRU. forward(X (B, T) [, valid_lens, ignored])
-- -> output (T, B, num_hiddens) (time-major, last layer), state (num_layers, B,
-- num_hiddens).
-- @type Seq2SeqEncoder
local Seq2SeqEncoder = Encoder:extend("Seq2SeqEncoder")
M.Seq2SeqEncoder = Seq2SeqEncoder

function Seq2SeqEncoder:init(vocab_size, embed_size, num_hiddens, num_layers, dropout)
  local v, e, h, l, p = sizes("Seq2SeqEncoder", vocab_size, embed_size, num_hiddens, num_layers, dropout)
  self.embedding = Embedding(v, e)
  self.rnn = gru.GRU(e, h, l, p)
end

function Seq2SeqEncoder:forward(X)
  check_ids("Seq2SeqEncoder", X)
  -- time-major for the GRU: the embedding of the transposed ids is the book's
  -- permuted embedding, built in place (no permute node, no copy of its gradient)
  local emb = self.embedding(X:t())
  return self.rnn(emb)
end

-- ---------------------------------------------------------------- Seq2SeqDecoder

--- `nn.Seq2SeqDecoder(vocab_size, embed_size, num_hiddens, num_layers [,
-- dropout [, {fixed_context = false}]])`: the baseline without attention. The GRU
-- (input embed_size + num_hiddens) starts from the encoder's final state; each
-- step's input is the token embedding followed by a context vector; a dense
-- layer maps to the vocabulary.
--
-- The book (v0.17) takes the context from the last layer of the state passed
-- in: in training (one call over the whole sequence) that is the encoder's
-- final top-layer state, but at prediction (one call per step) it drifts to
-- the decoder's own previous state (pitfall 6, d2l-en#2134). With
-- `fixed_context = true` the context is the encoder's last-step top-layer
-- output at every call (the v1.0 fix); the state is then {hidden, context}.
-- forward(X (B, T), state) -> output (B, T, vocab_size), state.
-- @type Seq2SeqDecoder
local Seq2SeqDecoder = Decoder:extend("Seq2SeqDecoder")
M.Seq2SeqDecoder = Seq2SeqDecoder

function Seq2SeqDecoder:init(vocab_size, embed_size, num_hiddens, num_layers, dropout, opts)
  local v, e, h, l, p = sizes("Seq2SeqDecoder", vocab_size, embed_size, num_hiddens, num_layers, dropout)
  opts = check.options("Seq2SeqDecoder", opts, { fixed_context = true }, 4)
  self.fixed_context = opts.fixed_context == true
  self.embedding = Embedding(v, e)
  self.rnn = gru.GRU(e + h, h, l, p)
  self.dense = Linear(h, v)
end

--- init_state({output, state}) -> state (the book), or {state, context} with fixed_context.
function Seq2SeqDecoder:init_state(enc_outputs)
  local output, state = enc_outputs[1], enc_outputs[2]
  if self.fixed_context then return { state, output:select(1, output:size(1)) } end
  return state
end

function Seq2SeqDecoder:forward(X, state)
  check_ids("Seq2SeqDecoder", X)
  local hidden, context = state
  if self.fixed_context then
    hidden, context = state[1], state[2]
  else
    context = hidden:select(1, hidden:size(1)) -- state[-1]: the last layer
  end
  local emb = self.embedding(X:t()) -- (T, B, embed): the permuted embedding, built in place
  local T, B = emb:size(1), emb:size(2)
  local ctx = context:unsqueeze(1):expand({ T, B, context:size(2) })
  local output, new_hidden = self.rnn(attn.cat({ emb, ctx }, 3), hidden)
  output = self.dense(output):permute(2, 1, 3)
  if self.fixed_context then return output, { new_hidden, context } end
  return output, new_hidden
end

-- ---------------------------------------------------------------- Seq2SeqAttentionDecoder

--- `nn.Seq2SeqAttentionDecoder(vocab_size, embed_size, num_hiddens, num_layers
-- [, dropout [, {scoring = "additive"|"dot"}]])`: the Bahdanau decoder
-- (`scoring = "dot"` swaps in scaled dot-product attention, the book's exercise). At each step the query is the previous
-- step's last-layer hidden state (B, 1, h); additive attention over the encoder
-- outputs, masked by the source valid lengths, gives a context (B, 1, h) that is
-- concatenated (context first, as the book) with the token embedding as the
-- GRU's input; a dense layer maps the outputs to the vocabulary.
-- init_state({output, state}, enc_valid_lens) -> {enc_outputs (B, T, h), state,
-- enc_valid_lens}. forward(X (B, T), state) -> (B, T, vocab_size), state. After a
-- call, `attention_weights` is the list of the steps' weights, each (B, 1, Nk)
-- (materialised in eval mode; see attn.nn.attention).
-- @type Seq2SeqAttentionDecoder
local Seq2SeqAttentionDecoder = AttentionDecoder:extend("Seq2SeqAttentionDecoder")
M.Seq2SeqAttentionDecoder = Seq2SeqAttentionDecoder

function Seq2SeqAttentionDecoder:init(vocab_size, embed_size, num_hiddens, num_layers, dropout, opts)
  local who = "Seq2SeqAttentionDecoder"
  local v, e, h, l, p = sizes(who, vocab_size, embed_size, num_hiddens, num_layers, dropout)
  opts = check.options(who, opts, { scoring = true }, 4)
  local scoring = opts.scoring or "additive"
  if scoring == "additive" then
    self.attention = attention.AdditiveAttention(h, h, h, p)
  elseif scoring == "dot" then
    -- the book's exercise: scaled dot-product scoring (query and keys are both h wide)
    self.attention = attention.DotProductAttention(p)
  else
    error(string.format("%s: scoring must be 'additive' or 'dot', got %s", who, tostring(scoring)), 3)
  end
  self.embedding = Embedding(v, e)
  self.rnn = gru.GRU(e + h, h, l, p)
  self.dense = Linear(h, v)
end

function Seq2SeqAttentionDecoder.init_state(_, enc_outputs, enc_valid_lens)
  local outputs, hidden_state = enc_outputs[1], enc_outputs[2]
  return { outputs:permute(2, 1, 3), hidden_state, enc_valid_lens }
end

function Seq2SeqAttentionDecoder:forward(X, state)
  check_ids("Seq2SeqAttentionDecoder", X)
  local enc_outputs, hidden_state, enc_valid_lens = state[1], state[2], state[3]
  -- the steps' embeddings as one node (the book's `for x in X`), not a narrow
  -- per step, whose gradient would be a full-size tensor each; each is (1, B, embed)
  local steps = gru.unbind(self.embedding(X:t()), true)
  local T = #steps
  local outputs, weights = {}, {}
  -- Additive scoring projects the keys (the same at every step) once, not once per step as the book
  local scorer = self.attention
  local keys = scorer.project_keys and scorer:project_keys(enc_outputs)
  -- the query is the last layer's state (B, 1, h); after the first step that is the
  -- GRU's output (the same numbers), one view of it instead of a select and an unsqueeze
  local query = hidden_state:select(1, hidden_state:size(1)):unsqueeze(2)
  for t = 1, T do
    local context = keys and scorer:attend_projected(query, keys, enc_outputs, enc_valid_lens)
      or scorer(query, enc_outputs, enc_outputs, enc_valid_lens)
    -- the book's cat of context and embedding, built time-major: (1, B, h + embed)
    local x = attn.cat({ context:transpose(1, 2), steps[t] }, 3)
    local out
    out, hidden_state = self.rnn(x, hidden_state)
    query = out:transpose(1, 2)
    outputs[t] = query
    weights[t] = scorer.attention_weights
  end
  self.attention_weights = weights
  -- the steps' outputs batch-major, (B, T, h): the dense layer then writes (B, T, vocab)
  -- in order, with no permute of its output or copy of its gradient
  local output = self.dense(attn.cat(outputs, 2))
  return output, { enc_outputs, hidden_state, enc_valid_lens }
end

return M
