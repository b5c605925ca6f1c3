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
local autograd = require "attn.autograd"
local fused = require "attn.nn.fused"

local Module = module.Module
local Linear, Embedding = linear.Linear, linear.Embedding

local M = {}

local core = attn.core
local record = autograd.record
local shape_str = core.shape_str

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

--- reorder_state(state, rows) -> the state of the batch rows `rows` (a list of
-- 1-based batch indices, repeats allowed), for batched beam search: row i of
-- the new state is row rows[i] of `state`. Each decoder knows where its
-- state keeps the batch; the base class has none.
function Decoder:reorder_state()
  error(self:class_name() .. ": has no reorder_state method (define " .. self:class_name() .. ":reorder_state)", 2)
end

--- Rows of a batch: a tensor's along its batch dim `dim` (index_select), or a
-- Lua list's (valid lengths); nil stays nil. The helper of `reorder_state`.
-- @param x a tensor, a list or nil
-- @tparam integer dim the batch dim of a tensor
-- @tparam table rows 1-based batch indices
-- @return the picked rows, x's kind
local function pick_rows(x, dim, rows)
  if x == nil then return nil end
  if attn.is_tensor(x) then return x:index_select(dim, rows) end
  local out = {}
  for i, r in ipairs(rows) do out[i] = x[r] end
  return out
end
M.pick_rows = pick_rows

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

--- The hidden state (num_layers, B, h) is batch-second; the fixed context (B, h) batch-first.
function Seq2SeqDecoder:reorder_state(state, rows)
  if self.fixed_context then return { pick_rows(state[1], 2, rows), pick_rows(state[2], 1, rows) } end
  return pick_rows(state, 2, rows)
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
-- [, dropout [, {scoring = "additive"|"dot", fused = true}]])`: the Bahdanau decoder
-- (`scoring = "dot"` swaps in scaled dot-product attention, the book's exercise). At each step the query is the previous
-- step's last-layer hidden state (B, 1, h); additive attention over the encoder
-- outputs, masked by the source valid lengths, gives a context (B, 1, h) that is
-- concatenated (context first, as the book) with the token embedding as the
-- GRU's input; a dense layer maps the outputs to the vocabulary.
-- init_state({output, state}, enc_valid_lens) -> {enc_outputs (B, T, h), state,
-- enc_valid_lens}. forward(X (B, T), state) -> (B, T, vocab_size), state. After a
-- call, `attention_weights` is the list of the steps' weights, each (B, 1, Nk)
-- (materialised in eval mode or with `attention.keep_weights`; see attn.nn.attention).
--
-- With additive scoring the whole step loop (the keys' projection, then per
-- step attention, cat and every GRU layer) is one C call and one autograd node
-- (`M.attention_decoder`, over src/nn/attn_decoder.h), its backward one C call
-- too. `fused = false` (or `attn.nn.set_fused(false)`, dot scoring, a GRU or
-- attention layer that may not fuse, or lengths that are not one per sample)
-- runs the step-by-step composition instead (`composed_forward`; the choice is
-- attn.nn.fused's rule, `can_fuse` the test).
-- @type Seq2SeqAttentionDecoder
local Seq2SeqAttentionDecoder = AttentionDecoder:extend("Seq2SeqAttentionDecoder")
M.Seq2SeqAttentionDecoder = Seq2SeqAttentionDecoder

function Seq2SeqAttentionDecoder:init(vocab_size, embed_size, num_hiddens, num_layers, dropout, opts)
  local who = "Seq2SeqAttentionDecoder"
  local v, e, h, l, p = sizes(who, vocab_size, embed_size, num_hiddens, num_layers, dropout)
  opts = check.options(who, opts, { scoring = true, fused = true }, 4)
  local scoring = opts.scoring or "additive"
  if scoring == "additive" then
    self.attention = attention.AdditiveAttention(h, h, h, p)
  elseif scoring == "dot" then
    -- the book's exercise: scaled dot-product scoring (query and keys are both h wide)
    self.attention = attention.DotProductAttention(p)
  else
    error(string.format("%s: scoring must be 'additive' or 'dot', got %s", who, tostring(scoring)), 3)
  end
  self.fused = opts.fused ~= false
  self.embedding = Embedding(v, e)
  self.rnn = gru.GRU(e + h, h, l, p)
  self.dense = Linear(h, v)
end

function Seq2SeqAttentionDecoder.init_state(_, enc_outputs, enc_valid_lens)
  local outputs, hidden_state = enc_outputs[1], enc_outputs[2]
  return { outputs:permute(2, 1, 3), hidden_state, enc_valid_lens }
end

--- {enc_outputs (B, T, h), state (num_layers, B, h), enc_valid_lens (B)}: the state batch-second.
function Seq2SeqAttentionDecoder.reorder_state(_, state, rows)
  return { pick_rows(state[1], 1, rows), pick_rows(state[2], 2, rows), pick_rows(state[3], 1, rows) }
end

--- The Bahdanau decoder's step loop as one autograd node (src/nn/attn_decoder.h).
-- W_k (ha, dv) projects the keys once; values (B, Nk, dv) are the keys and the
-- values; valid_lens nil or (B); emb (T, B, e) the steps' embeddings; h0 (L, B,
-- H); W_q (ha, H); w_v (1, ha) or (ha); params the GRU's
-- (`GRU:flat_parameters`, layer 0 taking dv + e inputs); p_attention, p_rnn the
-- dropout of the weights and between the GRU layers (0 when not training); seed
-- fixes every dropout stream (drawn when nil). Returns the outputs (B, T, H),
-- the final state (L, B, H) and the attention weights (B, T, Nk) before dropout
-- (not part of the graph).
-- @usage local out, hn, w = seq2seq.attention_decoder(Wk, V, lens, emb, h0, Wq, wv, params, 0, 0)
function M.attention_decoder(W_k, values, valid_lens, emb, h0, W_q, w_v, params, p_attention, p_rnn, seed)
  local c = core.contiguous
  local v, e, h = c(values), c(emb), c(h0)
  local out, hn, weights, saved
  out, hn, weights, saved, seed = core.decoder_forward(W_k, v, valid_lens, e, h, W_q, w_v, params, p_attention,
    p_rnn, seed)
  local inputs = { W_k, values, emb, h0, W_q, w_v }
  for i = 1, #params do inputs[i + 6] = params[i] end
  record("attention_decoder", { out, hn }, inputs, function(gout, ghn)
    local dWk, dv, de, dh, dWq, dwv, grads = core.decoder_backward(W_k, v, valid_lens, e, h, W_q, w_v, params,
      p_attention, p_rnn, seed, saved, gout and c(gout), ghn and c(ghn))
    return dWk, dv, de, dh, dWq, dwv, table.unpack(grads, 1, #params)
  end)
  return out, hn, weights
end

-- Lengths given as a Lua table become a tensor of the dtype of `like`, as the attention layer
-- makes them.
local function lens_tensor(lens, like)
  if type(lens) == "table" and not attn.is_tensor(lens) then return attn.tensor(lens, like:dtype()) end
  return lens
end

--- Whether the fused node can run this call (attn.nn.fused): additive scoring and a GRU that
-- may fuse (their own `fused` fields, one direction, the GRU's training dropout below 1), tensors of the
-- expected ranks, source lengths nil or one per sample.
function Seq2SeqAttentionDecoder:can_fuse(_, state)
  local scorer, rnn, enc_outputs, hidden_state = self.attention, self.rnn, state[1], state[2]
  if not (attn.is_tensor(enc_outputs) and attn.is_tensor(hidden_state) and enc_outputs:dim() == 3
      and hidden_state:dim() == 3 and getmetatable(scorer) == attention.AdditiveAttention and fused.allowed(scorer)
      and getmetatable(rnn) == gru.GRU and not rnn.bidirectional and fused.allowed(rnn) and rnn:can_fuse()) then
    return false
  end
  local lens = lens_tensor(state[3], enc_outputs)
  return lens == nil or attn.is_tensor(lens) and lens:dim() == 1 and lens:size(1) == enc_outputs:size(1)
end

function Seq2SeqAttentionDecoder:forward(X, state)
  check_ids("Seq2SeqAttentionDecoder", X)
  return fused.forward(self, X, state)
end

--- The fused path of forward (see the class comment), for the calls `can_fuse`
-- admits. `seed` (optional) fixes the dropout streams (drawn when nil).
function Seq2SeqAttentionDecoder:fused_forward(X, state, seed, lens)
  local scorer, rnn = self.attention, self.rnn
  local enc_outputs, hidden_state = state[1], state[2]
  if lens == nil then lens = lens_tensor(state[3], enc_outputs) end
  local drop = scorer.dropout
  local out, hn, weights = M.attention_decoder(scorer.W_k.weight, enc_outputs, lens,
    self.embedding(X:t()), hidden_state, scorer.W_q.weight, scorer.w_v.weight, rnn:flat_parameters(),
    drop.training and drop.p or 0, rnn.training and rnn.dropout or 0, seed)
  -- the steps' weights as views, kept when the attention layer would keep them (eval mode or
  -- keep_weights): in training the composition has none either
  local steps = {}
  if not scorer.training or scorer.keep_weights == true then
    for t = 1, weights:size(2) do steps[t] = weights:narrow(2, t, 1) end
  end
  self.attention_weights = steps
  return self.dense(out), { enc_outputs, hn, state[3] }
end

--- The composed path: the same decoder composed step by step (attention, cat,
-- the GRU over one step). With a seed, step t (1-based) drops what the fused
-- node with that seed drops: the attention weights with stream seed + (t-1) L
-- + L - 1, the GRU (its composed form) with stream seed + (t-1) L.
function Seq2SeqAttentionDecoder:composed_forward(X, state, seed)
  check_ids("Seq2SeqAttentionDecoder", X)
  local enc_outputs, hidden_state, enc_valid_lens = state[1], state[2], state[3]
  -- the steps' embeddings as one node (the book's `for x in X`), not a narrow
  -- per step, whose gradient would be a full-size tensor each; each is (1, B, embed)
  local steps = gru.unbind(self.embedding(X:t()), true)
  local T = #steps
  local outputs, weights = {}, {}
  -- Additive scoring projects the keys (the same at every step) once, not once per step as the book
  local scorer, rnn = self.attention, self.rnn
  local L = rnn.num_layers
  local keys = scorer.project_keys and scorer:project_keys(enc_outputs)
  -- the query is the last layer's state (B, 1, h); after the first step that is the
  -- GRU's output (the same numbers), one view of it instead of a select and an unsqueeze
  local query = hidden_state:select(1, hidden_state:size(1)):unsqueeze(2)
  for t = 1, T do
    local base = seed and seed + (t - 1) * L
    local context = keys and scorer:attend_projected(query, keys, enc_outputs, enc_valid_lens, base and base + L - 1)
      or scorer(query, enc_outputs, enc_outputs, enc_valid_lens)
    -- the book's cat of context and embedding, built time-major: (1, B, h + embed)
    local x = attn.cat({ context:transpose(1, 2), steps[t] }, 3)
    local out
    if base then
      out, hidden_state = rnn:composed_forward(x, hidden_state, base)
    else
      out, hidden_state = rnn(x, hidden_state)
    end
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
