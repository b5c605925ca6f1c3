/* attn_layernorm: layer normalisation over rows, forward and backward each in
 * one pass, as PyTorch's LayerNorm computes it.
 *
 * x is read as rows of n entries (the trailing dims the caller normalises
 * over). Row r with mean mu_r and biased variance var_r becomes
 *
 *     xhat = (x - mu_r) * rstd_r,   rstd_r = 1 / sqrt(var_r + eps)
 *     y    = xhat * weight + bias   (each factor only when given)
 *
 * Sums are accumulated in double for both dtypes. Rows are split over the
 * worker pool; the column sums of backward (dweight, dbias) are a second pass
 * split over columns, each column summed over all rows in row order, so
 * results do not depend on the thread count. Every operand must be
 * contiguous; x, weight, bias, out, dout and the gradients share x's float
 * dtype; the saved mean and rstd are float64 whatever x's dtype. */
#ifndef ATTN_LAYERNORM_H
#define ATTN_LAYERNORM_H

#include "core/attn_saved.h"
#include "core/attn_tensor.h"

/* The number of rows of x for rows of n entries, in *rows: the shape rule
 * of every function below, public so a caller (the Lua binding) sizes the
 * saved buffer by the same rule before calling forward. Fails, naming op,
 * when x is not a contiguous float tensor or n is not >= 1 and a divisor of
 * x's numel. */
attn_status attn_layer_norm_rows(const char *op, const attn_tensor *x, int64_t n, int64_t *rows);

/* The buffer forward fills and backward reads (attn_saved.h) for `rows`
 * rows: mean (rows) and rstd (rows), each row's mean and 1 / sqrt(var + eps);
 * parts in that order (the ATTN_LAYER_NORM_SAVED_* indices), float64 whatever
 * x's dtype (the layout fixes it). */
enum { ATTN_LAYER_NORM_SAVED_MEAN, ATTN_LAYER_NORM_SAVED_RSTD };
attn_status attn_layer_norm_saved_layout(int64_t rows, attn_saved_layout *l);

/* x (rows * n entries, any shape), n >= 1 dividing x's numel; weight and
 * bias (n entries, any shape) or NULL; eps as given (not validated: a
 * negative one gives NaN rows as the composed ops would).
 * Writes out (x's numel) and saved (1-D, contiguous, float64,
 * attn_layer_norm_saved_layout's size). */
attn_status attn_layer_norm_forward(const attn_tensor *x, int64_t n, const attn_tensor *weight,
                                    const attn_tensor *bias, double eps, attn_tensor *out, attn_tensor *saved);

/* Gradients of the forward above from dout (x's numel): x, n, weight and
 * saved as given to and filled by forward. Writes dx (x's numel, or NULL to
 * skip), dweight and dbias (n entries each, or NULL to skip). */
attn_status attn_layer_norm_backward(const attn_tensor *x, int64_t n, const attn_tensor *weight,
                                     const attn_tensor *saved, const attn_tensor *dout, attn_tensor *dx,
                                     attn_tensor *dweight, attn_tensor *dbias);

/* RMSNorm (Zhang & Sennrich 2019) by the same kernels without the centring: row r becomes
 *
 *     y = x * rstd_r * weight,   rstd_r = 1 / sqrt(mean(x^2) + eps)
 *
 * with the saved buffer of the layout above (its mean part all zeros) and no bias. */
attn_status attn_rms_norm_forward(const attn_tensor *x, int64_t n, const attn_tensor *weight, double eps,
                                  attn_tensor *out, attn_tensor *saved);
attn_status attn_rms_norm_backward(const attn_tensor *x, int64_t n, const attn_tensor *weight,
                                   const attn_tensor *saved, const attn_tensor *dout, attn_tensor *dx,
                                   attn_tensor *dweight);

#endif
