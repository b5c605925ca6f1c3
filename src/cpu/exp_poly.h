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

static inline float attn_cpu_exp_poly_scale(float r, uint32_t kb) {
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  uint32_t sb = kb << 23;
  float s;
  memcpy(&s, &sb, 4);
  return p * s;
}

#endif
