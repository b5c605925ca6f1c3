/* Batched, broadcasting matrix product through attn_gemm (the engine's small-product kernel or
 * OpenBLAS, by size). Both run single-threaded inside the engine's worker pool: batches are spread
 * over workers, and a single large product is split into blocks of rows and columns of the output
 * (attn_gemm_split). */
#include <string.h>

#include "core/attn_gemm.h"
#include "core/attn_ops.h"
#include "core/attn_parallel.h"

/* NumPy's promotion of 1-D operands, the one place it is decided: a 1-D a
 * (K) is read as (1, K) and a 1-D b (K) as (K, 1); the added dims are not in
 * the result. Sets the promoted views (struct copies: no reference taken). */
static attn_status promote(const attn_tensor *a, const attn_tensor *b, attn_tensor *a2, attn_tensor *b2) {
  if (a->ndim == 0 || b->ndim == 0)
    return attn_error(ATTN_ERR_SHAPE, "matmul: operands need at least 1 dim, got %s @ %s", attn_tensor_shape_str(a),
                      attn_tensor_shape_str(b));
  *a2 = *a;
  *b2 = *b;
  if (a->ndim == 1) attn_view_unsqueeze(a2, 0);
  if (b->ndim == 1) attn_view_unsqueeze(b2, 1);
  if (a2->shape[a2->ndim - 1] != b2->shape[b2->ndim - 2]) /* the caller's shapes, not the promoted ones */
    return attn_error(ATTN_ERR_SHAPE, "matmul: inner dims differ: %s @ %s", attn_tensor_shape_str(a),
                      attn_tensor_shape_str(b));
  return ATTN_OK;
}

/* The shape of the promoted product, (..., M, N) with both promoted dims kept. */
static attn_status promoted_shape(const attn_tensor *a, const attn_tensor *b, int *ndim, int64_t *shape) {
  attn_status fst = attn_check_float("matmul", a->dtype == ATTN_I64 ? a : b);
  if (fst != ATTN_OK) return fst;
  if (a->dtype != b->dtype)
    return attn_error(ATTN_ERR_DTYPE, "matmul: dtypes differ: %s %s @ %s %s", attn_dtype_name(a->dtype),
                      attn_tensor_shape_str(a), attn_dtype_name(b->dtype), attn_tensor_shape_str(b));
  attn_status st = attn_broadcast_shape("matmul (batch dims)", a->ndim - 2, a->shape, b->ndim - 2, b->shape,
                                        ndim, shape);
  if (st != ATTN_OK) return st;
  shape[(*ndim)++] = a->shape[a->ndim - 2];
  shape[(*ndim)++] = b->shape[b->ndim - 1];
  return ATTN_OK;
}

attn_status attn_matmul_shape(const attn_tensor *a, const attn_tensor *b, int *ndim, int64_t *shape) {
  attn_tensor a2, b2;
  attn_status st = promote(a, b, &a2, &b2);
  if (st == ATTN_OK) st = promoted_shape(&a2, &b2, ndim, shape);
  if (st != ATTN_OK) return st;
  if (b->ndim == 1) (*ndim)--; /* drop N = 1 */
  if (a->ndim == 1) {          /* drop M = 1 */
    shape[*ndim - (b->ndim == 1 ? 1 : 2)] = shape[*ndim - 1];
    (*ndim)--;
  }
  return ATTN_OK;
}

/* A matrix operand as BLAS sees it: base pointer per batch, leading dim, transpose flag. */
typedef struct {
  const attn_tensor *t; /* after making it BLAS-compatible */
  int trans;
  int64_t ld;
} blas_operand;

typedef struct {
  blas_operand a, b;
  attn_tensor *out;
  int batch_ndim;
  int64_t batches, m, n, k;
  double beta;       /* 0: out = a b; 1: out += a b (addmm) */
} matmul_job;

/* Element offset of batch number `flat` within operand t broadcast over out's batch dims. */
static int64_t batch_offset(const attn_tensor *t, const attn_tensor *out, int batch_ndim, int64_t flat) {
  int64_t off = 0;
  int tb = t->ndim - 2, lead = batch_ndim - tb;
  for (int d = batch_ndim - 1; d >= 0; d--) {
    int64_t i = flat % out->shape[d];
    flat /= out->shape[d];
    int td = d - lead;
    if (td >= 0 && t->shape[td] != 1) off += i * t->stride[td];
  }
  return off;
}

static void gemm(const matmul_job *j, int64_t batch) {
  const attn_tensor *A = j->a.t, *B = j->b.t;
  int64_t aoff = batch_offset(A, j->out, j->batch_ndim, batch);
  int64_t boff = batch_offset(B, j->out, j->batch_ndim, batch);
  int64_t ooff = batch * j->m * j->n;
  const size_t es = attn_dtype_size(j->out->dtype);
  attn_gemm(j->out->dtype, j->a.trans, j->b.trans, j->m, j->n, j->k, 1.0,
            (const char *)attn_tensor_data(A) + (size_t)aoff * es, j->a.ld > 0 ? j->a.ld : 1,
            (const char *)attn_tensor_data(B) + (size_t)boff * es, j->b.ld > 0 ? j->b.ld : 1, j->beta,
            (char *)attn_tensor_data(j->out) + (size_t)ooff * es, j->n > 0 ? j->n : 1);
}

static void run_batches(void *arg, int64_t begin, int64_t end) {
  const matmul_job *j = arg;
  for (int64_t b = begin; b < end; b++) gemm(j, b);
}

/* out = a b + beta out, beta 0 or 1. */
static attn_status product(const attn_tensor *a, const attn_tensor *b, attn_tensor *out, double beta) {
  int nd;
  int64_t shape[ATTN_MAX_DIMS];
  attn_status st = attn_matmul_shape(a, b, &nd, shape);
  if (st != ATTN_OK) return st;
  if (out->ndim != nd || memcmp(out->shape, shape, sizeof(int64_t) * (size_t)nd) || out->dtype != a->dtype ||
      !attn_tensor_is_contiguous(out))
    return attn_error(ATTN_ERR_SHAPE, "matmul: output %s must be a contiguous %s tensor of shape %s",
                      attn_tensor_shape_str(out), attn_dtype_name(a->dtype), attn_shape_str(nd, shape));
  if (a->ndim == 1 || b->ndim == 1) { /* the product of the promoted views, into out with the dims put back */
    attn_tensor a2, b2, out2 = *out;
    promote(a, b, &a2, &b2);
    if (a->ndim == 1) attn_view_unsqueeze(&out2, out2.ndim - (b->ndim == 1 ? 0 : 1));
    if (b->ndim == 1) attn_view_unsqueeze(&out2, out2.ndim);
    return product(&a2, &b2, &out2, beta);
  }
  attn_get_num_threads(); /* first use pins OpenBLAS to one thread, even on the serial path */
  int64_t m = shape[nd - 2], n = shape[nd - 1], k = a->shape[a->ndim - 1];
  if (m > 0x7fffffff || n > 0x7fffffff || k > 0x7fffffff)
    return attn_error(ATTN_ERR_SHAPE, "matmul: %s @ %s exceeds BLAS's 32-bit sizes", attn_tensor_shape_str(a),
                      attn_tensor_shape_str(b));
  int64_t numel = attn_tensor_numel(out);
  if (numel == 0) return ATTN_OK;
  if (k == 0) return beta == 0 ? attn_fill(out, 0) : ATTN_OK;
  attn_tensor ac = {0}, bc = {0};
  matmul_job j = {{a, 0, 0}, {b, 0, 0}, out, nd - 2, numel / (m * n), m, n, k, beta};
  if (!attn_gemm_layout(a, &j.a.trans, &j.a.ld)) {
    if ((st = attn_tensor_clone(&ac, a, a->dtype)) != ATTN_OK) return st;
    j.a.t = &ac;
    attn_gemm_layout(&ac, &j.a.trans, &j.a.ld);
  }
  if (!attn_gemm_layout(b, &j.b.trans, &j.b.ld)) {
    if ((st = attn_tensor_clone(&bc, b, b->dtype)) != ATTN_OK) {
      attn_tensor_free(&ac);
      return st;
    }
    j.b.t = &bc;
    attn_gemm_layout(&bc, &j.b.trans, &j.b.ld);
  }
  double flops = 2.0 * (double)m * (double)n * (double)k;
  if (j.batches > 1) {
    attn_parallel_for(j.batches, flops >= 4e6 ? 1 : (int64_t)(4e6 / flops) + 1, run_batches, &j);
  } else {
    /* row and column blocks sized by the shape alone (attn_gemm_row_block, _col_block), so the bits
     * do not follow the thread count */
    attn_gemm_split(out->dtype, j.a.trans, j.b.trans, m, n, k, 1.0, attn_tensor_data(j.a.t), j.a.ld > 0 ? j.a.ld : 1,
                    attn_tensor_data(j.b.t), j.b.ld > 0 ? j.b.ld : 1, beta, attn_tensor_data(out), n);
  }
  attn_tensor_free(&ac);
  attn_tensor_free(&bc);
  return ATTN_OK;
}

attn_status attn_matmul(const attn_tensor *a, const attn_tensor *b, attn_tensor *out) { return product(a, b, out, 0); }

attn_status attn_addmm(const attn_tensor *bias, const attn_tensor *a, const attn_tensor *b, attn_tensor *out) {
  if (a->ndim != 2 || b->ndim != 2 || bias->ndim != 1 || bias->shape[0] != b->shape[1])
    return attn_error(ATTN_ERR_SHAPE, "addmm: expected bias (N), a (M, K), b (K, N), got %s, %s, %s",
                      attn_tensor_shape_str(bias), attn_tensor_shape_str(a), attn_tensor_shape_str(b));
  if (bias->dtype != a->dtype)
    return attn_error(ATTN_ERR_DTYPE, "addmm: dtypes differ: bias %s %s, a %s %s", attn_dtype_name(bias->dtype),
                      attn_tensor_shape_str(bias), attn_dtype_name(a->dtype), attn_tensor_shape_str(a));
  int nd;
  int64_t shape[ATTN_MAX_DIMS];
  attn_status st = attn_matmul_shape(a, b, &nd, shape);
  if (st != ATTN_OK) return st;
  if (out->ndim != 2 || out->shape[0] != shape[0] || out->shape[1] != shape[1] || out->dtype != a->dtype ||
      !attn_tensor_is_contiguous(out))
    return attn_error(ATTN_ERR_SHAPE, "addmm: output %s must be a contiguous %s tensor of shape %s",
                      attn_tensor_shape_str(out), attn_dtype_name(a->dtype), attn_shape_str(nd, shape));
  attn_tensor rows = *bias; /* the bias as (M, N) rows: a view, no reference taken */
  attn_view_unsqueeze(&rows, 0);
  if ((st = attn_view_expand(&rows, 2, shape)) != ATTN_OK || (st = attn_copy(out, &rows)) != ATTN_OK) return st;
  return product(a, b, out, 1);
}
