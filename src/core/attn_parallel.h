/* attn_parallel: the engine's one worker pool.
 *
 * OpenBLAS is pinned to one thread and called from these workers, so the two
 * never spin against each other on a small machine: set_num_threads governs
 * both. Workers poll for the next job for a few tens of microseconds, then
 * sleep on a condition variable. Work is split
 * into contiguous ranges of indices that threads take as they become free,
 * and kernels only parallelise over independent outputs, so results depend
 * neither on the thread count nor on which thread ran which range. */
#ifndef ATTN_PARALLEL_H
#define ATTN_PARALLEL_H

#include <stdint.h>

/* Runs fn(ctx, begin, end) over disjoint ranges covering [0, n), each of at
 * least grain items (the last may be shorter), on at most num_threads threads:
 * the caller and the workers take the next range from a shared counter until
 * none is left (guided: each range is the items left over twice the thread
 * count, at least grain), then the caller waits for the workers still running a
 * range (not for one that had not started: it skips the job) and returns. How [0, n)
 * is cut and which thread runs a range vary, so fn must treat every item
 * independently of the range it comes in. Called from inside a worker (nested)
 * or while the pool is busy, it runs fn(ctx, 0, n) on the calling thread. */
typedef void (*attn_task_fn)(void *ctx, int64_t begin, int64_t end);
void attn_parallel_for(int64_t n, int64_t grain, attn_task_fn fn, void *ctx);

/* n >= 1; clamped to 64. Also pins OpenBLAS to one thread. */
void attn_set_num_threads(int n);
int attn_get_num_threads(void);

/* Stops and joins every worker (they run library code, so this must happen
 * before the library is unloaded). The pool restarts on next use. */
void attn_parallel_shutdown(void);

#endif
