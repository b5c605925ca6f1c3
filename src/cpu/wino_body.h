/* The Winograd F(2x2, 3x3) transforms (cpu/wino_cpu.h), written once in plain C whose loops run
 * over a whole band of tile rows (one flat run per row of the padded plane, not one short run
 * per row of tiles) so that the compiler vectorises them; each src/cpu/wino_<isa>.c includes it
 * with its own WINO_SUFFIX and is compiled with that ISA's flags (see the Makefile).
 *
 * The padded plane (2 th + 2 rows of Wp = 2 tw + 2 entries) is split into its even and odd rows,
 * and those into their even and odd columns: tile (ti, tj)'s 4x4 patch then lies in rows ti and
 * ti + 1, columns tj and tj + 1 of the four parts, so B^T d (along columns) and then B (along
 * rows) are flat loops at stride 1 over the band; with tw + 1 column pairs per row the flat run
 * has one dummy tile per tile row, at tj = tw (it straddles two rows). The gradient transform
 * reads dy's 2x2 tiles the same way. */
#include <stdint.h>
#include <string.h>

#include "cpu/wino_cpu.h"

/* GCC turns the copy of a short row (a dozen entries) into a call to memmove, which cost more
 * than all the transforms together; the copies stay inline loops. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif

#define WINO_CAT2(a, b) a##b
#define WINO_CAT(a, b) WINO_CAT2(a, b)
#define WINO_FN(name) WINO_CAT(name, WINO_SUFFIX)

#define WINO_DEFINE(S, T)                                                                                   \
  /* a short row, in an inline loop (not a call to memcpy) */                                              \
  static void WINO_FN(copy_##S)(const T *restrict src, int64_t n, T *restrict dst) {                        \
    for (int64_t j = 0; j < n; j++) dst[j] = src[j];                                                        \
  }                                                                                                         \
  /* n rows of the zero-padded plane src (h, w) from padded row r0, step 2, Wp entries each from dst: */   \
  /* src's row r - pt, column q - pl at padded row r, column q (pl + w <= Wp) */                           \
  static void WINO_FN(pad_rows_##S)(const T *src, int64_t h, int64_t w, int64_t pt, int64_t pl, int64_t r0,     \
                                    int64_t n, int64_t Wp, T *dst) {                                        \
    memset(dst, 0, (size_t)(n * Wp) * sizeof(T)); /* one call, then one copy per row inside the plane */  \
    for (int64_t k = 0; k < n; k++) {                                                                       \
      int64_t r = r0 + 2 * k - pt;                                                                          \
      if (r >= 0 && r < h) WINO_FN(copy_##S)(src + r * w, w, dst + k * Wp + pl);                            \
    }                                                                                                       \
  }                                                                                                         \
  /* The loops sit in functions of restrict parameters: GCC trusts restrict on parameters, not on */       \
  /* local pointers, and vectorises only then. */                                                           \
  /* the even and odd entries of src (n pairs) into ev and od: the transforms then read at stride 1 */       \
  static void WINO_FN(split_##S)(const T *restrict src, int64_t n, T *restrict ev, T *restrict od) {        \
    for (int64_t j = 0; j < n; j++) ev[j] = src[2 * j], od[j] = src[2 * j + 1];                             \
  }                                                                                                         \
  /* u (4 rows us apart) = B^T d along columns from rows e (even) and o (odd), next rows Tr on */            \
  static void WINO_FN(in_cols_##S)(const T *restrict e, const T *restrict o, int64_t L, int64_t Tr,          \
                                   T *restrict u, int64_t us) {                                             \
    for (int64_t k = 0; k < L; k++) { /* rows 0 - 2, 1 + 2, 2 - 1, 1 - 3 */                                 \
      T a0 = e[k], a1 = o[k], a2 = e[k + Tr], a3 = o[k + Tr];                                               \
      u[k] = a0 - a2, u[us + k] = a1 + a2, u[2 * us + k] = a2 - a1, u[3 * us + k] = a1 - a3;                \
    }                                                                                                       \
  }                                                                                                         \
  /* v (4 planes ps apart) = the same along rows, from columns ue (even) and uo (odd) */                    \
  static void WINO_FN(in_rows_##S)(const T *restrict ue, const T *restrict uo, int64_t L, T *restrict v,     \
                                   int64_t ps) {                                                            \
    for (int64_t m = 0; m < L; m++) {                                                                       \
      T a0 = ue[m], a1 = uo[m], a2 = ue[m + 1], a3 = uo[m + 1];                                             \
      v[m] = a0 - a2, v[ps + m] = a1 + a2, v[2 * ps + m] = a2 - a1, v[3 * ps + m] = a1 - a3;                \
    }                                                                                                       \
  }                                                                                                         \
  static void WINO_FN(input_##S)(const attn_wino_geom *g, const T *x, int64_t ti0, int64_t rows, T *V,        \
                                 int64_t ps, T *scratch) {                                                  \
    int64_t Tr = g->tw + 1, Wp = 2 * Tr, L = rows * Tr, n = (rows + 1) * Tr, us = L + 1;                     \
    T *E = scratch, *Od = E + (rows + 1) * Wp, *p = Od + (rows + 1) * Wp; /* p: 4 planes of n, u: 8 of us */  \
    T *u = p + 4 * n;                                                                                       \
    WINO_FN(pad_rows_##S)(x, g->H, g->W, g->ph, g->pw, 2 * ti0, rows + 1, Wp, E);                           \
    WINO_FN(pad_rows_##S)(x, g->H, g->W, g->ph, g->pw, 2 * ti0 + 1, rows + 1, Wp, Od);                      \
    WINO_FN(split_##S)(E, n, p, p + n);                                                                     \
    WINO_FN(split_##S)(Od, n, p + 2 * n, p + 3 * n);                                                        \
    WINO_FN(in_cols_##S)(p, p + 2 * n, L, Tr, u, 2 * us);           /* even columns: u rows 0, 2, 4, 6 */   \
    WINO_FN(in_cols_##S)(p + n, p + 3 * n, L, Tr, u + us, 2 * us); /* odd columns: rows 1, 3, 5, 7 */       \
    for (int j = 0; j < 8; j++) u[j * us + L] = 0;                 /* read by the last dummy tile */       \
    for (int i = 0; i < 4; i++) WINO_FN(in_rows_##S)(u + 2 * i * us, u + (2 * i + 1) * us, L, V + 4 * i * ps, ps); \
  }                                                                                                         \
  /* ye (rows of 2 (tw + 1)) and ye + 2 P (the odd output rows) = A^T m A + bias of M's P tiles */          \
  static void WINO_FN(out_tiles_##S)(const T *restrict M, int64_t ps, int64_t P, T bias, T *restrict ye) {  \
    for (int64_t s = 0; s < P; s++) { /* columns j of A^T m: a = rows 0 + 1 + 2, c = rows 1 - 2 - 3 */      \
      const T *m = M + s;                                                                                   \
      T a0 = m[0] + m[4 * ps] + m[8 * ps], a1 = m[ps] + m[5 * ps] + m[9 * ps];                              \
      T a2 = m[2 * ps] + m[6 * ps] + m[10 * ps], a3 = m[3 * ps] + m[7 * ps] + m[11 * ps];                   \
      T c0 = m[4 * ps] - m[8 * ps] - m[12 * ps], c1 = m[5 * ps] - m[9 * ps] - m[13 * ps];                   \
      T c2 = m[6 * ps] - m[10 * ps] - m[14 * ps], c3 = m[7 * ps] - m[11 * ps] - m[15 * ps];                 \
      ye[2 * s] = a0 + a1 + a2 + bias, ye[2 * s + 1] = a1 - a2 - a3 + bias;                                 \
      ye[2 * P + 2 * s] = c0 + c1 + c2 + bias, ye[2 * P + 2 * s + 1] = c1 - c2 - c3 + bias;                 \
    }                                                                                                       \
  }                                                                                                         \
  static void WINO_FN(output_##S)(const attn_wino_geom *g, const T *M, int64_t ps, int64_t ti0, int64_t rows,  \
                                  T bias, T *y, T *scratch) {                                               \
    int64_t Wp = 2 * g->tw + 2;                                                                             \
    T *ye = scratch, *yo = ye + rows * Wp;                                                                  \
    WINO_FN(out_tiles_##S)(M, ps, rows * (g->tw + 1), bias, ye);                                            \
    for (int64_t k = 0; k < rows; k++) {                                                                    \
      int64_t r = 2 * (ti0 + k);                                                                            \
      WINO_FN(copy_##S)(ye + k * Wp, g->Wo, y + r * g->Wo);                                                 \
      if (r + 1 < g->Ho) WINO_FN(copy_##S)(yo + k * Wp, g->Wo, y + (r + 1) * g->Wo);                        \
    }                                                                                                       \
  }                                                                                                         \
  /* z (4 planes ps apart) = row (w0, w1) of A e times A^T, for P tiles */                                  \
  static void WINO_FN(grad_row_##S)(const T *restrict w0, const T *restrict w1, int64_t P, T *restrict z,    \
                                    int64_t ps) {                                                           \
    for (int64_t s = 0; s < P; s++) {                                                                       \
      T a = w0[s], b = w1[s];                                                                               \
      z[s] = a, z[ps + s] = a + b, z[2 * ps + s] = a - b, z[3 * ps + s] = -b;                               \
    }                                                                                                       \
  }                                                                                                         \
  /* u (6 arrays of P) = rows 1 - 3 of A e: r0 + r1, r0 - r1, -r1 from the tiles' rows r0 = (e0, e1), */    \
  /* r1 = (o0, o1) */                                                                                       \
  static void WINO_FN(grad_cols_##S)(const T *restrict e, const T *restrict o, int64_t P, T *restrict u) {  \
    for (int64_t s = 0; s < 2 * P; s++) u[s] = e[s] + o[s], u[2 * P + s] = e[s] - o[s], u[4 * P + s] = -o[s]; \
  }                                                                                                         \
  static void WINO_FN(grad_##S)(const attn_wino_geom *g, const T *dy, int64_t ti0, int64_t rows, T *Z,        \
                                int64_t ps, T *scratch, double *sum) {                                      \
    int64_t Wp = 2 * g->tw + 2, P = rows * (g->tw + 1);                                                      \
    if (sum) WINO_FN(sum_rows_##S)(dy, g->Ho, g->Wo, 2 * ti0, 2 * (ti0 + rows), sum);                        \
    T *E = scratch, *Od = E + rows * Wp, *p = Od + rows * Wp, *u = p + 4 * P;                               \
    WINO_FN(pad_rows_##S)(dy, g->Ho, g->Wo, 0, 0, 2 * ti0, rows, Wp, E);                                    \
    WINO_FN(pad_rows_##S)(dy, g->Ho, g->Wo, 0, 0, 2 * ti0 + 1, rows, Wp, Od);                               \
    WINO_FN(split_##S)(E, P, p, p + P);          /* e0, e1: the tiles' top row */                           \
    WINO_FN(split_##S)(Od, P, p + 2 * P, p + 3 * P); /* o0, o1: the bottom row */                           \
    WINO_FN(grad_cols_##S)(p, p + 2 * P, P, u);                                                             \
    WINO_FN(grad_row_##S)(p, p + P, P, Z, ps);                                                              \
    for (int i = 1; i < 4; i++) WINO_FN(grad_row_##S)(u + (2 * i - 2) * P, u + (2 * i - 1) * P, P, Z + 4 * i * ps, ps); \
  }

/* The adjoint of the input transform (the input gradient), apart: an ISA file may bring its own. */
#define WINO_DEFINE_ADJOINT(S, T)                                                                           \
  /* p (16 arrays pn apart, entry (a, b) in array 4 a + b) = B v B^T of the P tiles v (16 planes ps */      \
  /* apart): along i with B's rows (v0, v1 - v2 + v3, v1 + v2 - v0, -v3), then along k the same */           \
  static void WINO_FN(adj_tiles_##S)(const T *restrict M, int64_t ps, int64_t P, T *restrict p, int64_t pn) { \
    for (int64_t s = 0; s < P; s++) {                                                                       \
      const T *v = M + s;                                                                                   \
      T w[4][4];                                                                                            \
      for (int k = 0; k < 4; k++) {                                                                         \
        T v0 = v[k * ps], v1 = v[(4 + k) * ps], v2 = v[(8 + k) * ps], v3 = v[(12 + k) * ps];                \
        w[0][k] = v0, w[1][k] = v1 - v2 + v3, w[2][k] = v1 + v2 - v0, w[3][k] = -v3;                        \
      }                                                                                                     \
      for (int a = 0; a < 4; a++) {                                                                         \
        p[(4 * a) * pn + s] = w[a][0], p[(4 * a + 1) * pn + s] = w[a][1] - w[a][2] + w[a][3];               \
        p[(4 * a + 2) * pn + s] = w[a][1] + w[a][2] - w[a][0], p[(4 * a + 3) * pn + s] = -w[a][3];          \
      }                                                                                                     \
    }                                                                                                       \
  }                                                                                                         \
  /* q[f] = the patch entries of the tiles that land on split position f: (a, b) = (r, c) + 0 or 2, */      \
  /* from tiles f - Tr (one up), f - Tr - 1, f, f - 1 (one to the left; zeros before p): the tile row */   \
  /* above's sum first, as the AVX-512 set adds a row to what the row above wrote */                        \
  static void WINO_FN(adj_gather_##S)(const T *restrict p0, const T *restrict p1, const T *restrict p2,      \
                                      const T *restrict p3, int64_t n, int64_t Tr, T *restrict q) {         \
    for (int64_t f = 0; f < n; f++) q[f] = (p2[f - Tr] + p3[f - Tr - 1]) + (p0[f] + p1[f - 1]);            \
  }                                                                                                         \
  /* dst[j] (+)= the interleaved (e[0], o[0], e[1], ...) from entry q on, n entries */                      \
  static void WINO_FN(adj_row_##S)(const T *restrict e, const T *restrict o, int64_t q, int64_t n, int add,  \
                                   T *restrict dst) {                                                       \
    for (int64_t j = 0; j < n; j++) {                                                                       \
      int64_t c = q + j;                                                                                    \
      T v = c & 1 ? o[c >> 1] : e[c >> 1];                                                                  \
      dst[j] = add ? dst[j] + v : v;                                                                        \
    }                                                                                                       \
  }                                                                                                         \
  static void WINO_FN(adjoint_##S)(const attn_wino_geom *g, const T *M, int64_t ps, int64_t ti0, int64_t rows, \
                                   T *dx, T *scratch, int seams) {                                          \
    int64_t Tr = g->tw + 1, P = rows * Tr, n = (rows + 1) * Tr, pn = P + 2 * Tr + 1;                        \
    T *p = scratch + Tr + 1, *q = scratch + 16 * pn; /* p: Tr + 1 zeros, P tiles, Tr zeros; q: 4 of n */    \
    for (int k = 0; k < 16; k++) {                                                                          \
      for (int64_t j = 1; j <= Tr + 1; j++) p[k * pn - j] = 0;                                              \
      for (int64_t j = 0; j < Tr; j++) p[k * pn + P + j] = 0;                                               \
    }                                                                                                       \
    WINO_FN(adj_tiles_##S)(M, ps, P, p, pn);                                                                \
    for (int r = 0; r < 2; r++)                                                                             \
      for (int c = 0; c < 2; c++) {                                                                         \
        const T *pa = p + (4 * r + c) * pn, *pb = p + (4 * (r + 2) + c) * pn;                              \
        WINO_FN(adj_gather_##S)(pa, pa + 2 * pn, pb, pb + 2 * pn, n, Tr, q + (2 * r + c) * n);              \
      }                                                                                                     \
    for (int64_t i = 0; i <= rows; i++) /* padded rows 2 (ti0 + i) + r: the seams' pairs first and last */ \
      for (int r = 0; r < 2; r++) {                                                                         \
        int64_t y = 2 * (ti0 + i) + r - g->ph;                                                              \
        if (y >= 0 && y < g->H)                                                                             \
          WINO_FN(adj_row_##S)(q + (2 * r) * n + i * Tr, q + (2 * r + 1) * n + i * Tr, g->pw, g->W,          \
                               (i == 0 && (seams & ATTN_WINO_ADD_TOP)) ||                                   \
                                   (i == rows && (seams & ATTN_WINO_ADD_BOTTOM)),                           \
                               dx + y * g->W);                                                              \
      }                                                                                                     \
  }

/* *sum += dy's rows [r0, r1) clipped to the plane (h, w), in double (the generic grads' bias
 * gradient: exact enough, any speed). */
#define WINO_DEFINE_SUM(S, T)                                                                               \
  static inline void WINO_FN(sum_rows_##S)(const T *dy, int64_t h, int64_t w, int64_t r0, int64_t r1, double *sum) { \
    double s = 0;                                                                                           \
    for (int64_t r = r0; r < r1 && r < h; r++)                                                              \
      for (int64_t c = 0; c < w; c++) s += (double)dy[r * w + c];                                           \
    *sum += s;                                                                                              \
  }
WINO_DEFINE_SUM(f32, float)
WINO_DEFINE_SUM(f64, double)

#include "cpu/wino4_body.h"

#ifndef WINO_OWN_F32
WINO_DEFINE(f32, float)
#endif
#ifndef WINO_OWN4_F32
WINO4_DEFINE(f32, float)
#endif
WINO4_DEFINE(f64, double)
WINO_DEFINE(f64, double)
#ifndef WINO_OWN_ADJOINT_F32
WINO_DEFINE_ADJOINT(f32, float)
#endif
WINO_DEFINE_ADJOINT(f64, double)

/* An ISA file may bring its own float32 transforms (the same arithmetic in the same order, so the
 * same bits): it defines WINO_OWN_F32 and the three functions before including this file. */
#ifdef WINO_OWN_F32
#define WINO_F32(name) WINO_CAT(name, _own)
#else
#define WINO_F32(name) WINO_FN(name)
#endif
#ifdef WINO_OWN_ADJOINT_F32
#define WINO_ADJOINT_F32 adjoint_f32_own
#else
#define WINO_ADJOINT_F32 WINO_FN(adjoint_f32)
#endif

#ifdef WINO_OWN4_F32
#define WINO4_F32(name) WINO_CAT(WINO_CAT(attn_wino4_, name), _f32_avx512)
#define WINO4_OWN 1
#define WINO_GEMM_NN attn_wino_gemm_nn_f32_avx512
#define WINO_GEMM_NT attn_wino_gemm_nt_f32_avx512
#else
#define WINO_GEMM_NN NULL
#define WINO_GEMM_NT NULL
#define WINO4_F32(name) WINO_FN(WINO_CAT(name, 4_f32))
#define WINO4_OWN 0
#endif

/* last: under clang it leaves contraction off to the end of the file */
#include "cpu/wino_weights_body.h"

const attn_wino_kernels WINO_FN(attn_wino_kernels_) = {
    {WINO_F32(input_f32), WINO_FN(input_f64), WINO_F32(output_f32), WINO_FN(output_f64), WINO_F32(grad_f32),
     WINO_FN(grad_f64), WINO_ADJOINT_F32, WINO_FN(adjoint_f64)},
    {WINO4_F32(input), WINO_FN(input4_f64), WINO4_F32(output), WINO_FN(output4_f64), WINO4_F32(grad),
     WINO_FN(grad4_f64), WINO4_F32(adjoint), WINO_FN(adjoint4_f64)},
    WINO_FN(weights_f32),
    WINO_FN(weights_f64),
    WINO_FN(reduce_f32),
    WINO_FN(reduce_f64),
    WINO4_OWN,
    WINO_GEMM_NN,
    WINO_GEMM_NT,
};
