/* RoPE kernels: see attn_rope.h for the model. */
#include "nn/attn_rope.h"

#include <math.h>

#include "core/attn_alloc.h"
#include "core/attn_parallel.h"

/* Below about this many entries a job stays on the calling thread. */
#define GRAIN_ELEMENTS 32768
/* Pairs whose angles are computed at once (positions outside the tables) in a stack buffer. */
#define CHUNK 64

typedef struct {
  const void *x;
  void *out, *out_sin; /* out_sin: the sin table attn_rope_tables fills */
  const void *cos, *sin; /* (P, h) tables or NULL */
  const int64_t *pos;    /* per-position list (see pos_of) or NULL: position t */
  const double *theta;   /* (h) frequencies */
  int64_t P, N, h, rows, per_sample; /* per_sample: rows of x per row of a (B, N) positions list */
  int64_t outer_ndim;
  int64_t outer_shape[ATTN_MAX_DIMS], outer_stride[ATTN_MAX_DIMS];
  int64_t tstride, dstride; /* x's strides along N and d */
  int interleaved, inverse;
} rope_job;

/* The position of row r (outer index r / N, token r % N). */
static int64_t pos_of(const rope_job *J, int64_t r) {
  int64_t t = r % J->N;
  if (!J->pos) return t;
  return J->pos[J->per_sample ? (r / J->N / J->per_sample) * J->N + t : t];
}

/* x's offset (elements) of outer index o. */
static int64_t outer_offset(const rope_job *J, int64_t o) {
  int64_t off = 0;
  for (int64_t k = J->outer_ndim - 1; k >= 0; k--) {
    off += (o % J->outer_shape[k]) * J->outer_stride[k];
    o /= J->outer_shape[k];
  }
  return off;
}

/* Per dtype (the only difference, hence the macro):
 * pairs: pairs [i0, i0 + n) of one row from angles c[0..n), s[0..n); the contiguous half-split
 * case has its own loops so that they vectorise. rows: rows [r0, r1), the angles from the
 * tables or computed CHUNK pairs at a time. */
#define ROTATE(T, A, B, OA, OB, C, S) \
  do {                             \
    T a_ = (A), b_ = (B);          \
    if (inv) {                     \
      OA = a_ * (C) + b_ * (S);    \
      OB = b_ * (C) - a_ * (S);    \
    } else {                       \
      OA = a_ * (C) - b_ * (S);    \
      OB = b_ * (C) + a_ * (S);    \
    }                              \
  } while (0)
#define DEFINE_ROPE(SUF, T)                                                                                  \
  static void pairs_##SUF(const rope_job *J, const T *x, T *o, const T *c, const T *s, int64_t i0, int64_t n) { \
    int64_t h = J->h, sd = J->dstride;                                                                       \
    int inv = J->inverse;                                                                                    \
    if (!J->interleaved && sd == 1) {                                                                        \
      const T *x1 = x + i0, *x2 = x + h + i0;                                                                \
      T *o1 = o + i0, *o2 = o + h + i0;                                                                      \
      if (inv)                                                                                               \
        for (int64_t j = 0; j < n; j++) o1[j] = x1[j] * c[j] + x2[j] * s[j], o2[j] = x2[j] * c[j] - x1[j] * s[j]; \
      else                                                                                                   \
        for (int64_t j = 0; j < n; j++) o1[j] = x1[j] * c[j] - x2[j] * s[j], o2[j] = x2[j] * c[j] + x1[j] * s[j]; \
    } else if (J->interleaved) {                                                                             \
      for (int64_t j = 0, i = i0; j < n; j++, i++)                                                           \
        ROTATE(T, x[2 * i * sd], x[(2 * i + 1) * sd], o[2 * i], o[2 * i + 1], c[j], s[j]);                       \
    } else {                                                                                                 \
      for (int64_t j = 0, i = i0; j < n; j++, i++) ROTATE(T, x[i * sd], x[(h + i) * sd], o[i], o[h + i], c[j], s[j]); \
    }                                                                                                        \
  }                                                                                                          \
  static void rows_##SUF(void *ctx, int64_t r0, int64_t r1) {                                                \
    const rope_job *J = ctx;                                                                                 \
    int64_t h = J->h;                                                                                        \
    T cbuf[CHUNK], sbuf[CHUNK];                                                                              \
    for (int64_t r = r0; r < r1; r++) {                                                                      \
      const T *x = (const T *)J->x + outer_offset(J, r / J->N) + (r % J->N) * J->tstride;                    \
      T *o = (T *)J->out + r * 2 * h;                                                                        \
      int64_t p = pos_of(J, r);                                                                              \
      if (p < J->P) {                                                                                        \
        pairs_##SUF(J, x, o, (const T *)J->cos + p * h, (const T *)J->sin + p * h, 0, h);                    \
        continue;                                                                                            \
      }                                                                                                      \
      for (int64_t i0 = 0; i0 < h; i0 += CHUNK) {                                                            \
        int64_t n = h - i0 < CHUNK ? h - i0 : CHUNK;                                                         \
        for (int64_t j = 0; j < n; j++) {                                                                    \
          double a = (double)p * J->theta[i0 + j];                                                           \
          cbuf[j] = (T)cos(a), sbuf[j] = (T)sin(a);                                                          \
        }                                                                                                    \
        pairs_##SUF(J, x, o, cbuf, sbuf, i0, n);                                                             \
      }                                                                                                      \
    }                                                                                                        \
  }                                                                                                          \
  static void tables_##SUF(void *ctx, int64_t p0, int64_t p1) {                                              \
    const rope_job *J = ctx;                                                                                 \
    for (int64_t p = p0; p < p1; p++)                                                                        \
      for (int64_t i = 0; i < J->h; i++) {                                                                   \
        double a = (double)p * J->theta[i];                                                                  \
        ((T *)J->out)[p * J->h + i] = (T)cos(a), ((T *)J->out_sin)[p * J->h + i] = (T)sin(a);                 \
      }                                                                                                      \
  }

DEFINE_ROPE(f32, float)
DEFINE_ROPE(f64, double)

/* ---------------------------------------------------------------- checks */

static attn_status check_base(const char *op, double base) {
  if (!(base > 0 && base < INFINITY))
    return attn_error(ATTN_ERR_ARG, "%s: base must be a positive number, got %g", op, base);
  return ATTN_OK;
}

/* x: float, (..., N, d) with d even. */
static attn_status check_x(const char *op, const char *what, const attn_tensor *x) {
  if (attn_check_float(op, x) != ATTN_OK) return ATTN_ERR_DTYPE;
  if (x->ndim < 2)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be (..., N, d)", op, what, attn_tensor_shape_str(x));
  int64_t d = x->shape[x->ndim - 1];
  if (d % 2 != 0)
    return attn_error(ATTN_ERR_SHAPE, "%s: the feature size d = %lld of %s %s must be even (features rotate in pairs)",
                      op, (long long)d, what, attn_tensor_shape_str(x));
  return ATTN_OK;
}

/* The (P, h) tables: both or neither, x's dtype, contiguous. */
static attn_status check_tables(const char *op, const attn_tensor *c, const attn_tensor *s, attn_dtype dt,
                                int64_t h) {
  if (!c && !s) return ATTN_OK;
  if (!c || !s) return attn_error(ATTN_ERR_ARG, "%s: give both angle tables (cos and sin) or neither", op);
  const attn_tensor *t[2] = {c, s};
  for (int k = 0; k < 2; k++) {
    if (t[k]->dtype != dt)
      return attn_error(ATTN_ERR_DTYPE, "%s: angle table %s is %s, expected %s", op, attn_tensor_shape_str(t[k]),
                        attn_dtype_name(t[k]->dtype), attn_dtype_name(dt));
    if (t[k]->ndim != 2 || t[k]->shape[1] != h || t[k]->shape[0] != c->shape[0] || !attn_tensor_is_contiguous(t[k]))
      return attn_error(ATTN_ERR_SHAPE, "%s: angle tables %s and %s must be contiguous (P, %lld)", op,
                        attn_tensor_shape_str(c), attn_tensor_shape_str(s), (long long)h);
  }
  return ATTN_OK;
}

/* The positions' shape against x (sets *per_sample: rows of x per positions row, 0 for 1-D). */
static attn_status check_positions_shape(const char *op, const attn_tensor *pos, const attn_tensor *x, int64_t outer,
                                         int64_t *per_sample) {
  int64_t N = x->shape[x->ndim - 2];
  *per_sample = 0;
  if (pos->ndim == 1 && pos->shape[0] == N) return ATTN_OK;
  if (pos->ndim == 2 && pos->shape[1] == N && x->ndim >= 3) {
    int64_t B = pos->shape[0];
    if (B == 1) return ATTN_OK;
    if (B == x->shape[0]) {
      *per_sample = outer / B;
      return ATTN_OK;
    }
    return attn_error(ATTN_ERR_SHAPE, "%s: positions %s has %lld rows, x %s has %lld samples", op,
                      attn_tensor_shape_str(pos), (long long)B, attn_tensor_shape_str(x), (long long)x->shape[0]);
  }
  return attn_error(ATTN_ERR_SHAPE, "%s: positions %s must be (%lld) or (B, %lld) (x has N = %lld)", op,
                    attn_tensor_shape_str(pos), (long long)N, (long long)N, (long long)N);
}

/* Reads the positions row-major into out, each an integer >= 0 (errors count 1-based). */
static attn_status read_positions(const char *op, const attn_tensor *pos, int64_t *out) {
  int64_t n = attn_tensor_numel(pos), idx[2] = {0, 0};
  int64_t cols = pos->shape[pos->ndim - 1];
  for (int64_t k = 0; k < n; k++) {
    if (pos->ndim == 2) idx[0] = k / cols, idx[1] = k % cols;
    else idx[0] = k;
    if (pos->dtype == ATTN_I64) {
      out[k] = attn_tensor_get_i64(pos, idx);
      if (out[k] < 0)
        return attn_error(ATTN_ERR_ARG, "%s: positions[%lld] = %lld is not a non-negative integer (positions are 0-based)",
                          op, (long long)(k + 1), (long long)out[k]);
    } else {
      double v = attn_tensor_get(pos, idx);
      if (!(v >= 0 && v < 9007199254740992.0 && v == floor(v)))
        return attn_error(ATTN_ERR_ARG, "%s: positions[%lld] = %g is not a non-negative integer (positions are 0-based)",
                          op, (long long)(k + 1), v);
      out[k] = (int64_t)v;
    }
  }
  return ATTN_OK;
}

static int64_t grain(int64_t per_item) { return GRAIN_ELEMENTS / (per_item > 0 ? per_item : 1) + 1; }

/* theta_i = base^(-2i/d), as the composed path computes it (a double division, then pow). */
static void fill_theta(double *theta, int64_t h, double base) {
  for (int64_t i = 0; i < h; i++) theta[i] = pow(base, (double)(-(2 * i)) / (double)(2 * h));
}

/* ---------------------------------------------------------------- entry points */

static attn_status rope_apply(const char *op, const char *what, const attn_tensor *x, const attn_rope_opts *o,
                              attn_tensor *out, int inverse) {
  attn_status st = check_x(op, what, x);
  if (st == ATTN_OK) st = check_base(op, o->base);
  if (st != ATTN_OK) return st;
  int nd = x->ndim;
  int64_t N = x->shape[nd - 2], d = x->shape[nd - 1], h = d / 2;
  int64_t numel = attn_tensor_numel(x), outer = 1;
  for (int k = 0; k < nd - 2; k++) outer *= x->shape[k];
  if (out->dtype != x->dtype || out->ndim != nd || !attn_tensor_is_contiguous(out))
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s %s must be a contiguous %s %s", op, attn_dtype_name(out->dtype),
                      attn_tensor_shape_str(out), attn_dtype_name(x->dtype), attn_tensor_shape_str(x));
  for (int k = 0; k < nd; k++)
    if (out->shape[k] != x->shape[k])
      return attn_error(ATTN_ERR_SHAPE, "%s: output %s must have the shape of %s %s", op, attn_tensor_shape_str(out),
                        what, attn_tensor_shape_str(x));
  if (numel > 0 && out->storage == x->storage)
    return attn_error(ATTN_ERR_ARG, "%s: the output must not share %s's storage", op, what);
  st = check_tables(op, o->cos, o->sin, x->dtype, h);
  rope_job J = {0};
  if (st == ATTN_OK && o->positions) st = check_positions_shape(op, o->positions, x, outer, &J.per_sample);
  if (st != ATTN_OK) return st;
  int64_t npos = o->positions ? attn_tensor_numel(o->positions) : 0;
  size_t cap = 0;
  double *buf = attn_alloc((size_t)(h + npos + 1) * sizeof(double), &cap);
  if (!buf) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for %lld positions", op, (long long)npos);
  int64_t *pos = (int64_t *)(buf + h);
  if (o->positions) st = read_positions(op, o->positions, pos);
  if (st == ATTN_OK && numel > 0) {
    fill_theta(buf, h, o->base);
    J.x = attn_tensor_data(x), J.out = attn_tensor_data(out);
    J.cos = o->cos ? attn_tensor_data(o->cos) : NULL, J.sin = o->sin ? attn_tensor_data(o->sin) : NULL;
    J.P = o->cos ? o->cos->shape[0] : 0;
    J.pos = o->positions ? pos : NULL, J.theta = buf;
    J.N = N, J.h = h, J.rows = outer * N;
    J.outer_ndim = nd - 2;
    for (int k = 0; k < nd - 2; k++) J.outer_shape[k] = x->shape[k], J.outer_stride[k] = x->stride[k];
    J.tstride = x->stride[nd - 2], J.dstride = x->stride[nd - 1];
    J.interleaved = o->interleaved != 0, J.inverse = inverse;
    attn_parallel_for(J.rows, grain(2 * d), x->dtype == ATTN_F32 ? rows_f32 : rows_f64, &J);
  }
  attn_free(buf, cap);
  return st;
}

attn_status attn_rope_forward(const char *op, const attn_tensor *x, const attn_rope_opts *o, attn_tensor *out) {
  return rope_apply(op ? op : "rope", "x", x, o, out, 0);
}

attn_status attn_rope_backward(const char *op, const attn_tensor *dout, const attn_rope_opts *o, attn_tensor *dx) {
  return rope_apply(op ? op : "rope backward", "the output gradient", dout, o, dx, 1);
}

attn_status attn_rope_tables(double base, attn_tensor *cos, attn_tensor *sin) {
  const char *op = "rope_tables";
  attn_status st = check_base(op, base);
  if (st == ATTN_OK) st = attn_check_float(op, cos);
  if (st != ATTN_OK) return st;
  if (cos->ndim != 2) return attn_error(ATTN_ERR_SHAPE, "%s: tables %s must be (P, d/2)", op, attn_tensor_shape_str(cos));
  int64_t P = cos->shape[0], h = cos->shape[1];
  st = check_tables(op, cos, sin, cos->dtype, h);
  if (st != ATTN_OK) return st;
  size_t cap = 0;
  double *theta = attn_alloc((size_t)(h + 1) * sizeof(double), &cap);
  if (!theta) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for %lld frequencies", op, (long long)h);
  fill_theta(theta, h, base);
  rope_job J = {0};
  J.theta = theta, J.h = h, J.P = P;
  J.out = attn_tensor_data(cos), J.out_sin = attn_tensor_data(sin);
  if (P * h > 0) attn_parallel_for(P, grain(4 * h), cos->dtype == ATTN_F32 ? tables_f32 : tables_f64, &J);
  attn_free(theta, cap);
  return ATTN_OK;
}
