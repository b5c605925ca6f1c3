--- Image captioning with attention (Show, Attend and Tell; Xu et al. 2015, arXiv:1502.03044):
-- `nn.CaptionCNN`, a small CNN that classifies 28 x 28 items and gives a grid of annotation
-- vectors over a larger canvas, and `nn.ShowAttendTell`, the decoder (an LSTM or GRU cell, step
-- by step, with soft additive attention over the grid, or without it as the baseline).
--
-- The models live beside the other layers (attn.nn) because they are plain modules with state
-- dicts; decoding and the metrics that need a dataset's boxes are the kit's
-- (attn.d2l.captioning).
--
-- **Encoder.** Two 3 x 3 convolutions (padding 1), each with BatchNorm2d, ReLU and 2 x 2 max
-- pooling: a 28 x 28 item gives a (C, 7, 7) map; the cell layer, a 7 x 7 convolution of stride 7
-- (a fully connected layer over one item's map) and a ReLU, makes it one D-vector, which `fc`
-- maps to 10 classes. Over an (H, W) canvas the same layers give (D, H/28, W/28) (`grid`): one
-- D-vector per 28 x 28 cell, exactly what the classifier sees of an item placed in that cell
-- (but for the convolutions' padding at the cell's borders). An 84 x 84 scene gives L = 9
-- annotation vectors, row by row.
--
-- **Decoder.** With annotation vectors a_i (L of them, D wide), their mean m, the previous word
-- y_{t-1} and the previous state h_{t-1}:
--
--     h_0 = tanh(init_h(m)), c_0 = tanh(init_c(m))     (the LSTM's cell; a GRU has none)
--     v_i = a_i + l_i                                   (l_i a learned location term, (L, D))
--     e_ti = w_v^T tanh(W_k v_i + p_i + W_q h_{t-1})    (additive scoring; p_i a learned
--                                                         location term, (L, A))
--     alpha_t = softmax_i(e_ti),  beta_t = sigmoid(f_beta(h_{t-1}))   (a scalar per step)
--     z_t = beta_t * sum_i alpha_ti v_i
--     h_t (, c_t) = cell([embedding(y_{t-1}), z_t], h_{t-1} (, c_{t-1}))
--     logits_t = fc([h_t, z_t])
--
-- The location terms are there because the features say what a cell holds, not where it is
-- (the CNN sees each cell alone), and the captions name items in reading order: p_i lets the
-- scores depend on where a cell is, l_i lets the context z_t say where the decoder looked, so
-- that h_t knows which cells it has named. Without l_i the decoder could only guess the next
-- cell from the words so far: on the example's scenes (lambda 0) its attention put 0.70 of
-- the weight on the named item against 0.94 with l_i. The baseline (`attention = false`)
-- is the same decoder with z_t = beta_t * m at every step: it sees which items the canvas
-- holds, not where they are.
--
-- **Loss** (`ShowAttendTell:loss`): the mean cross-entropy per real token (teacher forcing,
-- `<pad>` steps masked by the valid lengths) plus the doubly stochastic regulariser
-- lambda * mean_b sum_i (1 - sum_{t <= valid_len_b} alpha_bti)^2 (the authors' form: summed
-- over cells, averaged over the batch).
--
-- **Fused path.** With an LSTM and attention, teacher forcing (`forward`) runs the step loop
-- (query, scores, softmax and context, gate, LSTM cell) as one C call and one autograd node
-- (`M.show_attend_tell`, src/nn/attn_caption.h), its backward one C call; the output layer runs
-- once over all steps outside it. `fused = false`, `attn.nn.set_fused(false)`, a GRU or the
-- baseline take the step-by-step composition (`composed_forward`), whose forward (over the
-- fused LSTM cell) gives the same bits. Decoding (`step`) stays step by step.
-- @module attn.nn.captioning
-- @usage
-- local cnn = nn.CaptionCNN()                                   -- 28 x 28 items -> 10 classes
-- local feats = cnn:grid(canvases)                              -- (N, 1, 84, 84) -> (N, 9, 64)
-- local dec = nn.ShowAttendTell { vocab_size = #vocab, feature_size = 64, num_cells = 9 }
-- local loss = dec:loss(feats, captions, valid_len, { bos = vocab:id("<bos>") })
local attn = require "attn"
local autograd = require "attn.autograd"
local fused = require "attn.nn.fused"
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local layers = require "attn.nn.layers"
local conv = require "attn.nn.conv"
local containers = require "attn.nn.containers"
local gru = require "attn.nn.gru"
local lstm = require "attn.nn.lstm"
local attention = require "attn.nn.attention"
local loss_mod = require "attn.nn.loss"
local init = require "attn.nn.init"
local check = require "attn.check"

local Module = module.Module
local Linear = linear.Linear
local core = attn.core
local shape_str = core.shape_str

local M = {}

-- ---------------------------------------------------------------- CaptionCNN

--- `nn.CaptionCNN([{channels = {16, 32, 64}, num_classes = 10, cell = 28}])`: the encoder
-- (see the module comment). Children `features` (a Sequential: conv, BatchNorm2d, ReLU,
-- MaxPool2d, twice), `cell` (the cell layer: a Conv2d of kernel and stride cell / 4, then a
-- ReLU) and `fc` (D -> num_classes); `feature_size` D is the last channel count.
-- @type CaptionCNN
local CaptionCNN = Module:extend("CaptionCNN")
M.CaptionCNN = CaptionCNN

function CaptionCNN:init(opts)
  opts = check.options("CaptionCNN", opts, { channels = true, num_classes = true, cell = true }, 4)
  local ch = opts.channels or { 16, 32, 64 }
  if type(ch) ~= "table" or #ch ~= 3 then error("CaptionCNN: channels must be a list of 3 counts", 3) end
  for i = 1, 3 do check.positive_int("CaptionCNN", "channels[" .. i .. "]", ch[i], 4) end
  local classes = check.positive_int("CaptionCNN", "num_classes", opts.num_classes or 10, 4)
  self.cell_size = check.positive_int("CaptionCNN", "cell", opts.cell or 28, 4)
  if self.cell_size % 4 ~= 0 then
    error("CaptionCNN: cell must be a multiple of 4 (two 2 x 2 poolings), got " .. self.cell_size, 3)
  end
  self.features = containers.Sequential(conv.Conv2d(1, ch[1], 3, { padding = 1 }), layers.BatchNorm2d(ch[1]),
    linear.ReLU(), conv.MaxPool2d(2), conv.Conv2d(ch[1], ch[2], 3, { padding = 1 }), layers.BatchNorm2d(ch[2]),
    linear.ReLU(), conv.MaxPool2d(2))
  local k = self.cell_size // 4
  self.cell = containers.Sequential(conv.Conv2d(ch[2], ch[3], k, { stride = k }), linear.ReLU())
  self.fc = Linear(ch[3], classes)
  self.feature_size = ch[3]
end

--- forward(x): items x (N, 1, cell, cell) -> class logits (N, num_classes): `features`, the
-- cell layer (one D-vector per item) and `fc`.
-- @raise naming the shape when x is not (N, 1, cell, cell)
function CaptionCNN:forward(x)
  check.tensor("CaptionCNN", "input", x, 4, "(N, 1, h, w)")
  if x:size(3) ~= self.cell_size or x:size(4) ~= self.cell_size then
    error(string.format("CaptionCNN: items %s must be (N, 1, %d, %d)", shape_str(x:shape()), self.cell_size,
      self.cell_size), 2)
  end
  return self.fc(self.cell(self.features(x)):reshape({ x:size(1), self.feature_size }))
end

--- The annotation vectors of canvases: x (N, 1, H, W) with H and W multiples of `cell` ->
-- (N, L, D), L = (H / cell) (W / cell) cells in reading order (by rows, then columns), each the
-- cell layer's vector of its block of the feature map (what `forward` classifies for one item).
-- @tparam Tensor x (N, 1, H, W)
-- @treturn Tensor (N, L, D)
-- @raise naming the shape when H or W is not a multiple of `cell`
function CaptionCNN:grid(x)
  check.tensor("CaptionCNN:grid", "input", x, 4, "(N, 1, H, W)")
  local H, W = x:size(3), x:size(4)
  if H % self.cell_size ~= 0 or W % self.cell_size ~= 0 then
    error(string.format("CaptionCNN:grid: canvases %s are not made of %d x %d cells", shape_str(x:shape()),
      self.cell_size, self.cell_size), 2)
  end
  local f = self.cell(self.features(x)) -- (N, D, H / cell, W / cell)
  local N, D = f:size(1), f:size(2)
  return f:reshape({ N, D, -1 }):transpose(2, 3)
end

-- ---------------------------------------------------------------- ShowAttendTell

--- `nn.ShowAttendTell{vocab_size, feature_size, num_cells, embed_size = 32, num_hiddens = 64,
-- attention_size = 64, rnn = "lstm" | "gru", attention = true}`: the decoder (see the module
-- comment). Children `embedding`, `init_h` (and `init_c` for the LSTM), `attention` (an
-- nn.AdditiveAttention whose W_k, W_q and w_v the scores use; absent in the baseline),
-- `f_beta`, `rnn` (LSTMCell or GRUCell over embed_size + feature_size inputs) and `fc`
-- (num_hiddens + feature_size -> vocab_size); parameters `position` (num_cells, attention_size),
-- the location term of the scores, and `location` (num_cells, feature_size), that of the
-- annotation vectors (zeros at first).
-- @type ShowAttendTell
local ShowAttendTell = Module:extend("ShowAttendTell")
M.ShowAttendTell = ShowAttendTell

function ShowAttendTell:init(opts)
  local who = "ShowAttendTell"
  opts = check.options(who, opts, { vocab_size = true, feature_size = true, num_cells = true, embed_size = true,
    num_hiddens = true, attention_size = true, rnn = true, attention = true }, 4)
  local V = check.positive_int(who, "vocab_size", opts.vocab_size, 4)
  local D = check.positive_int(who, "feature_size", opts.feature_size, 4)
  local L = check.positive_int(who, "num_cells", opts.num_cells, 4)
  local E = check.positive_int(who, "embed_size", opts.embed_size or 32, 4)
  local H = check.positive_int(who, "num_hiddens", opts.num_hiddens or 64, 4)
  local A = check.positive_int(who, "attention_size", opts.attention_size or 64, 4)
  local kind = opts.rnn or "lstm"
  if kind ~= "lstm" and kind ~= "gru" then error(who .. ": rnn must be 'lstm' or 'gru', got " .. tostring(kind), 3) end
  self.kind, self.num_cells, self.feature_size, self.num_hiddens = kind, L, D, H
  self.attend = opts.attention ~= false
  self.embedding = linear.Embedding(V, E)
  self.init_h = Linear(D, H)
  if kind == "lstm" then self.init_c = Linear(D, H) end
  if self.attend then
    self.attention = attention.AdditiveAttention(D, H, A)
    self:register_parameter("position", init.normal_(attn.zeros(L, A), 0, 0.1))
    -- zeros: no draw from the generator, so the models made after this one start as before
    self:register_parameter("location", attn.zeros(L, D))
  end
  self.f_beta = Linear(H, 1)
  self.rnn = kind == "lstm" and lstm.LSTMCell(E + D, H) or gru.GRUCell(E + D, H)
  self.fc = Linear(H + D, V)
end

--- The decoder's state before the first word: feats (B, L, D) -> `{h =, c =, feats =, mean =,
-- keys =, w_v =}` (c only for the LSTM; with attention, feats are the annotation vectors plus
-- their location term, keys their projection plus the scores' location term (B, L, A), and w_v
-- (A); mean is the plain features' mean).
-- @tparam Tensor feats (B, L, D)
-- @treturn table
-- @raise naming the shapes when feats is not (B, num_cells, feature_size)
function ShowAttendTell:start(feats)
  check.tensor("ShowAttendTell", "feats", feats, 3, "(B, L, D)")
  if feats:size(2) ~= self.num_cells or feats:size(3) ~= self.feature_size then
    error(string.format("ShowAttendTell: feats %s must be (B, %d, %d) (num_cells, feature_size)",
      shape_str(feats:shape()), self.num_cells, self.feature_size), 2)
  end
  local mean = feats:mean(2)
  local s = { feats = feats, mean = mean, h = self.init_h(mean):tanh() }
  if self.kind == "lstm" then s.c = self.init_c(mean):tanh() end
  if self.attend then
    local att = self.attention
    s.feats = feats + self.location
    s.keys = att.W_k(s.feats) + self.position
    s.w_v = att.w_v.weight:reshape({ att.w_v.in_features })
  end
  return s
end

-- One step without the output layer: the next state, the context z_t (B, D) (gated), alpha_t
-- (B, 1, L) or nil, beta_t (B, 1). The attention is attn.additive_attention over the projected
-- keys (scores, softmax and weighted sum as two nodes, the weights differentiable).
local function advance(self, state, tokens)
  local h, feats = state.h, state.feats
  local alpha, context
  if self.attend then
    local qh = self.attention.W_q(h:unsqueeze(2))                         -- (B, 1, A)
    context, alpha = attn.additive_attention(qh, state.keys, feats, state.w_v)  -- (B, 1, D), (B, 1, L)
    context = context:squeeze(2)
  else
    context = state.mean
  end
  local beta = self.f_beta(h):sigmoid()                                   -- (B, 1)
  local z = context * beta
  local x = attn.cat({ self.embedding(tokens), z }, 2)
  local h2, c2
  if self.kind == "lstm" then h2, c2 = self.rnn(x, { h, state.c }) else h2 = self.rnn(x, h) end
  return { h = h2, c = c2, feats = feats, mean = state.mean, keys = state.keys, w_v = state.w_v }, z, alpha, beta
end

--- One step: tokens (B) (int64 or float ids of y_{t-1}) and a state from `start` or `step` ->
-- logits (B, vocab_size), the next state, the attention weights alpha_t (B, L) (nil in the
-- baseline) and the gate beta_t (B, 1). Differentiable throughout.
-- @tparam table state
-- @tparam Tensor tokens (B)
-- @treturn Tensor logits
-- @treturn table state
-- @treturn Tensor|nil alpha
-- @treturn Tensor beta
function ShowAttendTell:step(state, tokens)
  local next_state, z, alpha, beta = advance(self, state, tokens)
  return self.fc(attn.cat({ next_state.h, z }, 2)), next_state, alpha and alpha:squeeze(2), beta
end

--- Teacher forcing: feats (B, L, D), inputs (B, T) token ids (`<bos>` then the caption's first
-- T - 1 tokens) -> logits (B, T, vocab_size), the attention weights (B, T, L) (nil in the
-- baseline) and the gates (B, T). The output layer runs once over every step. With an LSTM and
-- attention the step loop is one fused node (`M.show_attend_tell`, `fused_forward`); otherwise,
-- or with fused paths off (attn.nn.fused), the step-by-step composition (`composed_forward`).
-- @raise naming the shape when inputs is not (B, T)
function ShowAttendTell:forward(feats, inputs)
  check.tensor("ShowAttendTell", "inputs", inputs, 2, "(B, T)")
  return fused.forward(self, feats, inputs)
end

--- Whether the fused node can run (attn.nn.fused): attention and an LSTM cell, with stock
-- children (LSTMCell, AdditiveAttention, Linear gate) that may fuse themselves.
function ShowAttendTell:can_fuse()
  local rnn, att = self.rnn, self.attention
  return self.attend and self.kind == "lstm" and getmetatable(rnn) == lstm.LSTMCell and fused.allowed(rnn)
    and getmetatable(att) == attention.AdditiveAttention and fused.allowed(att)
    and getmetatable(self.f_beta) == Linear and att.W_q.bias == nil
end

--- The fused path of forward: `start`'s state, the embeddings of every step, the step loop as
-- one node (`M.show_attend_tell`) and the output layer over all steps.
function ShowAttendTell:fused_forward(feats, inputs)
  local s, rnn = self:start(feats), self.rnn
  local out, alphas, betas = M.show_attend_tell(s.feats, s.keys, s.w_v, self.embedding(inputs:t()), s.h, s.c,
    self.attention.W_q.weight, self.f_beta.weight, self.f_beta.bias, rnn.weight_ih, rnn.weight_hh, rnn.bias_ih,
    rnn.bias_hh)
  return self.fc(out), alphas, betas
end

--- The composed path of forward: `start`, then one `step` (without the output layer) per word.
function ShowAttendTell:composed_forward(feats, inputs)
  local state = self:start(feats)
  local outs, alphas, betas = {}, {}, {}
  for t = 1, inputs:size(2) do
    local z
    state, z, alphas[t], betas[t] = advance(self, state, inputs:select(2, t))
    outs[t] = attn.cat({ state.h, z }, 2)
  end
  local logits = self.fc(attn.stack(outs, 2))
  return logits, self.attend and attn.cat(alphas, 2) or nil, attn.cat(betas, 2)
end

local function contiguous(t) return t and core.contiguous(t) or nil end

--- The Show, Attend and Tell step loop (LSTM, attention) as one autograd node
-- (src/nn/attn_caption.h): feats (B, L, D), keys (B, L, A) (W_k feats plus the location term),
-- w_v (A) or (1, A), emb (T, B, E) the steps' embeddings (time-major), h0 and c0 (B, H), W_q
-- (A, H), w_beta (1, H) and b_beta (1) or nil (the gate), and the LSTM cell's weight_ih
-- (4H, E + D), weight_hh (4H, H), bias_ih and bias_hh (4H) or nil. Returns cat(h_t, z_t) for
-- every step (B, T, H + D), the attention weights (B, T, L) and the gates (B, T), all
-- differentiable: the numbers of `ShowAttendTell:composed_forward` before its output layer.
-- @usage local out, alphas, betas = captioning.show_attend_tell(feats, keys, w_v, emb, h0, c0, W_q, w_b, b_b,
--   w_ih, w_hh, b_ih, b_hh)
function M.show_attend_tell(feats, keys, w_v, emb, h0, c0, W_q, w_beta, b_beta, w_ih, w_hh, b_ih, b_hh)
  local c = core.contiguous
  local args = { c(feats), c(keys), c(w_v), c(emb), c(h0), c(c0), c(W_q), c(w_beta), contiguous(b_beta), c(w_ih),
    c(w_hh), contiguous(b_ih), contiguous(b_hh) }
  local out, alphas, betas, saved = core.caption_forward(table.unpack(args, 1, 13))
  local inputs = { feats, keys, w_v, emb, h0, c0, W_q, w_beta, b_beta or false, w_ih, w_hh, b_ih or false,
    b_hh or false }
  autograd.record("show_attend_tell", { out, alphas, betas }, inputs, function(gout, galphas, gbetas)
    args[14], args[15], args[16], args[17] = saved, contiguous(gout), contiguous(galphas), contiguous(gbetas)
    return core.caption_backward(table.unpack(args, 1, 17))
  end)
  return out, alphas, betas
end

--- The decoder inputs of teacher forcing: `<bos>` then every caption token but the last.
-- @tparam Tensor captions (B, T) int64
-- @tparam integer bos the id of `<bos>`
-- @treturn Tensor (B, T) int64
function M.teacher_inputs(captions, bos)
  local B, T = captions:size(1), captions:size(2)
  local first = attn.full({ B, 1 }, bos, captions:dtype())
  if T == 1 then return first end
  return attn.cat({ first, captions:narrow(2, 1, T - 1) }, 2)
end

--- The (B, T) mask of real steps: 1 where t <= valid_len[b], else 0 (dtype of `like`).
-- @tparam Tensor valid_len (B)
-- @tparam integer T
-- @tparam[opt] string dtype default "float32"
-- @treturn Tensor (B, T)
function M.step_mask(valid_len, T, dtype)
  local steps = attn.arange(1, T + 1, 1, "float64"):unsqueeze(1)       -- (1, T)
  local lens = core.to(valid_len, "float64"):unsqueeze(2)              -- (B, 1)
  return core.to(steps:le(lens), dtype or "float32")
end

--- The doubly stochastic regulariser: alphas (B, T, L), mask (B, T) of real steps ->
-- mean_b sum_i (1 - sum_t mask_bt alpha_bti)^2, a scalar tensor (differentiable).
-- @tparam Tensor alphas (B, T, L)
-- @tparam Tensor mask (B, T)
-- @treturn Tensor scalar
function M.doubly_stochastic(alphas, mask)
  local total = (alphas * mask:unsqueeze(3)):sum(2)                     -- (B, L)
  return ((1 - total) ^ 2):sum(2):mean()
end

--- The training loss with teacher forcing: feats (B, L, D), captions (B, T) int64 (the
-- targets), valid_len (B) -> cross-entropy per real token + lambda * regulariser (a scalar
-- tensor), and the two parts as numbers.
-- @tparam Tensor feats (B, L, D)
-- @tparam Tensor captions (B, T)
-- @tparam Tensor valid_len (B)
-- @tparam table opts `bos` (the id of `<bos>`, required), `lambda` (default 1; the baseline
--   has no weights to regularise)
-- @treturn Tensor loss
-- @treturn number the cross-entropy per token
-- @treturn number the regulariser (0 in the baseline)
function ShowAttendTell:loss(feats, captions, valid_len, opts)
  opts = check.options("ShowAttendTell:loss", opts, { bos = true, lambda = true })
  local bos = check.positive_int("ShowAttendTell:loss", "bos", opts.bos)
  local lambda = opts.lambda or 1
  local logits, alphas = self(feats, M.teacher_inputs(captions, bos))
  local ce = loss_mod.masked_token_mean(logits, captions, valid_len)
  if not alphas or lambda == 0 then return ce, ce:item(), 0 end
  local reg = M.doubly_stochastic(alphas, M.step_mask(valid_len, captions:size(2), alphas:dtype()))
  return ce + reg * lambda, ce:item(), reg:item()
end

function ShowAttendTell:extra_repr()
  return string.format("%s, cells=%d, features=%d, hiddens=%d%s", self.kind, self.num_cells, self.feature_size,
    self.num_hiddens, self.attend and "" or ", attention=False")
end

return M
