/* The small float32 product (attn_vmath_gemm_small_f32), written once: each src/cpu/gemm_<isa>.c
 * defines GEMM_SUFFIX and its register block (GEMM_VW floats per vector, GEMM_MR rows by GEMM_NV
 * vectors of accumulators) and includes this file, compiled with that ISA's flags (see the
 * Makefile); src/attn_vmath.c picks one path at run time.
 *
 * C = alpha op(A) op(B) + beta C is built one panel of NR = GEMM_NV * GEMM_VW columns at a time,
 * and within a panel one tile of GEMM_MR rows at a time: the tile's accumulators stay in
 * registers over the whole K loop, each step loads GEMM_NV vectors of B and broadcasts GEMM_MR
 * entries of A. A is read where it is (either layout: a transposed A only changes the strides).
 * B is read where it is too when it is not transposed and the panel is whole; otherwise (B
 * transposed, or the last, narrower panel) the panel is copied once into pack, K rows of its
 * width rounded up to GEMM_VW with zero columns past N. Every entry of C is the same sequence of
 * multiply-adds in k order whatever tile or panel it falls in, so a row's bits do not depend on
 * M or on where a caller cuts the rows. */
#include <stdint.h>
#include <string.h>

#define GEMM_CAT2(a, b) a##b
#define GEMM_CAT(a, b) GEMM_CAT2(a, b)
#define GEMM_FN(name) GEMM_CAT(name, GEMM_SUFFIX)
#define GEMM_NR (GEMM_NV * GEMM_VW)

#if defined(__GNUC__)
#define GEMM_INLINE static inline __attribute__((always_inline))
#else
#define GEMM_INLINE static inline
#endif

typedef float gemm_vf __attribute__((vector_size(GEMM_VW * 4)));
typedef int32_t gemm_vi __attribute__((vector_size(GEMM_VW * 4)));

/* A GEMM_VW x GEMM_VW block transposed in registers, for packing a transposed B a vector at a time
 * instead of an entry at a time: stage s swaps bit s of the row and lane numbers, i.e. the
 * off-diagonal s x s blocks of every 2s x 2s block (two-source shuffles with constant lanes). */
#define GEMM_LO(l, s) (((l) & (s)) ? GEMM_VW + (l) - (s) : (l))
#define GEMM_HI(l, s) (((l) & (s)) ? GEMM_VW + (l) : (l) + (s))
#if GEMM_VW == 4
#define GEMM_LANES(F, s) F(0, s), F(1, s), F(2, s), F(3, s)
#elif GEMM_VW == 8
#define GEMM_LANES(F, s) F(0, s), F(1, s), F(2, s), F(3, s), F(4, s), F(5, s), F(6, s), F(7, s)
#elif GEMM_VW == 16
#define GEMM_LANES(F, s)                                                                                          \
  F(0, s), F(1, s), F(2, s), F(3, s), F(4, s), F(5, s), F(6, s), F(7, s), F(8, s), F(9, s), F(10, s), F(11, s), \
      F(12, s), F(13, s), F(14, s), F(15, s)
#endif
#if defined(__clang__)
#define GEMM_SHUFFLE(x, y, F, s) __builtin_shufflevector(x, y, GEMM_LANES(F, s))
#else
#define GEMM_SHUFFLE(x, y, F, s) __builtin_shuffle(x, y, (gemm_vi){GEMM_LANES(F, s)})
#endif
#define GEMM_STAGE(r, s)                                                 \
  for (int i = 0; i < GEMM_VW; i++)                                      \
    if (!(i & (s))) {                                                    \
      const gemm_vf lo = GEMM_SHUFFLE(r[i], r[i + (s)], GEMM_LO, s);     \
      r[i + (s)] = GEMM_SHUFFLE(r[i], r[i + (s)], GEMM_HI, s);           \
      r[i] = lo;                                                         \
    }

GEMM_INLINE void gemm_transpose(gemm_vf r[GEMM_VW]) {
#if GEMM_VW > 8
  GEMM_STAGE(r, 8)
#endif
#if GEMM_VW > 4
  GEMM_STAGE(r, 4)
#endif
  GEMM_STAGE(r, 2)
  GEMM_STAGE(r, 1)
}

/* p[k * pw + j] = B[(n0 + j) * ldb + k] for j < w, zero for w <= j < pw: a panel of a transposed B,
 * GEMM_VW x GEMM_VW blocks through gemm_transpose, the edges entry by entry. */
static void gemm_pack_t(const float *B, int64_t ldb, int64_t n0, int64_t w, int64_t K, float *p, int64_t pw) {
  int64_t j0 = 0;
  for (; j0 + GEMM_VW <= w; j0 += GEMM_VW) {
    const float *src = B + (n0 + j0) * ldb;
    int64_t k0 = 0;
    for (; k0 + GEMM_VW <= K; k0 += GEMM_VW) {
      gemm_vf r[GEMM_VW];
      for (int i = 0; i < GEMM_VW; i++) memcpy(&r[i], src + i * ldb + k0, sizeof r[i]);
      gemm_transpose(r);
      for (int i = 0; i < GEMM_VW; i++) memcpy(p + (k0 + i) * pw + j0, &r[i], sizeof r[i]);
    }
    for (; k0 < K; k0++)
      for (int i = 0; i < GEMM_VW; i++) p[k0 * pw + j0 + i] = src[i * ldb + k0];
  }
  for (int64_t k = 0; k < K; k++) {
    for (int64_t j = j0; j < w; j++) p[k * pw + j] = B[(n0 + j) * ldb + k];
    for (int64_t j = w; j < pw; j++) p[k * pw + j] = 0;
  }
}

/* One tile: rows r < mr of C (c, ldc) by nv vectors of columns, of which the first w exist.
 * A's entry (r, k) is a[r * ars + k * aks]; B's row k of the panel starts at b + k * bks.
 * mr and nv are constants at every call, so the accumulators are registers. */
GEMM_INLINE void gemm_tile(const int mr, const int nv, int64_t K, const float *a, int64_t ars, int64_t aks,
                           const float *b, int64_t bks, float *c, int64_t ldc, int64_t w, float alpha, float beta) {
  gemm_vf acc[GEMM_MR][GEMM_NV];
  for (int r = 0; r < mr; r++)
    for (int v = 0; v < nv; v++) acc[r][v] = (gemm_vf){0};
  for (int64_t k = 0; k < K; k++) {
    gemm_vf bv[GEMM_NV];
    for (int v = 0; v < nv; v++) memcpy(&bv[v], b + k * bks + v * GEMM_VW, sizeof bv[v]);
    for (int r = 0; r < mr; r++) {
      const float x = a[r * ars + k * aks];
      for (int v = 0; v < nv; v++) acc[r][v] += x * bv[v];
    }
  }
  for (int r = 0; r < mr; r++)
    for (int v = 0; v < nv; v++) {
      float *cr = c + r * ldc + v * GEMM_VW;
      const int64_t cols = w - v * GEMM_VW;
      gemm_vf y = alpha * acc[r][v];
      if (cols >= GEMM_VW) {
        if (beta != 0) { /* C is not read when beta is 0, as in BLAS */
          gemm_vf old;
          memcpy(&old, cr, sizeof old);
          y = beta * old + y;
        }
        memcpy(cr, &y, sizeof y);
      } else {
        float out[GEMM_VW];
        memcpy(out, &y, sizeof out);
        for (int t = 0; t < GEMM_VW; t++) /* a fixed trip count: the bound checker sees t < GEMM_VW */
          if (t < cols) cr[t] = beta != 0 ? beta * cr[t] + out[t] : out[t];
      }
    }
}

/* The tiles of one panel down all M rows, the last one shorter when GEMM_MR does not divide M
 * (a switch, so that every height is its own constant-sized block). */
GEMM_INLINE void gemm_panel(const int nv, int64_t M, int64_t K, const float *A, int64_t ars, int64_t aks,
                            const float *b, int64_t bks, float *C, int64_t ldc, int64_t w, float alpha, float beta) {
  int64_t m0 = 0;
  for (; m0 + GEMM_MR <= M; m0 += GEMM_MR)
    gemm_tile(GEMM_MR, nv, K, A + m0 * ars, ars, aks, b, bks, C + m0 * ldc, ldc, w, alpha, beta);
  const float *a = A + m0 * ars;
  float *c = C + m0 * ldc;
#define GEMM_REST(n)                                                      \
  case n:                                                                 \
    gemm_tile(n < GEMM_MR ? n : 1, nv, K, a, ars, aks, b, bks, c, ldc, w, alpha, beta); \
    break;
  switch (M - m0) {
    GEMM_REST(1)
    GEMM_REST(2)
    GEMM_REST(3)
    GEMM_REST(4)
    GEMM_REST(5)
    GEMM_REST(6)
    GEMM_REST(7)
    default:
      break;
  }
#undef GEMM_REST
}

const int64_t GEMM_FN(attn_vmath_gemm_small_max_) = GEMM_SMALL_MAX;

/* C = beta C, for K = 0 (every product is empty). */
static void gemm_scale(int64_t M, int64_t N, float beta, float *C, int64_t ldc) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) C[m * ldc + n] = beta != 0 ? beta * C[m * ldc + n] : 0.0f;
}

void GEMM_FN(attn_vmath_gemm_small_f32_)(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                                         const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                                         float *C, int64_t ldc, float *pack) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    gemm_scale(M, N, beta, C, ldc);
    return;
  }
  const int64_t ars = ta ? 1 : lda, aks = ta ? lda : 1;
  for (int64_t n0 = 0; n0 < N; n0 += GEMM_NR) {
    const int64_t w = N - n0 < GEMM_NR ? N - n0 : GEMM_NR;
    const int nv = (int)((w + GEMM_VW - 1) / GEMM_VW);
    const float *b = B + n0;
    int64_t bks = ldb;
    if (tb || w < GEMM_NR) { /* copy the panel into pack: K rows of nv vectors */
      bks = nv * GEMM_VW;
      if (tb)
        gemm_pack_t(B, ldb, n0, w, K, pack, bks);
      else
        for (int64_t k = 0; k < K; k++) /* one loop with a select, not memcpy: GCC inlined that as
                                            * rep movsq, whose start-up cost more than these rows */
          for (int64_t j = 0; j < bks; j++) pack[k * bks + j] = j < w ? B[k * ldb + n0 + j] : 0.0f;
      b = pack;
    }
    float *c = C + n0;
    if (nv == GEMM_NV)
      gemm_panel(GEMM_NV, M, K, A, ars, aks, b, bks, c, ldc, w, alpha, beta);
#if GEMM_NV > 1
    else if (nv == 1)
      gemm_panel(1, M, K, A, ars, aks, b, bks, c, ldc, w, alpha, beta);
#endif
#if GEMM_NV > 2
    else if (nv == 2)
      gemm_panel(2, M, K, A, ars, aks, b, bks, c, ldc, w, alpha, beta);
#endif
  }
}
