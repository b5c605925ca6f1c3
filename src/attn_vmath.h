/* attn_vmath: vectorised float32 math over rows, shared by the elementwise
 * ops, the softmax kernels, the attention kernels and the fused GRU.
 *
 * Each function exists in several instruction-set paths (src/cpu/): a
 * portable C one, and on x86-64 AVX2+FMA and AVX-512 ones, compiled from the
 * same source with their own flags. The best path the CPU supports is chosen
 * at the first call (cpuid through __builtin_cpu_supports); the environment
 * variable ATTN_ISA (generic, avx2, avx512) or attn_vmath_set_isa overrides
 * it, for tests and comparisons. Paths agree within a few ulps (FMA
 * contraction differs); one path always gives the same bits. */
#ifndef ATTN_VMATH_H
#define ATTN_VMATH_H

#include <stdint.h>

#include "attn_dropout.h"
#include "attn_error.h"

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

/* The rows of attn_dropout_f32/f64 (the rule of attn_dropout.h), per path:
 * every path gives the same bits (the rule is integer arithmetic and one
 * multiply by the scale). */
void attn_vmath_dropout_f32(const attn_dropout_rule *r, const float *x, float *y, int64_t n, uint64_t base);
void attn_vmath_dropout_f64(const attn_dropout_rule *r, const double *x, double *y, int64_t n, uint64_t base);

#endif
