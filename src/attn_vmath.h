/* attn_vmath (internal): vectorisable row math shared by the generic softmax
 * (attn_reduce.c) and the attention kernels (attn_attention_rows.c). */
#ifndef ATTN_VMATH_H
#define ATTN_VMATH_H

#include <stdint.h>

/* x[j] = exp(x[j] - m) in place for j < n, returns the sum in double. m must be
 * at least every x[j] (the row max). float32: a polynomial exp with relative
 * error about 1e-7, vectorised (an AVX2 variant is picked at run time; the
 * arithmetic is the same); float64: libm's exp. */
double attn_vmath_exp_row_f32(float *x, int64_t n, float m);
double attn_vmath_exp_row_f64(double *x, int64_t n, double m);

#endif
