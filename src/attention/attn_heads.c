/* The head layout of multi-head attention (d2l's transpose_qkv and transpose_output) as one
 * strided copy each: the 4-D views below are never materialised, so a move costs one pass over
 * the data instead of a reshape, a permute and a copying reshape. */
#include "attention/attn_attention.h"

/* Row-major strides of a contiguous (B*H, N, dh) or (B, N, H*dh) tensor are the only layout the
 * outputs take; the inputs may be any strided view. */
static attn_status check_out(const char *op, const attn_tensor *x, const attn_tensor *out, const int64_t *want) {
  if (out->dtype != x->dtype || out->ndim != 3 || out->shape[0] != want[0] || out->shape[1] != want[1] ||
      out->shape[2] != want[2] || !attn_tensor_is_contiguous(out))
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s must be a contiguous [%lldx%lldx%lld] %s tensor", op,
                      attn_tensor_shape_str(out), (long long)want[0], (long long)want[1], (long long)want[2],
                      attn_dtype_name(x->dtype));
  return ATTN_OK;
}

/* The output's one grown dim (B*H rows or H*dh columns) past int64: an empty x may have such
 * dims. An empty output is then returned before any stride product is formed. */
static attn_status too_many(const char *op, const attn_tensor *x, int64_t heads) {
  return attn_error(ATTN_ERR_SHAPE, "%s: X %s with num_heads %lld gives a dim past 2^63 - 1", op,
                    attn_tensor_shape_str(x), (long long)heads);
}

/* x is 3-D (the layout errors name) with dim `dim` (its `what`) a multiple of heads >= 1. */
static attn_status check_x(const char *op, const attn_tensor *x, int64_t heads, const char *layout, int dim,
                           const char *what) {
  if (x->ndim != 3) return attn_error(ATTN_ERR_SHAPE, "%s: X must be %s, got %s", op, layout, attn_tensor_shape_str(x));
  if (heads < 1 || x->shape[dim] % heads != 0)
    return attn_error(ATTN_ERR_ARG, "%s: %s %lld of X %s is not divisible by num_heads %lld", op, what,
                      (long long)x->shape[dim], attn_tensor_shape_str(x), (long long)heads);
  return ATTN_OK;
}

attn_status attn_attention_split_heads(const attn_tensor *x, int64_t heads, attn_tensor *out) {
  const char *op = "split_heads";
  attn_status st = check_x(op, x, heads, "(B, N, H*dh)", 2, "width");
  if (st != ATTN_OK) return st;
  int64_t B = x->shape[0], N = x->shape[1], dh = x->shape[2] / heads, BH;
  if (__builtin_mul_overflow(B, heads, &BH)) return too_many(op, x, heads);
  int64_t want[3] = {BH, N, dh};
  st = check_out(op, x, out, want);
  if (st != ATTN_OK || attn_tensor_numel(out) == 0) return st;
  /* x as (B, N, H, dh) read in (B, H, N, dh) order; out is (B*H, N, dh) = (B, H, N, dh) */
  int64_t shape[4] = {B, heads, N, dh};
  int64_t xs[4] = {x->stride[0], dh * x->stride[2], x->stride[1], x->stride[2]};
  int64_t os[4] = {heads * N * dh, N * dh, dh, 1};
  attn_tensor src = attn_view_as_strided(x, 4, shape, xs), dst = attn_view_as_strided(out, 4, shape, os);
  return attn_copy(&dst, &src);
}

attn_status attn_attention_merge_heads(const attn_tensor *x, int64_t heads, attn_tensor *out) {
  const char *op = "merge_heads";
  attn_status st = check_x(op, x, heads, "(B*H, N, dh)", 0, "batch");
  if (st != ATTN_OK) return st;
  int64_t B = x->shape[0] / heads, N = x->shape[1], dh = x->shape[2], Hdh;
  if (__builtin_mul_overflow(heads, dh, &Hdh)) return too_many(op, x, heads);
  int64_t want[3] = {B, N, Hdh};
  st = check_out(op, x, out, want);
  if (st != ATTN_OK || attn_tensor_numel(out) == 0) return st;
  /* x (B*H, N, dh) = (B, H, N, dh) read in out's own (B, N, H, dh) order: the destination is
   * then one contiguous run, which attn_copy fills row by row without its general iterator (in
   * x's order every 8-column row of a book-sized head cost an indirect call: 4% of a step) */
  int64_t shape[4] = {B, N, heads, dh};
  int64_t xs[4] = {heads * x->stride[0], x->stride[1], x->stride[0], x->stride[2]};
  int64_t os[4] = {N * heads * dh, heads * dh, dh, 1};
  attn_tensor src = attn_view_as_strided(x, 4, shape, xs), dst = attn_view_as_strided(out, 4, shape, os);
  return attn_copy(&dst, &src);
}
