/* attn_lstm: a fused multi-layer LSTM over a whole sequence, forward and
 * backward, with PyTorch's gate order (i, f, g, o) and layouts.
 *
 * Layer k of L (input size in_0 = I, in_k = H above) with weights
 * w_ih[k] (4H, in_k), w_hh[k] (4H, H) and optional biases b_ih[k], b_hh[k]
 * (4H), one step over an input x_t (B, in_k), state h and cell c (B, H):
 *
 *     i = sigmoid(W_ii x + b_ii + W_hi h + b_hi)
 *     f = sigmoid(W_if x + b_if + W_hf h + b_hf)
 *     g = tanh(W_ig x + b_ig + W_hg h + b_hg)
 *     o = sigmoid(W_io x + b_io + W_ho h + b_ho)
 *     c' = f * c + i * g
 *     h' = o * tanh(c')
 *
 * The input projections of all T steps (with both biases) are one GEMM per
 * layer, the recurrent product one GEMM per step added onto the step's rows,
 * and the gate math one pass per step (float32: attn_vmath's sigmoid and tanh
 * rows). The recurrent products run on attn_gemm's threads, whose rows do not
 * depend on the thread count, so neither do the results. Dropout with
 * probability p acts on the outputs of every layer but the last when p > 0:
 * the engine's dropout (attn_dropout.h) with stream seed + k over layer k's
 * output, as the GRU's (attn_rnn.h), so backward rebuilds the mask from the
 * seed. All operands share a dtype and must be contiguous. */
#ifndef ATTN_LSTM_H
#define ATTN_LSTM_H

#include "core/attn_saved.h"
#include "core/attn_tensor.h"

/* The buffer forward fills and backward reads (attn_saved.h), for T steps of B samples, H
 * hidden units and L layers: hs (L, T+1, B, H) every layer's states h_0..h_T, cs (L, T+1, B, H)
 * its cells c_0..c_T, gates (L, T, B, 4H) the activated gates i, f, g, o, and tc (L, T, B, H)
 * tanh(c_t); parts in that order (the ATTN_LSTM_SAVED_* indices). */
enum { ATTN_LSTM_SAVED_HS, ATTN_LSTM_SAVED_CS, ATTN_LSTM_SAVED_GATES, ATTN_LSTM_SAVED_TC };
attn_status attn_lstm_saved_layout(int64_t T, int64_t B, int64_t H, int layers, attn_saved_layout *l);

/* x (T, B, I); h0, c0 (L, B, H) or NULL for zeros; w_ih, w_hh, b_ih, b_hh arrays of L tensors
 * (bias entries may be NULL); dropout p in [0, 1). Writes out (T, B, H) (the last layer's
 * states), hn and cn (L, B, H) (every layer's last state and cell) and saved (1-D, contiguous,
 * attn_lstm_saved_layout's size). */
attn_status attn_lstm_forward(const attn_tensor *x, const attn_tensor *h0, const attn_tensor *c0, int layers,
                              const attn_tensor *const *w_ih, const attn_tensor *const *w_hh,
                              const attn_tensor *const *b_ih, const attn_tensor *const *b_hh, double dropout,
                              uint64_t seed, attn_tensor *out, attn_tensor *hn, attn_tensor *cn, attn_tensor *saved);

/* Gradients of the forward above from dout (T, B, H), dhn and dcn (L, B, H) (any may be NULL
 * for zero). x, weights, dropout, seed and saved as given to (and filled by) forward (the initial
 * state is in saved). Writes dx (T, B, I), dh0 and dc0 (L, B, H, or NULL to skip), dw_ih[k],
 * dw_hh[k], db_ih[k] and db_hh[k] (NULL entries are skipped; the arrays themselves may not be
 * NULL; both bias gradients are the same sums). */
attn_status attn_lstm_backward(const attn_tensor *x, int layers, const attn_tensor *const *w_ih,
                               const attn_tensor *const *w_hh, double dropout, uint64_t seed,
                               const attn_tensor *saved, const attn_tensor *dout, const attn_tensor *dhn,
                               const attn_tensor *dcn, attn_tensor *dx, attn_tensor *dh0, attn_tensor *dc0,
                               attn_tensor *const *dw_ih, attn_tensor *const *dw_hh, attn_tensor *const *db_ih,
                               attn_tensor *const *db_hh);

/* ---- one step's gate math, shared with the fused captioning decoder (attn_caption.c) ----
 * Raw contiguous buffers of dtype dt; float32 runs attn_vmath's sigmoid and tanh rows, float64
 * plain loops. */

/* pre (B, 4H) the pre-activations (both projections and biases, gate order i, f, g, o) and the
 * previous cells cp (B, H) -> the activated gates (B, 4H), the new cells cn, tanh(cn) in tc and
 * the new states hn (B, H). */
void attn_lstm_gates_forward(attn_dtype dt, int64_t B, int64_t H, const void *pre, const void *cp, void *gates,
                             void *cn, void *tc, void *hn);

/* Its gradient: dh (B, H) the new state's gradient from the step after, plus dy (B, H) (this
 * step's output gradient); dc (B, H) the new cell's gradient, replaced by the previous cell's.
 * Writes dG (B, 4H), the pre-activations' gradient (the caller adds dG W_hh to the previous
 * state's). */
void attn_lstm_gates_backward(attn_dtype dt, int64_t B, int64_t H, const void *dh, void *dc, const void *dy,
                              const void *cp, const void *gates, const void *tc, void *dG);

#endif
