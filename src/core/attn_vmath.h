/* attn_vmath: vectorised float32 math over rows, shared by the elementwise
 * ops, the softmax kernels, the attention kernels and the fused GRU.
 *
 * Each function exists in several instruction-set paths (src/cpu/): a
 * portable C one, and on x86-64 AVX2+FMA and AVX-512 ones, compiled from the
 * same source with their own flags, and gathered in one table
 * (src/cpu/cpu_dispatch.h) with the small products, the short-row and the
 * flash attention kernels. The best path the CPU supports is chosen at the
 * first call (cpuid through __builtin_cpu_supports); the environment variable
 * ATTN_ISA (generic, avx2, avx512) or attn_vmath_set_isa overrides it, for
 * every vectorised kernel at once, for tests and comparisons. Paths agree within a few ulps (FMA
 * contraction differs); one path always gives the same bits. */
#ifndef ATTN_VMATH_H
#define ATTN_VMATH_H

#include <stdint.h>

#include "core/attn_dropout.h"
#include "core/attn_error.h"

/* Name of the active path: "generic", "avx2" or "avx512". */
const char *attn_vmath_isa(void);
/* Selects a path by name ("auto" = the best supported). Fails, naming the
 * path, when it is unknown or the CPU lacks it. Not to be called while
 * kernels run on other threads. */
attn_status attn_vmath_set_isa(const char *name);
/* 1 when the CPU (and this build) can run the named path. */
int attn_vmath_isa_supported(const char *name);

/* y[j] = f(x[j]) for j < n (y may alias x), within 1 ulp of the exact value
 * over the whole float range: denormals, +-inf and NaN as libm does. */
void attn_vmath_exp_f32(const float *x, float *y, int64_t n);
void attn_vmath_log_f32(const float *x, float *y, int64_t n);
void attn_vmath_tanh_f32(const float *x, float *y, int64_t n);
void attn_vmath_sigmoid_f32(const float *x, float *y, int64_t n);

/* x[j] = exp(x[j] - m) in place for j < n, returns the sum in double. m must be
 * at least every x[j] (the row max). float32: a float polynomial with relative
 * error about 1e-7 (the softmax normalises anyway); float64: libm's exp. */
double attn_vmath_exp_row_f32(float *x, int64_t n, float m);
double attn_vmath_exp_row_f64(double *x, int64_t n, double m);

/* Small products (Linear layers, the GRU's gates, the attention kernels' tiny heads: a few dozen
 * to a few hundred rows and columns), where a BLAS call costs more in setup and packing than in
 * arithmetic; attn_gemm.h decides when they are used. C (M x N, row-major, ldc) = alpha * op(A)
 * op(B) + beta * C, op(A) M x K and op(B) K x N, row-major with leading dims lda, ldb (ta, tb:
 * transposed). Register-blocked tiles per instruction set (src/cpu/gemm_body.h); B is copied into
 * pack only when it is transposed, and then at most ATTN_VMATH_GEMM_PACK(min(N, ATTN_VMATH_GEMM_PANEL), K) floats (every path's panel is at
 * most that wide); ATTN_VMATH_GEMM_PACK(N, K) is always enough. C is not read when beta is 0 (as
 * in BLAS), and every product is summed (a NaN or inf in an operand reaches C, as through BLAS).
 * A row's bits depend on N, K and the path, never on M. */
#define ATTN_VMATH_GEMM_PANEL 32
#define ATTN_VMATH_GEMM_PACK(N, K) ((K) * (((N) + 15) / 16 * 16))
void attn_vmath_gemm_small_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                               float *pack);
/* The active path's size limit for attn_gemm's automatic choice: the most multiply-adds (M N K)
 * up to which its kernel measured faster than OpenBLAS (0: never chosen by size). */
int64_t attn_vmath_gemm_small_max(void);

/* The fused GRU's gate math for one time step (attn_rnn.c; the model in attn_rnn.h), float32,
 * over B rows of H units. Forward: gi, gh (B, 3H) the step's input and recurrent projections
 * (gate order r, z, n, biases included), hp (B, H) the previous state; writes the new state hn
 * (B, H) and the saved planes rz (B, 2H) (sigmoids r, z), n (B, H) (the tanh candidate) and ghn
 * (B, H) (the recurrent n projection). The output buffers do not overlap each other or the inputs.
 * Backward: dh (B, H) the new state's gradient, to which dy (B, H) is added first; writes dgi, dgh
 * (B, 3H), the gradients of the two projections, and replaces dh by dh * z (the caller adds
 * dgh W_hh). Sigmoid and tanh as attn_vmath_sigmoid/tanh_f32. */
void attn_vmath_gru_fwd_f32(int64_t B, int64_t H, const float *gi, const float *gh, const float *hp, float *hn,
                            float *rz, float *n, float *ghn);
void attn_vmath_gru_bwd_f32(int64_t B, int64_t H, float *dh, const float *dy, const float *hp, const float *rz,
                            const float *n, const float *ghn, float *dgi, float *dgh);
/* out (cols) = the column sums of m (rows, cols), added in double in row order, rounded once. */
void attn_vmath_colsum_f32(const float *m, int64_t rows, int64_t cols, float *out);

/* The rows of attn_dropout_f32/f64 (the rule of attn_dropout.h), per path:
 * every path gives the same bits (the rule is integer arithmetic and one
 * multiply by the scale). */
void attn_vmath_dropout_f32(const attn_dropout_rule *r, const float *x, float *y, int64_t n, uint64_t base);
void attn_vmath_dropout_f64(const attn_dropout_rule *r, const double *x, double *y, int64_t n, uint64_t base);

#endif
