/* attn_rnn: a fused multi-layer GRU over a whole sequence, forward and
 * backward, with PyTorch's gate order (r, z, n) and layouts.
 *
 * Layer k of L (input size in_0 = I, in_k = H above) with weights
 * w_ih[k] (3H, in_k), w_hh[k] (3H, H) and optional biases b_ih[k], b_hh[k]
 * (3H), one step over an input x_t (B, in_k) and state h (B, H):
 *
 *     r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
 *     z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
 *     n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
 *     h' = (1 - z) * n + z * h
 *
 * The input projections of all T steps are one GEMM per layer, the recurrent
 * product one GEMM per step, and the gate math one vectorised pass per step
 * (attn_vmath for float32). Dropout with probability p acts on the outputs of
 * every layer but the last when p > 0: the engine's dropout (attn_dropout.h)
 * with stream seed + k over layer k's output, so backward rebuilds the mask
 * from the seed. Everything runs
 * on the calling thread in a fixed order: results do not depend on the
 * thread count. All operands share a dtype and must be contiguous. */
#ifndef ATTN_RNN_H
#define ATTN_RNN_H

#include "core/attn_saved.h"
#include "core/attn_tensor.h"

/* The buffer forward fills and backward reads (attn_saved.h), for T steps of B samples, H
 * hidden units and L layers: hs (L, T+1, B, H) every layer's states h_0..h_T, rz (L, T, B, 2H)
 * the gates r, z, n (L, T, B, H) the candidates and ghn (L, T, B, H) W_hn h + b_hn; parts in
 * that order (the ATTN_GRU_SAVED_* indices). */
enum { ATTN_GRU_SAVED_HS, ATTN_GRU_SAVED_RZ, ATTN_GRU_SAVED_N, ATTN_GRU_SAVED_GHN };
attn_status attn_gru_saved_layout(int64_t T, int64_t B, int64_t H, int layers, attn_saved_layout *l);

/* x (T, B, I); h0 (L, B, H) or NULL for zeros; w_ih, w_hh, b_ih, b_hh arrays
 * of L tensors (bias entries may be NULL); dropout p in [0, 1).
 * Writes out (T, B, H) (the last layer's states), hn (L, B, H) (every layer's
 * last state) and saved (1-D, contiguous, attn_gru_saved_layout's size). */
attn_status attn_gru_forward(const attn_tensor *x, const attn_tensor *h0, int layers, const attn_tensor *const *w_ih,
                             const attn_tensor *const *w_hh, const attn_tensor *const *b_ih,
                             const attn_tensor *const *b_hh, double dropout, uint64_t seed, attn_tensor *out,
                             attn_tensor *hn, attn_tensor *saved);

/* Gradients of the forward above from dout (T, B, H) and dhn (L, B, H)
 * (either may be NULL for zero). x, h0, weights, dropout, seed and saved as
 * given to (and filled by) forward. Writes dx (T, B, I), dh0 (L, B, H, or
 * NULL to skip), dw_ih[k], dw_hh[k] and db_ih[k], db_hh[k] (NULL entries are
 * skipped; the arrays themselves may not be NULL). */
attn_status attn_gru_backward(const attn_tensor *x, const attn_tensor *h0, int layers,
                              const attn_tensor *const *w_ih, const attn_tensor *const *w_hh, double dropout,
                              uint64_t seed, const attn_tensor *saved, const attn_tensor *dout,
                              const attn_tensor *dhn, attn_tensor *dx, attn_tensor *dh0, attn_tensor *const *dw_ih,
                              attn_tensor *const *dw_hh, attn_tensor *const *db_ih, attn_tensor *const *db_hh);

/* ---- one step's kernels, shared with the fused attention decoder (attn_decoder.c) ----
 * Raw contiguous buffers of dtype dt; float32 runs attn_vmath's vectorised kernels, float64 plain
 * loops (the reference). */

/* The gate math of one step over B rows (the model above and in attn_vmath.h): gi, gh (B, 3H)
 * the input and recurrent projections with biases, hp (B, H) the previous state -> hn (B, H),
 * saved planes rz (B, 2H), n (B, H), ghn (B, H). */
void attn_gru_gates_forward(attn_dtype dt, int64_t B, int64_t H, const void *gi, const void *gh, const void *hp,
                            void *hn, void *rz, void *n, void *ghn);
/* Its gradient: dh (B, H) += dy (B, H), then dgi, dgh (B, 3H) and dh replaced by dh * z (the
 * caller adds dgh W_hh). */
void attn_gru_gates_backward(attn_dtype dt, int64_t B, int64_t H, void *dh, const void *dy, const void *hp,
                             const void *rz, const void *n, const void *ghn, void *dgi, void *dgh);

#endif
