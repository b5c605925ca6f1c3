#include "core/attn_iter.h"

#include "core/attn_parallel.h"

#define PARALLEL_MIN_ELEMENTS 32768

void attn_iter_begin(attn_iter *it, int ndim, const int64_t *shape) {
  it->ndim = ndim;
  it->nops = 0;
  for (int d = 0; d < ndim; d++) it->shape[d] = shape[d];
}

int attn_iter_add(attn_iter *it, const attn_tensor *t) {
  int k = it->nops++;
  int64_t elsize = (int64_t)attn_dtype_size(t->dtype);
  int lead = it->ndim - t->ndim; /* broadcasting aligns trailing dims */
  it->data[k] = attn_tensor_data(t);
  int empty = 0; /* nothing will be visited: an empty tensor's strides may be anything */
  for (int d = 0; d < it->ndim; d++) empty |= it->shape[d] == 0;
  for (int d = 0; d < it->ndim; d++) {
    int td = d - lead;
    it->stride[k][d] = (empty || td < 0 || t->shape[td] == 1) ? 0 : t->stride[td] * elsize;
  }
  return k;
}

int attn_iter_add_scalar(attn_iter *it, void *ptr) {
  int k = it->nops++;
  it->data[k] = ptr;
  for (int d = 0; d < it->ndim; d++) it->stride[k][d] = 0;
  return k;
}

/* Drops size-1 dims and merges neighbours that are contiguous for all operands. */
static void coalesce(attn_iter *it) {
  int out = 0;
  for (int d = 0; d < it->ndim; d++) {
    if (it->shape[d] == 1) continue;
    if (out > 0) {
      int mergeable = 1;
      for (int k = 0; k < it->nops; k++)
        if (it->stride[k][out - 1] != it->stride[k][d] * it->shape[d]) mergeable = 0;
      if (mergeable) {
        it->shape[out - 1] *= it->shape[d];
        for (int k = 0; k < it->nops; k++) it->stride[k][out - 1] = it->stride[k][d];
        continue;
      }
    }
    it->shape[out] = it->shape[d];
    for (int k = 0; k < it->nops; k++) it->stride[k][out] = it->stride[k][d];
    out++;
  }
  if (out == 0) { /* a single element */
    it->shape[0] = 1;
    for (int k = 0; k < it->nops; k++) it->stride[k][0] = 0;
    out = 1;
  }
  it->ndim = out;
}

typedef struct {
  attn_iter *it;
  attn_iter_fn fn;
  void *ctx;
} iter_job;

/* Runs the flat element range [begin, end) of the coalesced iteration. */
static void run_range(void *arg, int64_t begin, int64_t end) {
  iter_job *job = arg;
  attn_iter *it = job->it;
  int nd = it->ndim, nops = it->nops;
  int64_t inner = it->shape[nd - 1];
  int64_t index[ATTN_MAX_DIMS];
  int64_t step[ATTN_ITER_MAX_OPS];
  char *ptr[ATTN_ITER_MAX_OPS];
  for (int k = 0; k < nops; k++) step[k] = it->stride[k][nd - 1];
  int64_t pos = begin, rest = begin;
  for (int d = nd - 1; d >= 0; d--) {
    index[d] = rest % it->shape[d];
    rest /= it->shape[d];
  }
  while (pos < end) {
    for (int k = 0; k < nops; k++) {
      char *p = it->data[k];
      for (int d = 0; d < nd; d++) p += index[d] * it->stride[k][d];
      ptr[k] = p;
    }
    int64_t n = inner - index[nd - 1];
    if (n > end - pos) n = end - pos;
    job->fn(n, ptr, step, job->ctx);
    pos += n;
    index[nd - 1] = 0;
    for (int d = nd - 2; d >= 0; d--) {
      if (++index[d] < it->shape[d]) break;
      index[d] = 0;
    }
  }
}

void attn_iter_run_cost(attn_iter *it, attn_iter_fn fn, void *ctx, int64_t cost) {
  for (int d = 0; d < it->ndim; d++) /* before the product: an empty shape's may overflow */
    if (it->shape[d] == 0) return;
  int64_t numel = 1;
  for (int d = 0; d < it->ndim; d++) numel *= it->shape[d];
  if (cost < 1) cost = 1;
  /* A row this long is a whole job already; the bound keeps the products below from
   * overflowing (a reduced row of 2^63 - 1 entries) and changes no split. */
  if (cost > PARALLEL_MIN_ELEMENTS) cost = PARALLEL_MIN_ELEMENTS;
  coalesce(it);
  iter_job job = {it, fn, ctx};
  int64_t work;
  if (!__builtin_mul_overflow(numel, cost, &work) && work < PARALLEL_MIN_ELEMENTS)
    run_range(&job, 0, numel);
  else
    attn_parallel_for(numel, (PARALLEL_MIN_ELEMENTS / 2 + cost - 1) / cost, run_range, &job);
}

void attn_iter_run(attn_iter *it, attn_iter_fn fn, void *ctx) { attn_iter_run_cost(it, fn, ctx, 1); }
