/* The small float32 product (attn_vmath_gemm_small_f32), written once: each src/cpu/gemm_<isa>.c
 * defines GEMM_SUFFIX and its register block (GEMM_VW floats per vector, GEMM_MR rows by GEMM_NV
 * vectors of accumulators), optionally GEMM_LOADN / GEMM_STOREN (the ISA's masked load and store
 * of the first n lanes, which touch no memory past them), and includes this file, compiled with
 * that ISA's flags (see the Makefile); src/cpu/cpu_dispatch.c picks one path at run time.
 *
 * C = alpha op(A) op(B) + beta C is built one panel of NR = GEMM_NV * GEMM_VW columns at a time,
 * and within a panel one tile of GEMM_MR rows at a time: the tile's accumulators stay in
 * registers over the whole K loop, each step loads GEMM_NV vectors of B and broadcasts GEMM_MR
 * entries of A. A is read where it is (either layout: a transposed A only changes the strides).
 * A B that is not transposed is read where it is too, the last vector of a narrower panel by a
 * masked load (zeros past N), so the edge panels of N 8, 96 or 200 cost no copy. A transposed B
 * is copied once per panel into pack, K rows of its width rounded up to GEMM_VW with zero
 * columns past N, by GEMM_VW x GEMM_VW blocks transposed in registers (zero rows and masked loads
 * at the edges, so a tiny head's 10 x 8 block is one such block). Edge columns of C are written
 * by masked stores. Every entry of C is the same sequence of multiply-adds in k order whatever
 * tile or panel it falls in, so a row's bits do not depend on M or on where a caller cuts the
 * rows. */
#include <stdint.h>
#include <string.h>

#define GEMM_CAT2(a, b) a##b
#define GEMM_CAT(a, b) GEMM_CAT2(a, b)
#define GEMM_FN(name) GEMM_CAT(name, GEMM_SUFFIX)
#define GEMM_NR (GEMM_NV * GEMM_VW)

#include "cpu/cpu_inline.h"

typedef float gemm_vf __attribute__((vector_size(GEMM_VW * 4)));
typedef int32_t gemm_vi __attribute__((vector_size(GEMM_VW * 4)));

/* The first n (0..GEMM_VW) floats at p into a vector with zeros past them, and back: the ISA's
 * masked load and store when it has them, else lane by lane. (The clamp costs nothing in a loop,
 * where n is invariant, and shows the bound checker that no shift count is negative.) */
ATTN_CPU_INLINE gemm_vf gemm_loadn(const float *p, int64_t n) {
#ifdef GEMM_LOADN
  const unsigned u = n > 0 ? (unsigned)n : 0u;
  return GEMM_LOADN(p, u);
#else
  gemm_vf v = {0}; /* lane by lane: a staging array let GCC move its halves through MMX registers,
                     * whose unreset state then broke the x87 code of OpenBLAS's dnrm2 */
  for (int i = 0; i < GEMM_VW; i++)
    if (i < n) v[i] = p[i];
  return v;
#endif
}

ATTN_CPU_INLINE void gemm_storen(float *p, gemm_vf v, int64_t n) {
#ifdef GEMM_STOREN
  const unsigned u = n > 0 ? (unsigned)n : 0u;
  GEMM_STOREN(p, v, u);
#else
  float t[GEMM_VW];
  memcpy(t, &v, sizeof t);
  for (int i = 0; i < GEMM_VW; i++) /* a fixed trip count: the bound checker sees i < GEMM_VW */
    if (i < n) p[i] = t[i];
#endif
}

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

ATTN_CPU_INLINE void gemm_transpose(gemm_vf r[GEMM_VW]) {
#if GEMM_VW > 8
  GEMM_STAGE(r, 8)
#endif
#if GEMM_VW > 4
  GEMM_STAGE(r, 4)
#endif
  GEMM_STAGE(r, 2)
  GEMM_STAGE(r, 1)
}

/* p[k * pw + j] = B[(n0 + j) * ldb + k] for j < w, zero for w <= j < pw (pw: w rounded up to
 * GEMM_VW): a panel of a transposed B, one GEMM_VW x GEMM_VW block at a time through
 * gemm_transpose; rows past w enter as zero vectors and a last block of K by masked loads. */
static void gemm_pack_t(const float *B, int64_t ldb, int64_t n0, int64_t w, int64_t K, float *p, int64_t pw) {
  for (int64_t j0 = 0; j0 < pw; j0 += GEMM_VW) {
    const float *src = B + (n0 + j0) * ldb;
    const int64_t rows = w - j0 < GEMM_VW ? w - j0 : GEMM_VW;
    for (int64_t k0 = 0; k0 < K; k0 += GEMM_VW) {
      const int64_t kn = K - k0 < GEMM_VW ? K - k0 : GEMM_VW;
      gemm_vf r[GEMM_VW];
      for (int i = 0; i < GEMM_VW; i++) /* no branch: a row past w is a load of no lanes */
        r[i] = gemm_loadn(src + (i < rows ? i : 0) * ldb + k0, i < rows ? kn : 0);
      gemm_transpose(r);
      for (int i = 0; i < GEMM_VW; i++)
        if (i < kn) memcpy(p + (k0 + i) * pw + j0, &r[i], sizeof r[i]);
    }
  }
}

/* One tile: rows r < mr of C (c, ldc) by nv vectors of columns, of which the first w exist.
 * A's entry (r, k) is a[r * ars + k * aks]; B's row k of the panel starts at b + k * bks, and
 * when part is set its last vector holds only w - (nv - 1) GEMM_VW columns (a masked load).
 * mr, nv and part are constants at every call, so the accumulators are registers. */
ATTN_CPU_INLINE void gemm_tile(const int mr, const int nv, const int part, int64_t K, const float *a, int64_t ars,
                               int64_t aks, const float *b, int64_t bks, float *c, int64_t ldc, int64_t w, float alpha,
                               float beta) {
  const int64_t tail = w - (nv - 1) * GEMM_VW;
  gemm_vf acc[GEMM_MR][GEMM_NV];
  for (int r = 0; r < mr; r++)
    for (int v = 0; v < nv; v++) acc[r][v] = (gemm_vf){0};
  for (int64_t k = 0; k < K; k++) {
    gemm_vf bv[GEMM_NV];
    for (int v = 0; v < nv; v++) {
      if (part && v == nv - 1)
        bv[v] = gemm_loadn(b + k * bks + v * GEMM_VW, tail);
      else
        memcpy(&bv[v], b + k * bks + v * GEMM_VW, sizeof bv[v]);
    }
    for (int r = 0; r < mr; r++) {
      const float x = a[r * ars + k * aks];
      for (int v = 0; v < nv; v++) acc[r][v] += x * bv[v];
    }
  }
  if (beta != 0 && w < nv * GEMM_VW) {
    /* A narrow tile with beta: its old C is read before any of it is written. With N 8 (rows 32
     * bytes apart) a masked store's vector spans the next row, and a load there would wait for
     * the store to retire (2x the time of a 10 x 8 x 10 product). */
    for (int r = 0; r < mr; r++)
      for (int v = 0; v < nv; v++) {
        const float *cr = c + r * ldc + v * GEMM_VW;
        const int64_t cols = w - v * GEMM_VW;
        gemm_vf old;
        if (cols >= GEMM_VW)
          memcpy(&old, cr, sizeof old);
        else
          old = gemm_loadn(cr, cols);
        acc[r][v] = beta * old + (alpha == 1 ? acc[r][v] : alpha * acc[r][v]);
      }
    for (int r = 0; r < mr; r++)
      for (int v = 0; v < nv; v++) {
        float *cr = c + r * ldc + v * GEMM_VW;
        const int64_t cols = w - v * GEMM_VW;
        if (cols >= GEMM_VW)
          memcpy(cr, &acc[r][v], sizeof acc[r][v]);
        else
          gemm_storen(cr, acc[r][v], cols);
      }
    return;
  }
  for (int r = 0; r < mr; r++)
    for (int v = 0; v < nv; v++) {
      float *cr = c + r * ldc + v * GEMM_VW;
      const int64_t cols = w - v * GEMM_VW;
      gemm_vf y = alpha == 1 ? acc[r][v] : alpha * acc[r][v]; /* the same bits, one multiply less */
      if (cols >= GEMM_VW) {
        if (beta != 0) { /* C is not read when beta is 0, as in BLAS */
          gemm_vf old;
          memcpy(&old, cr, sizeof old);
          y = beta * old + y;
        }
        memcpy(cr, &y, sizeof y);
      } else {
        gemm_storen(cr, y, cols); /* beta is 0 here */
      }
    }
}

/* The tiles of one panel down all M rows, the last one shorter when GEMM_MR does not divide M
 * (a switch, so that every height is its own constant-sized block). */
ATTN_CPU_INLINE void gemm_panel(const int nv, const int part, int64_t M, int64_t K, const float *A, int64_t ars, int64_t aks,
                                const float *b, int64_t bks, float *C, int64_t ldc, int64_t w, float alpha, float beta) {
  int64_t m0 = 0;
  for (; m0 + GEMM_MR <= M; m0 += GEMM_MR)
    gemm_tile(GEMM_MR, nv, part, K, A + m0 * ars, ars, aks, b, bks, C + m0 * ldc, ldc, w, alpha, beta);
  const float *a = A + m0 * ars;
  float *c = C + m0 * ldc;
#define GEMM_REST(n)                                                      \
  case n:                                                                 \
    gemm_tile(n < GEMM_MR ? n : 1, nv, part, K, a, ars, aks, b, bks, c, ldc, w, alpha, beta); \
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
    int part = w % GEMM_VW != 0;
    if (tb) { /* copy the panel into pack: K rows of nv vectors, zeros past w */
      bks = nv * GEMM_VW;
      gemm_pack_t(B, ldb, n0, w, K, pack, bks);
      b = pack;
      part = 0;
    }
    float *c = C + n0;
#define GEMM_PANEL(n)                                                                   \
  if (part)                                                                             \
    gemm_panel(n, 1, M, K, A, ars, aks, b, bks, c, ldc, w, alpha, beta);                \
  else                                                                                  \
    gemm_panel(n, 0, M, K, A, ars, aks, b, bks, c, ldc, w, alpha, beta);
    if (nv == GEMM_NV) {
      GEMM_PANEL(GEMM_NV)
    }
#if GEMM_NV > 1
    else if (nv == 1) {
      GEMM_PANEL(1)
    }
#endif
#if GEMM_NV > 2
    else if (nv == 2) {
      GEMM_PANEL(2)
    }
#endif
#undef GEMM_PANEL
  }
}
