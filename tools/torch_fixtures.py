#!/usr/bin/python3
"""PyTorch parity fixtures for attn's nn.MultiheadAttention, Transformer, GRU, GRUCell, RNN,
Embedding, LSTM and LSTMCell classes, and the CNN layers (Conv2d, BatchNorm2d, MaxPool2d,
AdaptiveAvgPool2d, Flatten).

Run with a Python that has torch (written against PyTorch 1.13):

    /usr/bin/python3 tools/torch_fixtures.py [outdir]   # default spec/fixtures/torch

Each case builds one module with a fixed seed in float64, in eval mode (cnn_train: train mode)
with dropout 0, runs a
forward on fixed inputs and masks, and backpropagates sum(output * grad_output) (plus the weights'
term for MultiheadAttention). It writes one safetensors file per case (written by hand here: an
8-byte little-endian header length, a JSON header of dtype / shape / data_offsets, raw
little-endian bytes), with tensors named

    state.<key>         the module's state dict, PyTorch's keys
    input.<name>        query / key / value, src / tgt, memory; input / h0 / c0 (recurrent layers),
                        ids (Embedding: PyTorch's 0-based ids, as int64)
    mask.<name>         masks under their forward argument names; bool masks as I64 0/1
    output.0, output.1  the forward's results (output.1: MultiheadAttention's weights; LSTM:
    output.2            output, h_n, c_n; LSTMCell: h', c')
    grad_output.0/1/2   the gradients fed back
    grad.input.<name>   gradients of the inputs
    grad.state.<key>    gradients of the parameters
    after.<key>         the state after the forward (Embedding with max_norm renormalises rows;
                        cnn_train's BatchNorm2d running statistics)

The module's options are in the spec (spec/nn/torch_fixtures.lua), mirrored from CASES below.
No row of any mask here is fully masked (PyTorch 1.13 gives NaN there; attn gives zeros).
"""
import json
import os
import struct
import sys

import torch

torch.set_default_dtype(torch.float64)

DTYPES = {torch.float64: ("F64", "<d"), torch.int64: ("I64", "<q")}


def save_safetensors(path, tensors, metadata):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        if t.dtype == torch.bool:
            t = t.to(torch.int64)
        code, fmt = DTYPES[t.dtype]
        flat = t.flatten().tolist()
        blob = struct.pack("<%d%s" % (len(flat), fmt[1]), *flat)
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the format allows trailing spaces; aligned data
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for blob in blobs:
            f.write(blob)


def causal(n):
    return torch.nn.Transformer.generate_square_subsequent_mask(n).to(torch.float64)


def padding(rows):
    """A bool key_padding_mask from 0/1 rows (1 = padding)."""
    return torch.tensor(rows, dtype=torch.bool)


def run(module, inputs, masks, call, n_out):
    """Forward, backward with random output gradients; returns the tensors to save."""
    for x in inputs.values():
        if x.is_floating_point():
            x.requires_grad_(True)
    outs = call(module, inputs, masks)
    outs = outs if isinstance(outs, tuple) else (outs,)
    outs = outs[:n_out]
    loss = 0
    saved = {}
    for i, o in enumerate(outs):
        g = torch.randn(o.shape)
        saved["output.%d" % i] = o
        saved["grad_output.%d" % i] = g
        loss = loss + (o * g).sum()
    loss.backward()
    for k, v in module.state_dict().items():
        saved["state." + k] = v
    for k, p in module.named_parameters():
        saved["grad.state." + k] = p.grad
    for k, x in inputs.items():
        saved["input." + k] = x
        if x.grad is not None:
            saved["grad.input." + k] = x.grad
    for k, m in masks.items():
        saved["mask." + k] = m
    return saved


def mha_call(opts):
    def call(m, i, masks):
        q = i["query"]
        k = i.get("key", q)
        v = i.get("value", k)
        return m(q, k, v, **masks, **opts)
    return call


def mha_case(E, H, shapes, masks, fwd_opts=None, self_attention=False, **opts):
    m = torch.nn.MultiheadAttention(E, H, dropout=0.0, **opts).eval()
    kd, vd = opts.get("kdim", E), opts.get("vdim", E)
    inputs = {"query": torch.randn(shapes[0] + (E,))}
    if not self_attention:
        inputs["key"] = torch.randn(shapes[1] + (kd,))
        inputs["value"] = torch.randn(shapes[1] + (vd,))
    fwd_opts = fwd_opts or {}
    n_out = 1 if fwd_opts.get("need_weights") is False else 2
    return run(m, inputs, masks, mha_call(fwd_opts), n_out)


def layer_case(cls, d, H, shapes, masks, **opts):
    m = cls(d, H, dropout=0.0, **opts).eval()
    names = ("src",) if cls is torch.nn.TransformerEncoderLayer else ("tgt", "memory")
    inputs = {n: torch.randn(s + (d,)) for n, s in zip(names, shapes)}
    return run(m, inputs, masks, lambda m, i, k: m(*[i[n] for n in names], **k), 1)


def cases():
    bf = {"batch_first": True}
    L, S, N = 3, 4, 2
    yield "mha_plain", lambda: mha_case(8, 2, ((L, N), (S, N)), {})
    yield "mha_bool_masks", lambda: mha_case(8, 2, ((L, N), (S, N)), {
        "key_padding_mask": padding([[0, 0, 1, 0], [0, 0, 0, 1]]),
        "attn_mask": torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)})
    yield "mha_float_masks", lambda: mha_case(8, 2, ((L, N), (S, N)), {
        "key_padding_mask": padding([[0, 0, 1, 0], [0, 0, 0, 0]]),
        "attn_mask": torch.randn(L, S)}, {"average_attn_weights": False})
    # a float key_padding_mask alone: PyTorch 1.13 adds it (as documented); with a float attn_mask
    # as well 1.13 treats it as boolean (masked_fill), which 2.x and attn do not (they add both)
    yield "mha_float_padding", lambda: mha_case(8, 2, ((L, N), (S, N)), {
        "key_padding_mask": torch.tensor([[0.0, -0.5, float("-inf"), 0.25], [0.0, 0.0, 0.0, 1.0]])})
    yield "mha_kvdim_batch_first", lambda: mha_case(6, 3, ((N, L), (N, S)), {
        "attn_mask": torch.rand(N * 3, L, S) < 0.3 * torch.tensor([1.0, 1.0, 1.0, 0.0])},
        {"average_attn_weights": False}, kdim=5, vdim=3, **bf)
    yield "mha_self_causal", lambda: mha_case(8, 4, ((S, N), None), {
        "attn_mask": causal(S), "key_padding_mask": padding([[0, 0, 0, 1], [0, 0, 0, 0]])},
        self_attention=True)
    yield "mha_unbatched_no_bias", lambda: mha_case(4, 2, ((L,), (S,)), {
        "key_padding_mask": padding([0, 1, 0, 0])}, bias=False)
    yield "mha_no_weights_float_bias", lambda: mha_case(4, 1, ((L, N), (S, N)), {
        "attn_mask": torch.randn(N, L, S)}, {"need_weights": False})
    enc, dec = torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer
    yield "encoder_layer_post_relu", lambda: layer_case(enc, 8, 2, ((S, N),), {
        "src_mask": torch.randn(S, S), "src_key_padding_mask": padding([[0, 0, 1, 0], [0, 0, 0, 0]])},
        dim_feedforward=16)
    yield "encoder_layer_pre_gelu", lambda: layer_case(enc, 8, 2, ((N, S),), {
        "src_mask": causal(S)}, dim_feedforward=12, activation="gelu", norm_first=True, **bf)
    yield "decoder_layer_post", lambda: layer_case(dec, 8, 2, ((L, N), (S, N)), {
        "tgt_mask": causal(L), "memory_mask": torch.randn(L, S),
        "tgt_key_padding_mask": padding([[0, 0, 1], [0, 0, 0]]),
        "memory_key_padding_mask": padding([[0, 1, 0, 0], [0, 0, 0, 1]])}, dim_feedforward=16)
    yield "decoder_layer_pre_batch_first", lambda: layer_case(dec, 4, 2, ((N, L), (N, S)), {
        "tgt_mask": causal(L)}, dim_feedforward=8, norm_first=True, layer_norm_eps=1e-3, **bf)

    def transformer():
        m = torch.nn.Transformer(d_model=4, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                 dim_feedforward=8, dropout=0.0).eval()
        inputs = {"src": torch.randn(S, N, 4), "tgt": torch.randn(L, N, 4)}
        masks = {"src_mask": torch.randn(S, S), "tgt_mask": causal(L),
                 "memory_mask": torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool),
                 "src_key_padding_mask": padding([[0, 0, 0, 1], [0, 0, 0, 0]]),
                 "tgt_key_padding_mask": padding([[0, 0, 0], [0, 1, 0]]),
                 "memory_key_padding_mask": padding([[0, 0, 1, 0], [0, 0, 0, 0]])}
        return run(m, inputs, masks, lambda m, i, k: m(i["src"], i["tgt"], **k), 1)
    yield "transformer", transformer

    def encoder_stack():
        layer = torch.nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.0)
        m = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(4)).eval()
        with torch.no_grad():  # layers that differ (PyTorch's copies start equal)
            for p in m.layers[1].parameters():
                p.add_(0.1 * torch.randn(p.shape))
        inputs = {"src": torch.randn(S, N, 4)}
        masks = {"mask": torch.randn(S, S), "src_key_padding_mask": padding([[0, 1, 0, 0], [0, 0, 0, 0]])}
        return run(m, inputs, masks, lambda m, i, k: m(i["src"], **k), 1)
    yield "encoder_stack", encoder_stack

    # recurrent layers: output.0 the outputs, output.1 h_n (GRUCell: output.0 = h')
    def recurrent(m, x_shape, h_shape):
        inputs = {"input": torch.randn(x_shape)}
        if h_shape is not None:
            inputs["h0"] = torch.randn(h_shape)
        n_out = 2 if isinstance(m, torch.nn.RNNBase) else 1
        return run(m, inputs, {}, lambda m, i, k: m(i["input"], i.get("h0")), n_out)
    yield "gru_bidirectional_batch_first", lambda: recurrent(torch.nn.GRU(
        3, 4, 2, batch_first=True, bidirectional=True), (N, S, 3), (4, N, 4))
    yield "gru_no_bias", lambda: recurrent(torch.nn.GRU(3, 4, 2, bias=False), (S, N, 3), None)
    yield "gru_unbatched", lambda: recurrent(torch.nn.GRU(3, 2, 1, bidirectional=True), (S, 3), (2, 2))
    yield "gru_cell", lambda: recurrent(torch.nn.GRUCell(3, 4), (N, 3), (N, 4))
    yield "rnn_relu_bidirectional", lambda: recurrent(torch.nn.RNN(
        3, 4, 2, nonlinearity="relu", bidirectional=True), (S, N, 3), (4, N, 4))
    yield "rnn_cell_tanh_unbatched", lambda: recurrent(torch.nn.RNNCell(3, 4), (3,), (4,))

    def embedding(**opts):
        def make():
            m = torch.nn.Embedding(7, 3, **opts)
            before = {k: v.clone() for k, v in m.state_dict().items()}
            ids = torch.tensor([[0, 5, 3, 5], [6, 1, 5, 0]])
            saved = run(m, {"ids": ids}, {}, lambda m, i, k: m(i["ids"]), 1)
            for k, v in before.items():
                saved["after." + k] = saved["state." + k]
                saved["state." + k] = v
            return saved
        return make
    # padding_idx 5 is attn's 6; -2 is the same row in both
    yield "embedding_padding", embedding(padding_idx=5)
    yield "embedding_padding_max_norm", embedding(padding_idx=-2, max_norm=1.2, norm_type=1.5)

    # a small CNN (Conv2d, BatchNorm2d, ReLU, MaxPool2d, grouped dilated Conv2d, AdaptiveAvgPool2d,
    # Flatten, Linear) in train mode (batch statistics; after.* holds the running statistics the
    # step leaves) and in eval mode (running statistics set to random values first)
    def cnn(train):
        def make():
            nn = torch.nn
            m = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(4, 6, 3, groups=2, dilation=2, padding=2), nn.AdaptiveAvgPool2d((2, 2)),
                              nn.Flatten(), nn.Linear(24, 5))
            with torch.no_grad():
                m[1].weight.uniform_(0.5, 1.5)
                m[1].bias.normal_()
                m[1].running_mean.normal_()
                m[1].running_var.uniform_(0.5, 2.0)
                m[1].num_batches_tracked.fill_(3)
            m.train(train)
            before = {k: v.clone() for k, v in m.state_dict().items()}
            saved = run(m, {"input": torch.randn(3, 2, 10, 10)}, {}, lambda m, i, k: m(i["input"]), 1)
            for k, v in before.items():
                if train and k.startswith("1."):
                    saved["after." + k] = saved["state." + k]
                saved["state." + k] = v
            return saved
        return make
    yield "cnn_train", cnn(True)
    yield "cnn_eval", cnn(False)
    # LSTM: output.0 the outputs, output.1 h_n, output.2 c_n (LSTMCell: h', c'); the state is
    # (h0, c0) (appended last so the cases above keep their seeds)
    def lstm(m, x_shape, s_shape):
        inputs = {"input": torch.randn(x_shape)}
        if s_shape is not None:
            inputs["h0"], inputs["c0"] = torch.randn(s_shape), torch.randn(s_shape)
        layer = isinstance(m, torch.nn.LSTM)

        def call(m, i, k):
            r = m(i["input"], (i["h0"], i["c0"]) if "h0" in i else None)
            return (r[0], r[1][0], r[1][1]) if layer else r
        return run(m, inputs, {}, call, 3 if layer else 2)
    yield "lstm_bidirectional_batch_first", lambda: lstm(torch.nn.LSTM(
        3, 4, 2, batch_first=True, bidirectional=True), (N, S, 3), (4, N, 4))
    yield "lstm_no_bias", lambda: lstm(torch.nn.LSTM(3, 4, 2, bias=False), (S, N, 3), None)
    yield "lstm_unbatched", lambda: lstm(torch.nn.LSTM(3, 2, 1, bidirectional=True), (S, 3), (2, 2))
    yield "lstm_cell", lambda: lstm(torch.nn.LSTMCell(3, 4), (N, 3), (N, 4))
    yield "lstm_cell_unbatched_no_bias", lambda: lstm(torch.nn.LSTMCell(3, 4, bias=False), (3,), (4,))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "spec", "fixtures",
                                                             "torch")
    os.makedirs(out, exist_ok=True)
    for i, (name, make) in enumerate(cases()):
        torch.manual_seed(1000 + i)
        saved = make()
        path = os.path.join(out, name + ".safetensors")
        save_safetensors(path, saved, {"case": name, "torch": torch.__version__,
                                       "generator": "tools/torch_fixtures.py"})
        print("%-32s %6d bytes" % (name, os.path.getsize(path)))


if __name__ == "__main__":
    main()
