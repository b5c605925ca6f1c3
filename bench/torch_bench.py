"""PyTorch side of `make bench`: the same rows as bench/bench.lua, one thread.

Reads a JSON list of cases on stdin and prints a JSON object {"version": ..., "rows": {id: seconds}}
(fwd / fwd_bwd for attention rows). Times are process CPU time, the best of a few rounds, as the
Lua side measures them, so other load on a shared machine disturbs both alike. Models follow the
book's definitions (d2l, chapter "Attention Mechanisms and Transformers"), written out here.
"""
import json
import math
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)
torch.manual_seed(0)


def best_time(fn, budget):
    fn()  # warm-up
    best = math.inf
    for _ in range(3):
        reps, t0 = 0, time.process_time()
        while True:
            fn()
            reps += 1
            elapsed = time.process_time() - t0
            if elapsed >= budget / 3:
                break
        best = min(best, elapsed / reps)
    return best


# ---------------------------------------------------------------- the book's layers

def masked_softmax(X, valid_lens):
    if valid_lens is None:
        return F.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = X.reshape(-1, shape[-1])
    mask = torch.arange(shape[-1], dtype=torch.float32)[None, :] < valid_lens[:, None]
    X = X.masked_fill(~mask, -1e6)
    return F.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None, causal=False):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        if causal:
            n = scores.shape[-1]
            keep = torch.ones(n, n, dtype=torch.bool).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class AdditiveAttention(nn.Module):
    def __init__(self, key_size, query_size, num_hiddens, dropout):
        super().__init__()
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens):
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class MultiHeadAttention(nn.Module):
    def __init__(self, num_hiddens, num_heads, dropout, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_k = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_v = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_o = nn.LazyLinear(num_hiddens, bias=bias)

    def split(self, X):
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1).permute(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def merge(self, X):
        X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2]).permute(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)

    def forward(self, queries, keys, values, valid_lens, causal=False):
        q, k, v = self.split(self.W_q(queries)), self.split(self.W_k(keys)), self.split(self.W_v(values))
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        return self.W_o(self.merge(self.attention(q, k, v, valid_lens, causal)))


class PositionalEncoding(nn.Module):
    def __init__(self, num_hiddens, dropout, max_len=1000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.P = torch.zeros((1, max_len, num_hiddens))
        X = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
            10000, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens)
        self.P[:, :, 0::2] = torch.sin(X)
        self.P[:, :, 1::2] = torch.cos(X)

    def forward(self, X):
        return self.dropout(X + self.P[:, :X.shape[1], :])


class AddNorm(nn.Module):
    def __init__(self, shape, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(shape)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


def ffn(hidden, out):
    return nn.Sequential(nn.LazyLinear(hidden), nn.ReLU(), nn.LazyLinear(out))


class EncoderBlock(nn.Module):
    def __init__(self, h, f, heads, dropout):
        super().__init__()
        self.attention = MultiHeadAttention(h, heads, dropout)
        self.addnorm1, self.ffn, self.addnorm2 = AddNorm(h, dropout), ffn(f, h), AddNorm(h, dropout)

    def forward(self, X, valid_lens):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
        return self.addnorm2(Y, self.ffn(Y))


class DecoderBlock(nn.Module):
    """Training-time decoder block: the whole target at once, causal self-attention."""

    def __init__(self, h, f, heads, dropout):
        super().__init__()
        self.attention1, self.attention2 = MultiHeadAttention(h, heads, dropout), MultiHeadAttention(h, heads, dropout)
        self.addnorm1, self.addnorm2, self.addnorm3 = AddNorm(h, dropout), AddNorm(h, dropout), AddNorm(h, dropout)
        self.ffn = ffn(f, h)

    def forward(self, X, enc_outputs, enc_valid_lens):
        Y = self.addnorm1(X, self.attention1(X, X, X, None, causal=True))
        Z = self.addnorm2(Y, self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens))
        return self.addnorm3(Z, self.ffn(Z))


class Transformer(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, h, f, heads, blocks, dropout):
        super().__init__()
        self.h = h
        self.enc_emb, self.dec_emb = nn.Embedding(src_vocab, h), nn.Embedding(tgt_vocab, h)
        self.pos = PositionalEncoding(h, dropout)
        self.enc = nn.ModuleList([EncoderBlock(h, f, heads, dropout) for _ in range(blocks)])
        self.dec = nn.ModuleList([DecoderBlock(h, f, heads, dropout) for _ in range(blocks)])
        self.dense = nn.LazyLinear(tgt_vocab)

    def forward(self, src, src_len, dec_in):
        X = self.pos(self.enc_emb(src) * math.sqrt(self.h))
        for blk in self.enc:
            X = blk(X, src_len)
        Y = self.pos(self.dec_emb(dec_in) * math.sqrt(self.h))
        for blk in self.dec:
            Y = blk(Y, X, src_len)
        return self.dense(Y)


def greedy_decode(model, src, src_len, steps):
    """d2l's predict_seq2seq for a batch: the encoder once, then one position per step with each
    decoder block's past inputs cached (the book's state[2]), argmax tokens, no early stop."""
    X = model.pos(model.enc_emb(src) * math.sqrt(model.h))
    for blk in model.enc:
        X = blk(X, src_len)
    B = src.shape[0]
    tok = torch.full((B, 1), 3, dtype=torch.long)
    cache = [None] * len(model.dec)
    for _ in range(steps):
        Y = model.pos(model.dec_emb(tok) * math.sqrt(model.h))
        for i, blk in enumerate(model.dec):
            cache[i] = Y if cache[i] is None else torch.cat((cache[i], Y), dim=1)
            Z = blk.addnorm1(Y, blk.attention1(Y, cache[i], cache[i], None))
            Z = blk.addnorm2(Z, blk.attention2(Z, X, X, src_len))
            Y = blk.addnorm3(Z, blk.ffn(Z))
        tok = model.dense(Y).argmax(dim=-1)
    return tok


class Seq2SeqAttention(nn.Module):
    """The book's GRU encoder and Bahdanau attention decoder (one decoder step per target position)."""

    def __init__(self, vocab, embed, hidden, layers, dropout):
        super().__init__()
        self.enc_emb = nn.Embedding(vocab, embed)
        self.enc_rnn = nn.GRU(embed, hidden, layers, dropout=dropout)
        self.attention = AdditiveAttention(hidden, hidden, hidden, dropout)
        self.dec_emb = nn.Embedding(vocab, embed)
        self.dec_rnn = nn.GRU(embed + hidden, hidden, layers, dropout=dropout)
        self.dense = nn.LazyLinear(vocab)

    def forward(self, src, src_len, dec_in):
        enc_out, state = self.enc_rnn(self.enc_emb(src.t()))
        keys = enc_out.permute(1, 0, 2)
        X = self.dec_emb(dec_in).permute(1, 0, 2)
        outs = []
        for x in X:
            query = torch.unsqueeze(state[-1], dim=1)
            context = self.attention(query, keys, keys, src_len)
            x = torch.cat((context, torch.unsqueeze(x, dim=1)), dim=-1)
            out, state = self.dec_rnn(x.permute(1, 0, 2), state)
            outs.append(out)
        return self.dense(torch.cat(outs, dim=0)).permute(1, 0, 2)


class ShowAttendTell(nn.Module):
    """attn.nn.captioning's decoder (Xu et al. 2015): LSTM cell, additive attention over the cells
    with location terms on the scores and on the annotation vectors, the scalar gate, the output
    layer on [h, z]."""
    def __init__(self, V, D, L, E, H, A):
        super().__init__()
        self.embedding = nn.Embedding(V, E)
        self.init_h, self.init_c = nn.Linear(D, H), nn.Linear(D, H)
        self.W_k, self.W_q = nn.Linear(D, A, bias=False), nn.Linear(H, A, bias=False)
        self.w_v = nn.Linear(A, 1, bias=False)
        self.position = nn.Parameter(torch.randn(L, A) * 0.1)
        self.location = nn.Parameter(torch.zeros(L, D))
        self.f_beta = nn.Linear(H, 1)
        self.rnn = nn.LSTMCell(E + D, H)
        self.fc = nn.Linear(H + D, V)

    def forward(self, feats, inputs):
        mean = feats.mean(1)
        h, c = torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))
        feats = feats + self.location
        keys = self.W_k(feats) + self.position
        logits, alphas = [], []
        for t in range(inputs.shape[1]):
            alpha = self.w_v(torch.tanh(keys + self.W_q(h).unsqueeze(1))).squeeze(2).softmax(1)
            z = torch.bmm(alpha.unsqueeze(1), feats).squeeze(1) * torch.sigmoid(self.f_beta(h))
            h, c = self.rnn(torch.cat([self.embedding(inputs[:, t]), z], 1), (h, c))
            logits.append(self.fc(torch.cat([h, z], 1)))
            alphas.append(alpha)
        return torch.stack(logits, 1), torch.stack(alphas, 1)


def masked_ce(pred, label, valid_len):
    keep = (torch.arange(label.shape[1])[None, :] < valid_len[:, None]).float()
    loss = F.cross_entropy(pred.permute(0, 2, 1), label, reduction="none")
    return (loss * keep).mean(dim=1)


def train_step(model, opt, batch):
    src, src_len, dec_in, label, label_len = batch

    def step():
        opt.zero_grad()
        masked_ce(model(src, src_len, dec_in), label, label_len).sum().backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1)
        opt.step()
    return step


def batch_of(c):
    g = torch.Generator().manual_seed(1)
    B, T, V = c["batch"], c["steps"], c["vocab"]
    src = torch.randint(4, c.get("src_vocab", V), (B, T), generator=g)
    dec = torch.randint(4, V, (B, T), generator=g)
    lens = torch.randint(2, T + 1, (B,), generator=g)
    return src, lens, dec, dec, lens


def run_case(c, budget):
    kind = c["kind"]
    if kind == "attention":
        B, N, d, causal = c["B"], c["N"], c["d"], c["causal"]
        q, k, v = (torch.randn(B, N, d, requires_grad=True) for _ in range(3))
        att = DotProductAttention(0)

        def fwd():
            with torch.no_grad():
                att(q, k, v, None, causal)

        def fwd_bwd():
            out = att(q, k, v, None, causal)
            out.backward(torch.ones_like(out))
        return {"fwd": best_time(fwd, budget), "fwd_bwd": best_time(fwd_bwd, budget)}
    if kind == "one_op":
        x = torch.randn(64, 32, requires_grad=True)

        def one_op():
            y = x.tanh()
            y.backward(y)
            x.grad = None
        return {"time": best_time(one_op, budget)}
    if kind == "dot":
        q, k, v = torch.randn(2, 1, 2), torch.ones(2, 10, 2), torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
        att, lens = DotProductAttention(0.5).eval(), torch.tensor([2, 6])
        return {"time": best_time(lambda: att(q, k, v, lens), budget)}
    if kind == "additive":
        q, k, v = torch.normal(0, 1, (2, 1, 20)), torch.ones(2, 10, 2), torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
        att, lens = AdditiveAttention(2, 20, 8, 0.1).eval(), torch.tensor([2, 6])
        return {"time": best_time(lambda: att(q, k, v, lens), budget)}
    if kind == "mha":
        att = MultiHeadAttention(100, 5, 0.5).eval()
        X, Y, lens = torch.ones(2, 4, 100), torch.ones(2, 6, 100), torch.tensor([3, 2])
        att(X, Y, Y, lens)
        return {"time": best_time(lambda: att(X, Y, Y, lens), budget)}
    if kind == "mha_step":
        B, T, h = c["batch"], c["steps"], c["hidden"]
        att = MultiHeadAttention(h, c["heads"], 0.1)
        X = torch.randn(B, T, h)
        att(X, X, X, None)
        opt = torch.optim.Adam(att.parameters(), lr=0.005)

        def step():
            opt.zero_grad()
            att(X, X, X, None).sum().backward()
            opt.step()
        return {"time": best_time(step, budget)}
    if kind == "gru_step":
        B, T, e, h, layers = c["batch"], c["steps"], c["embed"], c["hidden"], c["layers"]
        emb, rnn = nn.Embedding(c["vocab"], e), nn.GRU(e, h, layers, dropout=0.1)
        src = batch_of(c)[0]

        def step():
            out, state = rnn(emb(src.t()))
            (out.sum() + state.sum()).backward()
        return {"time": best_time(step, budget)}
    if kind == "lstm_step":
        B, T, e, h, layers = c["batch"], c["steps"], c["embed"], c["hidden"], c["layers"]
        emb, rnn = nn.Embedding(c["vocab"], e), nn.LSTM(e, h, layers, dropout=0.1)
        src = batch_of(c)[0]

        def step():
            out, (hn, cn) = rnn(emb(src.t()))
            (out.sum() + hn.sum() + cn.sum()).backward()
        return {"time": best_time(step, budget)}
    if kind == "bahdanau":
        model = Seq2SeqAttention(c["vocab"], c["embed"], c["hidden"], c["layers"], 0.2)
        batch = batch_of(c)
        model(*batch[:3])
        opt = torch.optim.Adam(model.parameters(), lr=0.005)
        return {"time": best_time(train_step(model, opt, batch), budget)}
    if kind == "transformer":
        model = Transformer(c.get("src_vocab", c["vocab"]), c["vocab"], c["hidden"], c["ffn"], c["heads"],
                            c["layers"], 0.2)
        batch = batch_of(c)
        model(*batch[:3])
        opt = torch.optim.Adam(model.parameters(), lr=0.005)
        return {"time": best_time(train_step(model, opt, batch), budget)}
    if kind == "decode":  # batched greedy decoding as bench.lua's issue25_decode: a fixed number of steps
        model = Transformer(c["src_vocab"], c["vocab"], c["hidden"], c["ffn"], c["heads"], c["layers"], 0.1)
        src, lens = batch_of(c)[:2]
        model(src, lens, src[:, :1] % c["vocab"])  # materialise the lazy layers
        model.eval()

        def decode():
            with torch.no_grad():
                return greedy_decode(model, src, lens, c["steps"])
        return {"time": best_time(decode, budget)}
    if kind in ("torch_mha_step", "torch_encoder_step"):
        # PyTorch's own modules with their defaults, as bench.lua trains attn's: out.sum() backward, Adam
        E, heads, L, N, bf = c["hidden"], c["heads"], c["steps"], c["batch"], c["batch_first"]
        X = torch.randn(N, L, E) if bf else torch.randn(L, N, E)
        if kind == "torch_mha_step":
            model = nn.MultiheadAttention(E, heads, batch_first=bf)
            forward = lambda: model(X, X, X)[0]  # noqa: E731
        else:
            model = nn.TransformerEncoderLayer(E, heads, dim_feedforward=c["ffn"], batch_first=bf)
            forward = lambda: model(X)  # noqa: E731
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=0.005)

        def step():
            opt.zero_grad()
            forward().sum().backward()
            opt.step()
        return {"time": best_time(step, budget)}
    if kind == "captioning":  # one training step of ShowAttendTell, as bench.lua's train_captioning
        B, T, L, D = c["batch"], c["steps"], c["cells"], c["features"]
        model = ShowAttendTell(c["vocab"], D, L, c["embed"], c["hidden"], c["attention"])
        g = torch.Generator().manual_seed(1)
        feats = torch.rand(B, L, D)
        caps = torch.randint(4, c["vocab"], (B, T), generator=g)
        lens = torch.randint(2, T + 1, (B,), generator=g)
        inputs = torch.cat([torch.full((B, 1), 2), caps[:, :-1]], 1)
        keep = (torch.arange(T)[None, :] < lens[:, None]).float()
        opt = torch.optim.Adam(model.parameters(), lr=0.003)

        def cap_step():
            opt.zero_grad()
            logits, alphas = model(feats, inputs)
            ce = (F.cross_entropy(logits.permute(0, 2, 1), caps, reduction="none") * keep).sum() / keep.sum()
            reg = ((1 - (alphas * keep[:, :, None]).sum(1)) ** 2).sum(1).mean()
            (ce + reg).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5)
            opt.step()
        return {"time": best_time(cap_step, budget)}
    if kind == "conv":  # Conv2d forward+backward (dx, dW, db), as bench.lua's conv_row
        conv = nn.Conv2d(c["C"], c["O"], c["k"], padding=c["padding"])
        x = torch.randn(c["N"], c["C"], c["HW"], c["HW"], requires_grad=True)

        def conv_step():
            y = conv(x)
            y.backward(y)
            x.grad, conv.weight.grad, conv.bias.grad = None, None, None
        return {"time": best_time(conv_step, budget)}
    if kind == "maxpool":
        pool = nn.MaxPool2d(c["k"])
        x = torch.randn(c["N"], c["C"], c["HW"], c["HW"], requires_grad=True)

        def pool_step():
            y = pool(x)
            y.backward(y)
            x.grad = None
        return {"time": best_time(pool_step, budget)}
    raise ValueError("unknown case kind " + kind)


def main():
    cases = json.load(sys.stdin)
    rows = {}
    for c in cases:
        rows[c["id"]] = run_case(c, c.get("budget", 0.3))
    json.dump({"version": torch.__version__, "rows": rows}, sys.stdout)


if __name__ == "__main__":
    main()
