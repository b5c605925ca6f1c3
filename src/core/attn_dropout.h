/* attn_dropout: the engine's one dropout mechanism, inverted dropout with a
 * counter-based mask.
 *
 * Entry `index` of the stream `seed` is dropped when the top 53 bits of
 * attn_rng_hash(seed, index) are below p * 2^53; a kept entry is scaled by
 * 1/(1-p). The mask is a pure function of (seed, index), never stored:
 * backward rebuilds it from the seed, any thread computes any entry, so
 * results are the same bits on every thread count. Its users: nn.dropout
 * (attn_dropout over a tensor's row-major index), the fused GRU between
 * layers (attn_rnn.c, stream seed + layer) and the attention kernels on the
 * weights (index (b*Nq + i)*Nk + j, see attn_attention.h). */
#ifndef ATTN_DROPOUT_H
#define ATTN_DROPOUT_H

#include <stdint.h>

#include "core/attn_rng.h"
#include "core/attn_tensor.h"

typedef struct attn_dropout_rule {
  uint64_t seed;
  uint64_t threshold; /* p * 2^53: an entry is dropped when its 53-bit draw is below */
  double scale;       /* 1 / (1 - p) for a kept entry; 0 when p = 1 */
} attn_dropout_rule;

/* The rule of probability p in [0, 1] (not checked here) and stream seed. */
attn_dropout_rule attn_dropout_rule_make(double p, uint64_t seed);

/* Whether entry index is dropped; inline so mask loops vectorise. */
static inline int attn_dropout_drops(const attn_dropout_rule *r, uint64_t index) {
  return (attn_rng_hash(r->seed, index) >> 11) < r->threshold;
}

/* y[i] = 0 when entry base + i is dropped, else x[i] * scale (computed in
 * double), for i in [0, n); y may be x. */
void attn_dropout_f32(const attn_dropout_rule *r, const float *x, float *y, int64_t n, uint64_t base);
void attn_dropout_f64(const attn_dropout_rule *r, const double *x, double *y, int64_t n, uint64_t base);
/* y (n) = dropout of the contiguous buffer x (n; dt float32 or float64) with probability p and
 * stream seed, entries indexed from 0; y may be x. */
void attn_dropout_flat(attn_dtype dt, const void *x, void *y, int64_t n, uint64_t seed, double p);

/* out = dropout of x (float, any strided view; entries indexed in row-major
 * order) with probability p in [0, 1] and stream seed; out contiguous, of
 * x's shape and dtype (out may be x when x is contiguous). The backward of
 * dropout is the same call on the gradient with the same p and seed. Errors
 * name op. */
attn_status attn_dropout(const char *op, const attn_tensor *x, double p, uint64_t seed, attn_tensor *out);

#endif
