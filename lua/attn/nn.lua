--- `attn.nn`: layers, losses and initialisers with the book's PyTorch names.
--
-- Classes: Module (base; see attn.nn.module for writing your own), Linear,
-- Embedding, Dropout, LayerNorm, ReLU, Identity, GELU, BatchNorm1d, BatchNorm2d, Conv2d, MaxPool2d,
-- AvgPool2d, AdaptiveAvgPool2d, Flatten (attn.nn.conv),
-- Sequential, ModuleList, ModuleDict, GRU, GRUCell, RNN, RNNCell (attn.nn.rnn), LSTM, LSTMCell
-- (attn.nn.lstm), CaptionCNN and ShowAttendTell (image captioning; attn.nn.captioning), the book's seq2seq models
-- (Encoder, Decoder, AttentionDecoder, EncoderDecoder, Seq2SeqEncoder,
-- Seq2SeqDecoder, Seq2SeqAttentionDecoder; attn.nn.seq2seq) and Transformer
-- (PositionWiseFFN, AddNorm, TransformerEncoderBlock, TransformerEncoder,
-- TransformerDecoderBlock, TransformerDecoder; attn.nn.transformer), AdditiveAttention,
-- DotProductAttention, MultiHeadAttention, PositionalEncoding,
-- LearnedPositionalEncoding, CrossEntropyLoss, NLLLoss, MaskedSoftmaxCELoss; PyTorch's MultiheadAttention
-- (attn.nn.torch_attention), TransformerEncoderLayer, TransformerDecoderLayer, Transformer and
-- TorchTransformerEncoder / TorchTransformerDecoder (attn.nn.torch_transformer); today's
-- RMSNorm, SwiGLU, RotaryEmbedding (attn.nn.modern) and CausalSelfAttention, DecoderOnlyBlock,
-- DecoderOnlyTransformer with a KV cache and generate (attn.nn.decoder_only); EfficientAttention,
-- PerformerAttention, LinformerAttention (attn.nn.efficient).
-- `nn.TransformerEncoder` and `nn.TransformerDecoder` build PyTorch's class when the first argument
-- is a layer module and the book's when it is the vocabulary size; `nn.D2LTransformerEncoder` and
-- `nn.D2LTransformerDecoder` name the book's classes.
-- Functions: nn.init.* (xavier_uniform_, uniform_, normal_, zeros_, ...),
-- nn.clip_grad_norm_ (alias nn.clip_grad_norm), nn.clip_grad_value_, nn.masked_token_mean, nn.cross_entropy,
-- nn.cross_entropy_loss, nn.dropout, nn.conv2d, nn.max_pool2d, nn.avg_pool2d, nn.adaptive_avg_pool2d (attn.nn.conv),
-- nn.silu, nn.filter_logits (generate's top-k/top-p filter),
-- nn.class / nn.is_module, nn.deep_copy, nn.set_fused / nn.fused_enabled (one switch for every
-- fused path; attn.nn.fused).
--
-- Construct a layer by calling its class (`nn.Linear(3, 4)`), run it by calling
-- the instance (`layer(x)`). Sequential children are named "0", "1", ... like
-- PyTorch's, so state dicts saved from the book's code load unchanged.
-- @module attn.nn
local module = require "attn.nn.module"
local linear = require "attn.nn.linear"
local gru = require "attn.nn.gru"
local rnn = require "attn.nn.rnn"
local lstm = require "attn.nn.lstm"
local captioning = require "attn.nn.captioning"
local attention = require "attn.nn.attention"
local loss = require "attn.nn.loss"
local clip = require "attn.nn.clip"
local containers = require "attn.nn.containers"
local layers = require "attn.nn.layers"
local seq2seq = require "attn.nn.seq2seq"
local transformer = require "attn.nn.transformer"
local fused = require "attn.nn.fused"
local torch_attention = require "attn.nn.torch_attention"
local torch_transformer = require "attn.nn.torch_transformer"
local modern = require "attn.nn.modern"
local decoder_only = require "attn.nn.decoder_only"
local conv = require "attn.nn.conv"
local efficient = require "attn.nn.efficient"

local nn = {
  Module = module.Module,
  class = module.class,
  is_module = module.is_module,
  init = require "attn.nn.init",
  clip_grad_norm_ = clip.clip_grad_norm_,
  clip_grad_norm = clip.clip_grad_norm_, -- the name before PyTorch's in-place underscore
  clip_grad_value_ = clip.clip_grad_value_,
  dropout = linear.dropout,
  fused = fused,
  set_fused = fused.set_fused,
  fused_enabled = fused.enabled,
}

for _, name in ipairs { "Linear", "Embedding", "Dropout", "LayerNorm", "ReLU", "Sequential" } do nn[name] = linear[name] end
for _, name in ipairs { "ModuleList", "ModuleDict" } do nn[name] = containers[name] end
for _, name in ipairs { "Identity", "GELU", "BatchNorm1d", "BatchNorm2d" } do nn[name] = layers[name] end
for _, name in ipairs { "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Flatten", "conv2d", "max_pool2d",
  "avg_pool2d", "adaptive_avg_pool2d" } do
  nn[name] = conv[name]
end
for _, name in ipairs { "Encoder", "Decoder", "AttentionDecoder", "EncoderDecoder", "Seq2SeqEncoder", "Seq2SeqDecoder",
  "Seq2SeqAttentionDecoder" } do
  nn[name] = seq2seq[name]
end
for _, name in ipairs { "PositionWiseFFN", "AddNorm", "TransformerEncoderBlock", "TransformerEncoder",
  "TransformerDecoderBlock", "TransformerDecoder" } do
  nn[name] = transformer[name]
end
nn.GRU = gru.GRU
nn.GRUCell = gru.GRUCell
nn.RNN = rnn.RNN
nn.RNNCell = rnn.RNNCell
nn.LSTM = lstm.LSTM
nn.LSTMCell = lstm.LSTMCell
nn.CaptionCNN = captioning.CaptionCNN
nn.ShowAttendTell = captioning.ShowAttendTell
nn.cross_entropy = loss.cross_entropy
nn.masked_token_mean = loss.masked_token_mean
nn.CrossEntropyLoss = loss.CrossEntropyLoss
nn.NLLLoss = loss.NLLLoss
nn.cross_entropy_loss = loss.cross_entropy_loss
nn.MaskedSoftmaxCELoss = loss.MaskedSoftmaxCELoss
for _, name in ipairs { "AdditiveAttention", "DotProductAttention", "MultiHeadAttention", "PositionalEncoding",
  "LearnedPositionalEncoding" } do
  nn[name] = attention[name]
end
nn.MultiheadAttention = torch_attention.MultiheadAttention
-- PyTorch's Transformer classes; nn.TransformerEncoder / nn.TransformerDecoder pick PyTorch's or the
-- book's class by their first argument (attn.nn.torch_transformer)
for _, name in ipairs { "TransformerEncoderLayer", "TransformerDecoderLayer", "TorchTransformerEncoder",
  "TorchTransformerDecoder", "Transformer", "deep_copy" } do
  nn[name] = torch_transformer[name]
end
--- The book's TransformerEncoder class (attn.nn.transformer) by a name of its own.
-- @table D2LTransformerEncoder
nn.D2LTransformerEncoder = transformer.TransformerEncoder
--- The book's TransformerDecoder class (attn.nn.transformer) by a name of its own.
-- @table D2LTransformerDecoder
nn.D2LTransformerDecoder = transformer.TransformerDecoder
for name, d in pairs(torch_transformer.dispatchers(transformer)) do nn[name] = d end
-- today's decoder-only models (attn.nn.modern, attn.nn.decoder_only)
for _, name in ipairs { "RMSNorm", "SwiGLU", "RotaryEmbedding", "silu" } do nn[name] = modern[name] end
for _, name in ipairs { "CausalSelfAttention", "DecoderOnlyBlock", "DecoderOnlyTransformer", "filter_logits" } do
  nn[name] = decoder_only[name]
end
-- efficient attention (attn.nn.efficient)
for _, name in ipairs { "EfficientAttention", "PerformerAttention", "LinformerAttention" } do nn[name] = efficient[name] end

return nn
