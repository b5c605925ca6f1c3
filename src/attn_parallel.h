/* attn_parallel: the engine's one worker pool.
 *
 * OpenBLAS is pinned to one thread and called from these workers, so the two
 * never spin against each other on a small machine: set_num_threads governs
 * both. Workers sleep on a condition variable between jobs. Work is split
 * into contiguous chunks by index, and kernels only parallelise over
 * independent outputs, so results do not depend on the thread count. */
#ifndef ATTN_PARALLEL_H
#define ATTN_PARALLEL_H

#include <stdint.h>

/* Runs fn(ctx, begin, end) over [0, n) split into at most num_threads chunks of
 * at least grain items each; the caller runs one chunk and waits for the rest.
 * Called from inside a worker (nested) or while the pool is busy, it runs
 * serially on the calling thread. */
typedef void (*attn_task_fn)(void *ctx, int64_t begin, int64_t end);
void attn_parallel_for(int64_t n, int64_t grain, attn_task_fn fn, void *ctx);

/* n >= 1; clamped to 64. Also pins OpenBLAS to one thread. */
void attn_set_num_threads(int n);
int attn_get_num_threads(void);

/* Stops and joins every worker (they run library code, so this must happen
 * before the library is unloaded). The pool restarts on next use. */
void attn_parallel_shutdown(void);

#endif
