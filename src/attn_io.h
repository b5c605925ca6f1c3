/* attn_io: the Lua-free half of the checkpoint formats (safetensors, NumPy
 * .npy): element encodings between tensors and bytes, and atomic file writes.
 * The headers (safetensors' JSON, .npy's dict) are built and validated by
 * lua/attn/io.lua; with these functions a C program writes and reads the
 * data of the same files.
 *
 * Byte order: every function reads and writes an explicit byte order (the
 * files' little-endian unless told otherwise) by assembling bytes, so it is
 * correct on any host; a host-order memcpy is only a fast path, taken when
 * the host is detected (at run time) to be little-endian.
 *
 * Errors: attn_status with a message (attn_last_error) naming the operation;
 * file-system failures are ATTN_ERR_IO, and their message names the path. */
#ifndef ATTN_IO_H
#define ATTN_IO_H

#include <stddef.h>
#include <stdint.h>

#include "attn_tensor.h"

/* The element encodings of the files. F16 and BF16 load into float32 and
 * I32 into int64 (all exactly); the others load bit-exactly into their own
 * dtype. The small integers U8, I8 and I16 (image pixels and labels, as in
 * idx files) load into float32, where every such value is exact, at half
 * int64's size. Decoding only: tensors are saved in their own dtype. */
typedef enum {
  ATTN_ENC_F32, ATTN_ENC_F64, ATTN_ENC_F16, ATTN_ENC_BF16, ATTN_ENC_I32, ATTN_ENC_I64,
  ATTN_ENC_U8, ATTN_ENC_I8, ATTN_ENC_I16
} attn_encoding;

/* "float32"/"f32"/"F32"/"float", "float64"/"f64"/"F64"/"double",
 * "float16"/"f16"/"F16", "bfloat16"/"bf16"/"BF16", "int32"/"i32"/"I32",
 * "int64"/"i64"/"I64", "uint8"/"u1"/"U8", "int8"/"i1"/"I8",
 * "int16"/"i2"/"I16" (NumPy's byte-count codes for the small integers, whose
 * "i8" is int64); returns 0, or -1 for an unknown name. */
int attn_encoding_parse(const char *name, attn_encoding *out);
/* "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8",
 * "int8" or "int16". */
const char *attn_encoding_name(attn_encoding e);
/* Bytes per element: 4, 8, 2, 2, 4, 8, 1, 1, 2. */
size_t attn_encoding_size(attn_encoding e);
/* The dtype the encoding loads into. */
attn_dtype attn_encoding_dtype(attn_encoding e);

/* numel(t) * itemsize of t (any layout) in *nbytes; ATTN_ERR_MEMORY when it
 * does not fit a size_t. */
attn_status attn_io_nbytes(const attn_tensor *t, size_t *nbytes);

/* Whether t's storage, read from t's first element, already is its
 * little-endian row-major serialisation (contiguous, on a little-endian
 * host), so it can be written out without a copy. */
int attn_io_is_serialised(const attn_tensor *t);

/* dst[0 .. nbytes) = the elements of t (any dtype, any layout: a strided
 * view is read in row-major order) as little-endian bytes of its own dtype;
 * nbytes must be attn_io_nbytes(t). */
attn_status attn_io_encode(const attn_tensor *t, void *dst, size_t nbytes);

/* Checks that an array of encoding e and shape (ndim sizes >= 0) stored at
 * offset lies within len bytes (before allocating it). ATTN_ERR_IO "op:
 * float32 [2x3] needs 24 bytes at offset 8, the data has 20" (a truncated
 * file), ATTN_ERR_SHAPE when the byte count overflows. */
attn_status attn_io_check_span(const char *op, size_t len, size_t offset, attn_encoding e, int ndim,
                               const int64_t *shape);

/* out (contiguous, dtype attn_encoding_dtype(e)) = the elements of encoding
 * e stored at src + offset in row-major order (big-endian when big_endian),
 * where src holds len bytes; the span is checked as attn_io_check_span. */
attn_status attn_io_decode(const void *src, size_t len, size_t offset, attn_encoding e, int big_endian,
                           attn_tensor *out);

/* One piece of a file: len bytes at data. */
typedef struct {
  const void *data;
  size_t len;
} attn_io_part;

/* Writes parts[0 .. n) in order to a temporary file in path's folder (unnamed
 * until complete where the file system allows, O_TMPFILE), fsyncs it and
 * renames it over path, then fsyncs the folder (best effort). On failure
 * the temporary file is removed and path is left as it was; temporaries of
 * earlier saves to path whose process no longer exists are removed first.
 * ATTN_ERR_IO: "<path>: cannot ...: <reason>". */
attn_status attn_io_write_atomic(const char *path, const attn_io_part *parts, size_t n);

/* fsyncs the file at path. ATTN_ERR_IO: "<path>: cannot fsync: <reason>". */
attn_status attn_io_fsync(const char *path);

#endif
