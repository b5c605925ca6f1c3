/* attn_linear: linear attention (Katharopoulos et al. 2020, arXiv:2006.16236), forward and
 * backward, the kernel behind attn.linear_attention and (on features made in Lua) the last step
 * of attn.performer_attention.
 *
 * Shapes (0-based dims, row-major): q (B, Nq, d), k (B, Nk, d), v (B, Nk, dv), out (B, Nq, dv);
 * B is batch (or batch * heads). With a = phi(q_i) and c_j = phi(k_j):
 *   out_i = a^T S_i / (a^T z_i + eps),  S_i = sum_j c_j v_j^T (d x dv),  z_i = sum_j c_j (d),
 * the sums over every key j, or over j <= i when causal (then Nq must equal Nk). phi is
 * elu(x) + 1 (ATTN_LINEAR_ELU1) or the identity (ATTN_LINEAR_IDENTITY: q and k are features
 * already, e.g. Performer's positive random features; they should be >= 0 so the denominator is
 * positive). phi is applied row by row as the rows are read, never stored.
 *
 * Cost: O(B N d dv) time; memory O(d dv) per worker, nothing of size N x N and no (N, d, dv)
 * prefix tensor: the causal forward keeps one running S and z, and the causal backward computes
 * dq in a forward sweep (the running S, z again) and dk, dv in a reverse sweep that keeps the
 * running sums R = sum_{i >= j} a_i gn_i^T and r = sum_{i >= j} gd_i a_i (as idiap/
 * fast-transformers' causal_product_cpu.cpp), where gn_i = g_i / den_i and
 * gd_i = -(g_i . out_i) / den_i. The causal backward parks gn_i in dv's row i between the two
 * sweeps and keeps gd (Nq scalars) in a workspace: O(N) extra per worker.
 *
 * Sums run in the tensors' dtype, item by item in order j = 1..N; items (b) are split over
 * attn_parallel_for, each computed by one thread, so results do not depend on the thread count.
 * Inputs may be any strided views; outputs are contiguous and of the documented shapes. */
#ifndef ATTN_LINEAR_H
#define ATTN_LINEAR_H

#include "core/attn_tensor.h"

enum { ATTN_LINEAR_IDENTITY = 0, ATTN_LINEAR_ELU1 = 1 };

typedef struct attn_linear_opts {
  int causal;  /* nonzero: query i sees keys j <= i (Nq == Nk) */
  double eps;  /* added to every denominator, finite and >= 0 */
  int feature; /* ATTN_LINEAR_ELU1 or ATTN_LINEAR_IDENTITY */
} attn_linear_opts;

/* q (B, Nq, d), k (B, Nk, d), v (B, Nk, dv) -> out (B, Nq, dv). */
attn_status attn_linear_attention_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                          const attn_linear_opts *o, attn_tensor *out);

/* The gradients of a loss with gradient g (B, Nq, dv) at out = forward(q, k, v) (out as the
 * forward returned it: the backward reads it instead of recomputing the numerators):
 * dq (B, Nq, d), dk (B, Nk, d), dv (B, Nk, dv), all written. */
attn_status attn_linear_attention_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                           const attn_tensor *out, const attn_tensor *g, const attn_linear_opts *o,
                                           attn_tensor *dq, attn_tensor *dk, attn_tensor *dv);

#endif
