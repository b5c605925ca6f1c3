/* The row math of attn_vmath, written once in plain C that the compiler
 * vectorises; each src/cpu/vmath_<isa>.c includes it with its own VMATH_SUFFIX
 * and is compiled with that ISA's flags (see the Makefile), so one binary
 * carries every path and src/cpu/cpu_dispatch.c picks one at run time.
 *
 * float32 exp and tanh evaluate in float lanes (twice as many per vector as
 * double, no double division); the worst errors against libm over all 2^32
 * inputs, measured by `make check-vmath-ulp` (spec/c/vmath_ulp.c) on every
 * path, are 1 ulp for exp and 2 for tanh. sigmoid and log evaluate in double
 * (1 ulp). Denormal inputs and outputs, +-inf, NaN and -0 come out as
 * libm gives them, and no branch depends on the data: special values (+-inf, NaN,
 * zero, negatives for log) are chosen by selects at the end. Bit patterns go
 * through memcpy (type punning without aliasing trouble; compilers turn it
 * into a register move). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/attn_dropout.h" /* the rule: attn_dropout_drops, inline */
#include "cpu/exp_poly.h"

#define VMATH_CAT2(a, b) a##b
#define VMATH_CAT(a, b) VMATH_CAT2(a, b)
#define VMATH_FN(name) VMATH_CAT(name, VMATH_SUFFIX)

/* The loops vectorise only when the element functions are inlined into them. */
#include "cpu/cpu_inline.h"

ATTN_CPU_INLINE uint64_t vm_bits(double x) {
  uint64_t b;
  memcpy(&b, &x, 8);
  return b;
}
ATTN_CPU_INLINE double vm_double(uint64_t b) {
  double x;
  memcpy(&x, &b, 8);
  return x;
}

ATTN_CPU_INLINE float vm_bits_float(uint32_t b) {
  float x;
  memcpy(&x, &b, 4);
  return x;
}

ATTN_CPU_INLINE float vm_clampf(float x, float lo, float hi) {
  x = x < lo ? lo : x; /* NaN compares false and stays NaN */
  return x > hi ? hi : x;
}

/* exp of a float in float lanes (16 per AVX-512 vector): x clamped to [-104, 89] (below -104 the
 * result rounds to 0, above 89 to +inf), n = round(x / ln2) by the add-a-shifter trick, r = x - n ln2
 * with ln2 in two parts (the high part has 15 bits, so n ln2hi is exact), e^r by exp_poly.h's
 * degree-7 series, and 2^n applied as two factors 2^(n/2) so that n from -150 to 128 needs no
 * denormal or infinite scale: the one rounding into a denormal or +inf happens at the last multiply.
 * NaN propagates through the arithmetic. */
ATTN_CPU_INLINE float vm_expf(float x) {
  x = vm_clampf(x, -104.0f, 89.0f);
  float kf = x * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: round(x / ln2) in the low bits */
  uint32_t kb;
  memcpy(&kb, &kf, 4);
  float n = kf - 12582912.0f;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  int32_t k = (int32_t)(kb - 0x4B400000u); /* n as an integer */
  int32_t k1 = k / 2;
  float p = attn_cpu_exp_poly_scale(r, (uint32_t)(k1 + 127));
  return p * vm_bits_float((uint32_t)(k - k1 + 127) << 23);
}

/* exp(x) in double for the sigmoid: x in [-745, 709] (callers clamp), x = n ln2 + r with
 * |r| <= ln2/2, e^r by its Taylor series to degree 7, times 2^n built in the exponent bits. */
ATTN_CPU_INLINE double vm_exp_core(double x) {
  const double shifter = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
  double kd = x * 1.4426950408889634 + shifter;
  double n = kd - shifter;
  double r = x - n * 0.6931471803691238;
  r = r - n * 1.9082149292705877e-10;
  double p = 1.0 / 5040;
  p = p * r + 1.0 / 720;
  p = p * r + 1.0 / 120;
  p = p * r + 1.0 / 24;
  p = p * r + 1.0 / 6;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  uint64_t k = vm_bits(kd) - vm_bits(shifter); /* n as a two's complement integer */
  return p * vm_double((k + 1023) << 52);
}

ATTN_CPU_INLINE double vm_clamp(double x, double lo, double hi) {
  x = x < lo ? lo : x; /* NaN compares false and stays NaN */
  return x > hi ? hi : x;
}

/* sigmoid(x) = 1 / (1 + e^-x) stays in double (1 ulp): a float form (e^-|x| and one float
 * division, 2 ulps) moved the fused decoder's float32 gradients on aarch64 past the 1e-5 its spec
 * allows against the composed path. Exact 0 below -110 (e^-110 is under half the smallest
 * denormal) and 1 above 40 (e^-40 is under half an ulp of 1). */
ATTN_CPU_INLINE float vm_sigmoidf(float x) {
  double e = vm_exp_core(-vm_clamp(x, -110.0, 40.0));
  return (float)(1.0 / (1.0 + e));
}

/* tanh(x) for |x| >= 0.55 (where tanh >= 1/2) as 1 - 2 / (e^(2|x|) + 1): the subtracted part is
 * below 1/2, so its few ulps of error shrink to about one of the result; |x| is clamped to 10 (tanh
 * rounds to 1 from 9.01). Below 0.55 an odd polynomial x + x^3 P(x^2), P fitted by weighted least
 * squares on [0, 0.55] (approximation error under 0.05 ulp); it keeps tiny and denormal inputs
 * exact. The sign goes on last with copysignf, so -0 stays -0 and NaN stays NaN. */
ATTN_CPU_INLINE float vm_tanhf(float x) {
  float a = fabsf(x);
  float e = vm_expf(2 * (a > 10 ? 10 : a));
  float t = 1 - 2 / (e + 1);
  float a2 = a * a;
  float p = -6.264554802e-03f;
  p = p * a2 + 2.106428519e-02f;
  p = p * a2 + -5.385033786e-02f;
  p = p * a2 + 1.333256513e-01f;
  p = p * a2 + -3.333331645e-01f;
  float s = a + a * a2 * p;
  return copysignf(a < 0.55f ? s : t, x);
}

/* log(x): a float is a normal double, so x = m 2^e with m in [sqrt(1/2), sqrt(2))
 * from the bits, and log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172,
 * whose odd series to s^11 is exact to double rounding of a float. */
ATTN_CPU_INLINE float vm_logf(float x) {
  double d = x;
  uint64_t b = vm_bits(d);
  double m1 = vm_double((b & 0x000FFFFFFFFFFFFFull) | (1023ull << 52)); /* mantissa in [1, 2) */
  double big = m1 > 1.4142135623730951 ? 1.0 : 0.0;
  double m = m1 * (1 - 0.5 * big);
  /* exponent as a double without an int64 -> double conversion (none in AVX2) */
  double e = vm_double(0x4330000000000000ull | ((b >> 52) & 0x7FF)) - 4503599627370496.0 - 1023 + big;
  double s = (m - 1) / (m + 1);
  double s2 = s * s;
  double p = 1.0 / 11;
  p = p * s2 + 1.0 / 9;
  p = p * s2 + 1.0 / 7;
  p = p * s2 + 1.0 / 5;
  p = p * s2 + 1.0 / 3;
  p = p * s2 + 1.0;
  double y = e * 0.6931471805599453 + 2 * s * p;
  const double inf = 1.0 / 0.0;
  /* +inf stays +inf, 0 gives -inf, negatives and NaN give NaN */
  return (float)(d > 0 ? (d < inf ? y : inf) : (d == 0 ? -inf : inf - inf));
}

/* Row kernels: y[j] = f(x[j]) for j < n (y may alias x). */
void VMATH_FN(attn_vmath_exp_f32_)(const float *x, float *y, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = vm_expf(x[j]);
}
void VMATH_FN(attn_vmath_log_f32_)(const float *x, float *y, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = vm_logf(x[j]);
}
void VMATH_FN(attn_vmath_tanh_f32_)(const float *x, float *y, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = vm_tanhf(x[j]);
}
void VMATH_FN(attn_vmath_sigmoid_f32_)(const float *x, float *y, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = vm_sigmoidf(x[j]);
}

/* x[j] = exp(x[j] - m) (exp_poly.h's attn_cpu_exp_neg_f, which the short-row attention kernels
 * share, so both paths give the same weights), returns the sum: float lanes over runs of 256 entries,
 * added up in double (so the rounding error stays near 1e-7 for long rows). */
double VMATH_FN(attn_vmath_exp_row_f32_)(float *x, int64_t n, float m) {
  double s = 0;
  int64_t j = 0;
  while (j + 16 <= n) {
    float s16[16] = {0};
    int64_t stop = j + 256 < n ? j + 256 : n;
    for (; j + 16 <= stop; j += 16)
      for (int k = 0; k < 16; k++) {
        float e = attn_cpu_exp_neg_f(x[j + k] - m);
        x[j + k] = e;
        s16[k] += e;
      }
    for (int k = 0; k < 16; k += 2) s += (double)s16[k] + s16[k + 1];
  }
  for (; j < n; j++) {
    float e = attn_cpu_exp_neg_f(x[j] - m);
    x[j] = e;
    s += e;
  }
  return s;
}

/* The engine's dropout rule (attn_dropout.h) over a row; only AVX-512 DQ has
 * the 64-bit multiplies that let the hash vectorise. The kept value is
 * computed for every entry and cleared by a mask from the draw, not chosen
 * by a branch: the outcome is random, so a branch was mispredicted on about
 * min(p, 1 - p) of the entries. A dropped NaN or inf still gives 0. The rule
 * is read into locals once (y may alias it). */
#define DROPOUT_LOOP(T, U)                                                                          \
  do {                                                                                              \
    const attn_dropout_rule rule = *r;                                                              \
    for (int64_t i = 0; i < n; i++) {                                                               \
      T kept = (T)(x[i] * rule.scale);                                                              \
      U bits, keep = (U)0 - (U)!attn_dropout_drops(&rule, base + (uint64_t)i);                     \
      memcpy(&bits, &kept, sizeof bits);                                                            \
      bits &= keep;                                                                                 \
      memcpy(y + i, &bits, sizeof bits);                                                            \
    }                                                                                               \
  } while (0)

void VMATH_FN(attn_vmath_dropout_f32_)(const attn_dropout_rule *r, const float *x, float *y, int64_t n,
                                        uint64_t base) {
  DROPOUT_LOOP(float, uint32_t);
}

void VMATH_FN(attn_vmath_dropout_f64_)(const attn_dropout_rule *r, const double *x, double *y, int64_t n,
                                        uint64_t base) {
  DROPOUT_LOOP(double, uint64_t);
}

/* The fused GRU's per-step gate math (attn_rnn.c, model in attn_rnn.h) over B rows of H units,
 * one pass per row so the gates stay in registers: gi, gh (B, 3H) the step's input and recurrent
 * projections in PyTorch's gate order (r, z, n), hp (B, H) the previous state. Writes the new
 * state hn (B, H) and what backward reads: rz (B, 2H) the r and z gates, n (B, H) the candidate,
 * ghn (B, H) the recurrent n projection W_hn h + b_hn. The sigmoid and tanh are the element
 * functions above, so every path agrees with attn_vmath_sigmoid/tanh_f32 within their ulp. */
void VMATH_FN(attn_vmath_gru_fwd_f32_)(int64_t B, int64_t H, const float *gi, const float *gh, const float *hp,
                                        float *restrict hn, float *restrict rz, float *restrict n,
                                        float *restrict ghn) {
  for (int64_t b = 0; b < B; b++) {
    const float *i = gi + b * 3 * H, *h = gh + b * 3 * H, *p = hp + b * H;
    float *o = hn + b * H, *g = rz + b * 2 * H, *c = n + b * H, *q = ghn + b * H;
    for (int64_t j = 0; j < H; j++) {
      float r = vm_sigmoidf(i[j] + h[j]), z = vm_sigmoidf(i[H + j] + h[H + j]);
      float hn_j = h[2 * H + j];
      float v = vm_tanhf(i[2 * H + j] + r * hn_j);
      g[j] = r, g[H + j] = z, c[j] = v, q[j] = hn_j;
      o[j] = v + z * (p[j] - v);
    }
  }
}

/* The gradients of one step of the above: dh (B, H) holds the new state's gradient from the step
 * after; dy (B, H) is added to it first (the layer's output gradient at this step). hp,
 * rz, n, ghn as forward saved them. Writes dgi and dgh (B, 3H), the gradients of the two
 * projections, and replaces dh by dh * z, the direct part of the previous state's gradient (the
 * caller adds dgh W_hh). */
void VMATH_FN(attn_vmath_gru_bwd_f32_)(int64_t B, int64_t H, float *restrict dh, const float *restrict dy,
                                        const float *restrict hp, const float *restrict rz, const float *restrict n,
                                        const float *restrict ghn, float *restrict dgi, float *restrict dgh) {
  for (int64_t b = 0; b < B; b++) {
    float *d = dh + b * H, *i = dgi + b * 3 * H, *h = dgh + b * 3 * H;
    const float *y = dy + b * H, *p = hp + b * H, *g = rz + b * 2 * H, *c = n + b * H;
    const float *q = ghn + b * H;
    for (int64_t j = 0; j < H; j++) {
      float gr = d[j] + y[j];
      float r = g[j], z = g[H + j], v = c[j];
      float dn = gr - gr * z, dz = gr * (p[j] - v);
      float dan = dn * (1 - v * v), daz = dz * (z * (1 - z));
      float dar = (dan * q[j]) * (r * (1 - r));
      i[j] = h[j] = dar;
      i[H + j] = h[H + j] = daz;
      i[2 * H + j] = dan;
      h[2 * H + j] = dan * r;
      d[j] = gr * z;
    }
  }
}

/* out[c] = the sum of column c of m (rows, cols), added in double down the rows in row order (a
 * bias gradient over every step and batch row): 16 columns at a time held in registers. */
void VMATH_FN(attn_vmath_colsum_f32_)(const float *m, int64_t rows, int64_t cols, float *out) {
  int64_t c0 = 0;
  for (; c0 + 16 <= cols; c0 += 16) {
    double a[16] = {0};
    for (int64_t r = 0; r < rows; r++)
      for (int k = 0; k < 16; k++) a[k] += m[r * cols + c0 + k];
    for (int k = 0; k < 16; k++) out[c0 + k] = (float)a[k];
  }
  for (int64_t c = c0; c < cols; c++) {
    double a = 0;
    for (int64_t r = 0; r < rows; r++) a += m[r * cols + c];
    out[c] = (float)a;
  }
}
