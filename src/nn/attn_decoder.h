/* attn_decoder: the Bahdanau decoder's step loop (d2l's Seq2SeqAttentionDecoder, additive
 * scoring) as one forward and one backward call.
 *
 * Operands: values (B, Nk, dv) (the encoder outputs, also the keys), the attention's W_k (ha, dv)
 * (the keys are projected once, kh = values W_k^T (B, Nk, ha)), optional source lengths valid_lens (B), the steps'
 * embeddings emb (T, B, e) (time-major), the initial state h0 (L, B, H), the attention's W_q
 * (ha, H) and w_v (1, ha) or (ha), and an L-layer GRU whose layer 0 takes dv + e inputs (the
 * book's cat of context and embedding, context first): weights as attn_rnn.h. At step t
 * (0-based), with hs_k[t] the state of layer k before the step:
 *
 *     qh       = hs_{L-1}[t] W_q^T                                  (B, ha)
 *     scores   = attn_attention_additive_scores_forward(qh, kh, w_v) (B, 1, Nk)
 *     context  = attn_attention_scores_forward(scores, values)      (B, 1, dv)
 *                (d2l's masked softmax over valid_lens, dropout on the weights)
 *     x        = cat(context, emb[t])                               (B, dv + e)
 *     hs_k[t+1] = the GRU step of layer k (attn_rnn.h's kernels) on x for k = 0, on the
 *                layer below's new state (after dropout) above.
 *
 * Dropout draws from streams of one seed S: step t's GRU drops layer k's output (k < L-1) with
 * stream S + t*L + k and the attention drops its weights with stream S + t*L + L-1, each over
 * the entries' row-major index within the step (what attn_gru_forward over that one step and
 * attn_attention_scores_forward with those seeds drop), so a step-by-step composition with those
 * seeds gives the same numbers. The attention kernels are the engine's own; the products run on
 * attn_gemm; everything runs in a fixed order, so results do not depend on the thread count.
 * All tensors share a float dtype and must be contiguous. */
#ifndef ATTN_DECODER_H
#define ATTN_DECODER_H

#include "core/attn_saved.h"
#include "core/attn_tensor.h"

typedef struct attn_decoder_args {
  const attn_tensor *w_k;        /* (ha, dv) */
  const attn_tensor *values;     /* (B, Nk, dv): the keys and the values */
  const attn_tensor *valid_lens; /* NULL or (B): d2l's lengths (integers >= 0, above Nk = all) */
  const attn_tensor *emb;        /* (T, B, e) */
  const attn_tensor *h0;         /* (L, B, H) */
  const attn_tensor *w_q;        /* (ha, H) */
  const attn_tensor *w_v;        /* (1, ha) or (ha) */
  int layers;                    /* L >= 1 */
  const attn_tensor *const *w_ih, *const *w_hh; /* L entries: (3H, dv + e) then (3H, H); (3H, H) */
  const attn_tensor *const *b_ih, *const *b_hh; /* L entries (3H) or NULL */
  double attention_dropout;      /* on the weights, in [0, 1]; 0 = off (evaluation) */
  double rnn_dropout;            /* between GRU layers, in [0, 1); 0 = off */
  uint64_t seed;                 /* S above */
} attn_decoder_args;

typedef struct attn_decoder_dims {
  int64_t T, B, Nk, ha, dv, e, H;
  int layers;
} attn_decoder_dims;

/* Checks every operand of a (shapes, dtypes, contiguity, probabilities) and fills d; errors name
 * op and the shapes. Also checks that the saved buffer's layout (attn_decoder_saved_layout) fits. */
attn_status attn_decoder_check(const char *op, const attn_decoder_args *a, attn_decoder_dims *d);

/* The buffer forward fills and backward reads (attn_saved.h): kh (B, Nk, ha) the projected
 * keys; per step qh (T, B, ha), scores and weights (T, B, Nk) (before dropout), the context ctx
 * (T, B, dv); per layer the states hs (L, T+1, B, H) and the GRU's gate planes rz (L, T, B, 2H),
 * n and ghn (L, T, B, H) (attn_rnn.h); parts in that order (the ATTN_DECODER_SAVED_* indices).
 * Refuses sizes past ATTN_SAVED_MAX_NUMEL entries. */
enum {
  ATTN_DECODER_SAVED_KH,
  ATTN_DECODER_SAVED_QH,
  ATTN_DECODER_SAVED_SCORES,
  ATTN_DECODER_SAVED_WEIGHTS,
  ATTN_DECODER_SAVED_CTX,
  ATTN_DECODER_SAVED_HS,
  ATTN_DECODER_SAVED_RZ,
  ATTN_DECODER_SAVED_N,
  ATTN_DECODER_SAVED_GHN
};
attn_status attn_decoder_saved_layout(const attn_decoder_dims *d, attn_saved_layout *l);

/* Writes out (B, T, H) (the top layer's states, batch-major), hn (L, B, H), weights (B, T, Nk)
 * (the attention weights before dropout) and saved (1-D, contiguous, attn_decoder_saved_layout's size). */
attn_status attn_decoder_forward(const attn_decoder_args *a, attn_tensor *out, attn_tensor *hn, attn_tensor *weights,
                                 attn_tensor *saved);

/* Gradients of every operand, written (not accumulated); any entry may be NULL to skip it (the
 * w_ih .. b_hh arrays themselves are NULL or have L entries). */
typedef struct attn_decoder_grads {
  attn_tensor *w_k, *values, *emb, *h0, *w_q, *w_v; /* shapes of the operands */
  attn_tensor *const *w_ih, *const *w_hh, *const *b_ih, *const *b_hh;
} attn_decoder_grads;

/* Backward from dout (B, T, H) and dhn (L, B, H) (either NULL for zero), with a and saved as
 * given to and filled by the forward. */
attn_status attn_decoder_backward(const attn_decoder_args *a, const attn_tensor *saved, const attn_tensor *dout,
                                  const attn_tensor *dhn, const attn_decoder_grads *g);

#endif
