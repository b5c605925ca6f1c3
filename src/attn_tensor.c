#include "attn_tensor.h"

#include <stdlib.h>
#include <string.h>

#include "attn_alloc.h"
#include "attn_iter.h"

size_t attn_dtype_size(attn_dtype dtype) { return dtype == ATTN_F64 ? 8 : 4; }

const char *attn_dtype_name(attn_dtype dtype) { return dtype == ATTN_F64 ? "float64" : "float32"; }

int attn_dtype_parse(const char *name, attn_dtype *out) {
  if (!strcmp(name, "float32") || !strcmp(name, "float") || !strcmp(name, "f32")) {
    *out = ATTN_F32;
    return 0;
  }
  if (!strcmp(name, "float64") || !strcmp(name, "double") || !strcmp(name, "f64")) {
    *out = ATTN_F64;
    return 0;
  }
  return -1;
}

/* Row-major strides; a size-0 dim counts as 1 (as in PyTorch), so the dims
 * before it keep distinct strides and an empty tensor is not mistaken for an
 * expanded view. An empty tensor's outer strides may not fit in int64: they
 * address nothing, so they saturate to 0 instead of overflowing. */
void attn_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    stride[d] = s;
    int64_t n = shape[d] > 1 ? shape[d] : 1;
    s = s > INT64_MAX / n ? 0 : s * n;
  }
}

static void set_contiguous_strides(attn_tensor *t) { attn_contiguous_strides(t->ndim, t->shape, t->stride); }

attn_status attn_tensor_init(attn_tensor *t, attn_dtype dtype, int ndim, const int64_t *shape) {
  t->storage = NULL;
  if (ndim < 0 || ndim > ATTN_MAX_DIMS)
    return attn_error(ATTN_ERR_SHAPE, "tensor: %d dims requested, at most %d supported", ndim,
                      ATTN_MAX_DIMS);
  size_t elsize = attn_dtype_size(dtype);
  uint64_t numel = 1;
  int overflow = 0, empty = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return attn_error(ATTN_ERR_SHAPE, "tensor: negative size %lld in shape %s",
                        (long long)shape[d], attn_shape_str(ndim, shape));
    if (shape[d] == 0) empty = 1;
  }
  for (int d = 0; d < ndim && !empty; d++) {
    if (numel > (uint64_t)INT64_MAX / (uint64_t)shape[d]) overflow = 1;
    numel *= (uint64_t)shape[d];
  }
  if (empty) numel = 0;
  if (overflow || numel > (uint64_t)(SIZE_MAX / elsize))
    return attn_error(ATTN_ERR_MEMORY, "tensor: shape %s overflows the address space",
                      attn_shape_str(ndim, shape));
  size_t nbytes = (size_t)numel * elsize;
  attn_storage *s = malloc(sizeof *s);
  if (!s) return attn_error(ATTN_ERR_MEMORY, "tensor: out of memory for a storage header");
  s->data = attn_alloc(nbytes, &s->capacity);
  if (!s->data) {
    free(s);
    return attn_error(ATTN_ERR_MEMORY, "tensor: cannot allocate %zu bytes for %s %s", nbytes,
                      attn_dtype_name(dtype), attn_shape_str(ndim, shape));
  }
  s->nbytes = nbytes;
  s->refcount = 1;
  s->version = 0;
  t->storage = s;
  t->dtype = dtype;
  t->ndim = ndim;
  t->offset = 0;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  set_contiguous_strides(t);
  return ATTN_OK;
}

attn_status attn_tensor_init_zeros(attn_tensor *t, attn_dtype dtype, int ndim, const int64_t *shape) {
  attn_status st = attn_tensor_init(t, dtype, ndim, shape);
  if (st == ATTN_OK) memset(t->storage->data, 0, t->storage->nbytes);
  return st;
}

attn_status attn_tensor_init_like(attn_tensor *t, const attn_tensor *src) {
  return attn_tensor_init(t, src->dtype, src->ndim, src->shape);
}

void attn_tensor_view(attn_tensor *dst, const attn_tensor *src) {
  if (dst != src) *dst = *src;
  if (dst->storage) dst->storage->refcount++;
}

void attn_tensor_free(attn_tensor *t) {
  attn_storage *s = t->storage;
  t->storage = NULL;
  if (s && --s->refcount == 0) {
    attn_free(s->data, s->capacity);
    free(s);
  }
}

int64_t attn_tensor_numel(const attn_tensor *t) {
  for (int d = 0; d < t->ndim; d++) /* a non-empty shape's product was checked when it was made */
    if (t->shape[d] == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

int attn_tensor_is_contiguous(const attn_tensor *t) {
  int64_t expected = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] == 1) continue;
    if (t->stride[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

int attn_tensor_overlaps_itself(const attn_tensor *t) {
  if (attn_tensor_numel(t) == 0) return 0; /* no elements, nothing to alias */
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] > 1 && t->stride[d] == 0) return 1;
  return 0;
}

void *attn_tensor_data(const attn_tensor *t) {
  return (char *)t->storage->data + t->offset * (int64_t)attn_dtype_size(t->dtype);
}

const char *attn_tensor_shape_str(const attn_tensor *t) { return attn_shape_str(t->ndim, t->shape); }

static int64_t element_offset(const attn_tensor *t, const int64_t *index) {
  int64_t off = 0;
  for (int d = 0; d < t->ndim; d++) off += index[d] * t->stride[d];
  return off;
}

double attn_tensor_get(const attn_tensor *t, const int64_t *index) {
  int64_t off = element_offset(t, index);
  if (t->dtype == ATTN_F64) return ((const double *)attn_tensor_data(t))[off];
  return ((const float *)attn_tensor_data(t))[off];
}

void attn_tensor_set(attn_tensor *t, const int64_t *index, double value) {
  int64_t off = element_offset(t, index);
  if (t->dtype == ATTN_F64)
    ((double *)attn_tensor_data(t))[off] = value;
  else
    ((float *)attn_tensor_data(t))[off] = (float)value;
}

static attn_status check_dim(const char *op, const attn_tensor *t, int dim, int extra) {
  if (dim < 0 || dim >= t->ndim + extra)
    return attn_error(ATTN_ERR_ARG, "%s: dim %d out of range for %d-D tensor %s", op, dim + 1,
                      t->ndim, attn_tensor_shape_str(t));
  return ATTN_OK;
}

attn_status attn_view_transpose(attn_tensor *t, int dim0, int dim1) {
  attn_status st = check_dim("transpose", t, dim0, 0);
  if (st == ATTN_OK) st = check_dim("transpose", t, dim1, 0);
  if (st != ATTN_OK) return st;
  int64_t sh = t->shape[dim0], sd = t->stride[dim0];
  t->shape[dim0] = t->shape[dim1];
  t->stride[dim0] = t->stride[dim1];
  t->shape[dim1] = sh;
  t->stride[dim1] = sd;
  return ATTN_OK;
}

attn_status attn_view_permute(attn_tensor *t, const int *perm) {
  int seen[ATTN_MAX_DIMS] = {0};
  int64_t shape[ATTN_MAX_DIMS] = {0}, stride[ATTN_MAX_DIMS] = {0};
  for (int d = 0; d < t->ndim; d++) {
    int p = perm[d];
    if (p < 0 || p >= t->ndim || seen[p])
      return attn_error(ATTN_ERR_ARG, "permute: not a permutation of the %d dims of %s", t->ndim,
                        attn_tensor_shape_str(t));
    seen[p] = 1;
    shape[d] = t->shape[p];
    stride[d] = t->stride[p];
  }
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)t->ndim);
  memcpy(t->stride, stride, sizeof(int64_t) * (size_t)t->ndim);
  return ATTN_OK;
}

attn_status attn_view_narrow(attn_tensor *t, int dim, int64_t start, int64_t length) {
  attn_status st = check_dim("narrow", t, dim, 0);
  if (st != ATTN_OK) return st;
  if (start < 0 || length < 0 || start > t->shape[dim] || length > t->shape[dim] - start)
    return attn_error(ATTN_ERR_ARG, "narrow: start %lld length %lld outside dim %d of size %lld (%s)",
                      (long long)start + 1, (long long)length, dim + 1, (long long)t->shape[dim],
                      attn_tensor_shape_str(t));
  t->offset += start * t->stride[dim];
  t->shape[dim] = length;
  return ATTN_OK;
}

attn_status attn_view_select(attn_tensor *t, int dim, int64_t index) {
  attn_status st = check_dim("select", t, dim, 0);
  if (st != ATTN_OK) return st;
  if (index < 0 || index >= t->shape[dim])
    return attn_error(ATTN_ERR_ARG, "select: index %lld out of range for dim %d of size %lld (%s)",
                      (long long)index + 1, dim + 1, (long long)t->shape[dim],
                      attn_tensor_shape_str(t));
  t->offset += index * t->stride[dim];
  for (int d = dim; d < t->ndim - 1; d++) {
    t->shape[d] = t->shape[d + 1];
    t->stride[d] = t->stride[d + 1];
  }
  t->ndim--;
  return ATTN_OK;
}

attn_status attn_view_unsqueeze(attn_tensor *t, int dim) {
  attn_status st = check_dim("unsqueeze", t, dim, 1);
  if (st != ATTN_OK) return st;
  if (t->ndim >= ATTN_MAX_DIMS)
    return attn_error(ATTN_ERR_SHAPE, "unsqueeze: %s already has the maximum of %d dims",
                      attn_tensor_shape_str(t), ATTN_MAX_DIMS);
  for (int d = t->ndim; d > dim; d--) {
    t->shape[d] = t->shape[d - 1];
    t->stride[d] = t->stride[d - 1];
  }
  t->shape[dim] = 1;
  t->stride[dim] = dim + 1 < t->ndim + 1 ? t->stride[dim + 1] * t->shape[dim + 1] : 1;
  t->ndim++;
  return ATTN_OK;
}

attn_status attn_view_squeeze(attn_tensor *t, int dim) {
  if (dim >= 0) {
    attn_status st = check_dim("squeeze", t, dim, 0);
    if (st != ATTN_OK) return st;
    if (t->shape[dim] != 1) return ATTN_OK; /* as NumPy/PyTorch: no-op for size != 1 */
    return attn_view_select(t, dim, 0);
  }
  int out = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] == 1) continue;
    t->shape[out] = t->shape[d];
    t->stride[out] = t->stride[d];
    out++;
  }
  t->ndim = out;
  return ATTN_OK;
}

attn_status attn_view_expand(attn_tensor *t, int ndim, const int64_t *shape) {
  if (ndim < t->ndim || ndim > ATTN_MAX_DIMS)
    return attn_error(ATTN_ERR_SHAPE, "expand: cannot expand %s to %s", attn_tensor_shape_str(t),
                      attn_shape_str(ndim, shape));
  int64_t nshape[ATTN_MAX_DIMS] = {0}, nstride[ATTN_MAX_DIMS] = {0};
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++) {
    int td = d - lead;
    int64_t want = shape[d];
    if (td < 0) {
      if (want < 0)
        return attn_error(ATTN_ERR_SHAPE, "expand: -1 not allowed for new leading dim in %s",
                          attn_shape_str(ndim, shape));
      nshape[d] = want;
      nstride[d] = 0;
    } else if (want == -1 || want == t->shape[td]) {
      nshape[d] = t->shape[td];
      nstride[d] = t->stride[td];
    } else if (t->shape[td] == 1 && want >= 0) {
      nshape[d] = want;
      nstride[d] = 0;
    } else {
      return attn_error(ATTN_ERR_SHAPE, "expand: cannot expand %s to %s (dim %d: %lld vs %lld)",
                        attn_tensor_shape_str(t), attn_shape_str(ndim, shape), d + 1,
                        (long long)t->shape[td], (long long)want);
    }
  }
  int64_t count = 1;
  for (int d = 0; d < ndim; d++)
    if (__builtin_mul_overflow(count, nshape[d], &count))
      return attn_error(ATTN_ERR_SHAPE, "expand: %s has more elements than can be addressed",
                        attn_shape_str(ndim, nshape));
  t->ndim = ndim;
  memcpy(t->shape, nshape, sizeof(int64_t) * (size_t)ndim);
  memcpy(t->stride, nstride, sizeof(int64_t) * (size_t)ndim);
  return ATTN_OK;
}

attn_status attn_shape_infer(const char *op, int64_t numel, int ndim, int64_t *shape) {
  if (ndim > ATTN_MAX_DIMS)
    return attn_error(ATTN_ERR_SHAPE, "%s: %d dims requested, at most %d supported", op, ndim,
                      ATTN_MAX_DIMS);
  int infer = -1;
  int64_t known = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == -1) {
      if (infer >= 0)
        return attn_error(ATTN_ERR_SHAPE, "%s: only one dim may be -1 in %s", op,
                          attn_shape_str(ndim, shape));
      infer = d;
    } else if (shape[d] < 0) {
      return attn_error(ATTN_ERR_SHAPE, "%s: negative size in %s", op, attn_shape_str(ndim, shape));
    } else if (__builtin_mul_overflow(known, shape[d], &known)) {
      return attn_error(ATTN_ERR_SHAPE, "%s: shape %s has more elements than can be addressed", op,
                        attn_shape_str(ndim, shape));
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return attn_error(ATTN_ERR_SHAPE, "%s: cannot infer -1 in %s for %lld elements", op,
                        attn_shape_str(ndim, shape), (long long)numel);
    shape[infer] = numel / known;
    known = numel;
  }
  if (known != numel)
    return attn_error(ATTN_ERR_SHAPE, "%s: shape %s has %lld elements, tensor has %lld", op,
                      attn_shape_str(ndim, shape), (long long)known, (long long)numel);
  return ATTN_OK;
}

attn_status attn_view_reshape(const char *op, attn_tensor *t, int ndim, const int64_t *shape_in) {
  int64_t shape[ATTN_MAX_DIMS];
  if (ndim > ATTN_MAX_DIMS)
    return attn_error(ATTN_ERR_SHAPE, "%s: %d dims requested, at most %d supported", op, ndim,
                      ATTN_MAX_DIMS);
  memcpy(shape, shape_in, sizeof(int64_t) * (size_t)ndim);
  int64_t numel = attn_tensor_numel(t);
  attn_status st = attn_shape_infer(op, numel, ndim, shape);
  if (st != ATTN_OK) return st;
  int64_t stride[ATTN_MAX_DIMS];
  if (numel == 0 || attn_tensor_is_contiguous(t)) {
    attn_contiguous_strides(ndim, shape, stride);
  } else {
    /* Walk old dims in chunks that are contiguous among themselves; each chunk
     * must map onto a run of new dims with the same element count. */
    int nd = ndim - 1;
    int64_t chunk_base = t->stride[t->ndim - 1], tensor_numel = 1, view_numel = 1;
    for (int od = t->ndim - 1; od >= 0; od--) {
      tensor_numel *= t->shape[od];
      if (od == 0 || (t->shape[od - 1] != 1 && t->stride[od - 1] != tensor_numel * chunk_base)) {
        while (nd >= 0 && (view_numel < tensor_numel || shape[nd] == 1)) {
          stride[nd] = view_numel * chunk_base;
          view_numel *= shape[nd];
          nd--;
        }
        if (view_numel != tensor_numel)
          return attn_error(ATTN_ERR_SHAPE,
                            "%s: %s with strides that are not viewable as %s; copy it first "
                            "(contiguous or reshape)",
                            op, attn_tensor_shape_str(t), attn_shape_str(ndim, shape));
        if (od > 0) {
          chunk_base = t->stride[od - 1];
          tensor_numel = 1;
          view_numel = 1;
        }
      }
    }
    for (; nd >= 0; nd--) stride[nd] = 1; /* trailing size-1 dims */
  }
  t->ndim = ndim;
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  memcpy(t->stride, stride, sizeof(int64_t) * (size_t)ndim);
  return ATTN_OK;
}

attn_status attn_broadcast_shape(const char *op, int andim, const int64_t *ashape, int bndim,
                                 const int64_t *bshape, int *out_ndim, int64_t *out_shape) {
  int nd = andim > bndim ? andim : bndim;
  for (int d = 0; d < nd; d++) {
    int ad = d - (nd - andim), bd = d - (nd - bndim);
    int64_t a = ad < 0 ? 1 : ashape[ad], b = bd < 0 ? 1 : bshape[bd];
    if (a != b && a != 1 && b != 1)
      return attn_error(ATTN_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)",
                        op, attn_shape_str(andim, ashape), attn_shape_str(bndim, bshape), d + 1,
                        (long long)a, (long long)b);
    out_shape[d] = a == 1 ? b : a;
  }
  *out_ndim = nd;
  return ATTN_OK;
}

static int broadcasts_to(const attn_tensor *src, const attn_tensor *dst) {
  if (src->ndim > dst->ndim) return 0;
  for (int d = 0; d < src->ndim; d++) {
    int64_t s = src->shape[d], t = dst->shape[d + dst->ndim - src->ndim];
    if (s != t && s != 1) return 0;
  }
  return 1;
}

#define COPY_LOOP(TD, TS)                                            \
  for (int64_t i = 0; i < n; i++)                                    \
    *(TD *)(p[0] + i * step[0]) = (TD) * (const TS *)(p[1] + i * step[1]);

static void copy_f32_f32(int64_t n, char **p, const int64_t *step, void *ctx) {
  (void)ctx;
  if (step[0] == 4 && step[1] == 4) {
    memcpy(p[0], p[1], (size_t)n * 4);
    return;
  }
  COPY_LOOP(float, float)
}
static void copy_f64_f64(int64_t n, char **p, const int64_t *step, void *ctx) {
  (void)ctx;
  if (step[0] == 8 && step[1] == 8) {
    memcpy(p[0], p[1], (size_t)n * 8);
    return;
  }
  COPY_LOOP(double, double)
}
static void copy_f32_f64(int64_t n, char **p, const int64_t *step, void *ctx) {
  (void)ctx;
  COPY_LOOP(float, double)
}
static void copy_f64_f32(int64_t n, char **p, const int64_t *step, void *ctx) {
  (void)ctx;
  COPY_LOOP(double, float)
}

attn_status attn_copy(attn_tensor *dst, const attn_tensor *src) {
  if (attn_tensor_overlaps_itself(dst))
    return attn_error(ATTN_ERR_ARG, "copy: destination %s is an expanded view (several indices share one element); "
                      "write to a contiguous copy", attn_tensor_shape_str(dst));
  if (!broadcasts_to(src, dst))
    return attn_error(ATTN_ERR_SHAPE, "copy: source %s does not broadcast to destination %s",
                      attn_tensor_shape_str(src), attn_tensor_shape_str(dst));
  attn_iter it;
  attn_iter_begin(&it, dst->ndim, dst->shape);
  attn_iter_add(&it, dst);
  attn_iter_add(&it, src);
  attn_iter_fn fn = dst->dtype == ATTN_F32 ? (src->dtype == ATTN_F32 ? copy_f32_f32 : copy_f32_f64)
                                           : (src->dtype == ATTN_F32 ? copy_f64_f32 : copy_f64_f64);
  attn_iter_run(&it, fn, NULL);
  return ATTN_OK;
}

attn_status attn_fill(attn_tensor *t, double value) {
  float f = (float)value;
  attn_iter it;
  attn_iter_begin(&it, t->ndim, t->shape);
  attn_iter_add(&it, t);
  attn_iter_add_scalar(&it, t->dtype == ATTN_F32 ? (void *)&f : (void *)&value);
  attn_iter_run(&it, t->dtype == ATTN_F32 ? copy_f32_f32 : copy_f64_f64, NULL);
  return ATTN_OK;
}

attn_status attn_tensor_clone(attn_tensor *dst, const attn_tensor *src, attn_dtype dtype) {
  attn_status st = attn_tensor_init(dst, dtype, src->ndim, src->shape);
  if (st != ATTN_OK) return st;
  return attn_copy(dst, src);
}
