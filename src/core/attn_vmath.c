/* The row math of attn_vmath.h on the active instruction set (cpu/cpu_dispatch.h). */
#include "core/attn_vmath.h"

#include <math.h>
#include <string.h>

#include "cpu/cpu_dispatch.h"

/* The instruction set is the engine's one switch (cpu/cpu_dispatch.h): every vectorised kernel
 * runs the active set's. */
const char *attn_vmath_isa(void) { return attn_cpu()->name; }

int attn_vmath_isa_supported(const char *name) {
  const attn_cpu_kernels *k = attn_cpu_find(name);
  return k && attn_cpu_supported(k);
}

attn_status attn_vmath_set_isa(const char *name) {
  const attn_cpu_kernels *k = strcmp(name, "auto") == 0 ? attn_cpu_best() : attn_cpu_find(name);
  if (!k) return attn_error(ATTN_ERR_ARG, "set_isa: unknown path '%s' (generic, avx2, avx512 or auto)", name);
  if (!attn_cpu_supported(k)) return attn_error(ATTN_ERR_ARG, "set_isa: this CPU or build cannot run the '%s' path", name);
  attn_cpu_select(k);
  return ATTN_OK;
}

void attn_vmath_exp_f32(const float *x, float *y, int64_t n) { attn_cpu()->exp_f32(x, y, n); }
void attn_vmath_log_f32(const float *x, float *y, int64_t n) { attn_cpu()->log_f32(x, y, n); }
void attn_vmath_tanh_f32(const float *x, float *y, int64_t n) { attn_cpu()->tanh_f32(x, y, n); }
void attn_vmath_sigmoid_f32(const float *x, float *y, int64_t n) { attn_cpu()->sigmoid_f32(x, y, n); }
double attn_vmath_exp_row_f32(float *x, int64_t n, float m) { return attn_cpu()->exp_row_f32(x, n, m); }
void attn_vmath_dropout_f32(const attn_dropout_rule *r, const float *x, float *y, int64_t n, uint64_t base) {
  attn_cpu()->dropout_f32(r, x, y, n, base);
}
void attn_vmath_dropout_f64(const attn_dropout_rule *r, const double *x, double *y, int64_t n, uint64_t base) {
  attn_cpu()->dropout_f64(r, x, y, n, base);
}
void attn_vmath_gemm_small_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                               float *pack) {
  attn_cpu()->gemm_small_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
}

int64_t attn_vmath_gemm_small_max(void) { return *attn_cpu()->gemm_small_max; }

void attn_vmath_gru_fwd_f32(int64_t B, int64_t H, const float *gi, const float *gh, const float *hp, float *hn,
                            float *rz, float *n, float *ghn) {
  attn_cpu()->gru_fwd_f32(B, H, gi, gh, hp, hn, rz, n, ghn);
}
void attn_vmath_gru_bwd_f32(int64_t B, int64_t H, float *dh, const float *dy, const float *hp, const float *rz,
                            const float *n, const float *ghn, float *dgi, float *dgh) {
  attn_cpu()->gru_bwd_f32(B, H, dh, dy, hp, rz, n, ghn, dgi, dgh);
}
void attn_vmath_colsum_f32(const float *m, int64_t rows, int64_t cols, float *out) {
  attn_cpu()->colsum_f32(m, rows, cols, out);
}

double attn_vmath_exp_row_f64(double *x, int64_t n, double m) {
  double s = 0;
  for (int64_t j = 0; j < n; j++) {
    double e = exp(x[j] - m);
    x[j] = e;
    s += e;
  }
  return s;
}
