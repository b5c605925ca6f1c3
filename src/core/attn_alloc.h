/* attn_alloc: the caching allocator behind every tensor storage.
 *
 * Why: on these machines the first touch of freshly mapped memory costs about
 * 10 us per 4 KiB page, and glibc returns large blocks to the kernel on free.
 * Blocks are rounded up to size classes (four per power of two, so at most 25%
 * slack) and kept on per-class free lists after release, so a loop that
 * repeats an operation reuses warm pages instead of faulting in new ones.
 * Thread-safe (one mutex); 64-byte aligned. */
#ifndef ATTN_ALLOC_H
#define ATTN_ALLOC_H

#include <stddef.h>

/* Returns a block of at least nbytes (64-byte aligned), or NULL. The usable
 * size (the class size) is stored in *capacity. */
void *attn_alloc(size_t nbytes, size_t *capacity);

/* Returns a block obtained from attn_alloc with its capacity; it goes to the
 * cache unless that would make the cache larger than its limit or than twice
 * the largest number of bytes ever live at once. */
void attn_free(void *ptr, size_t capacity);

/* Gives every cached block back to the system. */
void attn_alloc_empty_cache(void);

/* Bytes in blocks handed out and not yet freed, and bytes held in the cache. */
size_t attn_alloc_live_bytes(void);
size_t attn_alloc_cached_bytes(void);

/* The most bytes live at once since the last reset (or the start); reset != 0
 * restarts the count from the bytes live now (benchmarks: extra memory of a call). */
size_t attn_alloc_peak_bytes(int reset);

/* Largest number of bytes the cache keeps (default 4 GiB); 0 disables it. */
void attn_alloc_set_cache_limit(size_t bytes);

/* Refuses single requests above this many bytes (default: 3/4 of physical
 * memory), so an absurd size fails cleanly instead of swamping the machine. */
void attn_alloc_set_max_request(size_t bytes);
size_t attn_alloc_max_request(void);

#endif
