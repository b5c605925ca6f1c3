/* attn_rope: rotary position embedding (RoPE, Su et al., arXiv:2104.09864) of x (..., N, d),
 * forward and backward in one pass each.
 *
 * d is even; the d/2 frequencies are theta_i = base^(-2i/d), i = 0..d/2-1 (0-based), and each
 * pair of features of the token at position p is rotated by the angle p * theta_i:
 *
 *     (a, b) -> (a cos - b sin, b cos + a sin)      forward
 *     (a, b) -> (a cos + b sin, b cos - a sin)      backward (the rotation by -angle: its transpose)
 *
 * with pairs (x_i, x_{i+d/2}) by default (GPT-NeoX, Llama) and (x_{2i}, x_{2i+1}) when
 * `interleaved` (RoFormer, GPT-J). cos and sin are computed in double, as
 * cos((double)p * pow(base, (double)(-2i) / d)), and rounded once to x's dtype; each output is
 * then two products and one sum in x's dtype. So the numbers are those of the composed tensor
 * ops (lua/attn/rope.lua's composed path), bit for bit.
 *
 * Positions: token t (0-based along N) is at position t unless `positions` says otherwise:
 * (N), or (B, N) per sample when x has at least 3 dims and B is x's first size (or 1); any
 * dtype, every value an integer >= 0. The optional tables cos and sin (P, d/2) of x's dtype,
 * contiguous (attn_rope_tables fills them), are a cache: position p < P reads row p, any other
 * is computed as above (the same numbers). Rows of x (every index before the last dim) are
 * split over the worker pool; each output depends only on its own pair, so the bits do not
 * depend on the thread count. */
#ifndef ATTN_ROPE_H
#define ATTN_ROPE_H

#include "core/attn_tensor.h"

typedef struct {
  const attn_tensor *positions; /* NULL: position t for token t; (N) or (B, N) */
  const attn_tensor *cos, *sin; /* NULL, or both (P, d/2) tables of x's dtype, contiguous */
  double base;                  /* > 0 and finite (10000 in every reference implementation) */
  int interleaved;              /* pairs (x_{2i}, x_{2i+1}) instead of (x_i, x_{i+d/2}) */
} attn_rope_opts;

/* x (..., N, d) float, any strides, d even; out x's shape and dtype, contiguous, not sharing
 * x's storage. op names the caller in errors ("rope" when NULL). */
attn_status attn_rope_forward(const char *op, const attn_tensor *x, const attn_rope_opts *o, attn_tensor *out);

/* The gradient of the forward above: dout (..., N, d) rotated by the opposite angles into dx
 * (same rules as x and out). */
attn_status attn_rope_backward(const char *op, const attn_tensor *dout, const attn_rope_opts *o, attn_tensor *dx);

/* cos and sin (P, d/2), float, same dtype, contiguous: row p gets the cos and sin of the angles
 * of position p, as above. */
attn_status attn_rope_tables(double base, attn_tensor *cos, attn_tensor *sin);

#endif
