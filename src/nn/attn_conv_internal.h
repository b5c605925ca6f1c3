/* Internal to attn_conv: the Winograd F(2x2, 3x3) and F(4x4, 3x3) kernels behind
 * attn_conv2d_forward and attn_conv2d_backward for 3x3 kernels at stride 1, dilation 1, groups 1
 * (attn_conv.h has the model and the choice between paths).
 *
 * Each m x m block of outputs ("tile", m 2 or 4) is y = A^T [sum_c (G g G^T) .* (B^T d B)] A with
 * d the (m + 2) x (m + 2) input patch under it (zero outside the image) and g the 3x3 kernel:
 * (m + 2)^2 products per tile and pair of channels instead of 9 m^2 (16 against 36, 36 against
 * 144), done as (m + 2)^2 GEMMs over channels (the engine's attn_gemm) per block of tiles (whole
 * images, or bands of tile rows of a large one, sized to stay in L2), the transforms around them.
 * The transforms are the active ISA set's (cpu/wino_cpu.h): each runs over a whole band of one
 * (image, channel) plane at once. F(2x2) lays a band's tiles out row by row with one dummy tile
 * per tile row that the GEMMs carry along (1 / (tw + 1) of their columns) and the outputs drop;
 * F(4x4) in groups of 4x4 tiles, 16 columns each (one vector), whose tiles past the outputs the
 * GEMMs carry along. The backward transforms dy's tiles once, Z = A dy A^T, and uses them twice:
 * the weight gradient is dg = G^T [sum_tiles Z .* (B^T d B)] G, and the input gradient is the
 * forward's adjoint, dd = B [sum_o U_o .* Z_o] B^T added up where the tiles' patches overlap (as
 * many products as forward). Neighbouring bands of a large image share two rows of dd: the even
 * bands write them, and after those the odd bands add into them, each phase's bands in parallel.
 * The bias gradient is summed as the gradient transforms read dy.
 *
 * Rounding: F(2x2)'s coefficients are 0, +-1/2, +-1, and every entry of a tile's result is a
 * signed sum of products of a weight and an input whose coefficients add up to at most 64 per
 * input channel (against 9 for the direct sum): |err| <= (C + 10) u 64 sum_c max|g_c| max|d| (u
 * the unit roundoff). F(4x4)'s reach 5 in B^T, 1/4 and 1/6 in G and 8 in A^T, and the sums' at most
 * 54^2 = 2916 (48^2 forward, 38.5^2 for the input gradient, 53.3^2 for the weight gradient), with up to C + 16 roundings: a bound 45
 * times F(2x2)'s, which the specs compare float32 with (the errors measured stay below a
 * thousandth of it), float64 tight.
 *
 * Results do not depend on the thread count: outputs are cut into blocks of tiles by the shape
 * alone, each block's sums run in a fixed order, and the weight gradient is summed per fixed
 * chunk of blocks, the chunks added in order. Functions return 0, or -1 when out of memory. */
#ifndef ATTN_CONV_INTERNAL_H
#define ATTN_CONV_INTERNAL_H

#include "core/attn_tensor.h"

/* 1 when the Winograd kernels compute this convolution: 3x3, stride 1, dilation 1, groups 1 (any
 * padding: the tiles cover the outputs, and the input gradient is the forward's adjoint). */
int attn_conv2d_winograd_applies(int64_t kh, int64_t kw, const int64_t stride[2], const int64_t dilation[2],
                                 int64_t groups);

/* y (N, O, H + 2 ph - 2, W + 2 pw - 2) = conv(x (N, C, H, W), w (O, C, 3, 3)) + b (O or NULL), by
 * F(m x m, 3x3), m 2 or 4. */
int attn_conv2d_winograd(attn_dtype dt, int m, const void *x, int64_t N, int64_t C, int64_t H, int64_t W,
                         const void *w, const void *b, int64_t O, int64_t ph, int64_t pw, void *y);

/* The gradients of the convolution above from dy (N, O, Ho, Wo): dx (N, C, H, W), dw (O, C, 3, 3)
 * and db (O), any may be NULL (not computed). db is summed as the gradient transforms read dy:
 * in float32, at most 8 entries per float partial before a double takes it. */
int attn_conv2d_winograd_backward(attn_dtype dt, int m, const void *x, int64_t N, int64_t C, int64_t H, int64_t W,
                                  const void *w, const void *dy, int64_t O, int64_t ph, int64_t pw, void *dx, void *dw,
                                  void *db);

#endif
