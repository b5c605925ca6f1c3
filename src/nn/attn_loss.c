/* Softmax cross-entropy kernels: see attn_loss.h for the model. */
#include "nn/attn_loss.h"

#include <math.h>

#include "core/attn_ops.h"
#include "core/attn_parallel.h"
#include "core/attn_vmath.h"

/* Below about this many logits a job stays on the calling thread. */
#define GRAIN_ELEMENTS 16384
/* The exp-and-sum pass works through a stack buffer of this many entries: the
 * softmax kernel sums a row of up to this length in the same single call, so
 * both give the same log-sum-exp. */
#define CHUNK 1024

typedef struct {
  const void *x, *valid, *stats, *dloss;
  const int64_t *index;
  void *loss, *out_stats, *dx;
  attn_dtype vdtype;
  double eps;                         /* label smoothing */
  int64_t C, steps;
  int lead;                           /* the dims before the classes */
  int64_t shape[ATTN_MAX_DIMS], stride[ATTN_MAX_DIMS]; /* theirs, strides in elements */
} ce_job;

/* Element offset of row r (row-major over the leading dims) in the logits. */
static int64_t row_offset(const ce_job *J, int64_t r) {
  int64_t off = 0;
  for (int d = J->lead - 1; d >= 0; d--) {
    off += r % J->shape[d] * J->stride[d];
    r /= J->shape[d];
  }
  return off;
}

/* Whether row r counts: its step t + 1 <= valid_len[b], compared in the
 * logits' dtype as the composed mask (valid_len converted, then <=) does. */
static int row_counts(const ce_job *J, int64_t r, int f32) {
  if (!J->valid) return 1;
  int64_t b = r / J->steps, t = r % J->steps + 1;
  double v = J->vdtype == ATTN_F32   ? ((const float *)J->valid)[b]
             : J->vdtype == ATTN_F64 ? ((const double *)J->valid)[b]
                                     : (double)((const int64_t *)J->valid)[b];
  return f32 ? (float)t <= (float)v : (double)t <= v;
}

static void exp_f64(const double *x, double *y, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = exp(x[j]);
}

/* Per dtype: the sum of exp(x - m) over a row through the stack buffer,
 * forward rows and backward rows. */
#define DEFINE_CE(S, T, F32)                                                           \
  static double exp_row_sum_##S(T *buf, const T *x, int64_t n, T m) {                  \
    double sum = 0;                                                                    \
    for (int64_t k = 0; k < n; k += CHUNK) {                                           \
      int64_t len = n - k < CHUNK ? n - k : CHUNK;                                     \
      for (int64_t j = 0; j < len; j++) buf[j] = x[k + j];                             \
      sum += attn_vmath_exp_row_##S(buf, len, m);                                      \
    }                                                                                  \
    return sum;                                                                        \
  }                                                                                    \
  static void forward_##S(void *ctx, int64_t r0, int64_t r1) {                         \
    const ce_job *J = ctx;                                                             \
    T buf[CHUNK];                                                                      \
    for (int64_t r = r0; r < r1; r++) {                                                \
      const T *x = (const T *)J->x + row_offset(J, r);                                 \
      T m = attn_row_max_##S(x, J->C);                                                      \
      if (m == -INFINITY) m = 0;                                                       \
      T s = (T)log(exp_row_sum_##S(buf, x, J->C, m));                                  \
      T l = -((x[J->index[r]] - m) - s);                                               \
      if (J->eps != 0) {                                                               \
        double sum = 0; /* -mean log p, as log_softmax and mean give it */             \
        for (int64_t c = 0; c < J->C; c++) sum += (double)((x[c] - m) - s);            \
        T smooth = -(T)(sum / (double)J->C);                                           \
        l = l * (T)(1 - J->eps) + smooth * (T)J->eps;                                  \
      }                                                                                \
      if (J->valid) l = l * (T)row_counts(J, r, F32);                                  \
      ((T *)J->loss)[r] = l;                                                           \
      ((T *)J->out_stats)[2 * r] = m, ((T *)J->out_stats)[2 * r + 1] = s;              \
    }                                                                                  \
  }                                                                                    \
  static void backward_##S(void *ctx, int64_t r0, int64_t r1) {                        \
    const ce_job *J = ctx;                                                             \
    for (int64_t r = r0; r < r1; r++) {                                                \
      const T *x = (const T *)J->x + row_offset(J, r);                                 \
      T *d = (T *)J->dx + r * J->C;                                                    \
      T m = ((const T *)J->stats)[2 * r], s = ((const T *)J->stats)[2 * r + 1];        \
      T g = ((const T *)J->dloss)[r];                                                  \
      if (J->valid) g = g * (T)row_counts(J, r, F32);                                  \
      for (int64_t c = 0; c < J->C; c++) d[c] = (x[c] - m) - s;                        \
      EXP_##S(d, d, J->C);                                                             \
      if (J->eps == 0) {                                                               \
        for (int64_t c = 0; c < J->C; c++) d[c] = d[c] * g;                            \
        d[J->index[r]] = d[J->index[r]] + -g;                                          \
      } else { /* d log p: -(1 - eps) g at y, -eps g / C everywhere */                 \
        T u = g * (T)J->eps / (T)J->C;                                                 \
        for (int64_t c = 0; c < J->C; c++) d[c] = d[c] * g - u;                        \
        d[J->index[r]] = d[J->index[r]] - g * (T)(1 - J->eps);                         \
      }                                                                                \
    }                                                                                  \
  }
#define EXP_f32 attn_vmath_exp_f32
#define EXP_f64 exp_f64
DEFINE_CE(f32, float, 1)
DEFINE_CE(f64, double, 0)

/* Checks the operands shared by forward and backward; fills the job. */
static attn_status setup(const char *op, const attn_tensor *logits, const attn_tensor *index,
                         const attn_tensor *valid_len, int64_t steps, ce_job *J, int64_t *rows) {
  attn_status st = attn_check_float(op, logits);
  if (st != ATTN_OK) return st;
  int lead = logits->ndim - 1;
  if (lead < 0 || logits->shape[lead] < 1 || (logits->shape[lead] > 1 && logits->stride[lead] != 1))
    return attn_error(ATTN_ERR_SHAPE, "%s: logits %s must be (..., C) with C >= 1 and unit stride over C", op,
                      attn_tensor_shape_str(logits));
  int64_t C = logits->shape[lead], R = attn_tensor_numel(logits) / C;
  if (index->dtype != ATTN_I64 || !attn_tensor_is_contiguous(index) || attn_tensor_numel(index) != R)
    return attn_error(ATTN_ERR_SHAPE, "%s: index %s must be %lld contiguous int64 ids for logits %s", op,
                      attn_tensor_shape_str(index), (long long)R, attn_tensor_shape_str(logits));
  if (valid_len) {
    int64_t B = attn_tensor_numel(valid_len);
    if (steps < 1 || !attn_tensor_is_contiguous(valid_len) || B * steps != R)
      return attn_error(ATTN_ERR_SHAPE, "%s: valid_len %s and %lld steps do not cover the %lld rows of logits %s", op,
                        attn_tensor_shape_str(valid_len), (long long)steps, (long long)R,
                        attn_tensor_shape_str(logits));
  }
  const int64_t *ids = attn_tensor_data(index);
  for (int64_t r = 0; r < R; r++)
    if (ids[r] < 0 || ids[r] >= C)
      return attn_error(ATTN_ERR_ARG, "%s: index %lld at row %lld is out of range 0..%lld", op, (long long)ids[r],
                        (long long)r + 1, (long long)C - 1);
  *J = (ce_job){.x = attn_tensor_data(logits), .index = ids, .C = C, .steps = steps, .lead = lead};
  for (int d = 0; d < lead; d++) J->shape[d] = logits->shape[d], J->stride[d] = logits->stride[d];
  if (valid_len) J->valid = attn_tensor_data(valid_len), J->vdtype = valid_len->dtype;
  *rows = R;
  return ATTN_OK;
}

static attn_status check_out(const char *op, const char *what, const attn_tensor *t, attn_dtype dtype, int64_t n) {
  if (t->dtype != dtype || !attn_tensor_is_contiguous(t) || attn_tensor_numel(t) != n)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be %lld contiguous %s entries", op, what,
                      attn_tensor_shape_str(t), (long long)n, attn_dtype_name(dtype));
  return ATTN_OK;
}

attn_status attn_softmax_ce_saved_layout(int64_t rows, attn_saved_layout *l) {
  attn_saved_begin(l, "softmax_ce");
  const int64_t shape[2] = {rows, 2};
  return attn_saved_add(l, "stats", 2, shape);
}

/* The stats part of saved for R rows of dtype dt, checked (op names the caller), in *stats. */
static attn_status saved_stats(const char *op, int64_t R, const attn_tensor *saved, attn_dtype dt, void **stats) {
  attn_saved_layout lay;
  attn_status st = attn_softmax_ce_saved_layout(R, &lay);
  if (st == ATTN_OK) st = attn_saved_check(op, &lay, saved, dt);
  if (st == ATTN_OK) *stats = attn_saved_data(saved, &lay, ATTN_SOFTMAX_CE_SAVED_STATS, 0);
  return st;
}

static int64_t grain(int64_t C) { return C >= GRAIN_ELEMENTS ? 1 : GRAIN_ELEMENTS / C; }

attn_status attn_softmax_ce_forward(const attn_tensor *logits, const attn_tensor *index,
                                    const attn_tensor *valid_len, int64_t steps, attn_tensor *loss,
                                    attn_tensor *saved, int64_t *count) {
  return attn_softmax_ce_smoothed_forward(logits, index, valid_len, steps, 0, loss, saved, count);
}

attn_status attn_softmax_ce_backward(const attn_tensor *logits, const attn_tensor *index,
                                     const attn_tensor *valid_len, int64_t steps, const attn_tensor *saved,
                                     const attn_tensor *dloss, attn_tensor *dlogits) {
  return attn_softmax_ce_smoothed_backward(logits, index, valid_len, steps, 0, saved, dloss, dlogits);
}

static attn_status check_smoothing(const char *op, double eps) {
  if (!(eps >= 0 && eps <= 1))
    return attn_error(ATTN_ERR_ARG, "%s: label smoothing %g must lie in [0, 1]", op, eps);
  return ATTN_OK;
}

attn_status attn_softmax_ce_smoothed_forward(const attn_tensor *logits, const attn_tensor *index,
                                             const attn_tensor *valid_len, int64_t steps, double smoothing,
                                             attn_tensor *loss, attn_tensor *saved, int64_t *count) {
  const char *op = "softmax_ce_forward";
  ce_job J;
  int64_t R;
  attn_status st = check_smoothing(op, smoothing);
  if (st == ATTN_OK) st = setup(op, logits, index, valid_len, steps, &J, &R);
  if (st == ATTN_OK) st = check_out(op, "loss", loss, logits->dtype, R);
  if (st == ATTN_OK) st = saved_stats(op, R, saved, logits->dtype, &J.out_stats);
  if (st != ATTN_OK) return st;
  J.loss = attn_tensor_data(loss), J.eps = smoothing;
  int f32 = logits->dtype == ATTN_F32;
  attn_parallel_for(R, grain(J.C), f32 ? forward_f32 : forward_f64, &J);
  int64_t n = 0;
  for (int64_t r = 0; r < R; r++) n += row_counts(&J, r, f32);
  *count = n;
  return ATTN_OK;
}

attn_status attn_softmax_ce_smoothed_backward(const attn_tensor *logits, const attn_tensor *index,
                                              const attn_tensor *valid_len, int64_t steps, double smoothing,
                                              const attn_tensor *saved, const attn_tensor *dloss,
                                              attn_tensor *dlogits) {
  const char *op = "softmax_ce_backward";
  ce_job J;
  int64_t R;
  attn_status st = check_smoothing(op, smoothing);
  if (st == ATTN_OK) st = setup(op, logits, index, valid_len, steps, &J, &R);
  void *stats = NULL;
  if (st == ATTN_OK) st = saved_stats(op, R, saved, logits->dtype, &stats);
  if (st == ATTN_OK) st = check_out(op, "dloss", dloss, logits->dtype, R);
  if (st == ATTN_OK) st = check_out(op, "dlogits", dlogits, logits->dtype, attn_tensor_numel(logits));
  if (st == ATTN_OK && attn_tensor_aliases(dlogits, logits))
    st = attn_error(ATTN_ERR_ARG, "%s: dlogits shares memory with logits", op);
  if (st != ATTN_OK) return st;
  J.eps = smoothing, J.stats = stats, J.dloss = attn_tensor_data(dloss), J.dx = attn_tensor_data(dlogits);
  attn_parallel_for(R, grain(J.C), logits->dtype == ATTN_F32 ? backward_f32 : backward_f64, &J);
  return ATTN_OK;
}
