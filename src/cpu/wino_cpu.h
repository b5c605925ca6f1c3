/* The per-ISA transforms of the Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions
 * (src/nn/attn_conv_winograd.c), gathered in cpu_dispatch.c. One call transforms one (image, channel) plane's band of tile
 * rows [ti0, ti0 + rows), so that every loop runs over the whole band at once (vectorised along
 * it, not along one short row of tiles).
 *
 * Layout: tile (ti, tj) of the band sits at column (ti - ti0) (tw + 1) + tj of each of the 16
 * planes (entry (i, j) of a tile in plane 4 i + j, planes ps entries apart): one dummy tile per
 * tile row, tj = tw, lets the row's tiles be read and written as one flat run. The gradient
 * transform writes zeros there (so the weight gradient's products add exact zeros), the input
 * transform whatever the flat run gives, the output transform ignores them. F(4x4) lays tiles
 * out in groups of 4x4 (wino4_body.h), with no dummy tiles within a group.
 * scratch holds attn_wino_scratch(rows, tw) entries of the plane's type. The AVX2 and AVX-512
 * sets exist only on x86-64. */
#ifndef ATTN_WINO_CPU_H
#define ATTN_WINO_CPU_H

#include <stdint.h>

typedef struct attn_wino_geom {
  int64_t H, W, ph, pw; /* input plane and padding */
  int64_t Ho, Wo;       /* output plane: H + 2 ph - 2, W + 2 pw - 2 */
  int64_t th, tw;       /* tile rows and columns: (Ho + 1) / 2, (Wo + 1) / 2; F(4x4): groups, (Ho + 15) / 16, (Wo + 15) / 16 */
} attn_wino_geom;

/* The adjoint's seams: add into the band's first (last) two padded rows rather than write them. */
enum { ATTN_WINO_ADD_TOP = 1, ATTN_WINO_ADD_BOTTOM = 2 };

/* Entries of scratch one call needs for a band of rows tile rows. */
static inline int64_t attn_wino_scratch(int64_t rows, int64_t tw) { return 20 * (rows + 2) * (tw + 1) + 16; }

/* The four transforms on one plane's band, per float type T (signatures below). */
#define ATTN_WINO_TRANSFORMS(T, S)                                                                          \
  typedef void (*attn_wino_input_##S)(const attn_wino_geom *g, const T *x, int64_t ti0, int64_t rows, T *V,     \
                                      int64_t ps, T *scratch);                                              \
  typedef void (*attn_wino_output_##S)(const attn_wino_geom *g, const T *M, int64_t ps, int64_t ti0,          \
                                       int64_t rows, T bias, T *y, T *scratch);                             \
  typedef void (*attn_wino_grad_##S)(const attn_wino_geom *g, const T *dy, int64_t ti0, int64_t rows, T *Z,     \
                                     int64_t ps, T *scratch, double *sum);                                  \
  typedef void (*attn_wino_adjoint_##S)(const attn_wino_geom *g, const T *M, int64_t ps, int64_t ti0,         \
                                        int64_t rows, T *dx, T *scratch, int seams);
ATTN_WINO_TRANSFORMS(float, f32)
ATTN_WINO_TRANSFORMS(double, f64)

/* One tile size's transforms.
 * input: V (16 planes): B^T d B of the band's 4x4 input patches d of x (H, W), zero outside it.
 * output: y (Ho, Wo): the band's 2x2 output tiles A^T m A + bias from the products M (16 planes),
 * clipped to (Ho, Wo).
 * grad: Z (16 planes): A e A^T of the band's 2x2 tiles e of dy (Ho, Wo), zero outside it; with
 * sum not NULL, adds the band's entries of dy to *sum (the bias gradient: float32 adds at most 8
 * entries per partial before a double takes it, as attn_conv's own sum; the AVX-512 transforms
 * add 4).
 * adjoint: dx (H, W): the adjoint of the input transform, B v B^T of the band's 4x4 tiles v of dV
 * (16 planes) added up where the tiles' patches overlap, clipped to (H, W). The band writes its
 * padded rows [2 ti0, 2 (ti0 + rows) + 2); the first two and the last two, which it shares with
 * the bands above and below, it adds to instead when seams has ATTN_WINO_ADD_TOP or
 * ATTN_WINO_ADD_BOTTOM (the other band wrote them first). Dummy tiles must hold zeros.
 * (As written for F(2x2); F(4x4), cpu/wino4_body.h: the same over 36 planes, th and tw counting
 * groups of 4x4 tiles (16 columns each), y's tiles 4x4, the adjoint's band covering its padded
 * rows [16 ti0, 16 (ti0 + rows) + 2) with the same seams.) */
typedef struct attn_wino_transforms {
  attn_wino_input_f32 input_f32;
  attn_wino_input_f64 input_f64;
  attn_wino_output_f32 output_f32;
  attn_wino_output_f64 output_f64;
  attn_wino_grad_f32 grad_f32;
  attn_wino_grad_f64 grad_f64;
  attn_wino_adjoint_f32 adjoint_f32;
  attn_wino_adjoint_f64 adjoint_f64;
} attn_wino_transforms;

/* A block's float32 products, plane after plane (an ISA set's own, or NULL: attn_gemm per plane).
 * nn: for p < np, C_p (M, N) = op(A_p) B_p (K, N); A_p at A + p M K, op(A_p) = A_p (M, K) or, with ta
 * set, A_p^T (A_p (K, M)); B_p at B + p bps (rows ldb apart), C_p at C + p cps (rows ldc apart).
 * nt: for p < np, C_p (M, N) = beta C_p + A_p (M, K) B_p^T, B_p (N, K); A_p at A + p aps (rows lda
 * apart), B_p at B + p bps (rows ldb apart), C_p at C + p M N (rows of N entries); beta 0 or 1;
 * pack holds attn_wino_gemm_pack(K) floats, 64-byte aligned.
 * Each entry is its sum over k in order from zero, then added to C's entry for beta 1, multiply-adds
 * written as in the small GEMM (cpu/gemm_body.h): its bits on each plane. */
typedef void (*attn_wino_gemm_nn_f32)(int64_t np, int ta, int64_t M, int64_t N, int64_t K, const float *A,
                                      const float *B, int64_t bps, int64_t ldb, float *C, int64_t cps, int64_t ldc);
typedef void (*attn_wino_gemm_nt_f32)(int64_t np, int64_t M, int64_t N, int64_t K, const float *A, int64_t aps,
                                      int64_t lda, const float *B, int64_t bps, int64_t ldb, float beta, float *C,
                                      float *pack);
static inline int64_t attn_wino_gemm_pack(int64_t K) { return 16 * (K + 15); }

/* The kernel transform and the weight gradient's reduction, for m = 2 (F(2x2)) or 4 (F(4x4)), np =
 * (m + 2)^2 planes, in double, rounded once (cpu/wino_weights_body.h: the same bits on every set).
 * weights: U (np, O, C) = G g G^T for the O C kernels g (3x3) of w (O, C, 3, 3).
 * reduce: dw's kernels [e0, e1) (of the O C in (O, C, 3, 3)) = G^T D G, D the sum over the chunks
 * of partial (chunks, np, O, C) in chunk order. */
#define ATTN_WINO_WEIGHTS(T, S)                                                                             \
  typedef void (*attn_wino_weights_##S)(int m, const T *w, int64_t O, int64_t C, T *U);                    \
  typedef void (*attn_wino_reduce_##S)(int m, const T *partial, int64_t chunks, int64_t O, int64_t C,       \
                                       int64_t e0, int64_t e1, T *dw);
ATTN_WINO_WEIGHTS(float, f32)
ATTN_WINO_WEIGHTS(double, f64)

typedef struct attn_wino_kernels {
  attn_wino_transforms f2, f4; /* F(2x2, 3x3) and F(4x4, 3x3) */
  attn_wino_weights_f32 weights_f32;
  attn_wino_weights_f64 weights_f64;
  attn_wino_reduce_f32 reduce_f32;
  attn_wino_reduce_f64 reduce_f64;
  /* 1 when the float32 F(4x4) transforms are the set's own vector code (AUTO then prefers them) */
  int own4_f32;
  attn_wino_gemm_nn_f32 gemm_nn_f32; /* the set's own block products, or NULL */
  attn_wino_gemm_nt_f32 gemm_nt_f32;
} attn_wino_kernels;

extern const attn_wino_kernels attn_wino_kernels_generic;
#if defined(__x86_64__)
extern const attn_wino_kernels attn_wino_kernels_avx2, attn_wino_kernels_avx512;
/* the AVX-512 set's own float32 F(4x4) transforms (wino4_avx512.c) */
void attn_wino4_input_f32_avx512(const attn_wino_geom *g, const float *x, int64_t ti0, int64_t rows, float *V,
                                 int64_t ps, float *scratch);
void attn_wino4_output_f32_avx512(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows,
                                  float bias, float *y, float *scratch);
void attn_wino4_grad_f32_avx512(const attn_wino_geom *g, const float *dy, int64_t ti0, int64_t rows, float *Z,
                                int64_t ps, float *scratch, double *sum);
void attn_wino4_adjoint_f32_avx512(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows,
                                   float *dx, float *scratch, int seams);
/* the AVX-512 set's block products (wino_gemm_avx512.c) */
void attn_wino_gemm_nn_f32_avx512(int64_t np, int ta, int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                                  int64_t bps, int64_t ldb, float *C, int64_t cps, int64_t ldc);
void attn_wino_gemm_nt_f32_avx512(int64_t np, int64_t M, int64_t N, int64_t K, const float *A, int64_t aps,
                                  int64_t lda, const float *B, int64_t bps, int64_t ldb, float beta, float *C,
                                  float *pack);
#endif

#endif
