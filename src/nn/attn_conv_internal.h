/* Internal to attn_conv: the Winograd F(2x2, 3x3) kernels behind attn_conv2d_forward and
 * attn_conv2d_backward for 3x3 kernels at stride 1, dilation 1, groups 1 (attn_conv.h has the
 * model and the choice between paths).
 *
 * Each 2x2 block of outputs ("tile") is y = A^T [sum_c (G g G^T) .* (B^T d B)] A with d the 4x4
 * input patch under it (zero outside the image) and g the 3x3 kernel: 16 products per tile and
 * pair of channels instead of 36, done as 16 GEMMs over channels (the engine's attn_gemm) per
 * block of tiles (whole images, or bands of tile rows of a large one, sized to stay in L2), the
 * transforms around them. The transforms are the active ISA set's (cpu/wino_cpu.h): each runs
 * over a whole band of one (image, channel) plane at once, with one dummy tile per tile row that
 * the GEMMs carry along (1 / (tw + 1) of their columns) and the outputs drop. The backward
 * transforms dy's tiles once, Z = A dy A^T, and uses them twice: the weight gradient is
 * dg = G^T [sum_tiles Z .* (B^T d B)] G, and the input gradient is the forward's adjoint,
 * dd = B [sum_o U_o .* Z_o] B^T added up where the tiles' 4x4 patches overlap (16 products per
 * tile and channel pair, as forward; an image's bands run in order on one thread, each adding
 * into the two rows the band above wrote).
 *
 * Rounding: the transforms' coefficients are 0, +-1/2, +-1 and every entry of a tile's result
 * is a signed sum of at most 64 products of a weight and an input per input channel (against 9
 * for the direct sum), so the error bound grows by that factor: |err| <= (C + 10) u 64 sum_c
 * max|g_c| max|d| (u the unit roundoff); the specs compare float32 with it and float64 tight.
 *
 * Results do not depend on the thread count: outputs are cut into blocks of tiles by the shape
 * alone, each block's sums run in a fixed order, and the weight gradient is summed per fixed
 * chunk of blocks, the chunks added in order. Functions return 0, or -1 when out of memory. */
#ifndef ATTN_CONV_INTERNAL_H
#define ATTN_CONV_INTERNAL_H

#include "core/attn_tensor.h"

/* 1 when the Winograd kernels compute this convolution: 3x3, stride 1, dilation 1, groups 1,
 * padding <= 2 (the input gradient's padding 2 - p is then >= 0). */
int attn_conv2d_winograd_applies(int64_t kh, int64_t kw, const int64_t stride[2], const int64_t padding[2],
                                 const int64_t dilation[2], int64_t groups);

/* y (N, O, H + 2 ph - 2, W + 2 pw - 2) = conv(x (N, C, H, W), w (O, C, 3, 3)) + b (O or NULL), by
 * F(m x m, 3x3), m 2 or 4. */
int attn_conv2d_winograd(attn_dtype dt, int m, const void *x, int64_t N, int64_t C, int64_t H, int64_t W,
                         const void *w, const void *b, int64_t O, int64_t ph, int64_t pw, void *y);

/* The gradients of the convolution above from dy (N, O, Ho, Wo): dx (N, C, H, W) and dw (O, C,
 * 3, 3), either may be NULL (not computed). */
int attn_conv2d_winograd_backward(attn_dtype dt, int m, const void *x, int64_t N, int64_t C, int64_t H, int64_t W,
                                  const void *w, const void *dy, int64_t O, int64_t ph, int64_t pw, void *dx, void *dw);

#endif
