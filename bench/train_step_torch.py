"""PyTorch twin of bench/train_step_bench.lua: the same GRU encoder step, d2l
Bahdanau training step (batch 64, 10 steps, embed 32, GRU 2x32, vocab 200) and
one op's record + backward, on one thread, CPU time, best of five rounds.
Run: /usr/bin/python3 bench/train_step_torch.py"""
import time

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
B, T, E, H, V = 64, 10, 32, 32, 200


def time_it(fn, min_seconds=1.0):
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(5):
        reps, t0 = 0, time.process_time()
        while True:
            fn()
            reps += 1
            if time.process_time() - t0 >= min_seconds / 5:
                break
        best = min(best, (time.process_time() - t0) / reps)
    return best


def masked_softmax(X, valid_lens):
    shape = X.shape
    lens = torch.repeat_interleave(valid_lens, shape[1])
    X = X.reshape(-1, shape[-1])
    mask = torch.arange(shape[-1])[None, :] < lens[:, None]
    X = X.masked_fill(~mask, -1e6)
    return F.softmax(X.reshape(shape), dim=-1)


class AdditiveAttention(nn.Module):
    def __init__(self, h, dropout):
        super().__init__()
        self.W_k = nn.Linear(h, h, bias=False)
        self.W_q = nn.Linear(h, h, bias=False)
        self.w_v = nn.Linear(h, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, q, k, v, valid_lens):
        q, k = self.W_q(q), self.W_k(k)
        features = torch.tanh(q.unsqueeze(2) + k.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        return torch.bmm(self.dropout(masked_softmax(scores, valid_lens)), v)


enc_emb, enc_rnn = nn.Embedding(V, E), nn.GRU(E, H, 2, dropout=0.1)
src = torch.randint(0, V, (B, T))
tgt = torch.randint(0, V, (B, T))
valid = torch.randint(2, T + 1, (B,))


def encode():
    return enc_rnn(enc_emb(src).permute(1, 0, 2))


def gru_step():
    out, state = encode()
    (out.sum() + state.sum()).backward()


dec_emb, attention = nn.Embedding(V, E), AdditiveAttention(H, 0.1)
dec_rnn, dense = nn.GRU(E + H, H, 2, dropout=0.1), nn.Linear(H, V)
modules = [enc_emb, enc_rnn, dec_emb, attention, dec_rnn, dense]
params = [p for m in modules for p in m.parameters()]
opt = torch.optim.Adam(params, lr=0.005)


def bahdanau_step():
    enc_out, state = encode()
    keys = enc_out.permute(1, 0, 2)
    X = dec_emb(tgt).permute(1, 0, 2)
    outs = []
    for t in range(T):
        query = state[-1].unsqueeze(1)
        context = attention(query, keys, keys, valid)
        x = torch.cat((context, X[t].unsqueeze(1)), dim=-1)
        out, state = dec_rnn(x.permute(1, 0, 2), state)
        outs.append(out)
    pred = dense(torch.cat(outs, dim=0)).permute(1, 0, 2)
    weights = (torch.arange(T)[None, :] < valid[:, None]).float()
    loss = (F.cross_entropy(pred.permute(0, 2, 1), tgt, reduction="none") * weights).mean(dim=1).sum()
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(params, 1)
    opt.step()


x = torch.randn(B, H, requires_grad=True)


def one_op():
    y = x.tanh()
    y.backward(y)
    x.grad = None


for m in modules:
    m.train()
print("%-44s %10.3f ms" % ("GRU encoder fwd+bwd (B 64, T 10, 2x32)", time_it(gru_step) * 1e3))
print("%-44s %10.3f ms" % ("Bahdanau training step (book settings)", time_it(bahdanau_step) * 1e3))
print("%-44s %10.2f us" % ("one op (tanh 64x32) record + backward", time_it(one_op, 0.5) * 1e6))
