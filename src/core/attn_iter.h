/* attn_iter (internal): walks up to four strided operands over one shape.
 *
 * Operands are given as base pointers and byte strides over the iteration
 * shape (a broadcast operand has stride 0). Dims of size 1 are dropped and
 * dims that are contiguous for every operand are merged, so the callback sees
 * long inner runs. Large iterations are split over the worker pool by flat
 * element range, so each element is handled exactly once. */
#ifndef ATTN_ITER_H
#define ATTN_ITER_H

#include "core/attn_tensor.h"

#define ATTN_ITER_MAX_OPS 4

typedef struct attn_iter {
  int ndim;
  int nops;
  int64_t shape[ATTN_MAX_DIMS];
  int64_t stride[ATTN_ITER_MAX_OPS][ATTN_MAX_DIMS]; /* bytes */
  char *data[ATTN_ITER_MAX_OPS];
} attn_iter;

/* Inner loop: n elements; ptr[k] is operand k's first element, step[k] its byte stride. */
typedef void (*attn_iter_fn)(int64_t n, char **ptr, const int64_t *step, void *ctx);

/* Starts an iteration over shape with no operands. */
void attn_iter_begin(attn_iter *it, int ndim, const int64_t *shape);
/* Adds tensor t broadcast to the iteration shape (caller has checked that it
 * broadcasts). Returns the operand index. */
int attn_iter_add(attn_iter *it, const attn_tensor *t);
/* Adds a scalar living at ptr (stride 0 everywhere). */
int attn_iter_add_scalar(attn_iter *it, void *ptr);
/* Merges dims and runs fn; parallel when the iteration is large. */
void attn_iter_run(attn_iter *it, attn_iter_fn fn, void *ctx);
/* Same, for callbacks that do `cost` units of work per element (a reduction
 * over a row of that length), so long rows are split over threads too. */
void attn_iter_run_cost(attn_iter *it, attn_iter_fn fn, void *ctx, int64_t cost);

#endif
