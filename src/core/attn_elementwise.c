/* Broadcasting elementwise kernels for float32 and float64, and the integer
 * subset for int64 (ids): add, sub, mul (wrapping, as two's complement
 * hardware and PyTorch do), maximum, minimum, comparisons, neg, abs, sign,
 * where and masked_fill. Other ops need a float dtype (attn_check_float). */
#include <tgmath.h>

#include "core/attn_iter.h"
#include "core/attn_ops.h"
#include "core/attn_vmath.h"

/* GELU and its derivative in double (libm's erfc: no cancellation for negative x, where 1 + erf
 * would lose every digit): Phi(x) = erfc(-x / sqrt 2) / 2, phi(x) = exp(-x^2 / 2) / sqrt(2 pi). */
#define ATTN_SQRT1_2 0.70710678118654752440
#define ATTN_INV_SQRT_2PI 0.39894228040143267794
static inline double gelu_d(double x) { return 0.5 * x * erfc(-x * ATTN_SQRT1_2); }
static inline double gelu_grad_d(double x) {
  return 0.5 * erfc(-x * ATTN_SQRT1_2) + x * exp(-0.5 * x * x) * ATTN_INV_SQRT_2PI;
}

static const char *binary_names[ATTN_BINARY_COUNT] = {"add", "sub", "mul", "div", "pow", "maximum",
                                                       "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                                                       "tanh_backward", "sigmoid_backward", "gelu_backward"};
static const char *unary_names[ATTN_UNARY_COUNT] = {"neg", "exp", "log", "sqrt", "tanh", "sigmoid", "relu",
                                                     "abs", "sign", "square", "reciprocal", "sin", "cos",
                                                     "erf", "gelu"};

const char *attn_binary_name(attn_binary_op op) { return binary_names[op]; }
const char *attn_unary_name(attn_unary_op op) { return unary_names[op]; }

/* Four versions of each loop: all contiguous, contiguous with a scalar second
 * or first operand, and general strides. The first three let the compiler
 * vectorise. */
#define BINARY_LOOP(T, EXPR)                                                            \
  do {                                                                                  \
    if (so == (int64_t)sizeof(T) && sa == so && sb == so) {                             \
      T *O = (T *)o;                                                                    \
      const T *A = (const T *)a, *B = (const T *)b;                                     \
      for (int64_t i = 0; i < n; i++) {                                                 \
        T x = A[i], y = B[i];                                                           \
        O[i] = (EXPR);                                                                  \
      }                                                                                 \
    } else if (so == (int64_t)sizeof(T) && sa == so && sb == 0) {                       \
      T *O = (T *)o;                                                                    \
      const T *A = (const T *)a;                                                        \
      const T y = *(const T *)b;                                                        \
      for (int64_t i = 0; i < n; i++) {                                                 \
        T x = A[i];                                                                     \
        O[i] = (EXPR);                                                                  \
      }                                                                                 \
    } else if (so == (int64_t)sizeof(T) && sa == 0 && sb == so) {                       \
      T *O = (T *)o;                                                                    \
      const T x = *(const T *)a;                                                        \
      const T *B = (const T *)b;                                                        \
      for (int64_t i = 0; i < n; i++) {                                                 \
        T y = B[i];                                                                     \
        O[i] = (EXPR);                                                                  \
      }                                                                                 \
    } else {                                                                            \
      for (int64_t i = 0; i < n; i++) {                                                 \
        T x = *(const T *)(a + i * sa), y = *(const T *)(b + i * sb);                   \
        *(T *)(o + i * so) = (EXPR);                                                    \
      }                                                                                 \
    }                                                                                   \
  } while (0)

#define DEFINE_BINARY(SUFFIX, T)                                                        \
  static void binary_##SUFFIX(int64_t n, char **p, const int64_t *st, void *ctx) {      \
    attn_binary_op op = *(const attn_binary_op *)ctx;                                   \
    char *o = p[0];                                                                     \
    const char *a = p[1], *b = p[2];                                                    \
    int64_t so = st[0], sa = st[1], sb = st[2];                                         \
    switch (op) {                                                                       \
    case ATTN_ADD: BINARY_LOOP(T, x + y); break;                                        \
    case ATTN_SUB: BINARY_LOOP(T, x - y); break;                                        \
    case ATTN_MUL: BINARY_LOOP(T, x * y); break;                                        \
    case ATTN_DIV: BINARY_LOOP(T, x / y); break;                                        \
    case ATTN_POW: BINARY_LOOP(T, pow(x, y)); break;                                    \
    case ATTN_MAXIMUM: BINARY_LOOP(T, (x > y || x != x) ? x : y); break;                \
    case ATTN_MINIMUM: BINARY_LOOP(T, (x < y || x != x) ? x : y); break;                \
    case ATTN_EQ: BINARY_LOOP(T, (T)(x == y)); break;                                   \
    case ATTN_NE: BINARY_LOOP(T, (T)(x != y)); break;                                   \
    case ATTN_LT: BINARY_LOOP(T, (T)(x < y)); break;                                    \
    case ATTN_LE: BINARY_LOOP(T, (T)(x <= y)); break;                                   \
    case ATTN_GT: BINARY_LOOP(T, (T)(x > y)); break;                                    \
    case ATTN_GE: BINARY_LOOP(T, (T)(x >= y)); break;                                   \
    case ATTN_TANH_GRAD: BINARY_LOOP(T, x * (1 - y * y)); break;                        \
    case ATTN_SIGMOID_GRAD: BINARY_LOOP(T, x * (y * (1 - y))); break;                   \
    case ATTN_GELU_GRAD: BINARY_LOOP(T, (T)((double)x * gelu_grad_d((double)y))); break; \
    default: break;                                                                     \
    }                                                                                   \
  }

DEFINE_BINARY(f32, float)
DEFINE_BINARY(f64, double)

/* Signed overflow is undefined in C: add, sub and mul wrap through uint64_t. */
#define WRAP(OP) (int64_t)((uint64_t)x OP (uint64_t)y)
static void binary_i64(int64_t n, char **p, const int64_t *st, void *ctx) {
  attn_binary_op op = *(const attn_binary_op *)ctx;
  char *o = p[0];
  const char *a = p[1], *b = p[2];
  int64_t so = st[0], sa = st[1], sb = st[2];
  switch (op) {
  case ATTN_ADD: BINARY_LOOP(int64_t, WRAP(+)); break;
  case ATTN_SUB: BINARY_LOOP(int64_t, WRAP(-)); break;
  case ATTN_MUL: BINARY_LOOP(int64_t, WRAP(*)); break;
  case ATTN_MAXIMUM: BINARY_LOOP(int64_t, x > y ? x : y); break;
  case ATTN_MINIMUM: BINARY_LOOP(int64_t, x < y ? x : y); break;
  case ATTN_EQ: BINARY_LOOP(int64_t, (int64_t)(x == y)); break;
  case ATTN_NE: BINARY_LOOP(int64_t, (int64_t)(x != y)); break;
  case ATTN_LT: BINARY_LOOP(int64_t, (int64_t)(x < y)); break;
  case ATTN_LE: BINARY_LOOP(int64_t, (int64_t)(x <= y)); break;
  case ATTN_GT: BINARY_LOOP(int64_t, (int64_t)(x > y)); break;
  case ATTN_GE: BINARY_LOOP(int64_t, (int64_t)(x >= y)); break;
  default: break;
  }
}

/* The int64 subset of the binary ops; the rest go through attn_check_float. */
static attn_status check_binary_dtype(attn_binary_op op, const attn_tensor *t) {
  if (op == ATTN_DIV || op == ATTN_POW || op >= ATTN_TANH_GRAD) return attn_check_float(binary_names[op], t);
  return ATTN_OK;
}

static const attn_iter_fn binary_fns[3] = {binary_f32, binary_f64, binary_i64};
static attn_status run_binary(attn_binary_op op, const attn_tensor *a, const attn_tensor *b, attn_tensor *out);

static attn_status check_writable(const char *op, const attn_tensor *out) {
  if (attn_tensor_overlaps_itself(out))
    return attn_error(ATTN_ERR_ARG, "%s: output %s is an expanded view (several indices share one element); "
                      "write to a contiguous copy", op, attn_tensor_shape_str(out));
  return ATTN_OK;
}

static attn_status check_dtypes(const char *op, const attn_tensor *a, const attn_tensor *b) {
  if (a->dtype == b->dtype) return ATTN_OK;
  if (a->dtype == ATTN_I64 || b->dtype == ATTN_I64)
    return attn_error(ATTN_ERR_DTYPE, "%s: dtypes differ: %s %s vs %s %s; int64 does not mix into float math, "
                      "convert it with :to(\"%s\")", op, attn_dtype_name(a->dtype), attn_tensor_shape_str(a),
                      attn_dtype_name(b->dtype), attn_tensor_shape_str(b),
                      attn_dtype_name(a->dtype == ATTN_I64 ? b->dtype : a->dtype));
  return attn_error(ATTN_ERR_DTYPE, "%s: dtypes differ: %s %s vs %s %s (convert with :to())", op,
                    attn_dtype_name(a->dtype), attn_tensor_shape_str(a), attn_dtype_name(b->dtype),
                    attn_tensor_shape_str(b));
}

/* Checks that each operand broadcasts exactly to out's shape. */
static attn_status check_broadcast_out(const char *op, const attn_tensor *a, const attn_tensor *b,
                                       const attn_tensor *out) {
  int nd;
  int64_t shape[ATTN_MAX_DIMS];
  attn_status st = attn_broadcast_shape(op, a->ndim, a->shape, b->ndim, b->shape, &nd, shape);
  if (st != ATTN_OK) return st;
  if (nd != out->ndim) goto mismatch;
  for (int d = 0; d < nd; d++)
    if (shape[d] != out->shape[d]) goto mismatch;
  return ATTN_OK;
mismatch:
  return attn_error(ATTN_ERR_SHAPE, "%s: output %s is not the broadcast shape %s of %s and %s", op,
                    attn_tensor_shape_str(out), attn_shape_str(nd, shape), attn_tensor_shape_str(a),
                    attn_tensor_shape_str(b));
}

/* Checks that out's shape is the joint broadcast shape of the n operands. */
static attn_status check_joint_broadcast(const char *op, int n, const attn_tensor *const *operands,
                                         const attn_tensor *out) {
  int nd = 0;
  int64_t shape[ATTN_MAX_DIMS];
  for (int k = 0; k < n; k++) {
    attn_status st = attn_broadcast_shape(op, nd, shape, operands[k]->ndim, operands[k]->shape, &nd, shape);
    if (st != ATTN_OK) return st;
  }
  int same = nd == out->ndim;
  for (int d = 0; same && d < nd; d++) same = shape[d] == out->shape[d];
  if (!same)
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s is not the broadcast shape %s of the operands", op,
                      attn_tensor_shape_str(out), attn_shape_str(nd, shape));
  return ATTN_OK;
}

attn_status attn_binary(attn_binary_op op, const attn_tensor *a_in, const attn_tensor *b_in, attn_tensor *out) {
  const char *name = binary_names[op];
  attn_status st = check_dtypes(name, a_in, b_in);
  if (st == ATTN_OK) st = check_dtypes(name, a_in, out);
  if (st == ATTN_OK) st = check_binary_dtype(op, a_in);
  if (st == ATTN_OK) st = check_writable(name, out);
  if (st == ATTN_OK) st = check_broadcast_out(name, a_in, b_in, out);
  if (st != ATTN_OK) return st;
  attn_tensor ta = {0}, tb = {0}; /* inputs that overlap out are read from copies */
  const attn_tensor *a = a_in, *b = b_in;
  st = attn_unalias(out, a_in, &ta, &a);
  if (st == ATTN_OK) st = attn_unalias(out, b_in, &tb, &b);
  if (st == ATTN_OK) st = run_binary(op, a, b, out);
  attn_tensor_free(&ta);
  attn_tensor_free(&tb);
  return st;
}

static attn_status run_binary(attn_binary_op op, const attn_tensor *a, const attn_tensor *b, attn_tensor *out) {
  attn_iter it;
  attn_iter_begin(&it, out->ndim, out->shape);
  attn_iter_add(&it, out);
  attn_iter_add(&it, a);
  attn_iter_add(&it, b);
  attn_iter_run(&it, binary_fns[out->dtype], &op);
  return ATTN_OK;
}

/* Swapped operands for "scalar op tensor". */
typedef struct {
  attn_binary_op op;
} swapped_ctx;

#define DEFINE_BINARY_SWAPPED(SUFFIX)                                                   \
  static void binary_swapped_##SUFFIX(int64_t n, char **p, const int64_t *st, void *ctx) { \
    char *q[3] = {p[0], p[2], p[1]};                                                    \
    int64_t s[3] = {st[0], st[2], st[1]};                                               \
    binary_##SUFFIX(n, q, s, ctx);                                                      \
  }
DEFINE_BINARY_SWAPPED(f32)
DEFINE_BINARY_SWAPPED(f64)
DEFINE_BINARY_SWAPPED(i64)
static const attn_iter_fn binary_swapped_fns[3] = {binary_swapped_f32, binary_swapped_f64, binary_swapped_i64};

attn_status attn_binary_scalar(attn_binary_op op, const attn_tensor *a, double s, int scalar_left,
                               attn_tensor *out) {
  const char *name = binary_names[op];
  char sbuf[8];
  attn_status st = check_dtypes(name, a, out);
  if (st == ATTN_OK) st = check_binary_dtype(op, a);
  if (st == ATTN_OK) st = check_writable(name, out);
  if (st == ATTN_OK) st = check_broadcast_out(name, a, a, out);
  if (st == ATTN_OK) st = attn_scalar_to(name, out->dtype, s, sbuf);
  if (st != ATTN_OK) return st;
  attn_iter it;
  attn_iter_begin(&it, out->ndim, out->shape);
  attn_iter_add(&it, out);
  attn_iter_add(&it, a);
  attn_iter_add_scalar(&it, sbuf);
  attn_iter_run(&it, scalar_left ? binary_swapped_fns[out->dtype] : binary_fns[out->dtype], &op);
  return ATTN_OK;
}

#define UNARY_LOOP(T, EXPR)                                                             \
  do {                                                                                  \
    if (so == (int64_t)sizeof(T) && sx == so) {                                         \
      T *O = (T *)o;                                                                    \
      const T *X = (const T *)xp;                                                       \
      for (int64_t i = 0; i < n; i++) {                                                 \
        T x = X[i];                                                                     \
        O[i] = (EXPR);                                                                  \
      }                                                                                 \
    } else {                                                                            \
      for (int64_t i = 0; i < n; i++) {                                                 \
        T x = *(const T *)(xp + i * sx);                                                \
        *(T *)(o + i * so) = (EXPR);                                                    \
      }                                                                                 \
    }                                                                                   \
  } while (0)

#define DEFINE_UNARY(SUFFIX, T)                                                         \
  static void unary_##SUFFIX(int64_t n, char **p, const int64_t *st, void *ctx) {       \
    attn_unary_op op = *(const attn_unary_op *)ctx;                                     \
    char *o = p[0];                                                                     \
    const char *xp = p[1];                                                              \
    int64_t so = st[0], sx = st[1];                                                     \
    const T one = 1, zero = 0;                                                          \
    switch (op) {                                                                       \
    case ATTN_NEG: UNARY_LOOP(T, -x); break;                                            \
    case ATTN_EXP: UNARY_LOOP(T, exp(x)); break;                                        \
    case ATTN_LOG: UNARY_LOOP(T, log(x)); break;                                        \
    case ATTN_SQRT: UNARY_LOOP(T, sqrt(x)); break;                                      \
    case ATTN_TANH: UNARY_LOOP(T, tanh(x)); break;                                      \
    case ATTN_SIGMOID:                                                                  \
      UNARY_LOOP(T, x >= zero ? one / (one + exp(-x)) : exp(x) / (one + exp(x)));       \
      break;                                                                            \
    case ATTN_RELU: UNARY_LOOP(T, x > zero ? x : (x != x ? x : zero)); break;           \
    case ATTN_ABS: UNARY_LOOP(T, fabs(x)); break;                                       \
    case ATTN_SIGN: UNARY_LOOP(T, x > zero ? one : (x < zero ? -one : x)); break;       \
    case ATTN_SQUARE: UNARY_LOOP(T, x * x); break;                                      \
    case ATTN_RECIPROCAL: UNARY_LOOP(T, one / x); break;                                \
    case ATTN_SIN: UNARY_LOOP(T, sin(x)); break;                                        \
    case ATTN_COS: UNARY_LOOP(T, cos(x)); break;                                        \
    case ATTN_ERF: UNARY_LOOP(T, (T)erf((double)x)); break;                             \
    case ATTN_GELU: UNARY_LOOP(T, (T)gelu_d((double)x)); break;                         \
    default: break;                                                                     \
    }                                                                                   \
  }

DEFINE_UNARY(f32, float)
DEFINE_UNARY(f64, double)

static void unary_i64(int64_t n, char **p, const int64_t *st, void *ctx) {
  attn_unary_op op = *(const attn_unary_op *)ctx;
  char *o = p[0];
  const char *xp = p[1];
  int64_t so = st[0], sx = st[1];
  switch (op) {
  case ATTN_NEG: UNARY_LOOP(int64_t, (int64_t)(0 - (uint64_t)x)); break;
  case ATTN_ABS: UNARY_LOOP(int64_t, x < 0 ? (int64_t)(0 - (uint64_t)x) : x); break;
  case ATTN_SIGN: UNARY_LOOP(int64_t, (int64_t)(x > 0) - (int64_t)(x < 0)); break;
  default: break;
  }
}
static const attn_iter_fn unary_fns[3] = {unary_f32, unary_f64, unary_i64};

/* float32 exp, log, tanh and sigmoid go through attn_vmath's row kernels:
 * contiguous runs directly, strided ones through a small buffer, so a value
 * gets the same bits whatever the layout. */
static void unary_vmath_f32(int64_t n, char **p, const int64_t *st, void *ctx) {
  attn_unary_op op = *(const attn_unary_op *)ctx;
  void (*f)(const float *, float *, int64_t) = op == ATTN_EXP    ? attn_vmath_exp_f32
                                               : op == ATTN_LOG  ? attn_vmath_log_f32
                                               : op == ATTN_TANH ? attn_vmath_tanh_f32
                                                                 : attn_vmath_sigmoid_f32;
  if (st[0] == 4 && st[1] == 4) {
    f((const float *)p[1], (float *)p[0], n);
    return;
  }
  float buf[256];
  for (int64_t i = 0; i < n; i += 256) {
    int64_t k = n - i < 256 ? n - i : 256;
    for (int64_t j = 0; j < k; j++) buf[j] = *(const float *)(p[1] + (i + j) * st[1]);
    f(buf, buf, k);
    for (int64_t j = 0; j < k; j++) *(float *)(p[0] + (i + j) * st[0]) = buf[j];
  }
}

attn_status attn_unary(attn_unary_op op, const attn_tensor *x, attn_tensor *out) {
  const char *name = unary_names[op];
  attn_status st = check_dtypes(name, x, out);
  if (st == ATTN_OK && op != ATTN_NEG && op != ATTN_ABS && op != ATTN_SIGN) st = attn_check_float(name, x);
  if (st == ATTN_OK) st = check_broadcast_out(name, x, x, out);
  if (st != ATTN_OK) return st;
  attn_iter it;
  attn_iter_begin(&it, out->ndim, out->shape);
  attn_iter_add(&it, out);
  attn_iter_add(&it, x);
  int vm = op == ATTN_EXP || op == ATTN_LOG || op == ATTN_TANH || op == ATTN_SIGMOID;
  attn_iter_run(&it, out->dtype == ATTN_F32 && vm ? unary_vmath_f32 : unary_fns[out->dtype], &op);
  return ATTN_OK;
}

/* The condition may have any dtype (nonzero selects a); ctx holds it. */
static inline int cond_true(const char *c, attn_dtype dt) {
  if (dt == ATTN_F32) return *(const float *)c != 0;
  if (dt == ATTN_F64) return *(const double *)c != 0;
  return *(const int64_t *)c != 0;
}

#define DEFINE_WHERE(SUFFIX, T)                                                         \
  static void where_##SUFFIX(int64_t n, char **p, const int64_t *st, void *ctx) {       \
    attn_dtype cdt = *(const attn_dtype *)ctx;                                          \
    for (int64_t i = 0; i < n; i++)                                                     \
      *(T *)(p[0] + i * st[0]) = cond_true(p[1] + i * st[1], cdt) ? *(const T *)(p[2] + i * st[2]) \
                                                                  : *(const T *)(p[3] + i * st[3]); \
  }
DEFINE_WHERE(f32, float)
DEFINE_WHERE(f64, double)
DEFINE_WHERE(i64, int64_t)
static const attn_iter_fn where_fns[3] = {where_f32, where_f64, where_i64};

attn_status attn_where(const attn_tensor *cond, const attn_tensor *a, const attn_tensor *b, attn_tensor *out) {
  attn_status st = check_dtypes("where", a, b);
  if (st == ATTN_OK) st = check_dtypes("where", a, out);
  const attn_tensor *operands[3] = {cond, a, b};
  if (st == ATTN_OK) st = check_joint_broadcast("where", 3, operands, out);
  if (st != ATTN_OK) return st;
  attn_dtype cdt = cond->dtype;
  attn_iter it;
  attn_iter_begin(&it, out->ndim, out->shape);
  attn_iter_add(&it, out);
  attn_iter_add(&it, cond);
  attn_iter_add(&it, a);
  attn_iter_add(&it, b);
  attn_iter_run(&it, where_fns[out->dtype], &cdt);
  return ATTN_OK;
}

attn_status attn_masked_fill(const attn_tensor *x, const attn_tensor *mask, double value, attn_tensor *out) {
  char vbuf[8];
  attn_status st = check_dtypes("masked_fill", x, out);
  const attn_tensor *operands[2] = {x, mask};
  if (st == ATTN_OK && (check_joint_broadcast("masked_fill", 2, operands, x) != ATTN_OK ||
                        check_joint_broadcast("masked_fill", 1, operands, out) != ATTN_OK))
    st = attn_error(ATTN_ERR_SHAPE, "masked_fill: mask %s must broadcast to the input %s (output %s)",
                    attn_tensor_shape_str(mask), attn_tensor_shape_str(x), attn_tensor_shape_str(out));
  if (st == ATTN_OK) st = attn_scalar_to("masked_fill", out->dtype, value, vbuf);
  if (st != ATTN_OK) return st;
  attn_dtype cdt = mask->dtype;
  attn_iter it;
  attn_iter_begin(&it, out->ndim, out->shape);
  attn_iter_add(&it, out);
  attn_iter_add(&it, mask);
  attn_iter_add_scalar(&it, vbuf);
  attn_iter_add(&it, x);
  attn_iter_run(&it, where_fns[out->dtype], &cdt);
  return ATTN_OK;
}
