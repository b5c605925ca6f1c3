/* attn_loss: softmax cross-entropy over rows as one forward and one backward
 * kernel, optionally masked by valid lengths (d2l's MaskedSoftmaxCELoss).
 *
 * logits are R rows of C classes (a float tensor (..., C) whose last dim has
 * unit stride; the rows may lie anywhere, as a permuted view's do); index holds R 0-based class ids (int64, contiguous: what
 * attn_index_convert writes from 1-based labels). When valid_len is given,
 * rows are read as (B, steps) with R = B * steps, and row (b, t) (t 0-based)
 * counts when t + 1 <= valid_len[b] (valid_len: B entries, contiguous, any
 * dtype; NaN counts nothing). Per row, in the logits' dtype, the same
 * operations as log_softmax, gather, neg and a 0/1 mask product:
 *
 *     m = max x (0 for a row of -inf),  s = log(sum exp(x - m))
 *     loss = -((x[y] - m) - s) * mask
 *     dlogits = exp((x - m) - s) * (g * mask) - onehot(y) * (g * mask)
 *
 * With label smoothing eps (the _smoothed entry points; PyTorch's, over the
 * C classes), loss = ((1 - eps) * -log p[y] + eps * -mean_c log p[c]) * mask
 * and dlogits = (p - (1 - eps) onehot(y) - eps / C) * (g * mask); eps = 0
 * gives the plain kernels' numbers exactly (the plain entry points call these).
 *
 * so a row past its valid length gives loss 0 (NaN when the row holds one,
 * as the product gives) and gradient 0. Rows are split over the worker pool;
 * each is independent, so results do not depend on the thread count. */
#ifndef ATTN_LOSS_H
#define ATTN_LOSS_H

#include "core/attn_saved.h"
#include "core/attn_tensor.h"

/* The buffer forward fills and backward reads (attn_saved.h) for R rows, in
 * the logits' dtype: stats (R, 2), each row's m and s (the one part,
 * ATTN_SOFTMAX_CE_SAVED_STATS). The ids are an operand of both (index), not a
 * part: they are int64, and the buffer has one dtype. */
enum { ATTN_SOFTMAX_CE_SAVED_STATS };
attn_status attn_softmax_ce_saved_layout(int64_t rows, attn_saved_layout *l);

/* Writes loss (R entries, logits' dtype), saved (1-D, contiguous, logits'
 * dtype, attn_softmax_ce_saved_layout's size) and *count (rows that count).
 * valid_len may be NULL (every row counts; steps is then ignored). */
attn_status attn_softmax_ce_forward(const attn_tensor *logits, const attn_tensor *index,
                                    const attn_tensor *valid_len, int64_t steps, attn_tensor *loss,
                                    attn_tensor *saved, int64_t *count);

/* dlogits (logits' shape, contiguous, apart from logits) from dloss (R entries, any shape,
 * contiguous) and the forward's saved; the other operands as given to forward. */
attn_status attn_softmax_ce_backward(const attn_tensor *logits, const attn_tensor *index,
                                     const attn_tensor *valid_len, int64_t steps, const attn_tensor *saved,
                                     const attn_tensor *dloss, attn_tensor *dlogits);

/* The same with label smoothing eps in [0, 1] (see above); backward takes forward's eps. */
attn_status attn_softmax_ce_smoothed_forward(const attn_tensor *logits, const attn_tensor *index,
                                             const attn_tensor *valid_len, int64_t steps, double smoothing,
                                             attn_tensor *loss, attn_tensor *saved, int64_t *count);
attn_status attn_softmax_ce_smoothed_backward(const attn_tensor *logits, const attn_tensor *index,
                                              const attn_tensor *valid_len, int64_t steps, double smoothing,
                                              const attn_tensor *saved, const attn_tensor *dloss,
                                              attn_tensor *dlogits);

#endif
