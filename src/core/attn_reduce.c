/* Reductions and softmax over one dim. The reduced dim is walked inside the
 * callback; the iterator (and the worker pool) runs over the other dims, so
 * each output is computed by one thread in a fixed order. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "core/attn_iter.h"
#include "core/attn_ops.h"
#include "core/attn_parallel.h"
#include "core/attn_vmath.h"

typedef struct {
  attn_reduce_op op;
  attn_dtype dtype;
  int64_t len;      /* size of the reduced dim */
  int64_t xstride;  /* its byte stride in x */
  int64_t ostride;  /* its byte stride in out (softmax only) */
  int with_index;
  int log;
} reduce_ctx;

static inline double load(const char *p, attn_dtype dt) {
  return dt == ATTN_F64 ? *(const double *)p : (double)*(const float *)p;
}
static inline void store(char *p, attn_dtype dt, double v) {
  if (dt == ATTN_F64)
    *(double *)p = v;
  else
    *(float *)p = (float)v;
}

/* int64 rows: exact integer sums (wrapping like the elementwise add) and extremes. */
static void reduce_rows_i64(int64_t n, char **p, const int64_t *st, void *arg) {
  const reduce_ctx *c = arg;
  for (int64_t i = 0; i < n; i++) {
    const char *x = p[1] + i * st[1];
    int64_t acc = c->op == ATTN_SUM ? 0 : *(const int64_t *)x, best = 0;
    if (c->xstride == 0) { /* an expanded dim: len copies of one value, in O(1) whatever len is */
      if (c->op == ATTN_SUM) acc = (int64_t)((uint64_t)*(const int64_t *)x * (uint64_t)c->len);
      *(int64_t *)(p[0] + i * st[0]) = acc;
      if (c->with_index) *(int64_t *)(p[2] + i * st[2]) = 0;
      continue;
    }
    for (int64_t k = c->op == ATTN_SUM ? 0 : 1; k < c->len; k++) {
      int64_t v = *(const int64_t *)(x + k * c->xstride);
      if (c->op == ATTN_SUM) {
        acc = (int64_t)((uint64_t)acc + (uint64_t)v);
      } else if (c->op == ATTN_MAX ? v > acc : v < acc) {
        acc = v;
        best = k;
      }
    }
    *(int64_t *)(p[0] + i * st[0]) = acc;
    if (c->with_index) *(int64_t *)(p[2] + i * st[2]) = best;
  }
}

/* Sums of SUM_BLOCK outputs at a time, each still added in order k = 0..len-1
 * (so the bits equal the one-output loop's), but as SUM_BLOCK independent
 * chains: one chain per output was bound by the latency of the add (a bias
 * gradient, the column sums of a (640, 200) tensor, took 75 us). Outputs next
 * to each other in x (column sums) make the inner loop a contiguous one. */
#define SUM_BLOCK 64
static void sum_block(const reduce_ctx *c, int64_t m, const char *x, int64_t xs, char *o, int64_t os) {
  double acc[SUM_BLOCK] = {0};
  if (m == 1) { /* one chain: the blocked loops' per-k overhead would cost more than they hide */
    for (int64_t k = 0; k < c->len; k++) acc[0] += load(x + k * c->xstride, c->dtype);
  } else if (c->dtype == ATTN_F32 && xs == 4) {
    for (int64_t k = 0; k < c->len; k++) {
      const float *row = (const float *)(x + k * c->xstride);
      for (int64_t i = 0; i < m; i++) acc[i] += (double)row[i];
    }
  } else if (c->dtype == ATTN_F64 && xs == 8) {
    for (int64_t k = 0; k < c->len; k++) {
      const double *row = (const double *)(x + k * c->xstride);
      for (int64_t i = 0; i < m; i++) acc[i] += row[i];
    }
  } else {
    for (int64_t k = 0; k < c->len; k++)
      for (int64_t i = 0; i < m; i++) acc[i] += load(x + i * xs + k * c->xstride, c->dtype);
  }
  for (int64_t i = 0; i < m; i++)
    store(o + i * os, c->dtype, c->op == ATTN_MEAN ? acc[i] / (double)c->len : acc[i]);
}

/* The max of contiguous float32 rows (a decoder's argmax over the vocabulary): the eight-chain row
 * max, then the first entry equal to it (the first NaN when there is one), which is the entry the
 * one-chain loop of reduce_rows picks, its value stored as it is (so a zero keeps its sign). */
static void max_rows_f32(const reduce_ctx *c, int64_t n, char **p, const int64_t *st) {
  for (int64_t i = 0; i < n; i++) {
    const float *x = (const float *)(p[1] + i * st[1]);
    float m = attn_row_max_f32(x, c->len);
    int64_t best = 0;
    if (m != m) {
      while (x[best] == x[best]) best++;
    } else {
      while (x[best] != m) best++;
    }
    *(float *)(p[0] + i * st[0]) = x[best];
    if (c->with_index) *(int64_t *)(p[2] + i * st[2]) = best;
  }
}

static void reduce_rows(int64_t n, char **p, const int64_t *st, void *arg) {
  const reduce_ctx *c = arg;
  if ((c->op == ATTN_SUM || c->op == ATTN_MEAN) && c->xstride != 0) {
    for (int64_t i = 0; i < n; i += SUM_BLOCK)
      sum_block(c, n - i < SUM_BLOCK ? n - i : SUM_BLOCK, p[1] + i * st[1], st[1], p[0] + i * st[0], st[0]);
    return;
  }
  if (c->op == ATTN_MAX && c->dtype == ATTN_F32 && c->xstride == (int64_t)sizeof(float) && c->len >= 64) {
    max_rows_f32(c, n, p, st);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    const char *x = p[1] + i * st[1];
    double acc;
    int64_t best = 0;
    if (c->xstride == 0) { /* an expanded dim: len copies of one value, in O(1) whatever len is */
      double v = load(x, c->dtype);
      acc = c->op == ATTN_SUM ? v * (double)c->len : (c->op == ATTN_PROD ? pow(v, (double)c->len) : v);
      store(p[0] + i * st[0], c->dtype, acc);
      if (c->with_index) *(int64_t *)(p[2] + i * st[2]) = 0;
      continue;
    }
    switch (c->op) {
    case ATTN_SUM:
    case ATTN_MEAN:
      acc = 0;
      for (int64_t k = 0; k < c->len; k++) acc += load(x + k * c->xstride, c->dtype);
      if (c->op == ATTN_MEAN) acc /= (double)c->len;
      break;
    case ATTN_PROD:
      acc = 1;
      for (int64_t k = 0; k < c->len; k++) acc *= load(x + k * c->xstride, c->dtype);
      break;
    default: /* MAX, MIN: the first extreme wins; NaN wins over everything */
      acc = load(x, c->dtype);
      for (int64_t k = 1; k < c->len && acc == acc; k++) {
        double v = load(x + k * c->xstride, c->dtype);
        if (v != v || (c->op == ATTN_MAX ? v > acc : v < acc)) {
          acc = v;
          best = k;
        }
      }
      break;
    }
    store(p[0] + i * st[0], c->dtype, acc);
    if (c->with_index) *(int64_t *)(p[2] + i * st[2]) = best;
  }
}

/* Adds t viewed at index 0 along dim (dim dropped): a callback walks the rows along dim itself. */
static void add_rows(attn_iter *it, const attn_tensor *t, int dim) {
  attn_tensor v = *t;
  attn_view_select(&v, dim, 0);
  attn_iter_add(it, &v);
}

/* Starts it over out's shape without dim and adds out, then x, both as add_rows does. */
static void begin_rows(attn_iter *it, const attn_tensor *out, const attn_tensor *x, int dim) {
  attn_tensor ov = *out;
  attn_view_select(&ov, dim, 0);
  attn_iter_begin(it, ov.ndim, ov.shape);
  attn_iter_add(it, &ov);
  add_rows(it, x, dim);
}

attn_status attn_reduce(attn_reduce_op op, const attn_tensor *x, int dim, attn_tensor *out, attn_tensor *indices) {
  static const char *names[] = {"sum", "mean", "max", "min", "prod"};
  const char *name = names[op];
  if (dim < 0 || dim >= x->ndim)
    return attn_error(ATTN_ERR_ARG, "%s: dim %d out of range for %d-D tensor %s", name, dim + 1, x->ndim,
                      attn_tensor_shape_str(x));
  if (x->shape[dim] == 0 && (op == ATTN_MAX || op == ATTN_MIN))
    return attn_error(ATTN_ERR_SHAPE, "%s: dim %d of %s is empty", name, dim + 1, attn_tensor_shape_str(x));
  if ((op == ATTN_MEAN || op == ATTN_PROD) && x->dtype == ATTN_I64) return attn_check_float(name, x);
  if (out->ndim != x->ndim || out->dtype != x->dtype || (indices && indices->dtype != ATTN_I64))
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s does not fit input %s", name,
                      attn_tensor_shape_str(out), attn_tensor_shape_str(x));
  for (int d = 0; d < x->ndim; d++)
    if (out->shape[d] != (d == dim ? 1 : x->shape[d]) ||
        (indices && indices->shape[d] != out->shape[d]))
      return attn_error(ATTN_ERR_SHAPE, "%s: output %s does not fit input %s reduced over dim %d", name,
                        attn_tensor_shape_str(out), attn_tensor_shape_str(x), dim + 1);
  reduce_ctx c = {op, x->dtype, x->shape[dim], x->stride[dim] * (int64_t)attn_dtype_size(x->dtype), 0,
                  indices != NULL, 0};
  if (x->shape[dim] == 0) { /* empty sum is 0, empty product 1, empty mean NaN */
    return attn_fill(out, op == ATTN_PROD ? 1.0 : (op == ATTN_MEAN ? NAN : 0.0));
  }
  attn_iter it;
  begin_rows(&it, out, x, dim);
  if (indices) add_rows(&it, indices, dim);
  attn_iter_run_cost(&it, x->dtype == ATTN_I64 ? reduce_rows_i64 : reduce_rows, &c, c.len);
  return ATTN_OK;
}

/* The max of a contiguous row, NaN if it holds one. Eight running maxima
 * instead of one: the single compare-and-select chain was latency-bound and
 * took most of the softmax's time. Equal to the one-chain max except perhaps
 * in the sign of a zero maximum. */
#define ROW_MAX(S, T)                                                              \
  T attn_row_max_##S(const T *x, int64_t n) {                                      \
    T m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,                           \
              -INFINITY, -INFINITY, -INFINITY, -INFINITY};                          \
    int nan = 0;                                                                   \
    int64_t k = 0;                                                                 \
    for (; k + 8 <= n; k += 8)                                                     \
      for (int j = 0; j < 8; j++) {                                                \
        T v = x[k + j];                                                            \
        nan |= v != v;                                                             \
        m[j] = v > m[j] ? v : m[j];                                                \
      }                                                                            \
    for (; k < n; k++) {                                                           \
      nan |= x[k] != x[k];                                                         \
      m[0] = x[k] > m[0] ? x[k] : m[0];                                            \
    }                                                                              \
    T mx = m[0];                                                                   \
    for (int j = 1; j < 8; j++) mx = m[j] > mx ? m[j] : mx;                        \
    return nan ? (T)NAN : mx;                                                      \
  }
ROW_MAX(f32, float)
ROW_MAX(f64, double)

/* A contiguous row into a separate contiguous output: the vectorised exp of
 * attn_vmath, one pass for the max, one for exp-and-sum, one to normalise. */
#define SOFTMAX_CONTIGUOUS(T, S, EXP_ROW)                                           \
  do {                                                                              \
    T *r = (T *)o;                                                                  \
    const T *xr = (const T *)x;                                                     \
    T mx = attn_row_max_##S(xr, c->len);                                            \
    if (mx == -INFINITY) mx = 0;                                                    \
    memcpy(r, xr, sizeof(T) * (size_t)c->len);                                      \
    double sum = EXP_ROW(r, c->len, mx);                                            \
    if (c->log) { /* (x - max) - log(sum), in this order, as the strided path */  \
      T logsum = (T)log(sum); /* cppcheck-suppress invalidFunctionArg */            \
      for (int64_t k = 0; k < c->len; k++) r[k] = (xr[k] - mx) - logsum;            \
    } else {                                                                        \
      T inv = (T)(1.0 / sum);                                                       \
      for (int64_t k = 0; k < c->len; k++) r[k] *= inv;                             \
    }                                                                               \
  } while (0)

static void softmax_rows(int64_t n, char **p, const int64_t *st, void *arg) {
  const reduce_ctx *c = arg;
  int64_t es = (int64_t)attn_dtype_size(c->dtype);
  for (int64_t i = 0; i < n; i++) {
    char *o = p[0] + i * st[0];
    const char *x = p[1] + i * st[1];
    if (c->xstride == es && c->ostride == es && o != x) {
      if (c->dtype == ATTN_F32)
        SOFTMAX_CONTIGUOUS(float, f32, attn_vmath_exp_row_f32);
      else
        SOFTMAX_CONTIGUOUS(double, f64, attn_vmath_exp_row_f64);
      continue;
    }
    double mx = -INFINITY;
    for (int64_t k = 0; k < c->len; k++) {
      double v = load(x + k * c->xstride, c->dtype);
      if (v > mx || v != v) mx = v;
    }
    if (mx == -INFINITY) mx = 0; /* a row of -inf: exp gives 0/0 = NaN below, as it should */
    double sum = 0;
    for (int64_t k = 0; k < c->len; k++) sum += exp(load(x + k * c->xstride, c->dtype) - mx);
    /* sum is 0 only for a row of -inf, where log gives -inf and the result NaN, as intended */
    double logsum = log(sum); // cppcheck-suppress invalidFunctionArg
    for (int64_t k = 0; k < c->len; k++) {
      double z = load(x + k * c->xstride, c->dtype) - mx;
      store(o + k * c->ostride, c->dtype, c->log ? z - logsum : exp(z) / sum);
    }
  }
}

attn_status attn_softmax(const attn_tensor *x, int dim, int log_softmax, attn_tensor *out) {
  const char *name = log_softmax ? "log_softmax" : "softmax";
  attn_status st = attn_check_float(name, x);
  if (st != ATTN_OK) return st;
  if (dim < 0 || dim >= x->ndim)
    return attn_error(ATTN_ERR_ARG, "%s: dim %d out of range for %d-D tensor %s", name, dim + 1, x->ndim,
                      attn_tensor_shape_str(x));
  if (out->ndim != x->ndim || out->dtype != x->dtype || memcmp(out->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim))
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s does not fit input %s", name, attn_tensor_shape_str(out),
                      attn_tensor_shape_str(x));
  /* no rows or empty rows: nothing to do (and a (0, 2^62) row length must not reach the cost below) */
  if (attn_tensor_numel(x) == 0) return ATTN_OK;
  int64_t es = (int64_t)attn_dtype_size(x->dtype);
  reduce_ctx c = {ATTN_SUM, x->dtype, x->shape[dim], x->stride[dim] * es, out->stride[dim] * es, 0, log_softmax};
  attn_iter it;
  begin_rows(&it, out, x, dim);
  attn_iter_run_cost(&it, softmax_rows, &c, 4 * c.len);
  return ATTN_OK;
}

/* ------------------------------------------------------------ sort */

/* Each entry becomes an unsigned key whose plain order is the wanted order:
 * floats by their IEEE bits (sign flipped, negatives inverted; -0 taken as 0,
 * every NaN as one value above +inf), int64 with its sign bit flipped, and all
 * keys inverted for a descending sort. A stable merge sort of (key, position)
 * pairs then needs one unsigned comparison per step. */
typedef struct {
  uint64_t key;
  int64_t pos;
} sort_pair;

static uint64_t float_key(double v) {
  if (v != v) return UINT64_MAX;
  if (v == 0) v = 0; /* -0 sorts with +0 */
  uint64_t b;
  memcpy(&b, &v, 8);
  return (b >> 63) ? ~b : b | ((uint64_t)1 << 63);
}

/* Stable bottom-up merge sort of a[0..n) by key; tmp holds n pairs. */
static void merge_sort(sort_pair *a, sort_pair *tmp, int64_t n) {
  for (int64_t lo = 0; lo < n; lo += 16) { /* insertion sort of short runs first */
    int64_t hi = lo + 16 < n ? lo + 16 : n;
    for (int64_t i = lo + 1; i < hi; i++) {
      sort_pair p = a[i];
      int64_t j = i;
      for (; j > lo && a[j - 1].key > p.key; j--) a[j] = a[j - 1];
      a[j] = p;
    }
  }
  for (int64_t width = 16; width < n; width *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
      int64_t x = lo, y = mid, o = lo;
      while (x < mid && y < hi) tmp[o++] = a[y].key < a[x].key ? a[y++] : a[x++];
      while (x < mid) tmp[o++] = a[x++];
      while (y < hi) tmp[o++] = a[y++];
    }
    memcpy(a, tmp, sizeof(sort_pair) * (size_t)n);
  }
}

attn_status attn_sort(const attn_tensor *x, int dim, int descending, attn_tensor *values, attn_tensor *indices) {
  if (dim < 0 || dim >= x->ndim)
    return attn_error(ATTN_ERR_ARG, "sort: dim %d out of range for %d-D tensor %s", dim + 1, x->ndim,
                      attn_tensor_shape_str(x));
  int ok = values->ndim == x->ndim && indices->ndim == x->ndim && values->dtype == x->dtype &&
           indices->dtype == ATTN_I64;
  for (int d = 0; ok && d < x->ndim; d++) ok = values->shape[d] == x->shape[d] && indices->shape[d] == x->shape[d];
  if (!ok)
    return attn_error(ATTN_ERR_SHAPE, "sort: outputs %s and %s must have the shape of %s (values in its dtype, "
                      "indices int64)", attn_tensor_shape_str(values), attn_tensor_shape_str(indices),
                      attn_tensor_shape_str(x));
  int64_t len = x->shape[dim], rows = len > 0 ? attn_tensor_numel(x) / len : 0;
  if (rows == 0 || len == 0) return ATTN_OK;
  if ((uint64_t)len > SIZE_MAX / (2 * sizeof(sort_pair)))
    return attn_error(ATTN_ERR_MEMORY, "sort: a row of %lld is more than can be held", (long long)len);
  size_t cap;
  sort_pair *pairs = attn_alloc(sizeof(sort_pair) * 2 * (size_t)len, &cap);
  if (!pairs) return attn_error(ATTN_ERR_MEMORY, "sort: out of memory for a row of %lld", (long long)len);
  /* rows in row-major order of the other dims; pos walks them with pos[dim] = 0 */
  size_t es = attn_dtype_size(x->dtype);
  int64_t xs = x->stride[dim] * (int64_t)es, vs = values->stride[dim] * (int64_t)es;
  int64_t is = indices->stride[dim] * (int64_t)sizeof(int64_t);
  uint64_t flip = descending ? UINT64_MAX : 0;
  int64_t pos[ATTN_MAX_DIMS] = {0};
  for (int64_t r = 0; r < rows; r++) {
    const char *xr = attn_tensor_ptr(x, pos);
    char *vr = attn_tensor_ptr(values, pos), *ir = attn_tensor_ptr(indices, pos);
    for (int64_t j = 0; j < len; j++) {
      const char *e = xr + j * xs;
      uint64_t key = x->dtype == ATTN_I64   ? (uint64_t)*(const int64_t *)e ^ ((uint64_t)1 << 63)
                     : x->dtype == ATTN_F64 ? float_key(*(const double *)e)
                                            : float_key(*(const float *)e);
      pairs[j].key = key ^ flip;
      pairs[j].pos = j;
    }
    merge_sort(pairs, pairs + len, len);
    for (int64_t j = 0; j < len; j++) {
      memcpy(vr + j * vs, xr + pairs[j].pos * xs, es);
      *(int64_t *)(ir + j * is) = pairs[j].pos;
    }
    for (int d = x->ndim - 1; d >= 0; d--) {
      if (d == dim) continue;
      if (++pos[d] < x->shape[d]) break;
      pos[d] = 0;
    }
  }
  attn_free(pairs, cap);
  return ATTN_OK;
}

/* ------------------------------------------------------------ topk */

/* The k first entries of each row in sort's order (attn_sort's keys, ties by position), without
 * sorting the row: a sorted buffer of the k best so far, which most entries fail to enter after
 * one comparison with its last key. Rows are independent and split across the threads. */
typedef struct {
  const attn_tensor *x, *values, *indices;
  int dim;
  int64_t k;
  uint64_t flip;
} topk_ctx;

static uint64_t entry_key(const char *e, attn_dtype dt) {
  return dt == ATTN_I64   ? (uint64_t)*(const int64_t *)e ^ ((uint64_t)1 << 63)
         : dt == ATTN_F64 ? float_key(*(const double *)e)
                          : float_key(*(const float *)e);
}

static void topk_rows(void *vctx, int64_t begin, int64_t end) {
  const topk_ctx *c = vctx;
  const attn_tensor *x = c->x;
  sort_pair best[ATTN_TOPK_MAX];
  size_t es = attn_dtype_size(x->dtype);
  int64_t len = x->shape[c->dim], k = c->k;
  int64_t xs = x->stride[c->dim] * (int64_t)es, vs = c->values->stride[c->dim] * (int64_t)es;
  int64_t is = c->indices->stride[c->dim] * (int64_t)sizeof(int64_t);
  for (int64_t r = begin; r < end; r++) {
    int64_t pos[ATTN_MAX_DIMS] = {0}, rest = r;
    for (int d = x->ndim - 1; d >= 0; d--) {
      if (d == c->dim) continue;
      pos[d] = rest % x->shape[d];
      rest /= x->shape[d];
    }
    const char *xr = attn_tensor_ptr(x, pos);
    int64_t n = 0;
    for (int64_t j = 0; j < len; j++) {
      uint64_t key = entry_key(xr + j * xs, x->dtype) ^ c->flip;
      if (n == k && key >= best[k - 1].key) continue; /* a later equal key ranks after */
      int64_t i = n < k ? n++ : k - 1;
      for (; i > 0 && best[i - 1].key > key; i--) best[i] = best[i - 1];
      best[i].key = key;
      best[i].pos = j;
    }
    char *vr = attn_tensor_ptr(c->values, pos), *ir = attn_tensor_ptr(c->indices, pos);
    for (int64_t j = 0; j < k; j++) {
      memcpy(vr + j * vs, xr + best[j].pos * xs, es);
      *(int64_t *)(ir + j * is) = best[j].pos;
    }
  }
}

attn_status attn_topk(const attn_tensor *x, int dim, int64_t k, int largest, attn_tensor *values,
                      attn_tensor *indices) {
  if (dim < 0 || dim >= x->ndim)
    return attn_error(ATTN_ERR_ARG, "topk: dim %d out of range for %d-D tensor %s", dim + 1, x->ndim,
                      attn_tensor_shape_str(x));
  if (k < 0 || k > x->shape[dim] || k > ATTN_TOPK_MAX)
    return attn_error(ATTN_ERR_ARG, "topk: k = %lld must be in 0..%lld (size of dim %d of %s) and at most %d",
                      (long long)k, (long long)x->shape[dim], dim + 1, attn_tensor_shape_str(x), ATTN_TOPK_MAX);
  int ok = values->ndim == x->ndim && indices->ndim == x->ndim && values->dtype == x->dtype &&
           indices->dtype == ATTN_I64;
  for (int d = 0; ok && d < x->ndim; d++) {
    int64_t want = d == dim ? k : x->shape[d];
    ok = values->shape[d] == want && indices->shape[d] == want;
  }
  if (!ok)
    return attn_error(ATTN_ERR_SHAPE, "topk: outputs %s and %s must have the shape of %s with %lld along dim %d "
                      "(values in its dtype, indices int64)", attn_tensor_shape_str(values),
                      attn_tensor_shape_str(indices), attn_tensor_shape_str(x), (long long)k, dim + 1);
  int64_t len = x->shape[dim], rows = len > 0 ? attn_tensor_numel(x) / len : 0;
  if (rows == 0 || k == 0) return ATTN_OK;
  topk_ctx c = {x, values, indices, dim, k, largest ? UINT64_MAX : 0};
  attn_parallel_for(rows, len >= 32768 ? 1 : 32768 / len + 1, topk_rows, &c);
  return ATTN_OK;
}

void attn_colsum_rows(attn_dtype dt, const void *m, int64_t rows, int64_t cols, void *out) {
  if (dt == ATTN_F32) {
    attn_vmath_colsum_f32(m, rows, cols, out);
    return;
  }
  const double *md = m;
  double *o = out;
  for (int64_t c = 0; c < cols; c++) o[c] = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) o[c] += md[r * cols + c];
}

void attn_fill_rows(void *m, int64_t rows, int64_t cols, size_t es, const void *v) {
  size_t row = (size_t)cols * es;
  for (int64_t r = 0; r < rows; r++)
    if (v)
      memcpy((char *)m + (size_t)r * row, v, row);
    else
      memset((char *)m + (size_t)r * row, 0, row);
}

/* ---- cumulative sums and products along a dim ---------------------------- */

typedef struct {
  attn_scan_op op;
  attn_dtype dtype;
  int64_t len;
  int64_t s[4]; /* byte strides along the dim: out, x, y (cumprod's output), g */
} scan_ctx;

/* One row of cumprod's gradient: grad_k = sum_{j >= k} g_j prod_{i <= j, i != k} x_i, without
 * dividing by a zero x_k. Before the first zero z it is (sum_{j >= k} g_j y_j) / x_k (the terms
 * past z vanish); at z the products skip x_z: y_{z-1} (1 before the row) times the running
 * product of the entries after z; after z every product holds x_z = 0. */
static void cumprod_grad_row(const scan_ctx *c, char *o, const char *x, const char *y, const char *g) {
  attn_dtype dt = c->dtype;
  int64_t n = c->len, z = n;
  for (int64_t k = 0; k < n; k++)
    if (load(x + k * c->s[1], dt) == 0) {
      z = k;
      break;
    }
  double acc = 0;
  for (int64_t k = z - 1; k >= 0; k--) {
    acc += load(g + k * c->s[3], dt) * load(y + k * c->s[2], dt);
    store(o + k * c->s[0], dt, acc / load(x + k * c->s[1], dt));
  }
  if (z == n) return;
  double run = z > 0 ? load(y + (z - 1) * c->s[2], dt) : 1.0;
  acc = run * load(g + z * c->s[3], dt);
  for (int64_t j = z + 1; j < n; j++) {
    run *= load(x + j * c->s[1], dt);
    acc += run * load(g + j * c->s[3], dt);
    store(o + j * c->s[0], dt, 0.0);
  }
  store(o + z * c->s[0], dt, acc);
}

static void scan_rows(int64_t n, char **p, const int64_t *st, void *arg) {
  const scan_ctx *c = arg;
  for (int64_t i = 0; i < n; i++) {
    char *o = p[0] + i * st[0];
    const char *x = p[1] + i * st[1];
    if (c->op == ATTN_CUMPROD_GRAD) {
      cumprod_grad_row(c, o, x, p[2] + i * st[2], p[3] + i * st[3]);
      continue;
    }
    int reverse = c->op == ATTN_CUMSUM_REVERSE;
    if (c->dtype == ATTN_I64) { /* exact, wrapping like the elementwise add and mul */
      uint64_t acc = c->op == ATTN_CUMPROD ? 1 : 0;
      for (int64_t j = 0; j < c->len; j++) {
        int64_t k = reverse ? c->len - 1 - j : j;
        uint64_t v = (uint64_t)*(const int64_t *)(x + k * c->s[1]);
        acc = c->op == ATTN_CUMPROD ? acc * v : acc + v;
        *(int64_t *)(o + k * c->s[0]) = (int64_t)acc;
      }
      continue;
    }
    double acc = c->op == ATTN_CUMPROD ? 1.0 : 0.0;
    for (int64_t j = 0; j < c->len; j++) {
      int64_t k = reverse ? c->len - 1 - j : j;
      double v = load(x + k * c->s[1], c->dtype);
      acc = c->op == ATTN_CUMPROD ? acc * v : acc + v;
      store(o + k * c->s[0], c->dtype, acc);
    }
  }
}

static attn_status scan_check(const char *name, const attn_tensor *x, int dim, const attn_tensor *t,
                              const char *what) {
  if (dim < 0 || dim >= x->ndim)
    return attn_error(ATTN_ERR_ARG, "%s: dim %d out of range for %d-D tensor %s", name, dim + 1, x->ndim,
                      attn_tensor_shape_str(x));
  int same = t->ndim == x->ndim && t->dtype == x->dtype;
  for (int d = 0; same && d < x->ndim; d++) same = t->shape[d] == x->shape[d];
  if (!same)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s %s must have the input's shape and dtype %s %s", name, what,
                      attn_dtype_name(t->dtype), attn_tensor_shape_str(t), attn_dtype_name(x->dtype),
                      attn_tensor_shape_str(x));
  return ATTN_OK;
}

static attn_status scan_run(attn_scan_op op, const attn_tensor *x, const attn_tensor *y, const attn_tensor *g,
                            int dim, attn_tensor *out) {
  int64_t es = (int64_t)attn_dtype_size(x->dtype);
  scan_ctx c = {op, x->dtype, x->shape[dim], {out->stride[dim] * es, x->stride[dim] * es, 0, 0}};
  if (x->shape[dim] == 0) return ATTN_OK;
  attn_iter it;
  begin_rows(&it, out, x, dim);
  if (y) {
    c.s[2] = y->stride[dim] * es;
    c.s[3] = g->stride[dim] * es;
    add_rows(&it, y, dim);
    add_rows(&it, g, dim);
  }
  attn_iter_run_cost(&it, scan_rows, &c, c.len);
  return ATTN_OK;
}

attn_status attn_cumulative(attn_scan_op op, const attn_tensor *x, int dim, attn_tensor *out) {
  static const char *names[] = {"cumsum", "cumprod", "cumsum_reverse", "cumprod_backward"};
  const char *name = op <= ATTN_CUMPROD_GRAD ? names[op] : "cumulative";
  if (op == ATTN_CUMPROD_GRAD)
    return attn_error(ATTN_ERR_ARG, "%s: use attn_cumprod_backward for the gradient", name);
  attn_status st = scan_check(name, x, dim, out, "output");
  if (st == ATTN_OK && (attn_tensor_overlaps_itself(out) || attn_tensor_aliases(out, x)))
    st = attn_error(ATTN_ERR_ARG, "%s: output %s must be a fresh tensor (not an expanded view or the input)", name,
                    attn_tensor_shape_str(out));
  return st == ATTN_OK ? scan_run(op, x, NULL, NULL, dim, out) : st;
}

attn_status attn_cumprod_backward(const attn_tensor *x, const attn_tensor *y, const attn_tensor *g, int dim,
                                  attn_tensor *out) {
  const char *name = "cumprod_backward";
  attn_status st = attn_check_float(name, x);
  if (st == ATTN_OK) st = scan_check(name, x, dim, y, "output y");
  if (st == ATTN_OK) st = scan_check(name, x, dim, g, "gradient");
  if (st == ATTN_OK) st = scan_check(name, x, dim, out, "result");
  if (st == ATTN_OK && (attn_tensor_overlaps_itself(out) || attn_tensor_aliases(out, x) ||
                        attn_tensor_aliases(out, y) || attn_tensor_aliases(out, g)))
    st = attn_error(ATTN_ERR_ARG, "%s: result %s must be a fresh tensor", name, attn_tensor_shape_str(out));
  return st == ATTN_OK ? scan_run(ATTN_CUMPROD_GRAD, x, y, g, dim, out) : st;
}
