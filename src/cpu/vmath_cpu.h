/* The per-ISA row kernels and small products behind attn_vmath.h and attn_gemm.h, gathered
 * in cpu_dispatch.c. Every set has the same functions with the ISA as suffix; the AVX2 and
 * AVX-512 sets exist only on x86-64. */
#ifndef ATTN_VMATH_CPU_H
#define ATTN_VMATH_CPU_H

#include <stdint.h>

struct attn_dropout_rule; /* core/attn_dropout.h */

#define ATTN_VMATH_DECLARE(isa)                                                   \
  void attn_vmath_exp_f32_##isa(const float *x, float *y, int64_t n);             \
  void attn_vmath_log_f32_##isa(const float *x, float *y, int64_t n);             \
  void attn_vmath_tanh_f32_##isa(const float *x, float *y, int64_t n);            \
  void attn_vmath_sigmoid_f32_##isa(const float *x, float *y, int64_t n);         \
  double attn_vmath_exp_row_f32_##isa(float *x, int64_t n, float m);                \
  void attn_vmath_dropout_f32_##isa(const struct attn_dropout_rule *r, const float *x, float *y, int64_t n, uint64_t base); \
  void attn_vmath_dropout_f64_##isa(const struct attn_dropout_rule *r, const double *x, double *y, int64_t n, uint64_t base); \
  void attn_vmath_gemm_small_f32_##isa(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,          \
                                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,  \
                                       float *C, int64_t ldc, float *pack);                                  \
  extern const int64_t attn_vmath_gemm_small_max_##isa;                                                    \
  void attn_vmath_gru_fwd_f32_##isa(int64_t B, int64_t H, const float *gi, const float *gh, const float *hp,  \
                                    float *restrict hn, float *restrict rz, float *restrict n,                \
                                    float *restrict ghn);                                                     \
  void attn_vmath_gru_bwd_f32_##isa(int64_t B, int64_t H, float *restrict dh, const float *restrict dy,       \
                                    const float *restrict hp, const float *restrict rz,                       \
                                    const float *restrict n, const float *restrict ghn,                       \
                                    float *restrict dgi, float *restrict dgh);                                \
  void attn_vmath_colsum_f32_##isa(const float *m, int64_t rows, int64_t cols, float *out);

ATTN_VMATH_DECLARE(generic)
#if defined(__x86_64__)
ATTN_VMATH_DECLARE(avx2)
ATTN_VMATH_DECLARE(avx512)
#endif

#endif
