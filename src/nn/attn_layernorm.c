/* LayerNorm kernels: see attn_layernorm.h for the model. */
#include "nn/attn_layernorm.h"

#include <math.h>

#include "core/attn_alloc.h"
#include "core/attn_parallel.h"

/* Below about this many entries a job stays on the calling thread. */
#define GRAIN_ELEMENTS 32768

typedef struct {
  const void *x, *w, *b, *dout;
  void *out, *dx, *dw, *db;
  double *mean, *rstd, *acc_w, *acc_b;
  int64_t rows, n;
  double eps;
  int rms; /* RMSNorm: no centring (mean 0) */
} ln_job;

/* Row sums go through LANES independent accumulators, added up in a fixed
 * order at the end: one serial chain of double adds would bound a row by the
 * add latency (several times slower at n = 32), while the fixed order keeps
 * the result the same on every run. */
#define LANES 8
/* Adds E(j + k) to accumulator a##k for k = 0..7; named locals, not an array,
 * so they stay in registers. */
#define ADD_LANES(a, E)                                                 \
  (a##0 += E(j), a##1 += E(j + 1), a##2 += E(j + 2), a##3 += E(j + 3), \
   a##4 += E(j + 4), a##5 += E(j + 5), a##6 += E(j + 6), a##7 += E(j + 7))
#define LANES_TOTAL(a) (((a##0 + a##1) + (a##2 + a##3)) + ((a##4 + a##5) + (a##6 + a##7)))

/* Per-dtype row and column loops (the dtype is the only difference, hence
 * the macro).
 *
 * fwd_rows: rows [r0, r1): mean, then the variance about it (two passes over
 * a row that is in cache: no cancellation as in E[x^2] - mu^2), then y.
 * bwd_rows: with d = g * w, dx = rstd (d - mean(d) - xhat mean(d xhat)).
 * bwd_cols: columns [c0, c1) of dw = sum_r g xhat and db = sum_r g, walking
 * the rows in order over a contiguous stretch of each. */
#define X_AT(i) ((double)x[i])
#define SQ_AT(i) ((x[i] - mu) * (x[i] - mu))
#define G_AT(i) ((double)g[i])
#define GH_AT(i) (G_AT(i) * ((x[i] - mu) * rs)) /* g * xhat */
#define DW_AT(i) (G_AT(i) * w[i])               /* d = g * w */
#define DWH_AT(i) (DW_AT(i) * ((x[i] - mu) * rs))
#define DEFINE_LN(S, T)                                                                                  \
  static double row_mean_##S(const T *x, int64_t n) {                                                   \
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;                              \
    int64_t j = 0;                                                                                      \
    for (; j + LANES <= n; j += LANES) ADD_LANES(a, X_AT);                                              \
    for (; j < n; j++) a0 += x[j];                                                                      \
    return LANES_TOTAL(a) / (double)n;                                                                  \
  }                                                                                                     \
  static double row_var_##S(const T *x, int64_t n, double mu) {                                         \
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;                              \
    int64_t j = 0;                                                                                      \
    for (; j + LANES <= n; j += LANES) ADD_LANES(a, SQ_AT);                                             \
    for (; j < n; j++) a0 += SQ_AT(j);                                                                  \
    return LANES_TOTAL(a) / (double)n;                                                                  \
  }                                                                                                     \
  static void fwd_rows_##S(void *ctx, int64_t r0, int64_t r1) {                                         \
    const ln_job *J = ctx;                                                                              \
    const T *w = J->w, *b = J->b;                                                                       \
    int64_t n = J->n;                                                                                   \
    for (int64_t r = r0; r < r1; r++) {                                                                 \
      const T *x = (const T *)J->x + r * n;                                                             \
      T *y = (T *)J->out + r * n;                                                                       \
      double mu = J->rms ? 0 : row_mean_##S(x, n), rs = 1 / sqrt(row_var_##S(x, n, mu) + J->eps);       \
      J->mean[r] = mu, J->rstd[r] = rs;                                                                 \
      if (w && b)                                                                                       \
        for (int64_t j = 0; j < n; j++) y[j] = (T)((x[j] - mu) * rs * w[j] + b[j]);                     \
      else if (w)                                                                                       \
        for (int64_t j = 0; j < n; j++) y[j] = (T)((x[j] - mu) * rs * w[j]);                            \
      else if (b)                                                                                       \
        for (int64_t j = 0; j < n; j++) y[j] = (T)((x[j] - mu) * rs + b[j]);                            \
      else                                                                                              \
        for (int64_t j = 0; j < n; j++) y[j] = (T)((x[j] - mu) * rs);                                   \
    }                                                                                                   \
  }                                                                                                     \
  static void bwd_rows_##S(void *ctx, int64_t r0, int64_t r1) {                                         \
    const ln_job *J = ctx;                                                                              \
    const T *w = J->w;                                                                                  \
    int64_t n = J->n;                                                                                   \
    for (int64_t r = r0; r < r1; r++) {                                                                 \
      const T *x = (const T *)J->x + r * n, *g = (const T *)J->dout + r * n;                            \
      T *dx = (T *)J->dx + r * n;                                                                       \
      double mu = J->mean[r], rs = J->rstd[r];                                                          \
      double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;                            \
      double c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0, c6 = 0, c7 = 0;                            \
      int64_t j = 0;                                                                                    \
      if (w) /* two loops: a test per element would keep them from vectorising */                      \
        for (; j + LANES <= n; j += LANES) ADD_LANES(a, DW_AT), ADD_LANES(c, DWH_AT);                   \
      else                                                                                              \
        for (; j + LANES <= n; j += LANES) ADD_LANES(a, G_AT), ADD_LANES(c, GH_AT);                     \
      for (; j < n; j++) a0 += w ? DW_AT(j) : G_AT(j), c0 += w ? DWH_AT(j) : GH_AT(j);                  \
      double sd = J->rms ? 0 : LANES_TOTAL(a) / (double)n, sdh = LANES_TOTAL(c) / (double)n;            \
      if (w)                                                                                            \
        for (j = 0; j < n; j++) dx[j] = (T)(rs * ((double)g[j] * w[j] - sd - (x[j] - mu) * rs * sdh));  \
      else                                                                                              \
        for (j = 0; j < n; j++) dx[j] = (T)(rs * (g[j] - sd - (x[j] - mu) * rs * sdh));                 \
    }                                                                                                   \
  }                                                                                                     \
  static void bwd_cols_##S(void *ctx, int64_t c0, int64_t c1) {                                         \
    const ln_job *J = ctx;                                                                              \
    int64_t n = J->n;                                                                                   \
    double *aw = J->acc_w, *ab = J->acc_b;                                                              \
    for (int64_t c = c0; c < c1; c++) aw[c] = ab[c] = 0;                                                \
    for (int64_t r = 0; r < J->rows; r++) {                                                             \
      const T *x = (const T *)J->x + r * n, *g = (const T *)J->dout + r * n;                            \
      double mu = J->mean[r], rs = J->rstd[r];                                                          \
      for (int64_t c = c0; c < c1; c++) {                                                               \
        aw[c] += g[c] * ((x[c] - mu) * rs);                                                             \
        ab[c] += g[c];                                                                                  \
      }                                                                                                 \
    }                                                                                                   \
    for (int64_t c = c0; c < c1; c++) {                                                                 \
      if (J->dw) ((T *)J->dw)[c] = (T)aw[c];                                                            \
      if (J->db) ((T *)J->db)[c] = (T)ab[c];                                                            \
    }                                                                                                   \
  }

DEFINE_LN(f32, float)
DEFINE_LN(f64, double)

/* ---------------------------------------------------------------- checks */

/* t: contiguous, of dtype dt, with numel entries. */
static attn_status check_operand(const char *op, const char *what, const attn_tensor *t, attn_dtype dt,
                                 int64_t numel) {
  if (t->dtype != dt)
    return attn_error(ATTN_ERR_DTYPE, "%s: %s %s is %s, expected %s", op, what, attn_tensor_shape_str(t),
                      attn_dtype_name(t->dtype), attn_dtype_name(dt));
  if (attn_tensor_numel(t) != numel)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must have %lld entries", op, what, attn_tensor_shape_str(t),
                      (long long)numel);
  if (!attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_ARG, "%s: %s %s must be contiguous", op, what, attn_tensor_shape_str(t));
  return ATTN_OK;
}

attn_status attn_layer_norm_rows(const char *op, const attn_tensor *x, int64_t n, int64_t *rows) {
  if (attn_check_float(op, x) != ATTN_OK) return ATTN_ERR_DTYPE;
  int64_t numel = attn_tensor_numel(x);
  if (n < 1 || numel % n != 0)
    return attn_error(ATTN_ERR_SHAPE, "%s: input %s does not split into rows of %lld entries", op,
                      attn_tensor_shape_str(x), (long long)n);
  if (!attn_tensor_is_contiguous(x))
    return attn_error(ATTN_ERR_ARG, "%s: input %s must be contiguous", op, attn_tensor_shape_str(x));
  *rows = numel / n;
  return ATTN_OK;
}

attn_status attn_layer_norm_saved_layout(int64_t rows, attn_saved_layout *l) {
  attn_saved_begin(l, "layer_norm");
  attn_saved_set_dtype(l, ATTN_F64); /* the row statistics stay in double for both dtypes */
  attn_status st = attn_saved_add(l, "mean", 1, &rows);
  return st == ATTN_OK ? attn_saved_add(l, "rstd", 1, &rows) : st;
}

/* The layout for `rows` rows, checked against saved (op names the caller);
 * sets the job's mean and rstd pointers into it. */
static attn_status saved_stats(const char *op, int64_t rows, const attn_tensor *saved, ln_job *J) {
  attn_saved_layout lay;
  attn_status st = attn_layer_norm_saved_layout(rows, &lay);
  if (st == ATTN_OK) st = attn_saved_check(op, &lay, saved, ATTN_F64);
  if (st != ATTN_OK) return st;
  J->mean = attn_saved_data(saved, &lay, ATTN_LAYER_NORM_SAVED_MEAN, 0);
  J->rstd = attn_saved_data(saved, &lay, ATTN_LAYER_NORM_SAVED_RSTD, 0);
  return ATTN_OK;
}

static int64_t grain(int64_t per_item) { return GRAIN_ELEMENTS / (per_item > 0 ? per_item : 1) + 1; }

/* ---------------------------------------------------------------- entry points */

static attn_status norm_forward(const char *op, int rms, const attn_tensor *x, int64_t n, const attn_tensor *weight,
                                const attn_tensor *bias, double eps, attn_tensor *out, attn_tensor *saved) {
  int64_t rows = 0;
  attn_status st = attn_layer_norm_rows(op, x, n, &rows);
  if (st == ATTN_OK && weight) st = check_operand(op, "weight", weight, x->dtype, n);
  if (st == ATTN_OK && bias) st = check_operand(op, "bias", bias, x->dtype, n);
  if (st == ATTN_OK) st = check_operand(op, "output", out, x->dtype, rows * n);
  ln_job J = {0};
  if (st == ATTN_OK) st = saved_stats(op, rows, saved, &J);
  if (st != ATTN_OK) return st;
  J.x = attn_tensor_data(x), J.w = weight ? attn_tensor_data(weight) : NULL;
  J.b = bias ? attn_tensor_data(bias) : NULL, J.out = attn_tensor_data(out);
  J.rows = rows, J.n = n, J.eps = eps, J.rms = rms;
  /* a forward row costs about 40 ns at n = 32 (its statistics in double, a square root): as a
   * dozen passes of cheap elementwise work, so the decoder's (256, 1, 32) rows split in two */
  attn_parallel_for(rows, grain(12 * n), x->dtype == ATTN_F32 ? fwd_rows_f32 : fwd_rows_f64, &J);
  return ATTN_OK;
}

attn_status attn_layer_norm_forward(const attn_tensor *x, int64_t n, const attn_tensor *weight,
                                    const attn_tensor *bias, double eps, attn_tensor *out, attn_tensor *saved) {
  return norm_forward("layer_norm", 0, x, n, weight, bias, eps, out, saved);
}

attn_status attn_rms_norm_forward(const attn_tensor *x, int64_t n, const attn_tensor *weight, double eps,
                                  attn_tensor *out, attn_tensor *saved) {
  return norm_forward("rms_norm", 1, x, n, weight, NULL, eps, out, saved);
}

static attn_status norm_backward(const char *op, int rms, const attn_tensor *x, int64_t n, const attn_tensor *weight,
                                 const attn_tensor *saved, const attn_tensor *dout, attn_tensor *dx,
                                 attn_tensor *dweight, attn_tensor *dbias) {
  int64_t rows = 0;
  attn_status st = attn_layer_norm_rows(op, x, n, &rows);
  if (st == ATTN_OK && weight) st = check_operand(op, "weight", weight, x->dtype, n);
  if (st == ATTN_OK) st = check_operand(op, "output gradient", dout, x->dtype, rows * n);
  if (st == ATTN_OK && dx) st = check_operand(op, "input gradient", dx, x->dtype, rows * n);
  if (st == ATTN_OK && dweight) st = check_operand(op, "weight gradient", dweight, x->dtype, n);
  if (st == ATTN_OK && dbias) st = check_operand(op, "bias gradient", dbias, x->dtype, n);
  ln_job J = {0};
  if (st == ATTN_OK) st = saved_stats(op, rows, saved, &J);
  if (st != ATTN_OK) return st;
  int f32 = x->dtype == ATTN_F32;
  J.x = attn_tensor_data(x), J.w = weight ? attn_tensor_data(weight) : NULL;
  J.dout = attn_tensor_data(dout), J.dx = dx ? attn_tensor_data(dx) : NULL;
  J.dw = dweight ? attn_tensor_data(dweight) : NULL, J.db = dbias ? attn_tensor_data(dbias) : NULL;
  J.rows = rows, J.n = n, J.rms = rms;
  if (dx) attn_parallel_for(rows, grain(3 * n), f32 ? bwd_rows_f32 : bwd_rows_f64, &J);
  if (dweight || dbias) {
    size_t cap = 0;
    J.acc_w = attn_alloc((size_t)(2 * n) * sizeof(double), &cap);
    if (!J.acc_w) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for %lld column sums", op, (long long)n);
    J.acc_b = J.acc_w + n;
    attn_parallel_for(n, grain(2 * rows), f32 ? bwd_cols_f32 : bwd_cols_f64, &J);
    attn_free(J.acc_w, cap);
  }
  return ATTN_OK;
}

attn_status attn_layer_norm_backward(const attn_tensor *x, int64_t n, const attn_tensor *weight,
                                     const attn_tensor *saved, const attn_tensor *dout, attn_tensor *dx,
                                     attn_tensor *dweight, attn_tensor *dbias) {
  return norm_backward("layer_norm backward", 0, x, n, weight, saved, dout, dx, dweight, dbias);
}

attn_status attn_rms_norm_backward(const attn_tensor *x, int64_t n, const attn_tensor *weight,
                                   const attn_tensor *saved, const attn_tensor *dout, attn_tensor *dx,
                                   attn_tensor *dweight) {
  return norm_backward("rms_norm backward", 1, x, n, weight, saved, dout, dx, dweight, NULL);
}
