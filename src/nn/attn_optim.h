/* attn_optim: fused optimizer updates and gradient clipping.
 *
 * Each update is one pass over a parameter that does, element by element and
 * in the parameter's dtype, the very operations lua/attn/optim.lua's composed
 * path does with whole-tensor ops (the same scalars rounded to the dtype, the
 * same order), so both give the same bits; the composed path stays as the
 * reference the specs compare against. Operands are contiguous, share one
 * float dtype and one element count (shapes may differ), and the written ones
 * (p, and the state buffers) alias nothing else in the call. */
#ifndef ATTN_OPTIM_H
#define ATTN_OPTIM_H

#include "core/attn_tensor.h"

/* torch.optim.Adam / AdamW at step `step` >= 1:
 *   maximize: g = -g
 *   AdamW:  p = p * (1 - lr * weight_decay)
 *   Adam:   g = p * weight_decay + g           (when weight_decay ~= 0)
 *   m = m * beta1 + g * (1 - beta1);  v = v * beta2 + g * g * (1 - beta2)
 *   amsgrad: vmax = maximum(vmax, v) (NaN in either gives NaN), and vmax replaces v below
 *   p = p - m / (sqrt(v) / sqrt(1 - beta2^step) + eps) * (lr / (1 - beta1^step)) */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  int decoupled; /* AdamW's decay instead of Adam's L2 term */
  int64_t step;
  int maximize; /* ascend: the gradient negated first */
} attn_adam_options;

/* p, grad, exp_avg, exp_avg_sq: n entries each; p, exp_avg, exp_avg_sq updated.
 * max_exp_avg_sq: NULL (amsgrad off), or n entries, updated (amsgrad on). */
attn_status attn_adam_step(attn_tensor *p, const attn_tensor *grad, attn_tensor *exp_avg, attn_tensor *exp_avg_sq,
                           attn_tensor *max_exp_avg_sq, const attn_adam_options *o);

/* n Adam updates in one call (a training step's parameters): p[i], grad[i],
 * exp_avg[i], exp_avg_sq[i] (and max_exp_avg_sq[i], the list NULL when
 * amsgrad is off) as attn_adam_step's operands, at step step[i] (o->step is
 * not read); grad[i] has exactly p[i]'s shape. Every parameter's operands are
 * checked before any is written (an error names the position); each update
 * has attn_adam_step's bits. The whole list is one job of the worker pool, in
 * blocks fixed by the sizes, unless two entries share a storage one of them
 * writes: then the updates run in list order. */
attn_status attn_adam_steps(int64_t n, attn_tensor *const *p, const attn_tensor *const *grad,
                            attn_tensor *const *exp_avg, attn_tensor *const *exp_avg_sq,
                            attn_tensor *const *max_exp_avg_sq, const int64_t *step, const attn_adam_options *o);

/* torch.optim.SGD (PyTorch >= 1.13's maximize: the gradient negated first):
 *   g = -g (maximize)
 *   d = p * weight_decay + g (when weight_decay ~= 0), else g
 *   momentum ~= 0: buf = d on the first step, else buf * momentum + d * (1 - dampening)
 *                  (the dampening product only when dampening ~= 0);
 *                  d = nesterov ? d + buf * momentum : buf
 *   p = p - d * lr */
typedef struct {
  double lr, momentum, dampening, weight_decay;
  int nesterov;
  int first; /* buf holds nothing yet: it becomes d */
  int maximize; /* ascend: the gradient negated first */
} attn_sgd_options;

/* p, grad: n entries; buf: n entries, or NULL when momentum is 0. */
attn_status attn_sgd_step(attn_tensor *p, const attn_tensor *grad, attn_tensor *buf, const attn_sgd_options *o);

/* n SGD updates in one call: p[i], grad[i] and buf[i] (buf NULL, or entries
 * NULL, when momentum is 0) as attn_sgd_step's operands; first[i] (first may
 * be NULL: all 0) replaces o->first. Checked before any write, as adam_steps. */
attn_status attn_sgd_steps(int64_t n, attn_tensor *const *p, const attn_tensor *const *grad, attn_tensor *const *buf,
                           const unsigned char *first, const attn_sgd_options *o);

/* The L2 norm of n tensors taken together (any shapes, float dtypes, any
 * strides), squares summed in double, in *norm: over the worker pool in blocks
 * fixed by the sizes alone, added in order, so the same bits on any thread
 * count. */
attn_status attn_grads_norm(int64_t n, const attn_tensor *const *grads, double *norm);

/* The p-norm of n tensors taken together, (sum |x|^p)^(1/p) with the sum in
 * double (p > 0; p = 2 is attn_grads_norm; p = INFINITY is max |x|, NaN when
 * any entry is NaN), in *norm. Same operands as attn_grads_norm. */
attn_status attn_grads_norm_p(int64_t n, const attn_tensor *const *grads, double p, double *norm);

/* Every one of n tensors clamped in place to [lo, hi] (rounded to its dtype;
 * NaN entries stay NaN), any strides. */
attn_status attn_grads_clamp_(int64_t n, attn_tensor *const *grads, double lo, double hi);

/* Every one of n tensors multiplied in place by scale (rounded to its dtype);
 * contiguous float tensors sharing no storage as one job of the worker pool. */
attn_status attn_grads_scale_(int64_t n, attn_tensor *const *grads, double scale);

#endif
