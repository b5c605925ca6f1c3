/* d2l's masking along a sequence: the valid-lengths reader every attention kernel uses (the one
 * home of the length rules), masked_softmax (attention over given scores with valid_lens and
 * no values) and sequence_mask. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "attention/attn_attention_internal.h"

/* ------------------------------------------------------------ lengths, masks */

attn_status attn_attention_lengths(const char *op, const char *arg, const char *ctx, const attn_tensor *lens, int64_t B,
                                   int64_t Nq, int64_t max_len, int allow_2d, int64_t *out) {
  int one = lens->ndim == 1 && lens->shape[0] == B;
  int two = allow_2d && lens->ndim == 2 && lens->shape[0] == B && lens->shape[1] == Nq;
  if (!one && !two) {
    if (allow_2d)
      return attn_error(ATTN_ERR_SHAPE, "%s: %s has shape %s, which does not fit %s (expected [%lld] or [%lldx%lld])",
                        op, arg, attn_tensor_shape_str(lens), ctx, (long long)B, (long long)B, (long long)Nq);
    return attn_error(ATTN_ERR_SHAPE, "%s: %s has shape %s, which does not fit %s (expected [%lld])", op, arg,
                      attn_tensor_shape_str(lens), ctx, (long long)B);
  }
  int64_t rows = one ? 1 : Nq;
  /* entries read through the strides directly (a per-entry attn_tensor_get was 1% of a
   * Transformer step: its decoder's 2-D lengths are 2,560 entries per call) */
  const char *base = attn_tensor_data(lens);
  const size_t es = attn_dtype_size(lens->dtype);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < rows; i++) {
      int64_t idx[2] = {b, i}, len;
      long long pos = (long long)(b * rows + i) + 1;
      const char *at = base + (size_t)(b * lens->stride[0] + (two ? i * lens->stride[1] : 0)) * es;
      if (lens->dtype == ATTN_I64) {
        len = *(const int64_t *)at;
      } else {
        double v = lens->dtype == ATTN_F32 ? (double)*(const float *)at : *(const double *)at;
        if (!(v == floor(v)) || !isfinite(v))
          return attn_error(ATTN_ERR_ARG, "%s: %s holds %g at entry %lld (1-based), not an integer (%s %s, %s)", op,
                            arg, v, pos, arg, attn_tensor_shape_str(lens), ctx);
        len = v > (double)max_len ? max_len : (v < 0 ? -1 : (int64_t)v);
      }
      if (len < 0)
        return attn_error(ATTN_ERR_ARG, "%s: %s holds %g at entry %lld (1-based), a negative length (%s %s, %s)", op,
                          arg, attn_tensor_get(lens, idx), pos, arg, attn_tensor_shape_str(lens), ctx);
      if (len > max_len) len = max_len; /* longer than the keys: every key is valid (PyTorch) */
      if (one)
        for (int64_t q = 0; q < Nq; q++) out[b * Nq + q] = len;
      else
        out[b * Nq + i] = len;
    }
  return ATTN_OK;
}

/* ------------------------------------------------------------ sparse patterns, global tokens */

attn_status attn_attention_prepare_pattern(attn_attention_job *J, attn_attention_mem *mem, const char *op,
                                           const attn_attention_opts *o) {
  if (o->pattern < ATTN_PATTERN_NONE || o->pattern > ATTN_PATTERN_FIXED)
    return attn_error(ATTN_ERR_ARG, "%s: pattern %d is not one of the ATTN_PATTERN_* values", op, o->pattern);
  J->pattern = o->pattern;
  if (J->pattern != ATTN_PATTERN_NONE) {
    const char *name = J->pattern == ATTN_PATTERN_STRIDED ? "strided" : "fixed";
    if (o->window >= 0)
      return attn_error(ATTN_ERR_ARG, "%s: pattern %s and window %lld exclude each other (the pattern is the local rule)",
                        op, name, (long long)o->window);
    if (o->stride < 1)
      return attn_error(ATTN_ERR_ARG, "%s: pattern %s needs a stride >= 1, got %lld", op, name, (long long)o->stride);
    J->stride = o->stride;
    J->summary = o->summary == 0 ? 1 : o->summary;
    if (J->summary < 1 || J->summary > J->stride)
      return attn_error(ATTN_ERR_ARG, "%s: summary %lld must lie in 1..stride (%lld)", op, (long long)o->summary,
                        (long long)J->stride);
  }
  if (o->nglobal > 0) {
    int64_t L = J->Nq < J->Nk ? J->Nq : J->Nk;
    mem->gcount = attn_alloc((size_t)(L + 1) * sizeof(int64_t), &mem->gcount_cap);
    if (!mem->gcount) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the global positions", op);
    memset(mem->gcount, 0, (size_t)(L + 1) * sizeof(int64_t));
    J->gmin = L;
    J->gmax = -1;
    for (int64_t g = 0; g < o->nglobal; g++) { /* flags first, in gcount[p + 1] */
      int64_t p = o->global[g];
      if (p < 0 || p >= L)
        return attn_error(ATTN_ERR_ARG, "%s: global position %lld is out of range 1..%lld (Nq %lld, Nk %lld)", op,
                          (long long)p + 1, (long long)L, (long long)J->Nq, (long long)J->Nk);
      if (mem->gcount[p + 1])
        return attn_error(ATTN_ERR_ARG, "%s: global position %lld is given twice", op, (long long)p + 1);
      mem->gcount[p + 1] = 1;
      J->gmin = p < J->gmin ? p : J->gmin;
      J->gmax = p > J->gmax ? p : J->gmax;
    }
    for (int64_t p = 0; p < L; p++) mem->gcount[p + 1] += mem->gcount[p];
    J->gcount = mem->gcount;
    J->glen = L;
  }
  J->rule = J->pattern != ATTN_PATTERN_NONE || (J->gcount && J->window >= 0);
  return ATTN_OK;
}

attn_status attn_attention_masked_softmax_forward(const attn_tensor *x, const attn_tensor *valid_lens,
                                                  attn_tensor *out) {
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.valid_lens = valid_lens;
  return attn_attention_scores_forward("masked_softmax", x, NULL, &o, NULL, out);
}

attn_status attn_attention_masked_softmax_backward(const attn_tensor *y, const attn_tensor *dy,
                                                   const attn_tensor *valid_lens, attn_tensor *dx) {
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.valid_lens = valid_lens;
  /* the stored output stands in for the scores: it is only read as weights */
  return attn_attention_scores_backward("masked_softmax backward", y, NULL, &o, y, NULL, dy, dx, NULL);
}

/* ------------------------------------------------------------ sequence_mask */

attn_status attn_attention_sequence_mask(const attn_tensor *x, const attn_tensor *valid_len, double value,
                                         attn_tensor *out) {
  const char *op = "sequence_mask";
  if (x->ndim < 2)
    return attn_error(ATTN_ERR_SHAPE, "%s: X must be (B, T, ...) with at least 2 dims, got %s", op,
                      attn_tensor_shape_str(x));
  if (out->ndim != x->ndim || memcmp(out->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim) || out->dtype != x->dtype)
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s must be a %s tensor of X's shape %s", op,
                      attn_tensor_shape_str(out), attn_dtype_name(x->dtype), attn_tensor_shape_str(x));
  int64_t B = x->shape[0], T = x->shape[1];
  char ctx[96];
  snprintf(ctx, sizeof ctx, "X %s", attn_tensor_shape_str(x));
  size_t cap = 0;
  int64_t *lens = attn_alloc(sizeof(int64_t) * (size_t)(B > 0 ? B : 1), &cap);
  if (!lens) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory (%s)", op, ctx);
  attn_status st = attn_attention_lengths(op, "valid_len", ctx, valid_len, B, 1, T, 0, lens);
  for (int64_t b = 0; st == ATTN_OK && b < B; b++) {
    attn_tensor xs = *x, os = *out;
    attn_view_select(&xs, 0, b);
    attn_view_select(&os, 0, b);
    int64_t len = lens[b];
    if (len > 0) {
      attn_tensor xk = xs, ok = os;
      attn_view_narrow(&xk, 0, 0, len);
      attn_view_narrow(&ok, 0, 0, len);
      st = attn_copy(&ok, &xk);
    }
    if (st == ATTN_OK && len < T) {
      attn_view_narrow(&os, 0, len, T - len);
      st = attn_fill(&os, value);
    }
  }
  attn_free(lens, cap);
  return st;
}

attn_status attn_attention_repeat_rows(const attn_tensor *x, int64_t n, attn_tensor *out) {
  const char *op = "repeat_interleave";
  /* R * n is formed only once it is known to fit (R of an empty view may be up to 2^63 - 1) */
  if (x->ndim < 1 || x->ndim > ATTN_MAX_DIMS - 1 || n < 1 || x->shape[0] > INT64_MAX / n || out->dtype != x->dtype ||
      out->ndim != x->ndim || out->shape[0] != x->shape[0] * n || !attn_tensor_is_contiguous(out))
    return attn_error(ATTN_ERR_SHAPE, "%s: %s repeated %lld times does not fit %s", op, attn_tensor_shape_str(x),
                      (long long)n, attn_tensor_shape_str(out));
  for (int d = 1; d < x->ndim; d++)
    if (out->shape[d] != x->shape[d])
      return attn_error(ATTN_ERR_SHAPE, "%s: %s repeated %lld times does not fit %s", op, attn_tensor_shape_str(x),
                        (long long)n, attn_tensor_shape_str(out));
  /* x read as (R, n, rest...) with stride 0 over the repeats; out is the same shape, contiguous */
  attn_tensor src = *x, dst = *out; /* borrowed views */
  src.ndim = dst.ndim = x->ndim + 1;
  src.shape[0] = dst.shape[0] = x->shape[0];
  src.stride[0] = x->stride[0];
  src.shape[1] = dst.shape[1] = n;
  src.stride[1] = 0;
  for (int d = 1; d < x->ndim; d++) {
    src.shape[d + 1] = dst.shape[d + 1] = x->shape[d];
    src.stride[d + 1] = x->stride[d];
  }
  attn_contiguous_strides(dst.ndim, dst.shape, dst.stride);
  return attn_copy(&dst, &src);
}
