/* Vectorisable row math shared by the softmax kernels. */
#include "attn_vmath.h"

#include <math.h>
#include <string.h>

/* exp(x) for x <= 0 in float, vectorisable: exact 0 below -87 and for -inf,
 * NaN stays NaN, relative error about 1e-7 elsewhere. The bit operations use
 * unsigned integers, so no float compare blocks if-conversion. */
static inline float exp_neg_f(float x) {
  uint32_t xb, kb, sb, yb;
  memcpy(&xb, &x, 4);
  float kf = x * 1.44269504088896341f + 12583039.0f; /* round(x / ln 2) + 127 in the low bits */
  memcpy(&kb, &kf, 4);
  float n = kf - 12583039.0f;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  sb = kb << 23;
  float s;
  memcpy(&s, &sb, 4);
  float y = p * s;
  memcpy(&yb, &y, 4);
  /* keep y unless -87 > x >= -inf (sign bit set, magnitude above 87) */
  yb &= (uint32_t)0 - (uint32_t)(xb <= 0xC2AE0000u || xb > 0xFF800000u);
  memcpy(&y, &yb, 4);
  return y;
}

/* x[j] = exp(x[j] - m), returns the sum: float lanes over runs of 256 entries,
 * added up in double (so the rounding error stays near 1e-7 for long rows). */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline double
exp_row_f_body(float *x, int64_t n, float m) {
  double s = 0;
  int64_t j = 0;
  while (j + 8 <= n) {
    float s8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t stop = j + 256 < n ? j + 256 : n;
    for (; j + 8 <= stop; j += 8)
      for (int k = 0; k < 8; k++) {
        float e = exp_neg_f(x[j + k] - m);
        x[j + k] = e;
        s8[k] += e;
      }
    s += ((double)s8[0] + s8[1]) + ((double)s8[2] + s8[3]) + ((double)s8[4] + s8[5]) + ((double)s8[6] + s8[7]);
  }
  for (; j < n; j++) {
    float e = exp_neg_f(x[j] - m);
    x[j] = e;
    s += e;
  }
  return s;
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__AVX2__)
/* The same loop compiled for AVX2 (8 floats per instruction), chosen at run
 * time; the arithmetic is identical, so results do not depend on the choice. */
__attribute__((target("avx2"))) static double exp_row_f32_avx2(float *x, int64_t n, float m) {
  return exp_row_f_body(x, n, m);
}
double attn_vmath_exp_row_f32(float *x, int64_t n, float m) {
  if (__builtin_cpu_supports("avx2")) return exp_row_f32_avx2(x, n, m);
  return exp_row_f_body(x, n, m);
}
#else
double attn_vmath_exp_row_f32(float *x, int64_t n, float m) { return exp_row_f_body(x, n, m); }
#endif

double attn_vmath_exp_row_f64(double *x, int64_t n, double m) {
  double s = 0;
  for (int64_t j = 0; j < n; j++) {
    double e = exp(x[j] - m);
    x[j] = e;
    s += e;
  }
  return s;
}
