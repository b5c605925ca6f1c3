/* attn_ops: math on strided tensors.
 *
 * Conventions: outputs are passed in, already allocated with the shape the
 * function documents (the binding allocates them; attn_*_shape helpers give
 * the shape). Inputs may be any strided view (transposed, narrowed, expanded)
 * and all operands of one call share a dtype (conditions, masks and index
 * tensors excepted, as documented). Dims are 0-based. Reductions accumulate in
 * double (int64 sums in int64) and parallelise only over independent outputs,
 * so results do not depend on the thread count. int64 operands are accepted
 * where documented (see attn_tensor.h); elsewhere they fail through
 * attn_check_float. */
#ifndef ATTN_OPS_H
#define ATTN_OPS_H

#include "core/attn_tensor.h"

typedef enum {
  ATTN_ADD, ATTN_SUB, ATTN_MUL, ATTN_DIV, ATTN_POW, ATTN_MAXIMUM, ATTN_MINIMUM,
  ATTN_EQ, ATTN_NE, ATTN_LT, ATTN_LE, ATTN_GT, ATTN_GE, /* comparisons give 1 or 0 */
  /* gradients through an activation from its output y, with x the incoming
   * gradient: x (1 - y^2) for tanh, x y (1 - y) for sigmoid (one pass, no temporaries) */
  ATTN_TANH_GRAD, ATTN_SIGMOID_GRAD,
  /* x gelu'(y) with y the activation's input: x (Phi(y) + y phi(y)), Phi, phi the standard normal
   * CDF and density (libm's erfc, so exact to double rounding) */
  ATTN_GELU_GRAD,
  ATTN_BINARY_COUNT
} attn_binary_op;

typedef enum {
  ATTN_NEG, ATTN_EXP, ATTN_LOG, ATTN_SQRT, ATTN_TANH, ATTN_SIGMOID, ATTN_RELU, ATTN_ABS,
  ATTN_SIGN, ATTN_SQUARE, ATTN_RECIPROCAL, ATTN_SIN, ATTN_COS,
  /* libm's erf, and the exact GELU x Phi(x) = x erfc(-x / sqrt 2) / 2 (float32 evaluated in double) */
  ATTN_ERF, ATTN_GELU,
  ATTN_UNARY_COUNT
} attn_unary_op;

typedef enum { ATTN_SUM, ATTN_MEAN, ATTN_MAX, ATTN_MIN, ATTN_PROD } attn_reduce_op;

const char *attn_binary_name(attn_binary_op op);
const char *attn_unary_name(attn_unary_op op);

/* out = a op b. a, b broadcast (NumPy rules) to out's shape, which must be
 * their broadcast shape. out may alias a or b when that operand has out's shape
 * and layout. int64: all ops but div and pow; add, sub, mul wrap on overflow. */
attn_status attn_binary(attn_binary_op op, const attn_tensor *a, const attn_tensor *b, attn_tensor *out);
/* out = a op s (or s op a when scalar_left). out has a's shape. For int64, s
 * must be an integer (see attn_scalar_to). */
attn_status attn_binary_scalar(attn_binary_op op, const attn_tensor *a, double s, int scalar_left,
                               attn_tensor *out);
/* out = f(x), same shape (out may alias x). int64: neg, abs and sign only. */
attn_status attn_unary(attn_unary_op op, const attn_tensor *x, attn_tensor *out);
/* out = cond != 0 ? a : b; cond, a, b broadcast to out's shape; cond may have
 * any dtype, a, b and out share one. */
attn_status attn_where(const attn_tensor *cond, const attn_tensor *a, const attn_tensor *b, attn_tensor *out);
/* out = mask != 0 ? value : x; mask (any dtype) broadcasts to x's shape; out
 * has x's shape and dtype. */
attn_status attn_masked_fill(const attn_tensor *x, const attn_tensor *mask, double value, attn_tensor *out);

/* Reduction over dim of x (N-D). out has x's shape and dtype with dim set to 1.
 * indices (may be NULL; only for MAX/MIN) is an int64 tensor of out's shape
 * that receives the 0-based position of the first extreme value. int64 x:
 * SUM (exact, wrapping), MAX and MIN only. */
attn_status attn_reduce(attn_reduce_op op, const attn_tensor *x, int dim, attn_tensor *out, attn_tensor *indices);
/* Stable sort along dim (any dtype): values (x's shape and dtype) get each
 * row in ascending order, or descending when descending is nonzero; indices
 * (int64, x's shape) the 0-based source positions. Equal keys keep their
 * order; NaN sorts above every number (last ascending, first descending). */
attn_status attn_sort(const attn_tensor *x, int dim, int descending, attn_tensor *values, attn_tensor *indices);
/* The k first entries of each row along dim in attn_sort's order (descending when largest is
 * nonzero), without sorting the rows: values (x's shape with k along dim, x's dtype) and indices
 * (int64, that shape, 0-based positions) equal attn_sort's first k; 0 <= k <= ATTN_TOPK_MAX.
 * Rows are split across the threads. */
#define ATTN_TOPK_MAX 64
attn_status attn_topk(const attn_tensor *x, int dim, int64_t k, int largest, attn_tensor *values,
                      attn_tensor *indices);
/* Cumulative sum or product along dim (PyTorch's cumsum/cumprod): out[.., k, ..] = x[.., 0, ..] op
 * ... op x[.., k, ..], accumulated in double (int64: exact, wrapping; both ops); CUMSUM_REVERSE
 * sums from the end (cumsum's gradient). out has x's shape and dtype and does not alias x. */
typedef enum { ATTN_CUMSUM, ATTN_CUMPROD, ATTN_CUMSUM_REVERSE, ATTN_CUMPROD_GRAD } attn_scan_op;
attn_status attn_cumulative(attn_scan_op op, const attn_tensor *x, int dim, attn_tensor *out);
/* Gradient of y = cumprod(x, dim) for the incoming gradient g (float; x, y, g and out of one shape
 * and dtype, out fresh): out_k = sum_{j >= k} g_j prod_{i <= j, i != k} x_i, exact where x holds
 * zeros (no division by them). */
attn_status attn_cumprod_backward(const attn_tensor *x, const attn_tensor *y, const attn_tensor *g, int dim,
                                  attn_tensor *out);
/* Softmax / log-softmax over dim, numerically stable; out has x's shape (float only). */
attn_status attn_softmax(const attn_tensor *x, int dim, int log, attn_tensor *out);

/* index: 0-based positions (length n, validated against x's dim size).
 * out has x's shape with dim replaced by n. */
attn_status attn_index_select(const attn_tensor *x, int dim, const int64_t *index, int64_t n, attn_tensor *out);
/* out[..., index[k], ...] += src[..., k, ...] along dim; src has out's shape with dim = n. */
attn_status attn_index_add(attn_tensor *out, int dim, const int64_t *index, int64_t n, const attn_tensor *src);
/* index (int64, 0-based values) has x's ndim; sizes <= x's except along dim;
 * out has index's shape and x's dtype (elements are copied bit-exactly).
 * out[i][j][k] = x[i][index[i][j][k]][k] for dim 1. */
attn_status attn_gather(const attn_tensor *x, int dim, const attn_tensor *index, attn_tensor *out);
/* Reverse of gather: out[i][index[i][j][k]][k] += src[i][j][k]; src has index's
 * shape and out's dtype; index is int64 with 0-based values. */
attn_status attn_scatter_add(attn_tensor *out, int dim, const attn_tensor *index, const attn_tensor *src);

/* The max of a contiguous row of n >= 0 entries (-inf when empty), NaN when
 * it holds one; eight running maxima, so long rows are not latency-bound.
 * Shared by the softmax and cross-entropy kernels. */
float attn_row_max_f32(const float *x, int64_t n);
double attn_row_max_f64(const double *x, int64_t n);

/* Raw contiguous buffers (dt float32 or float64), for kernels that keep their operands in one
 * workspace. out (cols) = the column sums of m (rows, cols), in row order (a bias gradient;
 * float32 on the attn_vmath path of this CPU). */
void attn_colsum_rows(attn_dtype dt, const void *m, int64_t rows, int64_t cols, void *out);
/* Every row of m (rows, cols; es bytes an entry) set to v (cols), or zeros when v is NULL. */
void attn_fill_rows(void *m, int64_t rows, int64_t cols, size_t es, const void *v);

/* out = x with the entries off a triangle of the last two dims (R, C) set to 0: tril keeps
 * column j of row i when j - i <= k, triu (upper nonzero) when j - i >= k (PyTorch's diagonal
 * argument, 0-based rows and columns). x has >= 2 dims; out has x's shape and dtype (any dtype). */
attn_status attn_triangle(const attn_tensor *x, int64_t k, int upper, attn_tensor *out);

/* Ids to indices: checks that every value of src (any dtype) is an integer in
 * base..base+limit-1 (limit < 0: no upper bound) and, when out is not NULL
 * (int64, src's shape, contiguous), writes value - base into it. Errors read
 * "op: <what> v at position p (1-based, row-major) is not an integer (<ctx>)"
 * or "... is out of range base..base+limit-1 (<ctx>)"; ctx NULL names src's shape. */
attn_status attn_index_convert(const char *op, const char *what, const char *ctx, const attn_tensor *src,
                               int64_t base, int64_t limit, attn_tensor *out);

/* Output shape of matmul: a (..., M, K) @ b (..., K, N) -> (..., M, N), batch
 * dims broadcast. NumPy's 1-D rule is decided here (and nowhere else): a 1-D
 * a (K) acts as (1, K) and a 1-D b (K) as (K, 1), and those added dims are
 * not in the result: (K) @ (K) -> (), (K) @ (..., K, N) -> (..., N),
 * (..., M, K) @ (K) -> (..., M). A 0-d operand is an error. */
attn_status attn_matmul_shape(const attn_tensor *a, const attn_tensor *b, int *ndim, int64_t *shape);
/* out = a @ b (shapes as attn_matmul_shape) through attn_gemm per batch (the
 * small-product kernel or BLAS; strided views are used in place when one of
 * their matrix strides is 1, copied otherwise). out must be contiguous and
 * not alias a or b. Batches are spread over the worker pool. */
attn_status attn_matmul(const attn_tensor *a, const attn_tensor *b, attn_tensor *out);
/* out (M, N) = bias (N) + a (M, K) @ b (K, N), PyTorch's addmm (a Linear's
 * forward): out starts as the bias rows and the product adds to it, one
 * rounding per entry as matmul then add. out contiguous, not aliasing. */
attn_status attn_addmm(const attn_tensor *bias, const attn_tensor *a, const attn_tensor *b, attn_tensor *out);

/* Creation kernels on contiguous out (1-D for arange/linspace, 2-D for eye). */
attn_status attn_arange(attn_tensor *out, double start, double step);
attn_status attn_linspace(attn_tensor *out, double start, double stop);
attn_status attn_eye(attn_tensor *out);

#endif
