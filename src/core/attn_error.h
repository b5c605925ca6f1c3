/* attn_error: status codes and the per-thread error message of the C core.
 *
 * Every core function that can fail returns an attn_status; on failure it
 * has recorded a message naming the operation and the shapes involved,
 * readable with attn_last_error() from the same thread. The core never
 * prints, exits or aborts. */
#ifndef ATTN_ERROR_H
#define ATTN_ERROR_H

#include <stdint.h>

typedef enum {
  ATTN_OK = 0,
  ATTN_ERR_ARG,     /* bad argument value (dim out of range, bad index) */
  ATTN_ERR_SHAPE,   /* shapes do not fit together */
  ATTN_ERR_DTYPE,   /* dtypes do not fit together */
  ATTN_ERR_MEMORY,  /* allocation failed or size overflows */
  ATTN_ERR_NUMERIC, /* a factorisation failed (singular matrix, no convergence) */
  ATTN_ERR_IO       /* file or format problem */
} attn_status;

/* Records a printf-style message for this thread and returns status. */
attn_status attn_error(attn_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The message of the last failure on this thread ("" if none). */
const char *attn_last_error(void);

/* Formats a shape as "[2x3x4]" ("[]" for 0-d) into a small per-thread ring of
 * buffers, so up to four shapes can appear in one message. */
const char *attn_shape_str(int ndim, const int64_t *shape);

#endif
