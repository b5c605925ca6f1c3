#include "core/attn_tensor.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "core/attn_iter.h"
#include "core/attn_parallel.h"

size_t attn_dtype_size(attn_dtype dtype) { return dtype == ATTN_F32 ? 4 : 8; }

const char *attn_dtype_name(attn_dtype dtype) {
  return dtype == ATTN_F32 ? "float32" : (dtype == ATTN_F64 ? "float64" : "int64");
}

int attn_dtype_parse(const char *name, attn_dtype *out) {
  static const struct {
    const char *name;
    attn_dtype dtype;
  } names[] = {{"float32", ATTN_F32}, {"float", ATTN_F32}, {"f32", ATTN_F32}, {"float64", ATTN_F64},
               {"double", ATTN_F64},  {"f64", ATTN_F64},   {"int64", ATTN_I64}, {"long", ATTN_I64},
               {"i64", ATTN_I64}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i].name)) {
      *out = names[i].dtype;
      return 0;
    }
  return -1;
}

attn_status attn_check_float(const char *op, const attn_tensor *t) {
  if (attn_dtype_is_float(t->dtype)) return ATTN_OK;
  return attn_error(ATTN_ERR_DTYPE, "%s: needs a float tensor, got int64 %s; convert with :to(\"float32\")", op,
                    attn_tensor_shape_str(t));
}

attn_status attn_scalar_to(const char *op, attn_dtype dtype, double v, void *buf) {
  if (dtype == ATTN_F32) {
    float f = (float)v;
    memcpy(buf, &f, 4);
  } else if (dtype == ATTN_F64) {
    memcpy(buf, &v, 8);
  } else {
    if (!(v == floor(v)))
      return attn_error(ATTN_ERR_DTYPE, "%s: %g is not an integer, and the tensor is int64 (a float tensor holds "
                        "it: float32 or float64)", op, v);
    if (!(fabs(v) < 9223372036854775808.0))
      return attn_error(ATTN_ERR_DTYPE, "%s: %g is outside the int64 range", op, v);
    int64_t i = (int64_t)v;
    memcpy(buf, &i, 8);
  }
  return ATTN_OK;
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
    s = s > INT64_MAX / 8 / n ? 0 : s * n; /* room for byte strides (x element size) too */
  }
}

static void set_contiguous_strides(attn_tensor *t) { attn_contiguous_strides(t->ndim, t->shape, t->stride); }

attn_status attn_tensor_check_size(const char *op, const char *what, attn_dtype dtype, int ndim,
                                   const int64_t *shape) {
  double bytes = (double)attn_dtype_size(dtype); /* a double: the product of the sizes may pass 2^64 */
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return attn_error(ATTN_ERR_SHAPE, "%s: negative size %lld in %s shape %s", op, (long long)shape[d], what,
                        attn_shape_str(ndim, shape));
    bytes *= (double)shape[d];
  }
  double limit = (double)attn_alloc_max_request();
  if (bytes > limit)
    return attn_error(ATTN_ERR_MEMORY, "%s: %s %s %s needs %.3g bytes, more than memory can hold (limit %.3g)", op,
                      what, attn_dtype_name(dtype), attn_shape_str(ndim, shape), bytes, limit);
  return ATTN_OK;
}

static _Atomic uint64_t last_serial;

uint64_t attn_storage_serial(void) { return atomic_load(&last_serial); }

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
  s->serial = atomic_fetch_add(&last_serial, 1) + 1;
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
  if (attn_tensor_numel(t) == 0) return 1; /* no element is out of place */
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

/* Byte span [lo, hi) of the elements of t relative to its storage. */
static void byte_span(const attn_tensor *t, int64_t *lo, int64_t *hi) {
  int64_t es = (int64_t)attn_dtype_size(t->dtype), below = 0, above = 0;
  for (int d = 0; d < t->ndim; d++) {
    int64_t reach = (t->shape[d] - 1) * t->stride[d];
    if (reach < 0) below += reach; else above += reach;
  }
  *lo = (t->offset + below) * es;
  *hi = (t->offset + above + 1) * es;
}

int attn_tensor_aliases(const attn_tensor *w, const attn_tensor *r) {
  if (!w->storage || w->storage != r->storage) return 0;
  if (attn_tensor_numel(w) == 0 || attn_tensor_numel(r) == 0) return 0;
  int same = w->dtype == r->dtype && w->offset == r->offset && w->ndim == r->ndim;
  for (int d = 0; same && d < w->ndim; d++) same = w->shape[d] == r->shape[d] && (w->shape[d] == 1 || w->stride[d] == r->stride[d]);
  if (same) return 0;
  int64_t wlo, whi, rlo, rhi;
  byte_span(w, &wlo, &whi);
  byte_span(r, &rlo, &rhi);
  return wlo < rhi && rlo < whi;
}

attn_status attn_unalias(const attn_tensor *w, const attn_tensor *r, attn_tensor *tmp, const attn_tensor **use) {
  tmp->storage = NULL;
  *use = r;
  if (!attn_tensor_aliases(w, r)) return ATTN_OK;
  attn_status st = attn_tensor_clone(tmp, r, r->dtype);
  if (st == ATTN_OK) *use = tmp;
  return st;
}

void *attn_tensor_data(const attn_tensor *t) {
  /* An empty view's offset may lie anywhere, even near 2^63 (the last row of a [2^63-1 x 0]
   * tensor): no element is read through it, so its pointer is the storage's and the offset is
   * never scaled to bytes (signed overflow, and a pointer past the allocation). */
  char *data = t->storage->data;
  if (t->offset == 0) return data; /* (most tensors: no loop over the dims) */
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] == 0) return data;
  return data + t->offset * (int64_t)attn_dtype_size(t->dtype);
}

const char *attn_tensor_shape_str(const attn_tensor *t) { return attn_shape_str(t->ndim, t->shape); }

static int64_t element_offset(const attn_tensor *t, const int64_t *index) {
  int64_t off = 0;
  for (int d = 0; d < t->ndim; d++) off += index[d] * t->stride[d];
  return off;
}

void *attn_tensor_ptr(const attn_tensor *t, const int64_t *index) {
  return (char *)attn_tensor_data(t) + element_offset(t, index) * (int64_t)attn_dtype_size(t->dtype);
}

double attn_tensor_get(const attn_tensor *t, const int64_t *index) {
  const void *p = attn_tensor_ptr(t, index);
  if (t->dtype == ATTN_F64) return *(const double *)p;
  if (t->dtype == ATTN_I64) return (double)*(const int64_t *)p;
  return *(const float *)p;
}

int64_t attn_tensor_get_i64(const attn_tensor *t, const int64_t *index) {
  if (t->dtype == ATTN_I64) return *(const int64_t *)attn_tensor_ptr(t, index);
  return attn_double_to_i64(attn_tensor_get(t, index));
}

void attn_tensor_set(attn_tensor *t, const int64_t *index, double value) {
  void *p = attn_tensor_ptr(t, index);
  if (t->dtype == ATTN_F64)
    *(double *)p = value;
  else if (t->dtype == ATTN_I64)
    *(int64_t *)p = attn_double_to_i64(value);
  else
    *(float *)p = (float)value;
}

void attn_tensor_set_i64(attn_tensor *t, const int64_t *index, int64_t value) {
  if (t->dtype == ATTN_I64)
    *(int64_t *)attn_tensor_ptr(t, index) = value;
  else
    attn_tensor_set(t, index, (double)value);
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

attn_tensor attn_view_as_strided(const attn_tensor *t, int ndim, const int64_t *shape, const int64_t *stride) {
  attn_tensor v = *t;
  v.ndim = ndim;
  for (int d = 0; d < ndim; d++) {
    v.shape[d] = shape[d];
    v.stride[d] = stride[d];
  }
  return v;
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

/* Same-dtype copies are a memcpy when both sides are contiguous. Conversions
 * to int64 go through attn_double_to_i64 (truncation, no undefined behaviour). */
#define DEFINE_COPY_SAME(NAME, T)                                                   \
  static void NAME(int64_t n, char **p, const int64_t *step, void *ctx) {          \
    (void)ctx;                                                                     \
    if (step[0] == (int64_t)sizeof(T) && step[1] == (int64_t)sizeof(T)) {          \
      memcpy(p[0], p[1], (size_t)n * sizeof(T));                                   \
      return;                                                                      \
    }                                                                              \
    for (int64_t i = 0; i < n; i++) *(T *)(p[0] + i * step[0]) = *(const T *)(p[1] + i * step[1]); \
  }
#define DEFINE_COPY_CONVERT(NAME, TD, TS, CONV)                                     \
  static void NAME(int64_t n, char **p, const int64_t *step, void *ctx) {          \
    (void)ctx;                                                                     \
    for (int64_t i = 0; i < n; i++) *(TD *)(p[0] + i * step[0]) = CONV(*(const TS *)(p[1] + i * step[1])); \
  }
#define AS_FLOAT(v) ((float)(v))
#define AS_DOUBLE(v) ((double)(v))
#define AS_I64(v) attn_double_to_i64((double)(v))
DEFINE_COPY_SAME(copy_f32_f32, float)
DEFINE_COPY_SAME(copy_f64_f64, double)
DEFINE_COPY_SAME(copy_i64_i64, int64_t)
DEFINE_COPY_CONVERT(copy_f32_f64, float, double, AS_FLOAT)
DEFINE_COPY_CONVERT(copy_f32_i64, float, int64_t, AS_FLOAT)
DEFINE_COPY_CONVERT(copy_f64_f32, double, float, AS_DOUBLE)
DEFINE_COPY_CONVERT(copy_f64_i64, double, int64_t, AS_DOUBLE)
DEFINE_COPY_CONVERT(copy_i64_f32, int64_t, float, AS_I64)
DEFINE_COPY_CONVERT(copy_i64_f64, int64_t, double, AS_I64)

/* copy_fns[dst dtype][src dtype] */
static const attn_iter_fn copy_fns[3][3] = {
    {copy_f32_f32, copy_f32_f64, copy_f32_i64},
    {copy_f64_f32, copy_f64_f64, copy_f64_i64},
    {copy_i64_f32, copy_i64_f64, copy_i64_i64},
};

/* One row of n elements at stride `stride` into a contiguous one; unit-stride
 * rows (the head layouts' 8 columns) as a loop the compiler vectorises. */
#define DEFINE_COPY_ROW(name, T)                                                   \
  static inline void name(char *out, const char *row, int64_t n, int64_t stride) { \
    const T *restrict a = (const T *)row;                                          \
    T *restrict o = (T *)out;                                                      \
    if (stride == 1)                                                               \
      for (int64_t j = 0; j < n; j++) o[j] = a[j];                                 \
    else                                                                           \
      for (int64_t j = 0; j < n; j++) o[j] = a[j * stride];                        \
  }
DEFINE_COPY_ROW(copy_row32, uint32_t)
DEFINE_COPY_ROW(copy_row64, uint64_t)

/* run unit-stride rows of `bytes` each, rstride bytes apart, into out; returns the end of out.
 * Inlined with a constant size, each row is a fixed-size move: the head layouts' rows of 8 or
 * 16 floats, where the element loop paid its setup and tail per row (split_heads of
 * (64, 10, 32): 7.1 -> 2.1 us, merge_heads 7.9 -> 2.4 us). */
static inline char *copy_fixed_rows(char *out, const char *row, int64_t run, int64_t rstride,
                                    const size_t bytes) {
  for (int64_t i = 0; i < run; i++, row += rstride, out += bytes) memcpy(out, row, bytes);
  return out;
}

/* Elements per range of a split strided copy (copy_rows_into_contiguous). */
#define COPY_SPLIT_ELEMENTS 32768

/* A same-dtype copy of a strided, non-contiguous src (same shape) into a
 * contiguous dst, for short inner rows (a permuted head layout has rows of a
 * head's 8 columns): loops over the last two dims with an odometer over the
 * others, where the general iterator pays an indirect call and a pointer
 * recomputation per row; unit-stride rows are a vectorised loop, or fixed-size
 * moves for rows of 32 and 64 bytes (copy_fixed_rows; split_heads' (64, 4, 10,
 * 8) copy: 9.5 -> 5.5 -> 2.1 us). A contiguous src is left to the
 * iterator, which copies it as one run (it was copied row by row here: 9.3 ->
 * 1.4 us for 80 KB). Large copies split into ranges of runs over the threads (each run is its
 * own stretch of dst, so the bits do not depend on the split): the iterator they went to
 * before paid its indirect call per row, 6.6 us on one thread became 41 us on two for the
 * decoder's (256, 10, 32) split_heads. Returns 0 when the case does not apply. */
typedef struct {
  const attn_tensor *src;
  char *out;
  size_t es;
} copy_rows_job;

/* Runs [begin, end) of copy_rows_into_contiguous: the rows of the last dim walked along the
 * next-to-last (no odometer step per row), an odometer over the others per run. */
static void copy_runs(void *arg, int64_t begin, int64_t end) {
  const copy_rows_job *j = arg;
  const attn_tensor *src = j->src;
  const int nd = src->ndim;
  const size_t es = j->es;
  int64_t inner = src->shape[nd - 1], istride = src->stride[nd - 1];
  int64_t run = src->shape[nd - 2], rstride = src->stride[nd - 2] * (int64_t)es;
  size_t row_bytes = (size_t)inner * es;
  int64_t index[ATTN_MAX_DIMS] = {0};
  const char *at = attn_tensor_data(src);
  for (int64_t d = nd - 3, rest = begin; d >= 0; d--) { /* the first run's outer index */
    index[d] = rest % src->shape[d];
    rest /= src->shape[d];
    at += index[d] * src->stride[d] * (int64_t)es;
  }
  char *out = j->out + (size_t)begin * (size_t)run * row_bytes;
  for (int64_t r = begin; r < end; r++) {
    const char *row = at;
    if (istride == 1 && row_bytes == 32)
      out = copy_fixed_rows(out, row, run, rstride, 32);
    else if (istride == 1 && row_bytes == 64)
      out = copy_fixed_rows(out, row, run, rstride, 64);
    else
      for (int64_t i = 0; i < run; i++, row += rstride, out += row_bytes) {
        if (es == 4)
          copy_row32(out, row, inner, istride);
        else
          copy_row64(out, row, inner, istride);
      }
    for (int d = nd - 3; d >= 0; d--) { /* next run: odometer over the outer dims */
      if (++index[d] < src->shape[d]) {
        at += src->stride[d] * (int64_t)es;
        break;
      }
      at -= (src->shape[d] - 1) * src->stride[d] * (int64_t)es;
      index[d] = 0;
    }
  }
}

static int copy_rows_into_contiguous(attn_tensor *dst, const attn_tensor *src) {
  int nd = src->ndim;
  size_t es = attn_dtype_size(src->dtype);
  if (src->dtype != dst->dtype || nd < 2 || nd != dst->ndim || !attn_tensor_is_contiguous(dst) || (es != 4 && es != 8))
    return 0;
  for (int d = 0; d < nd; d++)
    if (src->shape[d] != dst->shape[d] || src->shape[d] == 0) return 0;
  if (attn_tensor_is_contiguous(src)) return 0; /* one run: the iterator's memcpy */
  int64_t inner = src->shape[nd - 1], run = src->shape[nd - 2];
  if (inner > 64) return 0; /* long rows: the iterator's memcpy per row is as good */
  int64_t runs = attn_tensor_numel(src) / (inner * run);
  copy_rows_job j = {src, attn_tensor_data(dst), es};
  /* ranges of at least COPY_SPLIT_ELEMENTS elements: a few microseconds of moves each */
  attn_parallel_for(runs, COPY_SPLIT_ELEMENTS / (inner * run) + 1, copy_runs, &j);
  return 1;
}

attn_status attn_copy(attn_tensor *dst, const attn_tensor *src_in) {
  attn_tensor tmp;
  const attn_tensor *src;
  if (attn_tensor_overlaps_itself(dst))
    return attn_error(ATTN_ERR_ARG, "copy: destination %s is an expanded view (several indices share one element); "
                      "write to a contiguous copy", attn_tensor_shape_str(dst));
  if (!broadcasts_to(src_in, dst))
    return attn_error(ATTN_ERR_SHAPE, "copy: source %s does not broadcast to destination %s",
                      attn_tensor_shape_str(src_in), attn_tensor_shape_str(dst));
  attn_status st = attn_unalias(dst, src_in, &tmp, &src); /* overlapping copy: through a temporary */
  if (st != ATTN_OK) return st;
  if (copy_rows_into_contiguous(dst, src)) {
    attn_tensor_free(&tmp);
    return ATTN_OK;
  }
  attn_iter it;
  attn_iter_begin(&it, dst->ndim, dst->shape);
  attn_iter_add(&it, dst);
  attn_iter_add(&it, src);
  attn_iter_run(&it, copy_fns[dst->dtype][src->dtype], NULL);
  attn_tensor_free(&tmp);
  return ATTN_OK;
}

attn_status attn_fill(attn_tensor *t, double value) {
  char buf[8];
  if (attn_tensor_overlaps_itself(t)) /* as for every write; it would also loop over elements that are not there */
    return attn_error(ATTN_ERR_ARG, "fill: %s is an expanded view (several indices share one element); "
                      "write to a contiguous copy", attn_tensor_shape_str(t));
  attn_status st = attn_scalar_to("fill", t->dtype, value, buf);
  if (st != ATTN_OK) return st;
  if (attn_tensor_is_contiguous(t)) { /* one run (zeros for a gradient buffer): no iterator, no call per element */
    size_t n = (size_t)attn_tensor_numel(t), es = attn_dtype_size(t->dtype);
    char *p = attn_tensor_data(t);
    static const char zero[8];
    if (!memcmp(buf, zero, es)) {
      memset(p, 0, n * es);
    } else if (es == 4) {
      uint32_t v, *q = (uint32_t *)p;
      memcpy(&v, buf, 4);
      for (size_t i = 0; i < n; i++) q[i] = v;
    } else {
      uint64_t v, *q = (uint64_t *)p;
      memcpy(&v, buf, 8);
      for (size_t i = 0; i < n; i++) q[i] = v;
    }
    return ATTN_OK;
  }
  attn_iter it;
  attn_iter_begin(&it, t->ndim, t->shape);
  attn_iter_add(&it, t);
  attn_iter_add_scalar(&it, buf);
  attn_iter_run(&it, copy_fns[t->dtype][t->dtype], NULL);
  return ATTN_OK;
}

attn_status attn_tensor_clone(attn_tensor *dst, const attn_tensor *src, attn_dtype dtype) {
  attn_status st = attn_tensor_init(dst, dtype, src->ndim, src->shape);
  if (st != ATTN_OK) return st;
  return attn_copy(dst, src);
}
