/* attn_caption: the Show, Attend and Tell decoder's step loop (nn.ShowAttendTell with an LSTM
 * and attention, lua/attn/nn/captioning.lua) as one forward and one backward call.
 *
 * Operands: the annotation vectors feats (B, L, D), their projected keys (B, L, A) (W_k feats
 * plus the location term, computed by the caller once), w_v (A) or (1, A), the steps' embeddings
 * emb (T, B, E) (time-major), the initial state h0 and cell c0 (B, H), the attention's W_q (A, H),
 * the gate's w_beta (1, H) and b_beta (1) or NULL, and one LSTM cell over E + D inputs (the
 * embedding first, then the context; weights as attn_lstm.h: w_ih (4H, E + D), w_hh (4H, H),
 * b_ih, b_hh (4H) or NULL). At step t (0-based), from h = hs[t], c = cs[t]:
 *
 *     qh      = h W_q^T                                             (B, A)
 *     scores  = attn_attention_additive_scores_forward(qh, keys, w_v) (B, 1, L)
 *     alpha, ctx = attn_attention_scores_forward(scores, feats)     (B, 1, L), (B, 1, D)
 *                (a plain softmax: no lengths, no dropout)
 *     beta    = sigmoid(h w_beta^T + b_beta)                        (B, 1)
 *     z       = beta ctx                                            (B, D)
 *     hs[t+1], cs[t+1] = the LSTM step (attn_lstm.h's gate math) on x = cat(emb[t], z)
 *
 * Outputs, batch-major: out (B, T, H + D) = cat(hs[t+1], z_t) (what the output layer reads),
 * alphas (B, T, L), betas (B, T); all three are differentiable. The products run on attn_gemm
 * and the forward's attention kernels are the engine's own, all in a fixed order, so results do not depend
 * on the thread count. All tensors share a float dtype and must be contiguous. */
#ifndef ATTN_CAPTION_H
#define ATTN_CAPTION_H

#include "core/attn_saved.h"
#include "core/attn_tensor.h"

typedef struct attn_caption_args {
  const attn_tensor *feats;        /* (B, L, D) */
  const attn_tensor *keys;         /* (B, L, A) */
  const attn_tensor *w_v;          /* (A) or (1, A) */
  const attn_tensor *emb;          /* (T, B, E) */
  const attn_tensor *h0, *c0;      /* (B, H) */
  const attn_tensor *w_q;          /* (A, H) */
  const attn_tensor *w_beta;       /* (1, H) */
  const attn_tensor *b_beta;       /* (1) or NULL */
  const attn_tensor *w_ih, *w_hh;  /* (4H, E + D), (4H, H) */
  const attn_tensor *b_ih, *b_hh;  /* (4H) or NULL */
} attn_caption_args;

typedef struct attn_caption_dims {
  int64_t T, B, L, D, A, E, H;
} attn_caption_dims;

/* Checks every operand of a (shapes, dtypes, contiguity) and fills d; errors name op and the
 * shapes. */
attn_status attn_caption_check(const char *op, const attn_caption_args *a, attn_caption_dims *d);

/* The buffer forward fills and backward reads (attn_saved.h): the states hs and cells cs
 * (T+1, B, H), the activated gates (T, B, 4H) and tanh of the cells tc (T, B, H) (attn_lstm.h's
 * planes), the queries qh (T, B, A), scores and weights (T, B, L), the contexts ctx (T, B, D)
 * (before the gate), the gates beta (T, B) and the attention's tanh(qh + keys) (T, B, L, A), which
 * the backward reads instead of evaluating it again (T B L A entries: 720 KiB in float32 at 64 x
 * 5 words x 9 cells x 64 units, about as much as the other parts together); parts in that order
 * (ATTN_CAPTION_SAVED_*). */
enum {
  ATTN_CAPTION_SAVED_HS,
  ATTN_CAPTION_SAVED_CS,
  ATTN_CAPTION_SAVED_GATES,
  ATTN_CAPTION_SAVED_TC,
  ATTN_CAPTION_SAVED_QH,
  ATTN_CAPTION_SAVED_SCORES,
  ATTN_CAPTION_SAVED_WEIGHTS,
  ATTN_CAPTION_SAVED_CTX,
  ATTN_CAPTION_SAVED_BETA,
  ATTN_CAPTION_SAVED_TANH
};
attn_status attn_caption_saved_layout(const attn_caption_dims *d, attn_saved_layout *l);

/* Writes out (B, T, H + D), alphas (B, T, L), betas (B, T) and saved (1-D, contiguous,
 * attn_caption_saved_layout's size). */
attn_status attn_caption_forward(const attn_caption_args *a, attn_tensor *out, attn_tensor *alphas,
                                 attn_tensor *betas, attn_tensor *saved);

/* Gradients of every operand, written (not accumulated); any entry may be NULL to skip it
 * (b_ih, b_hh, b_beta also when the operand is NULL). */
typedef struct attn_caption_grads {
  attn_tensor *feats, *keys, *w_v, *emb, *h0, *c0, *w_q, *w_beta, *b_beta, *w_ih, *w_hh, *b_ih, *b_hh;
} attn_caption_grads;

/* Backward from dout (B, T, H + D), dalphas (B, T, L) and dbetas (B, T) (any NULL for zero),
 * with a and saved as given to and filled by the forward. */
attn_status attn_caption_backward(const attn_caption_args *a, const attn_tensor *saved, const attn_tensor *dout,
                                  const attn_tensor *dalphas, const attn_tensor *dbetas, const attn_caption_grads *g);

#endif
