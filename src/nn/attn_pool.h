/* attn_pool: 2-D max, average and adaptive average pooling (PyTorch's), forward and backward.
 *
 * x (N, C, H, W) -> y (N, C, Ho, Wo), each of the N C planes on its own:
 *
 *     Ho = (H + 2 ph - kh) / sh + 1   (floor; likewise Wo), padding at most half the kernel
 *
 * Max pooling takes the largest entry of each window (padding never wins: it is -inf; a NaN
 * wins as in PyTorch) and saves its index in the plane (ih W + iw, int64, PyTorch's indices) for
 * backward, which adds dy there. Average pooling divides the window's sum by kh kw
 * (count_include_pad) or by the number of entries inside the input. Adaptive average pooling
 * to (Ho, Wo) averages rows [floor(i H / Ho), ceil((i + 1) H / Ho)) (likewise columns).
 * Planes are split over the worker pool and each is computed in a fixed order, so the bits do not
 * depend on the thread count. These loops are plain: they are also the reference path. Operands
 * are contiguous and share x's float dtype (indices: int64). */
#ifndef ATTN_POOL_H
#define ATTN_POOL_H

#include "core/attn_tensor.h"

typedef struct attn_pool2d_params {
  int64_t kernel[2];  /* >= 1, (h, w) */
  int64_t stride[2];  /* >= 1 */
  int64_t padding[2]; /* >= 0, at most kernel / 2 */
  int count_include_pad; /* average pooling only */
} attn_pool2d_params;

/* The output shape of max or average pooling x (4-D) with p, in out; fails naming op, the shape
 * and the values (non-positive kernel or stride, negative or too much padding, a kernel larger
 * than the padded input). */
attn_status attn_pool2d_shape(const char *op, const attn_tensor *x, const attn_pool2d_params *p, int64_t out[4]);

/* y and indices (int64), both of attn_pool2d_shape. */
attn_status attn_max_pool2d_forward(const attn_tensor *x, const attn_pool2d_params *p, attn_tensor *y,
                                    attn_tensor *indices);
/* dx (N, C, H, W) from dy and the forward's indices (both (N, C, Ho, Wo)). */
attn_status attn_max_pool2d_backward(const attn_tensor *indices, const attn_tensor *dy, attn_tensor *dx);

attn_status attn_avg_pool2d_forward(const attn_tensor *x, const attn_pool2d_params *p, attn_tensor *y);
/* dx (the input's shape, given by dx) from dy (attn_pool2d_shape of dx). */
attn_status attn_avg_pool2d_backward(const attn_pool2d_params *p, const attn_tensor *dy, attn_tensor *dx);

/* y (N, C, Ho, Wo): the output size is y's; Ho, Wo >= 1. */
attn_status attn_adaptive_avg_pool2d_forward(const attn_tensor *x, attn_tensor *y);
attn_status attn_adaptive_avg_pool2d_backward(const attn_tensor *dy, attn_tensor *dx);

#endif
