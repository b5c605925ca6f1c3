"""PyTorch side of bench/gpt_bench.lua: the decoder-only model of nn.DecoderOnlyTransformer
(pre-norm RMSNorm, half-split RoPE, grouped-query attention, SwiGLU, tied embeddings), written out
with a hand-written preallocated key/value cache, greedy decoding, one thread, no grad.

Reads {"config": {...}, "cases": [{"id", "new_tokens", "cache"}]} on stdin, prints
{"version": ..., "rows": {id: seconds}} (process CPU time of one generation).
"""
import json
import sys
import time

import torch
from torch.nn import functional as F

torch.set_num_threads(1)
torch.manual_seed(0)


class Model:
    def __init__(self, c):
        V, D, H, Hkv, L, F_ = c["vocab_size"], c["d_model"], c["num_heads"], c["num_kv_heads"], c["num_layers"], c["ffn_hidden"]
        self.H, self.Hkv, self.dh, self.max_len = H, Hkv, D // H, c["max_len"]
        r = lambda *s: torch.randn(*s) * 0.05
        self.emb = r(V, D)
        self.layers = [dict(wq=r(H * self.dh, D), wk=r(Hkv * self.dh, D), wv=r(Hkv * self.dh, D), wo=r(D, H * self.dh),
                            w1=r(F_, D), w2=r(D, F_), w3=r(F_, D), n1=torch.ones(D), n2=torch.ones(D)) for _ in range(L)]
        self.norm = torch.ones(D)
        half = self.dh // 2
        inv = 10000.0 ** (-torch.arange(0, half, dtype=torch.float64) * 2 / self.dh)
        ang = torch.arange(self.max_len, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos().float(), ang.sin().float()

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rope(self, x, start):  # x (B, h, N, dh)
        N, half = x.shape[2], self.dh // 2
        c, s = self.cos[start:start + N], self.sin[start:start + N]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def forward(self, ids, cache=None, start=0):
        B, N = ids.shape
        h = self.emb[ids]
        g = self.H // self.Hkv
        for i, p in enumerate(self.layers):
            x = self.rms(h, p["n1"])
            q = (x @ p["wq"].t()).view(B, N, self.H, self.dh).transpose(1, 2)
            k = (x @ p["wk"].t()).view(B, N, self.Hkv, self.dh).transpose(1, 2)
            v = (x @ p["wv"].t()).view(B, N, self.Hkv, self.dh).transpose(1, 2)
            q, k = self.rope(q, start), self.rope(k, start)
            if cache is not None:
                kc, vc = cache[i]
                kc[:, :, start:start + N] = k
                vc[:, :, start:start + N] = v
                k, v = kc[:, :, :start + N], vc[:, :, :start + N]
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            s = (q @ k.transpose(-1, -2)) / self.dh ** 0.5
            if N > 1:
                T = k.shape[2]
                mask = torch.ones(N, T, dtype=torch.bool).tril(T - N)
                s = s.masked_fill(~mask, float("-inf"))
            a = F.softmax(s, -1) @ v
            h = h + a.transpose(1, 2).reshape(B, N, -1) @ p["wo"].t()
            x = self.rms(h, p["n2"])
            h = h + (F.silu(x @ p["w1"].t()) * (x @ p["w3"].t())) @ p["w2"].t()
        return self.rms(h, self.norm) @ self.emb.t()

    def generate(self, prompt, n, use_cache):
        ids = prompt
        if use_cache:
            cache = [(torch.zeros(1, self.Hkv, self.max_len, self.dh), torch.zeros(1, self.Hkv, self.max_len, self.dh))
                     for _ in self.layers]
            logits = self.forward(ids, cache, 0)[:, -1]
            pos = ids.shape[1]
            for _ in range(n - 1):
                nxt = logits.argmax(-1, keepdim=True)
                logits = self.forward(nxt, cache, pos)[:, -1]
                pos += 1
        else:
            for _ in range(n):
                nxt = self.forward(ids)[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], 1)


def main():
    req = json.load(sys.stdin)
    m = Model(req["config"])
    prompt = torch.randint(0, req["config"]["vocab_size"], (1, req["prompt"]))
    rows = {}
    with torch.no_grad():
        m.generate(prompt, 8, True)  # warm-up
        for c in req["cases"]:
            t0 = time.process_time()
            m.generate(prompt, c["new_tokens"], c["cache"])
            rows[c["id"]] = time.process_time() - t0
    print(json.dumps({"version": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
