/* Pooling kernels: see attn_pool.h for the model. */
#include "nn/attn_pool.h"

#include <math.h>
#include <string.h>

#include "core/attn_parallel.h"

/* Planes below about this many entries of work stay on the calling thread. */
#define GRAIN_ELEMENTS 32768

typedef enum { POOL_MAX, POOL_AVG, POOL_ADAPTIVE } pool_kind;

typedef struct {
  pool_kind kind;
  attn_dtype dt;
  attn_pool2d_params p;
  const void *x, *dy;
  const int64_t *idx_in;
  void *y, *dx;
  int64_t *idx;
  int64_t H, W, Ho, Wo;
} pool_job;

/* Output row i's input rows [*lo, *hi) (clipped to [0, size)) and, for average pooling, the
 * window's size along this dim before clipping to the input (PyTorch's count_include_pad divisor
 * clips to the padded input only). */
static void window(const pool_job *J, int dim, int64_t i, int64_t *lo, int64_t *hi, int64_t *full) {
  int64_t size = dim == 0 ? J->H : J->W, out = dim == 0 ? J->Ho : J->Wo;
  if (J->kind == POOL_ADAPTIVE) {
    *lo = i * size / out;
    *hi = ((i + 1) * size + out - 1) / out;
    *full = *hi - *lo;
    return;
  }
  int64_t s = i * J->p.stride[dim] - J->p.padding[dim];
  int64_t e = s + J->p.kernel[dim], pe = size + J->p.padding[dim];
  *full = (e < pe ? e : pe) - s;
  *lo = s > 0 ? s : 0;
  *hi = e < size ? e : size;
}

static double divisor(const pool_job *J, int64_t fh, int64_t fw, int64_t nh, int64_t nw) {
  return (double)(J->kind == POOL_AVG && J->p.count_include_pad ? fh * fw : nh * nw);
}

/* 2x2 windows at stride 2 without padding (every window inside the plane): the common case,
 * one output row at a time with the window's four taps side by side and no branch per tap (random
 * data makes "is this tap larger" a coin toss the branch predictor loses). */
static int pool_2x2(const pool_job *J) {
  const attn_pool2d_params *p = &J->p;
  return J->kind == POOL_MAX && p->kernel[0] == 2 && p->kernel[1] == 2 && p->stride[0] == 2 && p->stride[1] == 2 &&
         p->padding[0] == 0 && p->padding[1] == 0;
}

/* The running maximum takes tap v at position at when v is larger or NaN (so the first of equal
 * maxima and the last NaN win), by masks rather than branches (the compiler keeps a float select
 * as a branch). */
#define MAX_TAKE(S, best, where, v, at)                                                     \
  do {                                                                                     \
    const int64_t take_ = -(int64_t)(((v) > (best)) | ((v) != (v)));                       \
    (best) = select_##S(take_, (v), (best));                                               \
    (where) = ((at) & take_) | ((where) & ~take_);                                         \
  } while (0)

#define DEFINE_SELECT(S, T, U)                                                              \
  static inline T select_##S(int64_t mask, T a, T b) {                                     \
    U ua, ub;                                                                              \
    memcpy(&ua, &a, sizeof a);                                                             \
    memcpy(&ub, &b, sizeof b);                                                             \
    ua = (ua & (U)mask) | (ub & ~(U)mask);                                                 \
    memcpy(&a, &ua, sizeof a);                                                             \
    return a;                                                                              \
  }
DEFINE_SELECT(f32, float, uint32_t)
DEFINE_SELECT(f64, double, uint64_t)

#define DEFINE_POOL(S, T, U)                                                                        \
  static void max_2x2_##S(const pool_job *J, const T *x, T *y, int64_t *idx) {                     \
    enum { V = 16 / sizeof(T) }; /* outputs per step: one 16-byte vector of each tap */           \
    typedef T vt __attribute__((vector_size(16)));                                                 \
    typedef U vu __attribute__((vector_size(16)));                                                 \
    for (int64_t i = 0; i < J->Ho; i++) {                                                          \
      const T *r0 = x + 2 * i * J->W, *r1 = r0 + J->W;                                             \
      T *yr = y + i * J->Wo;                                                                       \
      int64_t *ir = idx + i * J->Wo, base = 2 * i * J->W, j = 0;                                   \
      for (; j + V <= J->Wo; j += V) {                                                             \
        T taps[4][V]; /* taps (0, 0), (0, 1), (1, 0), (1, 1) of V windows */                       \
        for (int l = 0; l < V; l++) {                                                              \
          taps[0][l] = r0[2 * (j + l)], taps[1][l] = r0[2 * (j + l) + 1];                          \
          taps[2][l] = r1[2 * (j + l)], taps[3][l] = r1[2 * (j + l) + 1];                          \
        }                                                                                          \
        vt best, cand[3];                                                                          \
        memcpy(&best, taps[0], sizeof best);                                                       \
        memcpy(cand, taps[1], sizeof cand);                                                        \
        vu tap = {0}, take;                                                                        \
        for (int t = 0; t < 3; t++) {                                                              \
          take = (vu)((cand[t] > best) | (cand[t] != cand[t]));                                    \
          best = (vt)(((vu)cand[t] & take) | ((vu)best & ~take));                                  \
          tap = ((U)(t + 1) & take) | (tap & ~take);                                               \
        }                                                                                          \
        for (int l = 0; l < V; l++) {                                                              \
          yr[j + l] = best[l];                                                                     \
          ir[j + l] = base + 2 * (j + l) + (int64_t)(tap[l] & 1) + (-(int64_t)(tap[l] >> 1) & J->W);  \
        }                                                                                          \
      }                                                                                            \
      for (; j < J->Wo; j++) {                                                                     \
        T best = r0[2 * j];                                                                        \
        int64_t at = base + 2 * j;                                                                 \
        MAX_TAKE(S, best, at, r0[2 * j + 1], base + 2 * j + 1);                                    \
        MAX_TAKE(S, best, at, r1[2 * j], base + J->W + 2 * j);                                     \
        MAX_TAKE(S, best, at, r1[2 * j + 1], base + J->W + 2 * j + 1);                             \
        yr[j] = best;                                                                              \
        ir[j] = at;                                                                                \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  static void forward_##S(void *ctx, int64_t p0, int64_t p1) {                                     \
    const pool_job *J = ctx;                                                                       \
    for (int64_t pl = p0; pl < p1; pl++) {                                                         \
      const T *x = (const T *)J->x + pl * J->H * J->W;                                             \
      T *y = (T *)J->y + pl * J->Ho * J->Wo;                                                       \
      if (pool_2x2(J)) {                                                                           \
        max_2x2_##S(J, x, y, J->idx + pl * J->Ho * J->Wo);                                         \
        continue;                                                                                  \
      }                                                                                            \
      for (int64_t i = 0; i < J->Ho; i++) {                                                        \
        int64_t h0, h1, fh;                                                                        \
        window(J, 0, i, &h0, &h1, &fh);                                                            \
        for (int64_t j = 0; j < J->Wo; j++) {                                                      \
          int64_t w0, w1, fw, o = i * J->Wo + j;                                                   \
          window(J, 1, j, &w0, &w1, &fw);                                                          \
          if (J->kind == POOL_MAX) {                                                               \
            T best = -(T)INFINITY;                                                                 \
            int64_t at = h0 * J->W + w0;                                                           \
            for (int64_t h = h0; h < h1; h++)                                                      \
              for (int64_t w = w0; w < w1; w++) MAX_TAKE(S, best, at, x[h * J->W + w], h * J->W + w); \
            y[o] = best;                                                                           \
            J->idx[pl * J->Ho * J->Wo + o] = at;                                                   \
          } else {                                                                                 \
            double s = 0;                                                                          \
            for (int64_t h = h0; h < h1; h++)                                                      \
              for (int64_t w = w0; w < w1; w++) s += x[h * J->W + w];                              \
            y[o] = (T)(s / divisor(J, fh, fw, h1 - h0, w1 - w0));                                  \
          }                                                                                        \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  static void backward_##S(void *ctx, int64_t p0, int64_t p1) {                                    \
    const pool_job *J = ctx;                                                                       \
    for (int64_t pl = p0; pl < p1; pl++) {                                                         \
      T *dx = (T *)J->dx + pl * J->H * J->W;                                                       \
      const T *dy = (const T *)J->dy + pl * J->Ho * J->Wo;                                         \
      memset(dx, 0, (size_t)(J->H * J->W) * sizeof(T));                                            \
      if (J->kind == POOL_MAX) {                                                                   \
        const int64_t *idx = J->idx_in + pl * J->Ho * J->Wo;                                       \
        for (int64_t o = 0; o < J->Ho * J->Wo; o++) dx[idx[o]] += dy[o];                           \
        continue;                                                                                  \
      }                                                                                            \
      for (int64_t i = 0; i < J->Ho; i++) {                                                        \
        int64_t h0, h1, fh;                                                                        \
        window(J, 0, i, &h0, &h1, &fh);                                                            \
        for (int64_t j = 0; j < J->Wo; j++) {                                                      \
          int64_t w0, w1, fw;                                                                      \
          window(J, 1, j, &w0, &w1, &fw);                                                          \
          T g = (T)(dy[i * J->Wo + j] / divisor(J, fh, fw, h1 - h0, w1 - w0));                     \
          for (int64_t h = h0; h < h1; h++)                                                        \
            for (int64_t w = w0; w < w1; w++) dx[h * J->W + w] += g;                               \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
  }

DEFINE_POOL(f32, float, uint32_t)
DEFINE_POOL(f64, double, uint64_t)

/* ---------------------------------------------------------------- checks */

static attn_status check_operand(const char *op, const char *what, const attn_tensor *t, attn_dtype dt,
                                 const int64_t *shape) {
  if (t->dtype != dt)
    return attn_error(ATTN_ERR_DTYPE, "%s: %s %s is %s, expected %s", op, what, attn_tensor_shape_str(t),
                      attn_dtype_name(t->dtype), attn_dtype_name(dt));
  int same = t->ndim == 4;
  for (int d = 0; same && d < 4; d++) same = t->shape[d] == shape[d];
  if (!same)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be %s", op, what, attn_tensor_shape_str(t),
                      attn_shape_str(4, shape));
  if (!attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_ARG, "%s: %s %s must be contiguous", op, what, attn_tensor_shape_str(t));
  return ATTN_OK;
}

static attn_status check_input(const char *op, const char *what, const attn_tensor *x) {
  if (attn_check_float(op, x) != ATTN_OK) return ATTN_ERR_DTYPE;
  if (x->ndim != 4)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be 4-D (N, C, H, W)", op, what, attn_tensor_shape_str(x));
  return check_operand(op, what, x, x->dtype, x->shape);
}

attn_status attn_pool2d_shape(const char *op, const attn_tensor *x, const attn_pool2d_params *p, int64_t out[4]) {
  attn_status st = check_input(op, "input", x);
  if (st != ATTN_OK) return st;
  const int64_t *k = p->kernel, *s = p->stride, *pad = p->padding;
  if (k[0] < 1 || k[1] < 1)
    return attn_error(ATTN_ERR_ARG, "%s: kernel_size %lldx%lld must be positive", op, (long long)k[0],
                      (long long)k[1]);
  if (s[0] < 1 || s[1] < 1)
    return attn_error(ATTN_ERR_ARG, "%s: stride %lldx%lld must be positive", op, (long long)s[0], (long long)s[1]);
  if (pad[0] < 0 || pad[1] < 0 || 2 * pad[0] > k[0] || 2 * pad[1] > k[1])
    return attn_error(ATTN_ERR_ARG, "%s: padding %lldx%lld must be >= 0 and at most half of kernel_size %lldx%lld",
                      op, (long long)pad[0], (long long)pad[1], (long long)k[0], (long long)k[1]);
  int64_t ph = x->shape[2] + 2 * pad[0], pw = x->shape[3] + 2 * pad[1];
  if (k[0] > ph || k[1] > pw)
    return attn_error(ATTN_ERR_SHAPE, "%s: kernel_size %lldx%lld is larger than the padded input %lldx%lld (input %s, "
                      "padding %lldx%lld)", op, (long long)k[0], (long long)k[1], (long long)ph, (long long)pw,
                      attn_tensor_shape_str(x), (long long)pad[0], (long long)pad[1]);
  out[0] = x->shape[0], out[1] = x->shape[1];
  out[2] = (ph - k[0]) / s[0] + 1, out[3] = (pw - k[1]) / s[1] + 1;
  return ATTN_OK;
}

/* Runs J over the planes: big is x (forward) or dx (backward), small is y or dy, both checked;
 * J brings the kind, the parameters and the indices. */
static attn_status run(pool_job J, const attn_tensor *big, const attn_tensor *small, int backward) {
  J.dt = big->dtype;
  J.H = big->shape[2], J.W = big->shape[3], J.Ho = small->shape[2], J.Wo = small->shape[3];
  if (backward)
    J.dx = attn_tensor_data(big), J.dy = attn_tensor_data(small);
  else
    J.x = attn_tensor_data(big), J.y = attn_tensor_data(small);
  int64_t planes = big->shape[0] * big->shape[1];
  /* No planes, no work: and an empty tensor's other dims may be anything (2^62 each), whose
   * products below would overflow. Any tensor with planes holds H*W and Ho*Wo elements. */
  if (planes == 0) return ATTN_OK;
  int64_t per = J.H * J.W + J.Ho * J.Wo;
  attn_task_fn fn = J.dt == ATTN_F32 ? (backward ? backward_f32 : forward_f32)
                                     : (backward ? backward_f64 : forward_f64);
  attn_parallel_for(planes, GRAIN_ELEMENTS / (per > 0 ? per : 1) + 1, fn, &J);
  return ATTN_OK;
}

static attn_status check_int64(const char *op, const attn_tensor *idx, const int64_t *shape) {
  return check_operand(op, "indices", idx, ATTN_I64, shape);
}

attn_status attn_max_pool2d_forward(const attn_tensor *x, const attn_pool2d_params *p, attn_tensor *y,
                                    attn_tensor *indices) {
  const char *op = "max_pool2d";
  int64_t ys[4];
  attn_status st = attn_pool2d_shape(op, x, p, ys);
  if (st == ATTN_OK) st = check_operand(op, "output", y, x->dtype, ys);
  if (st == ATTN_OK) st = check_int64(op, indices, ys);
  if (st != ATTN_OK) return st;
  return run((pool_job){.kind = POOL_MAX, .p = *p, .idx = attn_tensor_data(indices)}, x, y, 0);
}

attn_status attn_max_pool2d_backward(const attn_tensor *indices, const attn_tensor *dy, attn_tensor *dx) {
  const char *op = "max_pool2d backward";
  attn_status st = check_input(op, "input gradient", dx);
  if (st == ATTN_OK && (dy->ndim != 4 || dy->shape[0] != dx->shape[0] || dy->shape[1] != dx->shape[1]))
    st = attn_error(ATTN_ERR_SHAPE, "%s: output gradient %s does not fit input gradient %s", op,
                    attn_tensor_shape_str(dy), attn_tensor_shape_str(dx));
  if (st == ATTN_OK) st = check_operand(op, "output gradient", dy, dx->dtype, dy->shape);
  if (st == ATTN_OK) st = check_int64(op, indices, dy->shape);
  if (st != ATTN_OK) return st;
  const int64_t *idx = attn_tensor_data(indices);
  int64_t plane = dx->shape[2] * dx->shape[3], n = attn_tensor_numel(indices);
  for (int64_t i = 0; i < n; i++) /* indices come from Lua: a bad one must not write outside dx */
    if (idx[i] < 0 || idx[i] >= plane)
      return attn_error(ATTN_ERR_ARG, "%s: index %lld at %lld is outside a %lldx%lld plane", op, (long long)idx[i],
                        (long long)i, (long long)dx->shape[2], (long long)dx->shape[3]);
  return run((pool_job){.kind = POOL_MAX, .idx_in = idx}, dx, dy, 1);
}

/* Average pooling either way: big (x or dx) sets the pooled shape that small (y or dy) must have. */
static attn_status avg_pool(const char *op, const char *what, const attn_tensor *big, const attn_pool2d_params *p,
                            const attn_tensor *small, int backward) {
  int64_t ys[4];
  attn_status st = attn_pool2d_shape(op, big, p, ys);
  if (st == ATTN_OK) st = check_operand(op, what, small, big->dtype, ys);
  if (st != ATTN_OK) return st;
  return run((pool_job){.kind = POOL_AVG, .p = *p}, big, small, backward);
}

attn_status attn_avg_pool2d_forward(const attn_tensor *x, const attn_pool2d_params *p, attn_tensor *y) {
  return avg_pool("avg_pool2d", "output", x, p, y, 0);
}

attn_status attn_avg_pool2d_backward(const attn_pool2d_params *p, const attn_tensor *dy, attn_tensor *dx) {
  return avg_pool("avg_pool2d backward", "output gradient", dx, p, dy, 1);
}

/* Adaptive pooling either way, once x (or dx) and y (or dy) fit: both 4-D of one dtype, same N and
 * C, y at least 1x1. */
static attn_status adaptive_pool(const char *op, const attn_tensor *x, const char *xwhat, const attn_tensor *y,
                                 const char *ywhat, int backward) {
  attn_status st = check_input(op, xwhat, x);
  if (st == ATTN_OK) st = check_input(op, ywhat, y);
  if (st == ATTN_OK && (y->shape[0] != x->shape[0] || y->shape[1] != x->shape[1] || y->shape[2] < 1 ||
                        y->shape[3] < 1 || y->dtype != x->dtype))
    st = attn_error(ATTN_ERR_SHAPE, "%s: %s %s (%s) does not fit %s %s (%s)", op, ywhat, attn_tensor_shape_str(y),
                    attn_dtype_name(y->dtype), xwhat, attn_tensor_shape_str(x), attn_dtype_name(x->dtype));
  if (st != ATTN_OK) return st;
  return run((pool_job){.kind = POOL_ADAPTIVE}, x, y, backward);
}

attn_status attn_adaptive_avg_pool2d_forward(const attn_tensor *x, attn_tensor *y) {
  return adaptive_pool("adaptive_avg_pool2d", x, "input", y, "output", 0);
}

attn_status attn_adaptive_avg_pool2d_backward(const attn_tensor *dy, attn_tensor *dx) {
  return adaptive_pool("adaptive_avg_pool2d backward", dx, "input gradient", dy, "output gradient", 1);
}
