/* attn_tensor: dtypes, refcounted storage and strided tensor views.
 *
 * A tensor is a small view struct (dtype, shape, strides in elements, offset
 * in elements) holding one reference to a storage. Views share the storage
 * and retain it; attn_tensor_free releases the reference and is idempotent.
 * Shapes are row-major, outermost dimension first; all dims are 0-based here
 * (the Lua binding converts from 1-based). A 0-d tensor has ndim 0, numel 1. */
#ifndef ATTN_TENSOR_H
#define ATTN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/attn_error.h"

#define ATTN_MAX_DIMS 8

/* Two float dtypes for math and one integer dtype for ids, indices and
 * lengths. int64 takes part only in what ids need (creation, views, copies,
 * conversions, comparisons, add/sub/mul, maximum/minimum, sum/max/min, where,
 * indexing); every other kernel requires a float dtype through
 * attn_check_float, whose message says how to convert. */
typedef enum { ATTN_F32 = 0, ATTN_F64 = 1, ATTN_I64 = 2 } attn_dtype;

typedef struct attn_storage {
  void *data;
  size_t nbytes;   /* bytes requested */
  size_t capacity; /* bytes of the allocator block */
  int64_t refcount;
  uint64_t version; /* bumped by every in-place write, so autograd can tell saved data changed */
  uint64_t serial;  /* the order storages were made in (attn_storage_serial) */
} attn_storage;

/* The serial of the last storage made (0 before the first): a storage with a larger serial was
 * made after the call, so no tensor that existed then can share it. */
uint64_t attn_storage_serial(void);

typedef struct attn_tensor {
  attn_storage *storage; /* NULL once released */
  attn_dtype dtype;
  int ndim;
  int64_t offset;
  int64_t shape[ATTN_MAX_DIMS];
  int64_t stride[ATTN_MAX_DIMS];
} attn_tensor;

size_t attn_dtype_size(attn_dtype dtype);
const char *attn_dtype_name(attn_dtype dtype);
/* "float32"/"float"/"f32", "float64"/"double"/"f64" or "int64"/"long"/"i64";
 * returns 0 on success. */
int attn_dtype_parse(const char *name, attn_dtype *out);
static inline int attn_dtype_is_float(attn_dtype dtype) { return dtype != ATTN_I64; }
/* The one rule for int64 in float math: ATTN_OK for a float tensor, else an
 * ATTN_ERR_DTYPE error naming op, t's shape and the conversion to use. */
attn_status attn_check_float(const char *op, const attn_tensor *t);
/* double -> int64 without undefined behaviour: truncates toward zero,
 * saturates outside the int64 range, NaN gives 0. */
static inline int64_t attn_double_to_i64(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}
/* Writes the scalar v in dtype into buf (8 bytes). For int64, v must be an
 * integer in range, else an error naming op says to convert the tensor. */
attn_status attn_scalar_to(const char *op, attn_dtype dtype, double v, void *buf);

/* New contiguous tensor of the given shape with uninitialised contents.
 * Fails on negative sizes, more than ATTN_MAX_DIMS dims, overflow, or when
 * memory cannot be had. On failure *t is left released (storage NULL). */
attn_status attn_tensor_init(attn_tensor *t, attn_dtype dtype, int ndim, const int64_t *shape);
/* Whether a tensor of this dtype and shape could be allocated (the allocator's request limit,
 * attn_alloc_max_request): checked before a call walks its inputs (validating ids, converting
 * indices), so an output too large fails at once. The error reads "op: <what> float32 [3x...]
 * needs 2.6e+13 bytes, more than memory can hold (limit ...)". */
attn_status attn_tensor_check_size(const char *op, const char *what, attn_dtype dtype, int ndim,
                                   const int64_t *shape);
/* Same, filled with zeros. */
attn_status attn_tensor_init_zeros(attn_tensor *t, attn_dtype dtype, int ndim, const int64_t *shape);
/* New contiguous tensor with the shape and dtype of src (contents uninitialised). */
attn_status attn_tensor_init_like(attn_tensor *t, const attn_tensor *src);

/* dst becomes a view of src (copies the view struct, retains the storage). */
void attn_tensor_view(attn_tensor *dst, const attn_tensor *src);
/* Releases the storage reference; safe to call twice. */
void attn_tensor_free(attn_tensor *t);

int64_t attn_tensor_numel(const attn_tensor *t);
/* Row-major strides (in elements) of a contiguous tensor of shape (ndim). */
void attn_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
int attn_tensor_is_contiguous(const attn_tensor *t);
/* Whether two different indices of t address the same element (a dim of size
 * > 1 with stride 0, as expand makes): such a view cannot be written to. */
int attn_tensor_overlaps_itself(const attn_tensor *t);
/* Whether writing w element by element can change what reading r returns:
 * they share storage bytes and are not the very same view (same dtype,
 * offset, shape and strides, where each element is read before it is
 * written). Conservative: compares the byte spans the views cover. */
int attn_tensor_aliases(const attn_tensor *w, const attn_tensor *r);
/* What a kernel that writes w should read instead of r: r itself, or, when r
 * aliases w, a contiguous copy made in *tmp (*tmp is left released
 * otherwise; release it after the kernel in both cases). */
attn_status attn_unalias(const attn_tensor *w, const attn_tensor *r, attn_tensor *tmp, const attn_tensor **use);
/* Address of element 0 of the view; for an empty view, the start of its storage. */
void *attn_tensor_data(const attn_tensor *t);
/* Shape as "[2x3]" (see attn_shape_str). */
const char *attn_tensor_shape_str(const attn_tensor *t);
/* Element at a 0-based multi-index as double; index must be in range. int64
 * values beyond 2^53 round; attn_tensor_get_i64 reads them exactly (float
 * values are converted with attn_double_to_i64). set converts the same way. */
double attn_tensor_get(const attn_tensor *t, const int64_t *index);
int64_t attn_tensor_get_i64(const attn_tensor *t, const int64_t *index);
void attn_tensor_set(attn_tensor *t, const int64_t *index, double value);
void attn_tensor_set_i64(attn_tensor *t, const int64_t *index, int64_t value);
/* Address of the element at a 0-based multi-index. */
void *attn_tensor_ptr(const attn_tensor *t, const int64_t *index);

/* Metadata transforms: they edit the view struct *t in place (no storage
 * reference changes) and validate their arguments, naming op in errors. */
attn_status attn_view_transpose(attn_tensor *t, int dim0, int dim1);
attn_status attn_view_permute(attn_tensor *t, const int *perm); /* perm has t->ndim entries */
attn_status attn_view_narrow(attn_tensor *t, int dim, int64_t start, int64_t length);
attn_status attn_view_select(attn_tensor *t, int dim, int64_t index); /* drops dim */
attn_status attn_view_unsqueeze(attn_tensor *t, int dim);            /* dim in [0, ndim] */
attn_status attn_view_squeeze(attn_tensor *t, int dim);              /* dim < 0: all size-1 dims */
/* t's storage, offset and dtype under the given shape and element strides (ndim <= ATTN_MAX_DIMS),
 * as torch.as_strided: a borrowed struct copy, unchecked; the caller keeps it inside t's storage. */
attn_tensor attn_view_as_strided(const attn_tensor *t, int ndim, const int64_t *shape, const int64_t *stride);
/* Broadcast view to shape (ndim >= t->ndim; size-1 dims get stride 0; -1 keeps a size). */
attn_status attn_view_expand(attn_tensor *t, int ndim, const int64_t *shape);
/* Reshape without copying; one entry may be -1. Fails with ATTN_ERR_SHAPE
 * "not viewable" when the strides do not allow it (copy first). */
attn_status attn_view_reshape(const char *op, attn_tensor *t, int ndim, const int64_t *shape);
/* Resolves a -1 entry and checks the element count; shape is edited in place. */
attn_status attn_shape_infer(const char *op, int64_t numel, int ndim, int64_t *shape);

/* Broadcast shape of a and b (NumPy rules) into out_shape/out_ndim. */
attn_status attn_broadcast_shape(const char *op, int andim, const int64_t *ashape, int bndim,
                                 const int64_t *bshape, int *out_ndim, int64_t *out_shape);

/* dst[...] = src[...]: src broadcast to dst's shape, dtype converted (float
 * to int64 truncates toward zero, see attn_double_to_i64).
 * dst may be any strided view; dst and src must not partially overlap. */
attn_status attn_copy(attn_tensor *dst, const attn_tensor *src);
/* Every element of t becomes value (for int64: an integer, see attn_scalar_to). */
attn_status attn_fill(attn_tensor *t, double value);
/* New contiguous copy of src, in dtype. */
attn_status attn_tensor_clone(attn_tensor *dst, const attn_tensor *src, attn_dtype dtype);

#endif
