/* attn_steps_internal (internal): the small helpers the fused step-loop kernels share (attn_rnn.c,
 * attn_lstm.c, attn_decoder.c, attn_caption.c): the engine's product with alpha 1, addresses and
 * 3-D views into one contiguous saved buffer, and an in-place sum. Static inline, not API. */
#ifndef ATTN_STEPS_INTERNAL_H
#define ATTN_STEPS_INTERNAL_H

#include <stdint.h>

#include "core/attn_gemm.h"
#include "core/attn_tensor.h"

/* C = op(A) op(B) + beta C, row-major: the engine's small-product kernel or BLAS (attn_gemm.h). */
static inline void gemm(attn_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                        const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
  attn_gemm(dt, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

/* Address of entry `off` of contiguous t. */
static inline char *at(const attn_tensor *t, int64_t off) {
  return (char *)attn_tensor_data(t) + (size_t)off * attn_dtype_size(t->dtype);
}

/* A contiguous (a, b, c) view of contiguous t from entry `off` (borrowed, never freed). */
static inline attn_tensor view3(const attn_tensor *t, int64_t off, int64_t a, int64_t b, int64_t c) {
  const int64_t shape[3] = {a, b, c}, stride[3] = {b * c, c, 1};
  attn_tensor v = attn_view_as_strided(t, 3, shape, stride);
  v.offset = t->offset + off;
  return v;
}

/* y (n) += x (n). */
static inline void add_into(attn_dtype dt, void *y, const void *x, int64_t n) {
  if (dt == ATTN_F32) {
    float *restrict yf = y;
    const float *restrict xf = x;
    for (int64_t i = 0; i < n; i++) yf[i] += xf[i];
  } else {
    double *restrict yd = y;
    const double *restrict xd = x;
    for (int64_t i = 0; i < n; i++) yd[i] += xd[i];
  }
}

#endif
