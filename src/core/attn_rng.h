/* attn_rng: a seedable generator (xoshiro256**, seeded through splitmix64).
 *
 * The state is a plain struct owned by the caller (the binding keeps one per
 * Lua state); fills run sequentially in element order, so the same seed gives
 * the same numbers on every run and thread count. */
#ifndef ATTN_RNG_H
#define ATTN_RNG_H

#include "core/attn_tensor.h"

typedef struct attn_rng {
  uint64_t s[4];
} attn_rng;

void attn_rng_seed(attn_rng *rng, uint64_t seed);
uint64_t attn_rng_next(attn_rng *rng);
/* Uniform double in [0, 1) with 53 random bits. */
double attn_rng_uniform01(attn_rng *rng);

/* A counter-based draw: the splitmix64 finaliser of seed + (index + 1) times
 * the golden ratio. Stateless, so a kernel can recompute entry `index` of a
 * random mask (dropout) in backward, in any order, on any thread; inline, so
 * mask loops vectorise. */
static inline uint64_t attn_rng_hash(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Fill t (any strided view) in row-major element order. */
attn_status attn_rng_uniform(attn_rng *rng, attn_tensor *t, double low, double high);
attn_status attn_rng_normal(attn_rng *rng, attn_tensor *t, double mean, double std);
/* uniform and normal need a float t (attn_check_float). */
/* 1 with probability p, else 0; p in [0, 1]. Any dtype. */
attn_status attn_rng_bernoulli(attn_rng *rng, attn_tensor *t, double p);
/* Uniform integer in [0, n) without modulo bias (n = 0: all of uint64). */
uint64_t attn_rng_below(attn_rng *rng, uint64_t n);
/* Integers uniform in [low, high) (PyTorch's randint), any dtype (float
 * dtypes round values past their precision). low < high. */
attn_status attn_rng_randint(attn_rng *rng, attn_tensor *t, int64_t low, int64_t high);
/* probs (R, C) float, rows of nonnegative weights (need not sum to 1) -> out
 * (R, n) int64, contiguous: n 0-based category draws per row, row after row.
 * Without replacement a drawn category's weight becomes 0, so n may not
 * exceed the row's nonzero categories. Validates everything before drawing. */
attn_status attn_rng_multinomial(attn_rng *rng, const attn_tensor *probs, int64_t n, int replacement,
                                 attn_tensor *out);

#endif
