/* The AVX-512 set's float32 Winograd block products (cpu/wino_cpu.h): the 16 or 36 products of a
 * block, one plane after another, in one call. The small GEMM (cpu/gemm_body.h) tiles any product
 * in 8 x 32 blocks; on a block's planes (32 x 48 x 16 for 64 x 16->32 on 14x14) that leaves a
 * panel of 16 columns at 8 accumulators and a packed transpose per call, 165-225 GFLOP/s. Here
 * the products with B as stored take tiles of 8 rows x 48 columns (24 accumulators; 16 rows x 16
 * columns where a panel is one vector wide), and the product with B transposed packs B^T once per
 * plane and 16 columns and keeps 16 rows x 16 columns of accumulators: 235-245 and 195 GFLOP/s
 * on the same planes (Zen 5). Each entry is still its sum over k in order from zero (then added to
 * C's entry where beta is 1), written as the small GEMM writes it (acc += x b, which the compiler
 * fuses or not as it does there: fused at -O3, not at the sanitizers' -O1): the same bits. Planes
 * of any size come here (attn_gemm would send those above 2^22 multiply-adds to OpenBLAS): the
 * blocks attn_conv_winograd.c makes keep a tile's operands in L1 and L2. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#include "cpu/wino_avx512.h"
#include "cpu/wino_cpu.h"

#define INLINE static inline __attribute__((always_inline))

/* One tile of C = op(A) B: rows r < mr (unless full, rows past m repeat row m - 1 and are not
 * stored) by nv vectors of columns, the last one under mask last; op(A)'s entry (r, k) is A[r lda +
 * k], or A[k lda + r] when ta is set (the tile's rows at fixed k are then adjacent). */
INLINE void nn_tile(const int mr, const int nv, const int full, const int part, const int ta, int64_t m, int64_t K,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc, __mmask16 last) {
  __m512 acc[16][3];
  for (int r = 0; r < mr; r++)
    for (int v = 0; v < nv; v++) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    __m512 b[3];
    for (int v = 0; v < nv; v++) {
      const float *at = B + k * ldb + 16 * v;
      b[v] = part && v + 1 == nv ? _mm512_maskz_loadu_ps(last, at) : _mm512_loadu_ps(at);
    }
    #pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
      const int64_t row = full ? r : r < m ? r : m - 1;
      const __m512 x = _mm512_set1_ps(ta ? A[k * lda + row] : A[row * lda + k]);
      for (int v = 0; v < nv; v++) acc[r][v] += x * b[v];
    }
  }
  for (int r = 0; r < mr && r < m; r++)
    for (int v = 0; v < nv; v++)
      if (part && v + 1 == nv)
        _mm512_mask_storeu_ps(C + r * ldc + 16 * v, last, acc[r][v]);
      else
        _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
}

/* The rows of one panel of nv vectors, the last one partial (under mask last) when part is set:
 * tiles of 8 rows (16 for a one-vector panel). */
INLINE void nn_panel(const int nv, const int part, const int ta, int64_t M, int64_t K, const float *A, int64_t lda,
                     const float *B, int64_t ldb, float *C, int64_t ldc, __mmask16 last) {
  const int mr = nv == 1 ? 16 : 8;
  for (int64_t m0 = 0; m0 < M; m0 += mr) {
    const float *a = A + (ta ? m0 : m0 * lda);
    if (M - m0 >= mr)
      nn_tile(mr, nv, 1, part, ta, mr, K, a, lda, B, ldb, C + m0 * ldc, ldc, last);
    else
      nn_tile(mr, nv, 0, part, ta, M - m0, K, a, lda, B, ldb, C + m0 * ldc, ldc, last);
  }
}

/* A panel of nv vectors, whole or with a partial last one. */
INLINE void nn_panel_any(const int nv, const int ta, int64_t M, int64_t K, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc, __mmask16 last) {
  if (last == (__mmask16)0xffff)
    nn_panel(nv, 0, ta, M, K, A, lda, B, ldb, C, ldc, last);
  else
    nn_panel(nv, 1, ta, M, K, A, lda, B, ldb, C, ldc, last);
}

/* The panels of one plane, for a constant ta. */
INLINE void nn_plane(const int ta, int64_t M, int64_t N, int64_t K, const float *a, const float *b, int64_t ldb,
                     float *c, int64_t ldc) {
  const int64_t lda = ta ? M : K;
  for (int64_t n0 = 0; n0 < N; n0 += 48) {
    const int64_t w = N - n0 < 48 ? N - n0 : 48;
    const __mmask16 last = lanes_below(w - 16 * ((w - 1) / 16));
    if (w > 32)
      nn_panel_any(3, ta, M, K, a, lda, b + n0, ldb, c + n0, ldc, last);
    else if (w > 16)
      nn_panel_any(2, ta, M, K, a, lda, b + n0, ldb, c + n0, ldc, last);
    else
      nn_panel_any(1, ta, M, K, a, lda, b + n0, ldb, c + n0, ldc, last);
  }
}

void attn_wino_gemm_nn_f32_avx512(int64_t np, int ta, int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                                  int64_t bps, int64_t ldb, float *C, int64_t cps, int64_t ldc) {
  for (int64_t p = 0; p < np; p++)
    if (ta)
      nn_plane(1, M, N, K, A + p * M * K, B + p * bps, ldb, C + p * cps, ldc);
    else
      nn_plane(0, M, N, K, A + p * M * K, B + p * bps, ldb, C + p * cps, ldc);
}

/* r[i] lane j = r[j] lane i: a 16 x 16 transpose in registers. */
INLINE void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2)
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c)), r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d)), r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88), t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88), r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

/* pack[k 16 + j] = B[j ldb + k] for rows j < n (zeros past them), k < K. */
static void pack_t(const float *B, int64_t ldb, int64_t n, int64_t K, float *pack) {
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    const __mmask16 in = lanes_below(K - k0);
    __m512 r[16];
    for (int j = 0; j < 16; j++) r[j] = j < n ? _mm512_maskz_loadu_ps(in, B + j * ldb + k0) : _mm512_setzero_ps();
    transpose16(r);
    for (int i = 0; i < 16 && k0 + i < K; i++) _mm512_store_ps(pack + (k0 + i) * 16, r[i]);
  }
}

/* Rows r < 16 of C (rows of N) by the 16 columns under mask cols: sums over k of A's row r times
 * pack's row k, added to C where beta is 1. Unless full, rows past m repeat row m - 1 and are not
 * stored. */
INLINE void nt_tile(const int full, int64_t m, int64_t K, const float *A, int64_t lda, const float *pack, float beta,
                    float *C, int64_t ldc, __mmask16 cols) {
  __m512 acc[16];
  for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    const __m512 b = _mm512_load_ps(pack + k * 16);
    /* a whole tile's rows are r lda on from A, which the compiler turns into scaled indices of a
     * few registers; a clamped row for each r would take a register of its own */
    #pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
      acc[r] += _mm512_set1_ps(A[(full ? r : r < m ? r : m - 1) * lda + k]) * b;
  }
  for (int r = 0; r < 16 && r < m; r++) {
    float *c = C + r * ldc;
    _mm512_mask_storeu_ps(c, cols, beta != 0 ? _mm512_add_ps(_mm512_maskz_loadu_ps(cols, c), acc[r]) : acc[r]);
  }
}

void attn_wino_gemm_nt_f32_avx512(int64_t np, int64_t M, int64_t N, int64_t K, const float *A, int64_t aps,
                                  int64_t lda, const float *B, int64_t bps, int64_t ldb, float beta, float *C,
                                  float *pack) {
  for (int64_t p = 0; p < np; p++)
    for (int64_t n0 = 0; n0 < N; n0 += 16) {
      const int64_t n = N - n0 < 16 ? N - n0 : 16;
      pack_t(B + p * bps + n0 * ldb, ldb, n, K, pack);
      for (int64_t m0 = 0; m0 < M; m0 += 16) {
        const float *a = A + p * aps + m0 * lda;
        float *c = C + p * M * N + m0 * N + n0;
        if (M - m0 >= 16)
          nt_tile(1, 16, K, a, lda, pack, beta, c, N, lanes_below(n));
        else
          nt_tile(0, M - m0, K, a, lda, pack, beta, c, N, lanes_below(n));
      }
    }
}
#endif
