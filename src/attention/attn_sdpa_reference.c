/* The blocked reference path of dot-product attention, which is also the kernel of attention over
 * given scores: for each (batch, block of query rows) the scores come from one gemm (or a copy of
 * the given scores), the softmax runs row by row in a BLK x Nk workspace (src/attention/attn_sdpa_rows.c),
 * and the weighted sum is a second gemm; the backward recomputes or reads the weights per block. */
#include <cblas.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "attention/attn_attention_internal.h"
#include "core/attn_parallel.h"
#include "core/attn_vmath.h"
#include "cpu/cpu_dispatch.h"

#define BLK ATTN_SDPA_BLOCK
/* The fixed cost of a forward item in multiply-add terms: a decoder step's one-query rows
 * ((1024, 1, 8) x (1024, 10, 8)) cost ~125 ns each on the short-row kernels, about 5000 flops
 * at the big tiles' rate, where their products count 480; by those alone all 1024 rows stayed
 * on one thread (130 us). */
#define ITEM_FLOPS 4096.0

/* ------------------------------------------------------------ short rows */

/* The instruction set's kernel set (cpu/cpu_dispatch.h) when its short-row kernels apply to J,
 * else NULL (attn_attention_internal.h): such an item runs there first and here only when a
 * result came out not finite. */
static const attn_cpu_kernels *small_path(const attn_attention_job *J, int backward) {
  if (!J->tiny || J->dt != ATTN_F32 || !J->dot || J->Nk < 1 || J->Nk > ATTN_SDPA_SMALL_KEYS ||
      J->d > ATTN_SDPA_TINY_WIDTH || J->dv > ATTN_SDPA_TINY_WIDTH || J->mask || J->rule || attn_attention_has_bias(J) ||
      J->has_wst || J->has_dw || J->gs ||
      (backward && !J->has_dout))
    return NULL;
  return attn_cpu();
}

/* The tiny-head products in float64 (J->tiny), written like attn_vmath_gemm_small_f32 (the float32
 * one, vectorised per instruction set): op(B) packed into K rows of N rounded up to 16 (zero
 * columns past N), each row of C built 16 columns at a time in a fixed-length accumulator. */
static void gemm_small_f64(int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const double *A,
                           int64_t lda, const double *B, int64_t ldb, double beta, double *C, int64_t ldc,
                           double *pack) {
  const int64_t Np = (N + 15) / 16 * 16;
  for (int64_t k = 0; k < K; k++) {
    for (int64_t n = 0; n < N; n++) pack[k * Np + n] = tb ? B[n * ldb + k] : B[k * ldb + n];
    for (int64_t n = N; n < Np; n++) pack[k * Np + n] = 0;
  }
  for (int64_t m = 0; m < M; m++) {
    double *c = C + m * ldc;
    for (int64_t n0 = 0; n0 < N; n0 += 16) {
      double acc[16] = {0};
      for (int64_t k = 0; k < K; k++) {
        const double a = ta ? A[k * lda + m] : A[m * lda + k], *p = pack + k * Np + n0;
        for (int t = 0; t < 16; t++) acc[t] += a * p[t];
      }
      const int64_t w = N - n0 < 16 ? N - n0 : 16;
      for (int64_t t = 0; t < w; t++) c[n0 + t] = beta != 0 ? beta * c[n0 + t] + alpha * acc[t] : alpha * acc[t];
    }
  }
}

/* Elements of the tiny products' workspace: op(B) has at most n = max(Nk, BLK, d, dv) rows and
 * columns. */
static size_t pack_elems(const attn_attention_job *J) {
  if (!J->tiny) return 0;
  int64_t n = J->Nk > BLK ? J->Nk : BLK;
  if (J->d > n) n = J->d;
  if (J->dv > n) n = J->dv;
  return (size_t)ATTN_VMATH_GEMM_PACK(n, n);
}

/* C (M x N, row-major, ldc) = alpha * op(A) op(B) + beta * C: sgemm/dgemm, or plain loops over
 * the workspace pack (pack_elems) when J->tiny. */
static void gemm(const attn_attention_job *J, void *pack, int ta, int tb, int64_t M, int64_t N, int64_t K,
                 double alpha, const void *A, int lda, const void *B, int ldb, double beta, void *C, int64_t ldc) {
  const attn_dtype dt = J->dt;
  if (J->tiny) {
    if (dt == ATTN_F32)
      attn_vmath_gemm_small_f32(ta, tb, M, N, K, (float)alpha, A, lda, B, ldb, (float)beta, C, ldc, pack);
    else
      gemm_small_f64(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
    return;
  }
  CBLAS_TRANSPOSE a = ta ? CblasTrans : CblasNoTrans, b = tb ? CblasTrans : CblasNoTrans;
  if (dt == ATTN_F32)
    cblas_sgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, (float)alpha, A, lda, B, ldb, (float)beta, C, (int)ldc);
  else
    cblas_dgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, alpha, A, lda, B, ldb, beta, C, (int)ldc);
}

/* Weights of block (b, rows i0..i0+r) into ws (r x Nk); per-row masks into rm, per-row live ranges
 * (attn_sdpa_live_range) into rn0/rn1 and their union into *n0, *n1. */
static void block_probs(const attn_attention_job *J, void *pack, int64_t b, int64_t i0, int64_t r, char *ws,
                        attn_attention_rowmask *rm, int64_t *rn0, int64_t *rn1, int64_t *n0, int64_t *n1) {
  const size_t es = J->es;
  const int64_t Nk = J->Nk;
  int64_t lo = Nk, hi = 0;
  for (int64_t rr = 0; rr < r; rr++) attn_attention_row_mask(J, b, i0 + rr, &rm[rr]);
  if (J->has_wst) {
    for (int64_t rr = 0; rr < r; rr++)
      attn_sdpa_load_row(J, ws + (size_t)(rr * Nk) * es, attn_attention_at(&J->wst, es, b, i0 + rr, 0), J->wst.sc, Nk, 1.0);
  } else {
    /* columns whose scores some row needs: the unfilled keys [a, e) */
    for (int64_t rr = 0; rr < r; rr++)
      if (rm[rr].a < rm[rr].e) {
        if (rm[rr].a < lo) lo = rm[rr].a;
        if (rm[rr].e > hi) hi = rm[rr].e;
      }
    if (hi > lo) {
      if (J->dot) {
        if (J->d > 0)
          gemm(J, pack, J->q.trans, !J->k.trans, r, hi - lo, J->d, J->scale, attn_attention_at(&J->q, es, b, i0, 0),
               J->q.ld, attn_attention_at(&J->k, es, b, lo, 0), J->k.ld, 0.0, ws + (size_t)lo * es, Nk);
        else
          for (int64_t rr = 0; rr < r; rr++) memset(ws + (size_t)(rr * Nk + lo) * es, 0, (size_t)(hi - lo) * es);
        if (attn_attention_has_bias(J)) /* on the keys the softmax reads as scores */
          for (int64_t rr = 0; rr < r; rr++)
            attn_sdpa_bias_row(J, b, i0 + rr, ws + (size_t)(rr * Nk) * es, rm[rr].a, rm[rr].e);
      } else {
        for (int64_t rr = 0; rr < r; rr++)
          if (rm[rr].e > rm[rr].a)
            attn_sdpa_load_row(J, ws + (size_t)(rr * Nk + rm[rr].a) * es, attn_attention_at(&J->sc, es, b, i0 + rr, rm[rr].a),
                             J->sc.sc, rm[rr].e - rm[rr].a, J->scale);
      }
    }
    attn_sdpa_softmax_block(J, ws, rm, r);
  }
  lo = Nk;
  hi = 0;
  for (int64_t rr = 0; rr < r; rr++) {
    attn_sdpa_live_range(J, &rm[rr], ws + (size_t)(rr * Nk) * es, &rn0[rr], &rn1[rr]);
    if (rn1[rr] > rn0[rr]) {
      if (rn0[rr] < lo) lo = rn0[rr];
      if (rn1[rr] > hi) hi = rn1[rr];
    }
  }
  if (hi <= lo) lo = hi = 0;
  *n0 = lo;
  *n1 = hi;
}

static uint64_t stream_base(const attn_attention_job *J, int64_t b, int64_t i) {
  return ((uint64_t)b * (uint64_t)J->Nq + (uint64_t)i) * (uint64_t)J->Nk;
}

/* ------------------------------------------------------------ forward */

static void forward_task(void *ctx, int64_t begin, int64_t end) {
  attn_attention_job *J = ctx;
  const size_t es = J->es;
  const int64_t Nk = J->Nk, dv = J->dv;
  size_t cap = 0;
  char *ws = attn_alloc((size_t)(BLK * (Nk > 0 ? Nk : 1)) * es + 2 * BLK * sizeof(int64_t) + pack_elems(J) * es, &cap);
  if (!ws) {
    atomic_store(&J->failed, 1);
    return;
  }
  int64_t *rn0 = (int64_t *)(ws + (size_t)(BLK * (Nk > 0 ? Nk : 1)) * es), *rn1 = rn0 + BLK;
  void *pack = rn1 + BLK;
  attn_attention_rowmask rm[BLK];
  const attn_cpu_kernels *small = small_path(J, 0);
  for (int64_t item = begin; item < end; item++) {
    int64_t b = item / J->nblk, i0 = (item % J->nblk) * BLK;
    int64_t r = J->Nq - i0 < BLK ? J->Nq - i0 : BLK, n0, n1;
    if (small && small->sdpa_small_forward(J, b, i0, r)) continue;
    block_probs(J, pack, b, i0, r, ws, rm, rn0, rn1, &n0, &n1);
    if (J->weights) memcpy(J->weights + (size_t)((b * J->Nq + i0) * Nk) * es, ws, (size_t)(r * Nk) * es);
    if (!J->out) continue;
    char *out = J->out + (size_t)((b * J->Nq + i0) * dv) * es;
    if (J->dropout)
      for (int64_t rr = 0; rr < r; rr++)
        attn_sdpa_dropout_row(J, ws + (size_t)(rr * Nk) * es, rn0[rr], rn1[rr], stream_base(J, b, i0 + rr));
    if (dv == 0) continue;
    if (n1 > n0)
      gemm(J, pack, 0, J->v.trans, r, dv, n1 - n0, 1.0, ws + (size_t)n0 * es, (int)Nk,
           attn_attention_at(&J->v, es, b, n0, 0), J->v.ld, 0.0, out, dv);
    else
      memset(out, 0, (size_t)(r * dv) * es);
    for (int64_t rr = 0; rr < r; rr++) {
      char *orow = out + (size_t)(rr * dv) * es;
      if (!attn_sdpa_row_finite(J, orow, dv))
        attn_sdpa_combine_row(J, &rm[rr], ws + (size_t)(rr * Nk) * es, rn0[rr], rn1[rr], &J->v, b, orow, dv);
    }
  }
  attn_free(ws, cap);
}

/* ------------------------------------------------------------ backward */

static void backward_task(void *ctx, int64_t begin, int64_t end) {
  attn_attention_job *J = ctx;
  const size_t es = J->es;
  const int64_t Nk = J->Nk, Nq = J->Nq, d = J->d, dv = J->dv, G = J->groups;
  size_t cap = 0, row_bytes = (size_t)(Nk > 0 ? Nk : 1) * es;
  char *P = attn_alloc(2 * BLK * row_bytes + 2 * BLK * sizeof(int64_t) + pack_elems(J) * es, &cap);
  if (!P) {
    atomic_store(&J->failed, 1);
    return;
  }
  char *dP = P + BLK * row_bytes;
  int64_t *rn0 = (int64_t *)(dP + BLK * row_bytes), *rn1 = rn0 + BLK;
  void *pack = rn1 + BLK;
  attn_attention_rowmask rm[BLK];
  const attn_cpu_kernels *small = small_path(J, 1);
  for (int64_t item = begin; item < end; item++) {
    int64_t b = item / G, g = item % G;
    int64_t blk0 = g * J->nblk / G, blk1 = (g + 1) * J->nblk / G;
    char *acc_k = NULL, *acc_v = NULL;
    if (J->gk)
      acc_k = G == 1 ? J->gk + (size_t)(b * Nk * d) * es : J->partial_k + (size_t)((b * G + g) * Nk * d) * es;
    if (J->gv && J->has_v)
      acc_v = G == 1 ? J->gv + (size_t)(b * Nk * dv) * es : J->partial_v + (size_t)((b * G + g) * Nk * dv) * es;
    /* the short-row kernels write the accumulators whole; the blocked path adds to zeros */
    if (small && small->sdpa_small_backward(J, b, blk0 * BLK, blk1 * BLK < Nq ? blk1 * BLK : Nq, (float *)acc_k, (float *)acc_v))
      continue;
    if (acc_k) memset(acc_k, 0, (size_t)(Nk * d) * es);
    if (acc_v) memset(acc_v, 0, (size_t)(Nk * dv) * es);
    for (int64_t blk = blk0; blk < blk1; blk++) {
      int64_t i0 = blk * BLK, r = Nq - i0 < BLK ? Nq - i0 : BLK, n0, n1;
      block_probs(J, pack, b, i0, r, P, rm, rn0, rn1, &n0, &n1);
      char *dq = J->gq ? J->gq + (size_t)((b * Nq + i0) * d) * es : NULL;
      char *ds = J->gs ? J->gs + (size_t)((b * Nq + i0) * Nk) * es : NULL;
      if (ds) memset(ds, 0, (size_t)(r * Nk) * es);
      if (n1 <= n0) {
        if (dq) memset(dq, 0, (size_t)(r * d) * es);
        continue;
      }
      int64_t m = n1 - n0;
      /* dL/dweights on [n0, n1) */
      if (J->has_dout && J->has_v && dv > 0) {
        gemm(J, pack, J->dout.trans, !J->v.trans, r, m, dv, 1.0, attn_attention_at(&J->dout, es, b, i0, 0), J->dout.ld,
             attn_attention_at(&J->v, es, b, n0, 0), J->v.ld, 0.0, dP + (size_t)n0 * es, Nk);
        if (J->dropout)
          for (int64_t rr = 0; rr < r; rr++)
            attn_sdpa_dropout_row(J, dP + (size_t)(rr * Nk) * es, n0, n1, stream_base(J, b, i0 + rr));
      } else {
        for (int64_t rr = 0; rr < r; rr++) memset(dP + (size_t)(rr * Nk + n0) * es, 0, (size_t)m * es);
      }
      if (J->has_dw)
        for (int64_t rr = 0; rr < r; rr++)
          attn_sdpa_add_row(J, dP + (size_t)(rr * Nk + n0) * es, attn_attention_at(&J->dw, es, b, i0 + rr, n0), J->dw.sc, m);
      /* dL/dscores (dot mode: times scale) */
      for (int64_t rr = 0; rr < r; rr++)
        attn_sdpa_softmax_back_row(J, P + (size_t)(rr * Nk) * es, dP + (size_t)(rr * Nk) * es, n0, n1, &rm[rr],
                                 J->scale);
      if (ds)
        for (int64_t rr = 0; rr < r; rr++)
          memcpy(ds + (size_t)(rr * Nk + n0) * es, dP + (size_t)(rr * Nk + n0) * es, (size_t)m * es);
      if (dq) {
        if (d > 0)
          gemm(J, pack, 0, J->k.trans, r, d, m, 1.0, dP + (size_t)n0 * es, (int)Nk,
               attn_attention_at(&J->k, es, b, n0, 0), J->k.ld, 0.0, dq, d);
        for (int64_t rr = 0; rr < r; rr++) {
          char *row = dq + (size_t)(rr * d) * es;
          if (!attn_sdpa_row_finite(J, row, d))
            attn_sdpa_combine_row(J, &rm[rr], dP + (size_t)(rr * Nk) * es, n0, n1, &J->k, b, row, d);
        }
      }
      if (acc_k && d > 0) {
        if (attn_sdpa_block_finite(J, &J->q, b, i0, r, d))
          gemm(J, pack, 1, J->q.trans, m, d, r, 1.0, dP + (size_t)n0 * es, (int)Nk,
               attn_attention_at(&J->q, es, b, i0, 0), J->q.ld, 1.0, acc_k + (size_t)(n0 * d) * es, d);
        else
          attn_sdpa_outer_acc(J, rm, dP, Nk, r, n0, n1, &J->q, b, i0, acc_k, d);
      }
      if (acc_v && J->has_dout && dv > 0) {
        if (J->dropout)
          for (int64_t rr = 0; rr < r; rr++)
            attn_sdpa_dropout_row(J, P + (size_t)(rr * Nk) * es, n0, n1, stream_base(J, b, i0 + rr));
        if (attn_sdpa_block_finite(J, &J->dout, b, i0, r, dv))
          gemm(J, pack, 1, J->dout.trans, m, dv, r, 1.0, P + (size_t)n0 * es, (int)Nk,
               attn_attention_at(&J->dout, es, b, i0, 0), J->dout.ld, 1.0, acc_v + (size_t)(n0 * dv) * es, dv);
        else
          attn_sdpa_outer_acc(J, rm, P, Nk, r, n0, n1, &J->dout, b, i0, acc_v, dv);
      }
    }
  }
  attn_free(P, cap);
}

/* dk/dv = sum over groups of the partial buffers, in group order. Items: (b, key row). */
static void reduce_task(void *ctx, int64_t begin, int64_t end) {
  attn_attention_job *J = ctx;
  const size_t es = J->es;
  const int64_t Nk = J->Nk, G = J->groups;
  for (int64_t item = begin; item < end; item++) {
    int64_t b = item / Nk, j = item % Nk;
    if (J->gk) {
      char *dst = J->gk + (size_t)((b * Nk + j) * J->d) * es;
      memcpy(dst, J->partial_k + (size_t)(((b * G) * Nk + j) * J->d) * es, (size_t)J->d * es);
      for (int64_t g = 1; g < G; g++)
        attn_sdpa_add_row(J, dst, J->partial_k + (size_t)(((b * G + g) * Nk + j) * J->d) * es, 1, J->d);
    }
    if (J->gv && J->has_v) {
      char *dst = J->gv + (size_t)((b * Nk + j) * J->dv) * es;
      memcpy(dst, J->partial_v + (size_t)(((b * G) * Nk + j) * J->dv) * es, (size_t)J->dv * es);
      for (int64_t g = 1; g < G; g++)
        attn_sdpa_add_row(J, dst, J->partial_v + (size_t)(((b * G + g) * Nk + j) * J->dv) * es, 1, J->dv);
    }
  }
}

attn_status attn_attention_run_forward(attn_attention_job *J, const char *op) {
  int64_t items = J->B * J->nblk;
  if (items > 0 && J->Nk > 0) {
    /* an item's cost: its products, plus ITEM_FLOPS for what every item pays (packing, the
     * softmax's setup), which dominates short rows */
    double flops = 2.0 * (double)(J->Nq < BLK ? J->Nq : BLK) * (double)J->Nk * (double)(J->d + J->dv + 8) + ITEM_FLOPS;
    atomic_init(&J->failed, 0);
    attn_parallel_for(items, (int64_t)(1e6 / flops) + 1, forward_task, J);
    if (atomic_load(&J->failed)) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the workspace", op);
  } else if (J->out) {
    memset(J->out, 0, (size_t)(J->B * J->Nq * J->dv) * J->es);
  }
  return ATTN_OK;
}

attn_status attn_attention_run_backward(attn_attention_job *J, const char *op) {
  const size_t es = J->es;
  int accum = J->gk || (J->gv && J->has_v);
  if (J->B == 0 || J->Nq == 0 || J->Nk == 0) {
    if (J->gq) memset(J->gq, 0, (size_t)(J->B * J->Nq * J->d) * es);
    if (J->gs) memset(J->gs, 0, (size_t)(J->B * J->Nq * J->Nk) * es);
    if (J->gk) memset(J->gk, 0, (size_t)(J->B * J->Nk * J->d) * es);
    if (J->gv && J->has_v) memset(J->gv, 0, (size_t)(J->B * J->Nk * J->dv) * es);
    return ATTN_OK;
  }
  /* Groups of query blocks per batch: shape-determined (never the thread count), so sums are reproducible. */
  int64_t G = J->nblk;
  if (accum) {
    G = J->B >= 16 ? 1 : (16 + J->B - 1) / J->B;
    if (G > J->nblk) G = J->nblk;
    double per_group = (double)J->B * (double)J->Nk * (double)(J->d + J->dv) * (double)es;
    while (G > 1 && per_group * (double)G > 256.0 * 1048576.0) G /= 2;
  }
  J->groups = G;
  size_t partial_cap = 0;
  char *partial = NULL;
  if (accum && G > 1) {
    size_t nk = (size_t)(J->B * G * J->Nk);
    size_t bytes = nk * (size_t)(J->d + J->dv) * es;
    partial = attn_alloc(bytes ? bytes : 1, &partial_cap);
    if (!partial) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for gradient buffers", op);
    J->partial_k = partial;
    J->partial_v = partial + nk * (size_t)J->d * es;
  }
  double flops = 2.0 * (double)(J->Nq < BLK ? J->Nq : BLK) * (double)J->Nk * (double)(2 * J->d + 2 * J->dv + 8) *
                 (double)(J->nblk / G);
  atomic_init(&J->failed, 0);
  attn_parallel_for(J->B * G, (int64_t)(1e6 / flops) + 1, backward_task, J);
  attn_status st = ATTN_OK;
  if (atomic_load(&J->failed))
    st = attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the workspace", op);
  else if (accum && G > 1)
    attn_parallel_for(J->B * J->Nk, 256, reduce_task, J);
  if (partial) attn_free(partial, partial_cap);
  return st;
}
