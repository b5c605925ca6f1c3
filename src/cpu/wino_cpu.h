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
  /* F(4x4, 3x3) (cpu/wino4_body.h): the same four transforms over 36 planes, th and tw counting
   * groups of 4x4 tiles (16 columns each), y's tiles 4x4; the adjoint's band writes its padded rows
   * [16 ti0, 16 (ti0 + rows) + 2), adding into the top two when ti0 > 0. */
  void (*input4_f32)(const attn_wino_geom *g, const float *x, int64_t ti0, int64_t rows, float *V, int64_t ps,
                     float *scratch);
  void (*input4_f64)(const attn_wino_geom *g, const double *x, int64_t ti0, int64_t rows, double *V, int64_t ps,
                     double *scratch);
  void (*output4_f32)(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows, float bias,
                      float *y, float *scratch);
  void (*output4_f64)(const attn_wino_geom *g, const double *M, int64_t ps, int64_t ti0, int64_t rows, double bias,
                      double *y, double *scratch);
  void (*grad4_f32)(const attn_wino_geom *g, const float *dy, int64_t ti0, int64_t rows, float *Z, int64_t ps,
                    float *scratch);
  void (*grad4_f64)(const attn_wino_geom *g, const double *dy, int64_t ti0, int64_t rows, double *Z, int64_t ps,
                    double *scratch);
  void (*adjoint4_f32)(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows, float *dx,
                       float *scratch);
  void (*adjoint4_f64)(const attn_wino_geom *g, const double *M, int64_t ps, int64_t ti0, int64_t rows, double *dx,
                       double *scratch);
  /* 1 when the float32 F(4x4) transforms are the set's own vector code (AUTO then prefers them) */
  int own4_f32;
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
                                int64_t ps, float *scratch);
void attn_wino4_adjoint_f32_avx512(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows,
                                   float *dx, float *scratch);
#endif

#endif
