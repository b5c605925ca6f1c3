/* Additive attention scores (d2l's AdditiveAttention): w_v . tanh(q + k) for every (query, key)
 * pair, forward and backward, without the (B, Nq, Nk, h) tensor the book builds. float64 is the
 * plain reference (libm tanh, double sums); float32 goes through the vectorised tanh over blocks
 * of pairs, one tanh per pair in the backward. The masking, softmax and weighted sum that follow
 * are attention over given scores (src/attention/attn_attention.c). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "attention/attn_attention.h"
#include "core/attn_parallel.h"
#include "core/attn_vmath.h"

/* ------------------------------------------------------------ additive scores */

typedef struct {
  int64_t B, Nq, Nk, h;
  const double *q, *k, *w, *g; /* contiguous float64 copies */
  attn_dtype dt;
  char *out, *dq, *dk; /* outputs in dt (contiguous) */
  char *tanh_out;      /* NULL or (B, Nq, Nk, h) in dt: the forward's tanh values */
  double *dw_rows;     /* (B * Nq, h) partial sums of dw */
  int skip_zero;       /* finite qh and kh: a pair with grad 0 contributes exactly 0 */
} additive_job;

static void store(void *base, attn_dtype dt, int64_t i, double v) {
  if (dt == ATTN_F32)
    ((float *)base)[i] = (float)v;
  else
    ((double *)base)[i] = v;
}

static void additive_forward_task(void *ctx, int64_t begin, int64_t end) {
  const additive_job *J = ctx;
  const int64_t h = J->h;
  for (int64_t row = begin; row < end; row++) { /* row = b * Nq + i */
    int64_t b = row / J->Nq;
    const double *q = J->q + row * h;
    for (int64_t j = 0; j < J->Nk; j++) {
      const double *k = J->k + (b * J->Nk + j) * h;
      double s = 0;
      for (int64_t c = 0; c < h; c++) {
        double t = tanh(q[c] + k[c]);
        s += J->w[c] * t;
        if (J->tanh_out) store(J->tanh_out, J->dt, (row * J->Nk + j) * h + c, t);
      }
      store(J->out, J->dt, row * J->Nk + j, s);
    }
  }
}

/* Rows (b, i): dq[b,i,:] and the partial dw of the row. */
static void additive_query_task(void *ctx, int64_t begin, int64_t end) {
  const additive_job *J = ctx;
  const int64_t h = J->h;
  for (int64_t row = begin; row < end; row++) {
    int64_t b = row / J->Nq;
    const double *q = J->q + row * h, *g = J->g + row * J->Nk;
    double *dw = J->dw_rows + row * h;
    for (int64_t c = 0; c < h; c++) dw[c] = 0;
    for (int64_t c = 0; c < h; c++) {
      double acc = 0, accw = 0;
      for (int64_t j = 0; j < J->Nk; j++) {
        if (g[j] == 0 && J->skip_zero) continue; /* masked: never evaluated */
        double t = tanh(q[c] + J->k[(b * J->Nk + j) * h + c]);
        acc += g[j] * (1 - t * t);
        accw += g[j] * t;
      }
      dw[c] = accw;
      if (J->dq) store(J->dq, J->dt, row * h + c, acc * J->w[c]);
    }
  }
}

/* Rows (b, j): dk[b,j,:]. */
static void additive_key_task(void *ctx, int64_t begin, int64_t end) {
  const additive_job *J = ctx;
  const int64_t h = J->h;
  for (int64_t row = begin; row < end; row++) { /* row = b * Nk + j */
    int64_t b = row / J->Nk, j = row % J->Nk;
    const double *k = J->k + row * h;
    for (int64_t c = 0; c < h; c++) {
      double acc = 0;
      for (int64_t i = 0; i < J->Nq; i++) {
        double g = J->g[(b * J->Nq + i) * J->Nk + j];
        if (g == 0 && J->skip_zero) continue;
        double t = tanh(J->q[(b * J->Nq + i) * h + c] + k[c]);
        acc += g * (1 - t * t);
      }
      store(J->dk, J->dt, row * h + c, acc * J->w[c]);
    }
  }
}

static attn_status additive_check(const char *op, const attn_tensor *qh, const attn_tensor *kh, const attn_tensor *wv) {
  const attn_tensor *operands[3] = {qh, kh, wv};
  static const char *const names[3] = {"Qh", "Kh", "w_v"}, *const dims[3] = {"(B, Nq, h)", "(B, Nk, h)", "(h)"};
  for (int n = 0; n < 3; n++)
    if (operands[n]->ndim != (n < 2 ? 3 : 1))
      return attn_error(ATTN_ERR_SHAPE, "%s: %s must be %s, got %s", op, names[n], dims[n],
                        attn_tensor_shape_str(operands[n]));
  if (qh->ndim != 3 || kh->ndim != 3 || wv->ndim != 1 || qh->shape[0] != kh->shape[0] || qh->shape[2] != kh->shape[2] ||
      wv->shape[0] != qh->shape[2])
    return attn_error(ATTN_ERR_SHAPE,
                      "%s: expected projected queries (B, Nq, h), keys (B, Nk, h) and w_v (h), got %s, %s and %s", op,
                      attn_tensor_shape_str(qh), attn_tensor_shape_str(kh), attn_tensor_shape_str(wv));
  if (kh->dtype != qh->dtype || wv->dtype != qh->dtype)
    return attn_error(ATTN_ERR_DTYPE, "%s: dtypes differ: queries %s, keys %s, w_v %s", op, attn_dtype_name(qh->dtype),
                      attn_dtype_name(kh->dtype), attn_dtype_name(wv->dtype));
  return attn_check_float(op, qh);
}

static attn_status check_out3(const char *op, const char *name, const attn_tensor *t, attn_dtype dt, int ndim,
                              const int64_t *shape) {
  int ok = t->ndim == ndim && t->dtype == dt && attn_tensor_is_contiguous(t);
  for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
  if (!ok)
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s %s must be a contiguous %s tensor of shape %s", op, name,
                      attn_tensor_shape_str(t), attn_dtype_name(dt), attn_shape_str(ndim, shape));
  return ATTN_OK;
}

/* Items per parallel chunk for items of `tanhs` tanh each, costing `flops`
 * apiece (libm's double tanh ~20, the vectorised float one ~4). */
static int64_t additive_grain(int64_t tanhs, double flops) {
  double work = (double)tanhs * flops;
  return (int64_t)(2e5 / (work > 1 ? work : 1)) + 1;
}

/* float32 path: the shared vectorised tanh (attn_vmath) over blocks of (i, j)
 * pairs, float arithmetic in a fixed order per output row. The float64 path
 * above (libm, double) stays as the plain reference. */
enum { ADDITIVE_BLOCK = 1024 }; /* floats of tanh per block: 4 KiB, in L1 */

typedef struct {
  int64_t B, Nq, Nk, h;
  const float *q, *k, *w, *g; /* contiguous */
  float *out, *dq, *dk;       /* contiguous outputs, or NULL */
  float *tanh_out;            /* NULL or (B, Nq, Nk, h): the forward's tanh values */
  float *dw_b;                /* (B, h) partial sums of dw */
  int skip_zero;              /* as additive_job's */
} additive32_job;

/* Pairs of one block: np keys starting at k (rows of h floats), columns
 * c0 .. c0 + hc - 1. t[p * hc + c] = tanh(q[c0 + c] + k[p][c0 + c]). */
static void tanh_pairs(const float *q, const float *const *k, int64_t np, int64_t c0, int64_t hc, float *t) {
  for (int64_t p = 0; p < np; p++)
    for (int64_t c = 0; c < hc; c++) t[p * hc + c] = q[c0 + c] + k[p][c0 + c];
  attn_vmath_tanh_f32(t, t, np * hc);
}

/* Keys per block and columns per chunk: whole rows of h when they fit. */
static int64_t block_cols(int64_t h) { return h < ADDITIVE_BLOCK ? h : ADDITIVE_BLOCK; }

static void additive32_forward_task(void *ctx, int64_t begin, int64_t end) {
  const additive32_job *J = ctx;
  const int64_t h = J->h, hc = block_cols(h), jb = ADDITIVE_BLOCK / hc;
  float tbuf[ADDITIVE_BLOCK];
  const float *kp[ADDITIVE_BLOCK];
  for (int64_t row = begin; row < end; row++) { /* row = b * Nq + i */
    int64_t b = row / J->Nq;
    const float *q = J->q + row * h;
    float *out = J->out + row * J->Nk;
    for (int64_t j = 0; j < J->Nk; j++) out[j] = 0;
    for (int64_t c0 = 0; c0 < h; c0 += hc) {
      int64_t nc = h - c0 < hc ? h - c0 : hc;
      for (int64_t j0 = 0; j0 < J->Nk; j0 += jb) {
        int64_t np = J->Nk - j0 < jb ? J->Nk - j0 : jb;
        for (int64_t p = 0; p < np; p++) kp[p] = J->k + (b * J->Nk + j0 + p) * h;
        /* whole rows: the block is the tanh output's rows j0 .. j0 + np - 1 as they are, so it is
         * written there (the same call on the same values: the same bits) */
        float *t = J->tanh_out && nc == h ? J->tanh_out + (row * J->Nk + j0) * h : tbuf;
        tanh_pairs(q, kp, np, c0, nc, t);
        if (J->tanh_out && t == tbuf)
          for (int64_t p = 0; p < np; p++)
            memcpy(J->tanh_out + (row * J->Nk + j0 + p) * h + c0, t + p * nc, sizeof(float) * (size_t)nc);
        for (int64_t p = 0; p < np; p++) {
          float s[4] = {0, 0, 0, 0}; /* four lanes the compiler can keep in one register */
          int64_t c = 0;
          for (; c + 4 <= nc; c += 4)
            for (int l = 0; l < 4; l++) s[l] += J->w[c0 + c + l] * t[p * nc + c + l];
          for (; c < nc; c++) s[0] += J->w[c0 + c] * t[p * nc + c];
          out[j0 + p] += (s[0] + s[1]) + (s[2] + s[3]);
        }
      }
    }
  }
}

static void add_row(float *restrict y, const float *restrict x, int64_t n) {
  for (int64_t c = 0; c < n; c++) y[c] += x[c];
}

/* Batches b: dq[b], dk[b] and the partial dw of b from one tanh per unmasked
 * pair (pairs whose grad is 0 are never evaluated when skip_zero says that is exact). */
static void additive32_backward_task(void *ctx, int64_t begin, int64_t end) {
  const additive32_job *J = ctx;
  const int64_t h = J->h, Nq = J->Nq, Nk = J->Nk, hc = block_cols(h), jb = ADDITIVE_BLOCK / hc;
  float t[ADDITIVE_BLOCK];
  const float *kp[ADDITIVE_BLOCK];
  int64_t jp[ADDITIVE_BLOCK];
  for (int64_t b = begin; b < end; b++) {
    float *dw = J->dw_b + b * h;
    float *dk = J->dk ? J->dk + b * Nk * h : NULL;
    for (int64_t c = 0; c < h; c++) dw[c] = 0;
    if (dk)
      for (int64_t x = 0; x < Nk * h; x++) dk[x] = 0;
    for (int64_t i = 0; i < Nq; i++) {
      const float *q = J->q + (b * Nq + i) * h, *g = J->g + (b * Nq + i) * Nk;
      float *dq = J->dq ? J->dq + (b * Nq + i) * h : NULL;
      if (dq)
        for (int64_t c = 0; c < h; c++) dq[c] = 0;
      for (int64_t c0 = 0; c0 < h; c0 += hc) {
        int64_t nc = h - c0 < hc ? h - c0 : hc;
        for (int64_t j = 0; j < Nk;) {
          int64_t np = 0;
          for (; j < Nk && np < jb; j++)
            if (g[j] != 0 || !J->skip_zero) {
              jp[np] = j;
              kp[np++] = J->k + (b * Nk + j) * h;
            }
          tanh_pairs(q, kp, np, c0, nc, t);
          /* Separate unconditional loops over c, so each one vectorises. */
          for (int64_t p = 0; p < np; p++) {
            const float gj = g[jp[p]];
            float *restrict tp = t + p * nc, *restrict dwc = dw + c0;
            for (int64_t c = 0; c < nc; c++) {
              dwc[c] += gj * tp[c];
              tp[c] = gj * (1 - tp[c] * tp[c]); /* now the grad of the pre-activation */
            }
            if (dq) add_row(dq + c0, tp, nc);
            if (dk) add_row(dk + jp[p] * h + c0, tp, nc);
          }
        }
      }
      if (dq)
        for (int64_t c = 0; c < h; c++) dq[c] *= J->w[c];
    }
    if (dk)
      for (int64_t j = 0; j < Nk; j++)
        for (int64_t c = 0; c < h; c++) dk[j * h + c] *= J->w[c];
  }
}

/* 1 when x[0:n] is finite. With finite qh and kh, tanh(q + k) is finite and a pair whose grad is
 * 0 contributes exactly 0, so it may be skipped; a NaN in qh or kh must still reach the gradients.
 * x - x is 0 exactly for a finite x (NaN for NaN and inf); the flags are or-reduced as integers,
 * which vectorises (the decoder runs it on the keys at every step). */
#define ATTN_FINITE_CHECK(name, type)                               \
  static int name(const type *x, int64_t n) {                       \
    int bad = 0;                                                    \
    for (int64_t i = 0; i < n; i++) bad |= !(x[i] - x[i] == 0);     \
    return !bad;                                                    \
  }
ATTN_FINITE_CHECK(finite_f32, float)
ATTN_FINITE_CHECK(finite_f64, double)

/* Data of t as contiguous float32: t's own, or a copy made in *tmp. */
static attn_status f32_data(const attn_tensor *t, attn_tensor *tmp, const float **p) {
  if (attn_tensor_is_contiguous(t)) {
    *p = attn_tensor_data(t);
    return ATTN_OK;
  }
  attn_status st = attn_tensor_clone(tmp, t, ATTN_F32);
  *p = st == ATTN_OK ? attn_tensor_data(tmp) : NULL;
  return st;
}

attn_status attn_attention_additive_scores_forward(const attn_tensor *qh, const attn_tensor *kh, const attn_tensor *wv,
                                                   attn_tensor *out) {
  return attn_attention_additive_scores_forward_tanh(qh, kh, wv, out, NULL);
}

attn_status attn_attention_additive_scores_forward_tanh(const attn_tensor *qh, const attn_tensor *kh,
                                                        const attn_tensor *wv, attn_tensor *out,
                                                        attn_tensor *tanh_out) {
  const char *op = "additive_scores";
  attn_status st = additive_check(op, qh, kh, wv);
  if (st != ATTN_OK) return st;
  int64_t os[3] = {qh->shape[0], qh->shape[1], kh->shape[1]};
  const int64_t ts[4] = {os[0], os[1], os[2], qh->shape[2]};
  if ((st = check_out3(op, "scores", out, qh->dtype, 3, os)) != ATTN_OK ||
      (tanh_out && (st = check_out3(op, "tanh", tanh_out, qh->dtype, 4, ts)) != ATTN_OK))
    return st;
  attn_tensor q = {0}, k = {0}, w = {0};
  if (qh->dtype == ATTN_F32) {
    additive32_job J = {.B = os[0],
                        .Nq = os[1],
                        .Nk = os[2],
                        .h = qh->shape[2],
                        .out = attn_tensor_data(out),
                        .tanh_out = tanh_out ? attn_tensor_data(tanh_out) : NULL};
    if ((st = f32_data(qh, &q, &J.q)) == ATTN_OK && (st = f32_data(kh, &k, &J.k)) == ATTN_OK &&
        (st = f32_data(wv, &w, &J.w)) == ATTN_OK)
      attn_parallel_for(J.B * J.Nq, additive_grain(J.Nk * J.h, 4), additive32_forward_task, &J);
    attn_tensor_free(&q);
    attn_tensor_free(&k);
    attn_tensor_free(&w);
    return st;
  }
  if ((st = attn_tensor_clone(&q, qh, ATTN_F64)) == ATTN_OK && (st = attn_tensor_clone(&k, kh, ATTN_F64)) == ATTN_OK &&
      (st = attn_tensor_clone(&w, wv, ATTN_F64)) == ATTN_OK) {
    additive_job J = {.B = os[0],
                      .Nq = os[1],
                      .Nk = os[2],
                      .h = qh->shape[2],
                      .q = attn_tensor_data(&q),
                      .k = attn_tensor_data(&k),
                      .w = attn_tensor_data(&w),
                      .dt = qh->dtype,
                      .out = attn_tensor_data(out),
                      .tanh_out = tanh_out ? attn_tensor_data(tanh_out) : NULL};
    attn_parallel_for(J.B * J.Nq, additive_grain(J.Nk * J.h, 20), additive_forward_task, &J);
  }
  attn_tensor_free(&q);
  attn_tensor_free(&k);
  attn_tensor_free(&w);
  return st;
}

attn_status attn_attention_additive_scores_backward(const attn_tensor *qh, const attn_tensor *kh, const attn_tensor *wv,
                                                    const attn_tensor *dscores, attn_tensor *dqh, attn_tensor *dkh,
                                                    attn_tensor *dwv) {
  const char *op = "additive_scores backward";
  attn_status st = additive_check(op, qh, kh, wv);
  if (st != ATTN_OK) return st;
  int64_t B = qh->shape[0], Nq = qh->shape[1], Nk = kh->shape[1], h = qh->shape[2];
  int64_t ss[3] = {B, Nq, Nk};
  if (dscores->ndim != 3 || dscores->shape[0] != B || dscores->shape[1] != Nq || dscores->shape[2] != Nk ||
      dscores->dtype != qh->dtype)
    return attn_error(ATTN_ERR_SHAPE, "%s: grad of scores %s %s must be %s %s", op, attn_tensor_shape_str(dscores),
                      attn_dtype_name(dscores->dtype), attn_dtype_name(qh->dtype), attn_shape_str(3, ss));
  if ((dqh && (st = check_out3(op, "dqh", dqh, qh->dtype, 3, qh->shape)) != ATTN_OK) ||
      (dkh && (st = check_out3(op, "dkh", dkh, qh->dtype, 3, kh->shape)) != ATTN_OK) ||
      (dwv && (st = check_out3(op, "dw_v", dwv, qh->dtype, 1, wv->shape)) != ATTN_OK))
    return st;
  attn_tensor q = {0}, k = {0}, w = {0}, g = {0};
  size_t cap = 0;
  double *dw_rows = NULL;
  if (qh->dtype == ATTN_F32) {
    additive32_job J = {.B = B,
                        .Nq = Nq,
                        .Nk = Nk,
                        .h = h,
                        .dq = dqh ? attn_tensor_data(dqh) : NULL,
                        .dk = dkh ? attn_tensor_data(dkh) : NULL};
    float *dw_b = NULL;
    if ((st = f32_data(qh, &q, &J.q)) != ATTN_OK || (st = f32_data(kh, &k, &J.k)) != ATTN_OK ||
        (st = f32_data(wv, &w, &J.w)) != ATTN_OK || (st = f32_data(dscores, &g, &J.g)) != ATTN_OK)
      goto done;
    dw_b = attn_alloc(sizeof(float) * (size_t)(B * h > 0 ? B * h : 1), &cap);
    if (!dw_b) {
      st = attn_error(ATTN_ERR_MEMORY, "%s: out of memory", op);
      goto done;
    }
    J.dw_b = dw_b;
    J.skip_zero = finite_f32(J.q, B * Nq * h) && finite_f32(J.k, B * Nk * h);
    attn_parallel_for(B, additive_grain(Nq * Nk * h, 4), additive32_backward_task, &J);
    if (dwv) {
      float *out = attn_tensor_data(dwv);
      for (int64_t c = 0; c < h; c++) {
        double s = 0; /* fixed order over b: the same bits on any thread count */
        for (int64_t b = 0; b < B; b++) s += dw_b[b * h + c];
        out[c] = (float)s;
      }
    }
    attn_free(dw_b, cap);
    goto done;
  }
  if ((st = attn_tensor_clone(&q, qh, ATTN_F64)) != ATTN_OK || (st = attn_tensor_clone(&k, kh, ATTN_F64)) != ATTN_OK ||
      (st = attn_tensor_clone(&w, wv, ATTN_F64)) != ATTN_OK ||
      (st = attn_tensor_clone(&g, dscores, ATTN_F64)) != ATTN_OK)
    goto done;
  additive_job J = {.B = B,
                    .Nq = Nq,
                    .Nk = Nk,
                    .h = h,
                    .q = attn_tensor_data(&q),
                    .k = attn_tensor_data(&k),
                    .w = attn_tensor_data(&w),
                    .g = attn_tensor_data(&g),
                    .dt = qh->dtype,
                    .dq = dqh ? attn_tensor_data(dqh) : NULL,
                    .dk = dkh ? attn_tensor_data(dkh) : NULL};
  J.skip_zero = finite_f64(J.q, B * Nq * h) && finite_f64(J.k, B * Nk * h);
  if (dqh || dwv) {
    size_t n = (size_t)(B * Nq * h);
    dw_rows = attn_alloc(sizeof(double) * (n ? n : 1), &cap);
    if (!dw_rows) {
      st = attn_error(ATTN_ERR_MEMORY, "%s: out of memory", op);
      goto done;
    }
    J.dw_rows = dw_rows;
    attn_parallel_for(B * Nq, additive_grain(Nk * h, 20), additive_query_task, &J);
    if (dwv) {
      char *out = attn_tensor_data(dwv);
      for (int64_t c = 0; c < h; c++) {
        double s = 0;
        for (int64_t row = 0; row < B * Nq; row++) s += dw_rows[row * h + c];
        store(out, qh->dtype, c, s);
      }
    }
  }
  if (dkh) attn_parallel_for(B * Nk, additive_grain(Nq * h, 20), additive_key_task, &J);
done:
  if (dw_rows) attn_free(dw_rows, cap);
  attn_tensor_free(&q);
  attn_tensor_free(&k);
  attn_tensor_free(&w);
  attn_tensor_free(&g);
  return st;
}
