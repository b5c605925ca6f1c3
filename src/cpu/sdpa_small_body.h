/* The short-row kernels of dot-product attention (float32), written once: each
 * src/cpu/sdpa_small_<isa>.c defines SMALL_SUFFIX and includes this file, compiled with
 * that ISA's flags (see the Makefile); src/cpu/cpu_dispatch.c picks one set at run time
 * and runs them where attn_attention_internal.h says (rows of at most ATTN_SDPA_SMALL_KEYS
 * keys: the Transformer's heads of 10).
 *
 * A row's keys sit in the lanes of one 16-float vector (GCC vector extensions: one register
 * with AVX-512, two with AVX2, four in portable C), so a query row goes from its scores to its
 * output in registers: scores by d broadcast-multiply-adds against the packed keys, the masks
 * by lane selects, max, exp and sum across the vector, the dropout factors from the engine's
 * one mask rule (attn_dropout.h), then the weighted sum of the value rows. The blocked path
 * spends its time around such rows instead (a product setup, a dozen row calls, scans for live
 * ranges and non-finite values per row); here K and V are packed once per item.
 *
 * Non-finite values: the kernels never look for them in their operands. Every lane is
 * computed (a masked key with weight 0 included), so any NaN or inf they read reaches a
 * result, and a kernel returns 0 when a result is not finite: its caller then redoes the
 * item on the blocked path, which owns the rules for such rows (attn_attention.h).
 *
 * Vectors are passed by pointer: 64-byte vector arguments draw an ABI note from GCC where
 * the ISA has no 64-byte registers. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/attn_attention_internal.h"
#include "cpu/exp_poly.h"

#define SMALL_CAT2(a, b) a##b
#define SMALL_CAT(a, b) SMALL_CAT2(a, b)
#define SMALL_FN(name) SMALL_CAT(name, SMALL_SUFFIX)

#define KL ATTN_SDPA_SMALL_KEYS /* key lanes */
#define NV (ATTN_SDPA_TINY_WIDTH / KL) /* vectors of the widest row */
/* Rows a kernel works on side by side: each row is one long chain of dependent steps (products,
 * max, exp, sum, weighted sum), and independent chains keep the vector units busy. */
#define SR 2

#include "cpu/cpu_inline.h"

typedef float small_vf __attribute__((vector_size(KL * 4)));
typedef int32_t small_vi __attribute__((vector_size(KL * 4)));
typedef uint32_t small_vu __attribute__((vector_size(KL * 4)));
typedef int32_t small_hi __attribute__((vector_size(KL * 2)));
typedef uint64_t small_vq __attribute__((vector_size(KL * 4)));
typedef int64_t small_vl __attribute__((vector_size(KL * 4)));

static const small_vi small_lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const small_vq small_lane8 = {0, 1, 2, 3, 4, 5, 6, 7};
static const small_vf small_zero = {0}; /* small_zero + x: x in every lane */

/* where m (all ones or zeros per lane) then a else b */
#define SMALL_SEL(m, a, b) ((small_vf)(((small_vi)(a) & (m)) | ((small_vi)(b) & ~(m))))
#define SMALL_HALVES(v, w) __builtin_shufflevector(v, v, w, w + 1, w + 2, w + 3, w + 4, w + 5, w + 6, w + 7, \
                                                   0, 1, 2, 3, 4, 5, 6, 7)

/* One head's keys and values, packed once per item, in whole vectors: lanes past Nk and
 * columns past d or dv hold zeros. */
typedef struct {
  small_vf kt[ATTN_SDPA_TINY_WIDTH]; /* kt[c][j] = K[j][c]: the keys in lanes, for the scores */
  small_vf vt[ATTN_SDPA_TINY_WIDTH]; /* vt[c][j] = V[j][c], for dL/dweights */
  small_vf kr[KL][NV];               /* kr[j] = row j of K, for dq */
  small_vf vr[KL][NV];               /* vr[j] = row j of V, for the output */
  int64_t nd, ndv;                   /* vectors per row of K and of V */
} small_head;

/* Rows [0, n) of operand m of head b, w wide: into cols (w lane vectors) and/or rows (n x NV).
 * A unit-stride row of 8 or 16 floats (the book's heads) is one fixed-size move, where a copy
 * loop became a memcpy call per row. */
static void small_pack(const attn_attention_mat *m, int64_t b, int64_t n, int64_t w, small_vf *cols,
                       small_vf (*rows)[NV]) {
  const int64_t sc = m->sc;
  for (int64_t c = 0; cols && c < w; c++) cols[c] = small_zero;
  for (int64_t j = 0; j < n; j++) {
    const float *x = attn_attention_at(m, sizeof(float), b, j, 0);
    for (int64_t c = 0; cols && c < w; c++) cols[c][j] = x[c * sc];
    if (!rows) continue;
    for (int64_t t = 0; t < (w + KL - 1) / KL; t++) rows[j][t] = small_zero; /* the vectors read */
    if (sc == 1 && w == KL / 2) {
      memcpy(rows[j], x, sizeof(float) * (KL / 2));
    } else if (sc == 1 && w == KL) {
      memcpy(rows[j], x, sizeof(small_vf));
    } else {
      float *r = (float *)rows[j];
      for (int64_t c = 0; c < w; c++) r[c] = x[c * sc];
    }
  }
}

/* Row r of operand m of head b. */
ATTN_CPU_INLINE const float *small_rowp(const attn_attention_mat *m, int64_t b, int64_t r) {
  return attn_attention_at(m, sizeof(float), b, r, 0);
}

/* *s = scale * (x . lane j of t) for every lane j; x a row of w values at stride sx (read one by
 * one as broadcasts, never gathered into a vector: a vector load right after scalar stores
 * stalls on the store forwarding). */
ATTN_CPU_INLINE void small_lanes(const float *x, int64_t sx, const small_vf *t, int64_t w, float scale, small_vf *s) {
  small_vf acc[2] = {{0}, {0}}; /* two chains of multiply-adds: half the latency */
  int64_t c = 0;
  for (; c + 2 <= w; c += 2) {
    acc[0] += x[c * sx] * t[c];
    acc[1] += x[(c + 1) * sx] * t[c + 1];
  }
  if (c < w) acc[0] += x[c * sx] * t[c];
  *s = (acc[0] + acc[1]) * scale;
}

ATTN_CPU_INLINE float small_max(const small_vf *x) {
  small_vf v = *x, w;
  small_vi m;
  w = SMALL_HALVES(v, 8), m = w > v, v = SMALL_SEL(m, w, v);
  w = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15), m = w > v;
  v = SMALL_SEL(m, w, v);
  w = __builtin_shufflevector(v, v, 2, 3, 0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), m = w > v;
  v = SMALL_SEL(m, w, v);
  return v[1] > v[0] ? v[1] : v[0];
}

ATTN_CPU_INLINE float small_sum(const small_vf *x) {
  small_vf v = *x;
  v += SMALL_HALVES(v, 8);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return v[0] + v[1];
}

/* e^x for x <= 0 lane by lane: exp_poly.h's attn_cpu_exp_neg_f written on vectors (the same
 * steps, so the weights match the row kernels': exact 0 for -inf and below -87, NaN stays). */
ATTN_CPU_INLINE void small_exp_neg(const small_vf *xp, small_vf *y) {
  const small_vf x = *xp;
  small_vf kf = x * 1.44269504088896341f + 12583039.0f;
  small_vf n = kf - 12583039.0f;
  small_vf r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  small_vf p = ATTN_CPU_EXP_POLY(r);
  small_vf s = (small_vf)((small_vu)kf << 23);
  small_vu xb = (small_vu)x;
  small_vi keep = (xb <= 0xC2AE0000u) | (xb > 0xFF800000u);
  *y = (small_vf)((small_vi)(p * s) & keep);
}

/* The weights *p of one row from its scores *s under the row's masks m (attn_attention_row_mask):
 * scores on [a, e), the d2l fill on [e, b), exactly 0 elsewhere and past Nk; a row with no key
 * is all 0. Returns 0 when the row has no finite softmax (a NaN or inf among the scores it reads,
 * or only -inf): the blocked path decides those rows. */
ATTN_CPU_INLINE int small_softmax(const attn_attention_rowmask *m, const small_vf *s, small_vf *p) {
  const int32_t a = (int32_t)m->a, e = (int32_t)m->e, b = (int32_t)m->b;
  const small_vf fill = small_zero + (float)ATTN_MASKED_SOFTMAX_FILL, none = small_zero - INFINITY;
  small_vf x = SMALL_SEL(small_lane < e, *s, fill);
  x = SMALL_SEL((small_lane >= a) & (small_lane < b), x, none);
  /* without branches, so the rows a kernel interleaves stay one straight run of code: a row
   * with no key has every lane at -inf, shifts by 0 and gets exp = 0 and a factor of 0 */
  const int has = a < b;
  float mx = small_max(&x);
  x -= has ? mx : 0.0f;
  small_exp_neg(&x, p);
  float sum = small_sum(p); /* >= 1 (the largest lane gives exp(0)) unless NaN */
  *p *= has ? 1 / sum : 0.0f;
  return (has ^ 1) | ((sum >= 1) & (sum <= KL));
}

/* *kf: the dropout factors of the row whose stream index starts at base (0 dropped, 1/(1-p)
 * kept), or 1 without dropout. The mask is attn_dropout_drops (attn_rng_hash's splitmix64
 * finaliser) on 64-bit lanes, 16 entries at once: written on vectors because the scalar
 * call in a lane loop does not vectorise here (the short-row forward with dropout took 1.45x
 * as long); a spec compares the masks with the reference path's. */
ATTN_CPU_INLINE void small_keep(const attn_attention_job *J, uint64_t base, small_vf *kf) {
  if (!J->dropout) {
    *kf = small_zero + 1.0f;
    return;
  }
  small_vl drop[2];
  for (int h = 0; h < 2; h++) {
    small_vq i = small_lane8 + (base + (uint64_t)(8 * h));
    small_vq z = J->drop.seed + (i + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    drop[h] = (small_vl)((z >> 11) < J->drop.threshold);
  }
  small_hi lo = __builtin_convertvector(drop[0], small_hi), hi = __builtin_convertvector(drop[1], small_hi);
  small_vi m = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  *kf = SMALL_SEL(m, small_zero, small_zero + (float)J->drop.scale);
}

/* o[0, nv) = sum over j < n of a[j] * rows[j][0, nv), in two chains of multiply-adds (a read as
 * floats: one broadcast per row). */
ATTN_CPU_INLINE void small_combine(const small_vf *a, small_vf (*rows)[NV], int64_t n, int64_t nv, small_vf *o) {
  float w[KL];
  memcpy(w, a, sizeof w);
  if (nv == 1) { /* rows of up to 16 (the book's heads): the sums stay in registers */
    small_vf s0 = {0}, s1 = {0};
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
      s0 += w[j] * rows[j][0];
      s1 += w[j + 1] * rows[j + 1][0];
    }
    if (j < n) s0 += w[j] * rows[j][0];
    o[0] = s0 + s1;
    return;
  }
  small_vf acc[2][NV];
  for (int64_t t = 0; t < nv; t++) acc[0][t] = acc[1][t] = small_zero;
  int64_t j = 0;
  for (; j + 2 <= n; j += 2)
    for (int64_t t = 0; t < nv; t++) {
      acc[0][t] += w[j] * rows[j][t];
      acc[1][t] += w[j + 1] * rows[j + 1][t];
    }
  if (j < n)
    for (int64_t t = 0; t < nv; t++) acc[0][t] += w[j] * rows[j][t];
  for (int64_t t = 0; t < nv; t++) o[t] = acc[0][t] + acc[1][t];
}

/* dst[0, n) = the first n floats of the vectors v: rows of 8 or 16 floats (the book's heads) as
 * one fixed-size move, where a copy loop becomes a memcpy call per row. */
ATTN_CPU_INLINE void small_store(float *dst, const small_vf *v, int64_t n) {
  if (n == KL / 2) {
    memcpy(dst, v, sizeof(float) * (KL / 2));
  } else if (n == KL) {
    memcpy(dst, v, sizeof(small_vf));
  } else {
    const float *f = (const float *)v;
    for (int64_t c = 0; c < n; c++) dst[c] = f[c];
  }
}

static inline uint64_t small_base(const attn_attention_job *J, int64_t b, int64_t i) {
  return ((uint64_t)b * (uint64_t)J->Nq + (uint64_t)i) * (uint64_t)J->Nk;
}

int SMALL_FN(attn_sdpa_small_forward_)(const attn_attention_job *J, int64_t b, int64_t i0, int64_t r) {
  const int64_t d = J->d, dv = J->dv, Nk = J->Nk;
  small_head h;
  h.nd = (d + KL - 1) / KL;
  h.ndv = (dv + KL - 1) / KL;
  small_pack(&J->k, b, Nk, d, h.kt, NULL);
  if (J->out) small_pack(&J->v, b, Nk, dv, NULL, h.vr);
  const float scale = (float)J->scale;
  small_vf chk = {0};
  for (int64_t i = i0; i < i0 + r; i += SR) {
    int64_t row[SR]; /* past the end: the last row again, whose values are written twice */
    for (int u = 0; u < SR; u++) row[u] = i + u < i0 + r ? i + u : i0 + r - 1;
    attn_attention_rowmask m[SR];
    small_vf s[SR], p[SR], kf[SR], o[SR][NV];
    int ok = 1;
    for (int u = 0; u < SR; u++) {
      attn_attention_row_mask(J, b, row[u], &m[u]);
      small_lanes(small_rowp(&J->q, b, row[u]), J->q.sc, h.kt, d, scale, &s[u]);
    }
    for (int u = 0; u < SR; u++) ok &= small_softmax(&m[u], &s[u], &p[u]);
    if (!ok) return 0;
    for (int u = 0; u < SR; u++) {
      if (J->weights) {
        float *w = (float *)J->weights + (b * J->Nq + row[u]) * Nk;
        small_store(w, &p[u], Nk);
      }
    }
    if (!J->out) continue;
    for (int u = 0; u < SR; u++) {
      small_keep(J, small_base(J, b, row[u]), &kf[u]);
      p[u] *= kf[u];
    }
    for (int u = 0; u < SR; u++) small_combine(&p[u], h.vr, Nk, h.ndv, o[u]);
    for (int u = 0; u < SR; u++) {
      small_store((float *)J->out + (b * J->Nq + row[u]) * dv, o[u], dv);
      for (int64_t t = 0; t < h.ndv; t++) chk += o[u][t] * 0;
    }
  }
  return small_sum(&chk) == 0;
}

int SMALL_FN(attn_sdpa_small_backward_)(const attn_attention_job *J, int64_t b, int64_t i0, int64_t i1,
                                        float *acc_k, float *acc_v) {
  const int64_t d = J->d, dv = J->dv, Nk = J->Nk;
  small_head h;
  h.nd = (d + KL - 1) / KL;
  h.ndv = (dv + KL - 1) / KL;
  small_pack(&J->k, b, Nk, d, h.kt, h.kr);
  small_pack(&J->v, b, Nk, dv, h.vt, NULL);
  /* dk and dv with the keys in lanes, akt[c][j] = dK[j][c]: a row adds q[c] * ds and dout[c] *
   * (dropped weights), d + dv multiply-adds of whole vectors */
  small_vf akt[ATTN_SDPA_TINY_WIDTH], avt[ATTN_SDPA_TINY_WIDTH];
  for (int64_t c = 0; c < d; c++) akt[c] = small_zero;
  for (int64_t c = 0; c < dv; c++) avt[c] = small_zero;
  const float scale = (float)J->scale;
  small_vf chk = {0};
  for (int64_t i = i0; i < i1; i += SR) { /* SR rows side by side, as forward */
    int64_t row[SR];
    for (int u = 0; u < SR; u++) row[u] = i + u < i1 ? i + u : i1 - 1;
    const int n = i1 - i < SR ? (int)(i1 - i) : SR; /* the rows past them repeat the last, unused */
    attn_attention_rowmask m[SR];
    const float *q[SR], *g[SR];
    small_vf s[SR], p[SR], dp[SR], kf[SR], ds[SR];
    const int64_t sq = J->q.sc, sg = J->dout.sc;
    int ok = 1;
    for (int u = 0; u < SR; u++) {
      attn_attention_row_mask(J, b, row[u], &m[u]);
      q[u] = small_rowp(&J->q, b, row[u]);
      g[u] = small_rowp(&J->dout, b, row[u]);
      small_lanes(q[u], sq, h.kt, d, scale, &s[u]);
      small_lanes(g[u], sg, h.vt, dv, 1.0f, &dp[u]); /* dL/d(dropped weights) */
    }
    for (int u = 0; u < SR; u++) ok &= small_softmax(&m[u], &s[u], &p[u]);
    if (!ok) return 0;
    for (int u = 0; u < SR; u++) {
      small_keep(J, small_base(J, b, row[u]), &kf[u]);
      dp[u] *= kf[u]; /* dL/dweights */
      small_vf pdp = p[u] * dp[u];
      const float D = small_sum(&pdp);
      /* dL/dscores times scale: 0 on every masked key (a filled key's score is a constant); a
       * row with no key has p = 0 and gives 0 */
      ds[u] = scale * (p[u] * (dp[u] - D));
      ds[u] = SMALL_SEL((small_lane >= (int32_t)m[u].a) & (small_lane < (int32_t)m[u].e), ds[u], small_zero);
    }
    if (J->gq)
      for (int u = 0; u < n; u++) {
        small_vf o[NV];
        small_combine(&ds[u], h.kr, Nk, h.nd, o);
        small_store((float *)J->gq + (b * J->Nq + row[u]) * d, o, d);
        for (int64_t t = 0; t < h.nd; t++) chk += o[t] * 0;
      }
    for (int u = 0; u < n; u++) {
      if (acc_k)
        for (int64_t c = 0; c < d; c++) akt[c] += q[u][c * sq] * ds[u];
      if (acc_v) {
        small_vf pk = p[u] * kf[u];
        for (int64_t c = 0; c < dv; c++) avt[c] += g[u][c * sg] * pk;
      }
    }
  }
  if (acc_k) {
    for (int64_t c = 0; c < d; c++) chk += akt[c] * 0;
    const float *t = (const float *)akt;
    for (int64_t j = 0; j < Nk; j++)
      for (int64_t c = 0; c < d; c++) acc_k[j * d + c] = t[c * KL + j];
  }
  if (acc_v) {
    for (int64_t c = 0; c < dv; c++) chk += avt[c] * 0;
    const float *t = (const float *)avt;
    for (int64_t j = 0; j < Nk; j++)
      for (int64_t c = 0; c < dv; c++) acc_v[j * dv + c] = t[c * KL + j];
  }
  return small_sum(&chk) == 0;
}

#undef KL
#undef NV
#undef SR
