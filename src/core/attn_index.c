/* Index-based selection and its accumulating reverse, plus creation kernels. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/attn_ops.h"

static attn_status check_index_args(const char *op, const attn_tensor *x, int dim, const int64_t *index,
                                    int64_t n, int64_t limit) {
  if (dim < 0 || dim >= x->ndim)
    return attn_error(ATTN_ERR_ARG, "%s: dim %d out of range for %d-D tensor %s", op, dim + 1, x->ndim,
                      attn_tensor_shape_str(x));
  for (int64_t k = 0; k < n; k++)
    if (index[k] < 0 || index[k] >= limit)
      return attn_error(ATTN_ERR_ARG, "%s: index %lld at position %lld out of range 1..%lld for dim %d of %s",
                        op, (long long)index[k] + 1, (long long)k + 1, (long long)limit, dim + 1,
                        attn_tensor_shape_str(x));
  return ATTN_OK;
}

static attn_status check_slices(const char *op, const attn_tensor *big, const attn_tensor *small, int dim,
                                int64_t n) {
  if (big->ndim != small->ndim || big->dtype != small->dtype || small->shape[dim] != n)
    goto bad;
  for (int d = 0; d < big->ndim; d++)
    if (d != dim && big->shape[d] != small->shape[d]) goto bad;
  return ATTN_OK;
bad:
  return attn_error(ATTN_ERR_SHAPE, "%s: %s and %s differ outside dim %d (or in dtype), or dim %d is not %lld",
                    op, attn_tensor_shape_str(big), attn_tensor_shape_str(small), dim + 1, dim + 1,
                    (long long)n);
}

attn_status attn_index_select(const attn_tensor *x, int dim, const int64_t *index, int64_t n, attn_tensor *out) {
  attn_status st = check_index_args("index_select", x, dim, index, n, dim >= 0 && dim < x->ndim ? x->shape[dim] : 0);
  if (st == ATTN_OK) st = check_slices("index_select", x, out, dim, n);
  if (st != ATTN_OK) return st;
  if (dim == 0 && attn_tensor_is_contiguous(x) && attn_tensor_is_contiguous(out)) {
    /* whole rows (an embedding lookup): one memcpy each instead of a strided copy call */
    size_t row = (size_t)(attn_tensor_numel(x) / (x->shape[0] > 0 ? x->shape[0] : 1)) * attn_dtype_size(x->dtype);
    const char *xs = attn_tensor_data(x);
    char *os = attn_tensor_data(out);
    for (int64_t k = 0; k < n; k++) memcpy(os + (size_t)k * row, xs + (size_t)index[k] * row, row);
    return ATTN_OK;
  }
  for (int64_t k = 0; k < n; k++) {
    attn_tensor src = *x, dst = *out;
    attn_view_select(&src, dim, index[k]);
    attn_view_select(&dst, dim, k);
    attn_copy(&dst, &src);
  }
  return ATTN_OK;
}

attn_status attn_index_add(attn_tensor *out, int dim, const int64_t *index, int64_t n, const attn_tensor *src_in) {
  attn_status st = check_index_args("index_add", out, dim, index, n, dim >= 0 && dim < out->ndim ? out->shape[dim] : 0);
  if (st == ATTN_OK) st = check_slices("index_add", out, src_in, dim, n);
  if (st != ATTN_OK) return st;
  attn_tensor tmp; /* a source overlapping out is read from a copy */
  const attn_tensor *src;
  st = attn_unalias(out, src_in, &tmp, &src);
  if (st == ATTN_OK && dim == 0 && out->dtype != ATTN_I64 && attn_tensor_is_contiguous(out) &&
      attn_tensor_is_contiguous(src)) {
    /* whole rows (an embedding's gradient): the same additions in the same
     * order as the per-row attn_binary calls below, without their setup */
    int64_t row = attn_tensor_numel(out) / (out->shape[0] > 0 ? out->shape[0] : 1);
    for (int64_t k = 0; k < n; k++) {
      if (out->dtype == ATTN_F32) {
        float *d = (float *)attn_tensor_data(out) + index[k] * row;
        const float *a = (const float *)attn_tensor_data(src) + k * row;
        for (int64_t j = 0; j < row; j++) d[j] = d[j] + a[j];
      } else {
        double *d = (double *)attn_tensor_data(out) + index[k] * row;
        const double *a = (const double *)attn_tensor_data(src) + k * row;
        for (int64_t j = 0; j < row; j++) d[j] = d[j] + a[j];
      }
    }
    attn_tensor_free(&tmp);
    return ATTN_OK;
  }
  for (int64_t k = 0; st == ATTN_OK && k < n; k++) { /* in order: repeated indices accumulate deterministically */
    attn_tensor s = *src, d = *out;
    attn_view_select(&s, dim, k);
    attn_view_select(&d, dim, index[k]);
    st = attn_binary(ATTN_ADD, &d, &s, &d);
  }
  attn_tensor_free(&tmp);
  return st;
}

attn_status attn_index_convert(const char *op, const char *what, const char *ctx, const attn_tensor *src,
                               int64_t base, int64_t limit, attn_tensor *out) {
  int64_t n = attn_tensor_numel(src), pos[ATTN_MAX_DIMS] = {0};
  if (out && (out->dtype != ATTN_I64 || !attn_tensor_is_contiguous(out) || attn_tensor_numel(out) != n))
    return attn_error(ATTN_ERR_SHAPE, "%s: index output %s must be a contiguous int64 tensor of %lld elements", op,
                      attn_tensor_shape_str(out), (long long)n);
  char shape_ctx[64];
  if (!ctx) {
    snprintf(shape_ctx, sizeof shape_ctx, "indices %s", attn_tensor_shape_str(src));
    ctx = shape_ctx;
  }
  int64_t *o = out ? attn_tensor_data(out) : NULL;
  /* a contiguous source (the usual batch of ids) is read straight through: the per-element
   * position walk cost more than the checks (an embedding's 640 ids took ~10 us) */
  const void *flat = attn_tensor_is_contiguous(src) ? attn_tensor_data(src) : NULL;
  for (int64_t e = 0; e < n; e++) {
    int64_t v;
    if (src->dtype == ATTN_I64) {
      v = flat ? ((const int64_t *)flat)[e] : attn_tensor_get_i64(src, pos);
    } else {
      double d = !flat ? attn_tensor_get(src, pos)
                       : (src->dtype == ATTN_F32 ? ((const float *)flat)[e] : ((const double *)flat)[e]);
      if (!(d == floor(d) && fabs(d) < 9.0e15))
        return attn_error(ATTN_ERR_ARG, "%s: %s %g at position %lld is not an integer (%s)", op, what, d,
                          (long long)e + 1, ctx);
      v = (int64_t)d;
    }
    if (v < base && limit < 0) /* the upper bound is checked later, by the kernel that knows the sizes */
      return attn_error(ATTN_ERR_ARG, "%s: %s %lld at position %lld is out of range: indices start at %lld (%s)", op,
                        what, (long long)v, (long long)e + 1, (long long)base, ctx);
    if (v < base || (limit >= 0 && v - base >= limit)) /* the last id as limit - 1 + base: no overflow at 2^63 - 1 */
      return attn_error(ATTN_ERR_ARG, "%s: %s %lld at position %lld is out of range %lld..%lld (%s)", op, what,
                        (long long)v, (long long)e + 1, (long long)base, (long long)(limit - 1 + base), ctx);
    if (o) o[e] = v - base;
    if (flat) continue;
    for (int d = src->ndim - 1; d >= 0; d--) {
      if (++pos[d] < src->shape[d]) break;
      pos[d] = 0;
    }
  }
  return ATTN_OK;
}

/* Shared walk of gather/scatter_add: visits every element of index in
 * row-major order with the offsets into the indexed tensor and the other one. */
static attn_status gather_walk(const char *op, const attn_tensor *big, int dim, const attn_tensor *index,
                               const attn_tensor *other, int scatter) {
  if (dim < 0 || dim >= big->ndim)
    return attn_error(ATTN_ERR_ARG, "%s: dim %d out of range for %d-D tensor %s", op, dim + 1, big->ndim,
                      attn_tensor_shape_str(big));
  if (index->dtype != ATTN_I64)
    return attn_error(ATTN_ERR_DTYPE, "%s: index %s must be int64 (0-based), got %s", op,
                      attn_tensor_shape_str(index), attn_dtype_name(index->dtype));
  int bad = index->ndim != big->ndim || other->ndim != index->ndim || other->dtype != big->dtype;
  for (int d = 0; !bad && d < index->ndim; d++)
    bad = other->shape[d] != index->shape[d] || (d != dim && index->shape[d] > big->shape[d]);
  if (bad)
    return attn_error(ATTN_ERR_SHAPE, "%s: index %s and values %s must have the same shape, no larger than %s "
                      "outside dim %d (and one dtype)", op, attn_tensor_shape_str(index),
                      attn_tensor_shape_str(other), attn_tensor_shape_str(big), dim + 1);
  int64_t n = attn_tensor_numel(index), pos[ATTN_MAX_DIMS] = {0};
  size_t es = attn_dtype_size(big->dtype);
  for (int pass = 0; pass < 2; pass++) { /* validate everything before writing anything */
    memset(pos, 0, sizeof pos);
    for (int64_t e = 0; e < n; e++) {
      int64_t v = attn_tensor_get_i64(index, pos);
      if (pass == 0) {
        if (v < 0 || v >= big->shape[dim])
          return attn_error(ATTN_ERR_ARG, "%s: index value %lld out of range 1..%lld for dim %d of %s", op,
                            (long long)v + 1, (long long)big->shape[dim], dim + 1, attn_tensor_shape_str(big));
      } else {
        int64_t bpos[ATTN_MAX_DIMS];
        memcpy(bpos, pos, sizeof bpos);
        bpos[dim] = v;
        if (!scatter)
          memcpy(attn_tensor_ptr(other, pos), attn_tensor_ptr(big, bpos), es);
        else if (big->dtype == ATTN_I64)
          attn_tensor_set_i64((attn_tensor *)big, bpos,
                              (int64_t)((uint64_t)attn_tensor_get_i64(big, bpos) + (uint64_t)attn_tensor_get_i64(other, pos)));
        else
          attn_tensor_set((attn_tensor *)big, bpos, attn_tensor_get(big, bpos) + attn_tensor_get(other, pos));
      }
      for (int d = index->ndim - 1; d >= 0; d--) {
        if (++pos[d] < index->shape[d]) break;
        pos[d] = 0;
      }
    }
  }
  return ATTN_OK;
}

attn_status attn_gather(const attn_tensor *x, int dim, const attn_tensor *index, attn_tensor *out) {
  return gather_walk("gather", x, dim, index, out, 0);
}

attn_status attn_scatter_add(attn_tensor *out, int dim, const attn_tensor *index, const attn_tensor *src) {
  return gather_walk("scatter_add", out, dim, index, src, 1);
}

static attn_status need_contiguous(const char *op, const attn_tensor *t, int ndim) {
  if (t->ndim != ndim || !attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s must be a contiguous %d-D tensor", op,
                      attn_tensor_shape_str(t), ndim);
  return ATTN_OK;
}

attn_status attn_arange(attn_tensor *out, double start, double step) {
  attn_status st = need_contiguous("arange", out, 1);
  if (st != ATTN_OK) return st;
  for (int64_t i = 0; i < out->shape[0]; i++) attn_tensor_set(out, &i, start + (double)i * step);
  return ATTN_OK;
}

attn_status attn_linspace(attn_tensor *out, double start, double stop) {
  attn_status st = need_contiguous("linspace", out, 1);
  if (st != ATTN_OK) return st;
  int64_t n = out->shape[0];
  for (int64_t i = 0; i < n; i++) {
    double v = n == 1 ? start : start + (stop - start) * (double)i / (double)(n - 1);
    if (i == n - 1 && n > 1) v = stop; /* hit the end point exactly */
    attn_tensor_set(out, &i, v);
  }
  return ATTN_OK;
}

attn_status attn_eye(attn_tensor *out) {
  attn_status st = need_contiguous("eye", out, 2);
  if (st != ATTN_OK) return st;
  attn_fill(out, 0);
  for (int64_t i = 0; i < out->shape[0] && i < out->shape[1]; i++) {
    int64_t pos[2] = {i, i};
    attn_tensor_set(out, pos, 1);
  }
  return ATTN_OK;
}

attn_status attn_triangle(const attn_tensor *x, int64_t k, int upper, attn_tensor *out) {
  const char *op = upper ? "triu" : "tril";
  if (x->ndim < 2)
    return attn_error(ATTN_ERR_SHAPE, "%s: input %s must have at least 2 dims", op, attn_tensor_shape_str(x));
  int same = out->ndim == x->ndim && out->dtype == x->dtype;
  for (int d = 0; same && d < x->ndim; d++) same = out->shape[d] == x->shape[d];
  if (!same)
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s %s must have the input's shape and dtype %s %s", op,
                      attn_dtype_name(out->dtype), attn_tensor_shape_str(out), attn_dtype_name(x->dtype),
                      attn_tensor_shape_str(x));
  attn_status st = attn_copy(out, x);
  int64_t R = x->shape[x->ndim - 2], C = x->shape[x->ndim - 1];
  if (st != ATTN_OK || R == 0 || C == 0) return st;
  /* k past the matrix keeps (or clears) everything; clamped, i + k cannot overflow */
  if (k > C) k = C;
  if (k < -R) k = -R;
  int rdim = x->ndim - 2, cdim = x->ndim - 1;
  for (int64_t i = 0; i < R && st == ATTN_OK; i++) {
    /* the columns to clear in row i: [i + k + 1, C) for tril, [0, i + k) for triu */
    int64_t lo = upper ? 0 : i + k + 1, hi = upper ? i + k : C;
    if (lo < 0) lo = 0;
    if (hi > C) hi = C;
    if (hi <= lo) continue;
    attn_tensor row = *out;
    attn_view_select(&row, rdim, i);
    attn_view_narrow(&row, cdim - 1, lo, hi - lo);
    st = attn_fill(&row, 0);
  }
  return st;
}
