/* The per-ISA transforms of the Winograd F(2x2, 3x3) convolution (src/nn/attn_conv_winograd.c),
 * gathered in cpu_dispatch.c. One call transforms one (image, channel) plane's band of tile
 * rows [ti0, ti0 + rows), so that every loop runs over the whole band at once (vectorised along
 * it, not along one short row of tiles).
 *
 * Layout: tile (ti, tj) of the band sits at column (ti - ti0) (tw + 1) + tj of each of the 16
 * planes (entry (i, j) of a tile in plane 4 i + j, planes ps entries apart): one dummy tile per
 * tile row, tj = tw, lets the row's tiles be read and written as one flat run. The gradient
 * transform writes zeros there (so the weight gradient's products add exact zeros), the input
 * transform whatever the flat run gives, the output transform ignores them.
 * scratch holds attn_wino_scratch(rows, tw) entries of the plane's type. The AVX2 and AVX-512
 * sets exist only on x86-64. */
#ifndef ATTN_WINO_CPU_H
#define ATTN_WINO_CPU_H

#include <stdint.h>

typedef struct attn_wino_geom {
  int64_t H, W, ph, pw; /* input plane and padding */
  int64_t Ho, Wo;       /* output plane: H + 2 ph - 2, W + 2 pw - 2 */
  int64_t th, tw;       /* tiles per column and row: (Ho + 1) / 2, (Wo + 1) / 2 */
} attn_wino_geom;

/* Entries of scratch one call needs for a band of rows tile rows. */
static inline int64_t attn_wino_scratch(int64_t rows, int64_t tw) { return 20 * (rows + 2) * (tw + 1) + 16; }

typedef struct attn_wino_kernels {
  /* V (16 planes): B^T d B of the band's 4x4 input patches d of x (H, W), zero outside it */
  void (*input_f32)(const attn_wino_geom *g, const float *x, int64_t ti0, int64_t rows, float *V, int64_t ps,
                    float *scratch);
  void (*input_f64)(const attn_wino_geom *g, const double *x, int64_t ti0, int64_t rows, double *V, int64_t ps,
                    double *scratch);
  /* y (Ho, Wo): the band's 2x2 output tiles A^T m A + bias from the products M (16 planes),
   * clipped to (Ho, Wo) */
  void (*output_f32)(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows, float bias,
                     float *y, float *scratch);
  void (*output_f64)(const attn_wino_geom *g, const double *M, int64_t ps, int64_t ti0, int64_t rows, double bias,
                     double *y, double *scratch);
  /* Z (16 planes): A e A^T of the band's 2x2 tiles e of dy (Ho, Wo), zero outside it */
  void (*grad_f32)(const attn_wino_geom *g, const float *dy, int64_t ti0, int64_t rows, float *Z, int64_t ps,
                   float *scratch);
  void (*grad_f64)(const attn_wino_geom *g, const double *dy, int64_t ti0, int64_t rows, double *Z, int64_t ps,
                   double *scratch);
  /* dx (H, W): the adjoint of the input transform, B v B^T of the band's 4x4 tiles v of dV (16
   * planes) added up where the tiles' patches overlap, clipped to (H, W). The band writes its
   * padded rows [2 ti0, 2 (ti0 + rows) + 2) and adds into the top two when ti0 > 0 (the band above
   * wrote them): an image's bands run in order. Dummy tiles must hold zeros. */
  void (*adjoint_f32)(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows, float *dx,
                      float *scratch);
  void (*adjoint_f64)(const attn_wino_geom *g, const double *M, int64_t ps, int64_t ti0, int64_t rows, double *dx,
                      double *scratch);
} attn_wino_kernels;

extern const attn_wino_kernels attn_wino_kernels_generic;
#if defined(__x86_64__)
extern const attn_wino_kernels attn_wino_kernels_avx2, attn_wino_kernels_avx512;
#endif

#endif
