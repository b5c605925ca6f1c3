/* Helpers shared by the AVX-512 Winograd transforms (wino_avx512.c for F(2x2), wino4_avx512.c for
 * F(4x4)): masks of lanes inside a row, masked loads and stores of plane rows. Only for files
 * compiled with the AVX-512 flags. */
#ifndef ATTN_WINO_AVX512_H
#define ATTN_WINO_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* The first n lanes (none for n <= 0, all for n >= 16). */
static inline __attribute__((always_inline)) __mmask16 lanes_below(int64_t n) {
  return n <= 0 ? 0 : n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* The lanes of entries [q, q + 16) that lie in a row of n entries. */
static inline __attribute__((always_inline)) __mmask16 in_row16(int64_t n, int64_t q) { return (__mmask16)(lanes_below(n - q) & ~lanes_below(-q)); }

/* Entries [q, q + 16) of row under mask m, zeros elsewhere. Masked lanes are not read, so the
 * address may lie before or past the row. */
static inline __attribute__((always_inline)) __m512 load16(const float *row, int64_t q, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, (const float *)((uintptr_t)row + (uintptr_t)(q * (int64_t)sizeof(float))));
}

/* Row r of a plane (h, w), with a mask that keeps it (all lanes) or drops it (none: outside). */
static inline __attribute__((always_inline)) const float *plane_row(const float *x, int64_t h, int64_t w, int64_t r, __mmask16 *keep) {
  *keep = r >= 0 && r < h ? (__mmask16)0xffff : 0;
  return r >= 0 && r < h ? x + r * w : x;
}

/* -v by its sign bit, as C's unary minus (-0 for +0). */
static inline __attribute__((always_inline)) __m512 neg(__m512 v) { return _mm512_xor_ps(v, _mm512_set1_ps(-0.0f)); }

/* Row y of dx (h, w) from the padded columns in lanes [0, 16) of r, first padded column q, padding
 * pl: written, or added to what the tile row above left there. Rows outside the plane are skipped;
 * the address may lie before or past the row where no lane is stored. */
static inline __attribute__((always_inline)) void put_row(float *dx, int64_t h, int64_t w, int64_t y, int64_t q, int64_t pl, int add,
                                      __m512 r) {
  if (y < 0 || y >= h) return;
  const __mmask16 m = in_row16(w, q - pl);
  float *at = (float *)((uintptr_t)(dx + y * w) + (uintptr_t)((q - pl) * (int64_t)sizeof(float)));
  if (add) r = _mm512_add_ps(_mm512_maskz_loadu_ps(m, at), r);
  _mm512_mask_storeu_ps(at, m, r);
}

/* The bias gradient's sum in the gradient transforms: float32 vectors of at most 8 entries per
 * lane each (as attn_conv's own sum), flushed into double lanes, added up once per call. */
typedef struct {
  __m512d lo, hi;
} wino_dsum;

static inline __attribute__((always_inline)) void dsum_add(wino_dsum *d, __m512 f) {
  d->lo = _mm512_add_pd(d->lo, _mm512_cvtps_pd(_mm512_castps512_ps256(f)));
  d->hi = _mm512_add_pd(d->hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1))));
}

static inline __attribute__((always_inline)) void dsum_done(const wino_dsum *d, double *sum) {
  if (sum) *sum += _mm512_reduce_add_pd(_mm512_add_pd(d->lo, d->hi));
}

#endif
