/* The polynomial-and-scale step shared by the float exponentials of the
 * vmath and flash kernel bodies: e^r * 2^k for a reduced argument |r| <= ln2/2
 * and kb holding k + 127 in its low bits (what adding 12583039.0f to the
 * rounded exponent leaves there). Branch-free and inline, so the loops that
 * call it still vectorise; each caller does its own range reduction and its
 * own underflow mask. */
#ifndef ATTN_CPU_EXP_POLY_H
#define ATTN_CPU_EXP_POLY_H

#include <stdint.h>
#include <string.h>

/* e^r to degree 7 in Horner form, for a float r or a GCC vector of floats (the short-row
 * attention kernels evaluate it on whole vectors). */
#define ATTN_CPU_EXP_POLY(r)                                                                          \
  ((((((((1.0f / 5040) * (r) + 1.0f / 720) * (r) + 1.0f / 120) * (r) + 1.0f / 24) * (r) + 1.0f / 6) * \
        (r) + 0.5f) * (r) + 1.0f) * (r) + 1.0f)

static inline float attn_cpu_exp_poly_scale(float r, uint32_t kb) {
  float p = ATTN_CPU_EXP_POLY(r);
  uint32_t sb = kb << 23;
  float s;
  memcpy(&s, &sb, 4);
  return p * s;
}

/* exp(x) for x <= 0 in float for the softmax rows: exact 0 below -87 and for
 * -inf, NaN stays NaN, relative error about 1e-7 elsewhere (cheaper than a
 * double evaluation, and the softmax normalises anyway). */
static inline float attn_cpu_exp_neg_f(float x) {
  uint32_t xb, kb, yb;
  memcpy(&xb, &x, 4);
  float kf = x * 1.44269504088896341f + 12583039.0f; /* round(x / ln 2) + 127 in the low bits */
  memcpy(&kb, &kf, 4);
  float n = kf - 12583039.0f;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  float y = attn_cpu_exp_poly_scale(r, kb);
  memcpy(&yb, &y, 4);
  /* keep y unless -87 > x >= -inf (sign bit set, magnitude above 87) */
  yb &= (uint32_t)0 - (uint32_t)(xb <= 0xC2AE0000u || xb > 0xFF800000u);
  memcpy(&y, &yb, 4);
  return y;
}

#endif
