/* attn_conv: 2-D convolution (PyTorch's conv2d, cross-correlation), forward and backward.
 *
 * x (N, C, H, W), weight (O, C/G, kh, kw), bias (O) or NULL, y (N, O, Ho, Wo) with
 *
 *     Ho = (H + 2 ph - dh (kh - 1) - 1) / sh + 1   (likewise Wo)
 *     y[n, o, i, j] = b[o] + sum_{c, p, q} w[o, c, p, q] x[n, g C/G + c, i sh - ph + p dh, j sw - pw + q dw]
 *
 * for o in group g (of G); taps outside the input read zero. The fast path unfolds one image at a
 * time (im2col, one column per output position, the group's rows contiguous) into a workspace and
 * runs one attn_gemm per group: Y_g = W_g col_g. Backward: dcol_g = W_g^T dY_g folded back (col2im)
 * for dx, and dW_g^T = sum_n col_g dY_g^T. Images are split over the worker pool; dW is summed per
 * fixed chunk of images (the chunking depends on N alone) and the chunks are added in order, so
 * the bits do not depend on the thread count. db sums dY over images and positions in a fixed
 * order (float32 partials of at most 8 entries in 32 lanes, flushed into doubles; one output
 * channel per task); the Winograd paths sum it as their gradient transforms read dY when dx or
 * dW is asked for too.
 *
 * 3x3 kernels at stride 1, dilation 1 and groups 1 (any padding) can run Winograd F(2x2, 3x3)
 * or F(4x4, 3x3) instead (attn_conv_internal.h): 16 products per 2x2 outputs and channel pair
 * against 36, or 36 per 4x4 against 144, the input gradient as the forward's adjoint and the
 * weight gradient as its transpose, both from one transform of dy's tiles; their float32 rounding
 * is a multiple of the direct sum's (bounds there). AUTO takes Winograd where it applies with at
 * least 8 input and 8 output channels and outputs of at least 12 x 12, F(4x4) in float32 on a set
 * with its own F(4x4) transforms (AVX-512), else F(2x2); elsewhere im2col. Measured on one thread
 * (AVX-512, float32), forward+backward, im2col / F(2x2) / F(4x4): 16->32 channels on 14x14
 * (batch 64) 3.2 / 1.49 / 1.46 ms; 32->32 on 28x28 16.9 / 8.5 / 5.9 ms; 64->64 on 56x56 56 / 23 /
 * 17 ms; 8->8 on 14x14 0.88 / 0.40 / 0.35 ms; on 7x7 outputs F(4x4) is slower than F(2x2) (a
 * group of 4x4 tiles for 2x2 of them), below 8 channels Winograd slower than im2col (the
 * transforms cost more than the products they save).
 *
 * The reference path is the formula above as plain loops with double sums, on the calling
 * thread: the specs compare the other paths with it. Every operand must be contiguous and share
 * x's float dtype. Errors name the op, the shapes and the offending values. */
#ifndef ATTN_CONV_H
#define ATTN_CONV_H

#include "core/attn_tensor.h"

typedef struct attn_conv2d_params {
  int64_t stride[2];   /* >= 1, (h, w) */
  int64_t padding[2];  /* >= 0 */
  int64_t dilation[2]; /* >= 1 */
  int64_t groups;      /* >= 1, divides C and O */
} attn_conv2d_params;

/* Which path runs: AUTO is Winograd or im2col (above); WINOGRAD and WINOGRAD4 fail naming the
 * shapes where they do not apply. */
typedef enum {
  ATTN_CONV_AUTO = 0,
  ATTN_CONV_REFERENCE,
  ATTN_CONV_IM2COL,
  ATTN_CONV_WINOGRAD, /* F(2x2, 3x3) */
  ATTN_CONV_WINOGRAD4 /* F(4x4, 3x3) */
} attn_conv2d_kernel;

/* The output shape (N, O, Ho, Wo) of conv2d on x and weight, in out; fails naming op, the
 * shapes and the values when ranks, channel counts, groups, strides, padding or dilation do not
 * fit, or the dilated kernel is larger than the padded input. */
attn_status attn_conv2d_shape(const char *op, const attn_tensor *x, const attn_tensor *weight,
                              const attn_conv2d_params *p, int64_t out[4]);

/* y (attn_conv2d_shape) = conv2d(x, weight) + bias (bias may be NULL). */
attn_status attn_conv2d_forward(const attn_tensor *x, const attn_tensor *weight, const attn_tensor *bias,
                                const attn_conv2d_params *p, attn_conv2d_kernel kernel, attn_tensor *y);

/* Gradients of the forward above from dy (N, O, Ho, Wo): dx (x's shape), dweight (weight's
 * shape), dbias (O); each may be NULL to skip it. */
attn_status attn_conv2d_backward(const attn_tensor *x, const attn_tensor *weight, const attn_conv2d_params *p,
                                 const attn_tensor *dy, attn_conv2d_kernel kernel, attn_tensor *dx,
                                 attn_tensor *dweight,
                                 attn_tensor *dbias);

#endif
