#define _POSIX_C_SOURCE 200809L
#include "core/attn_alloc.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define CLASS_COUNT 256
#define MIN_BLOCK 64

typedef struct free_block {
  struct free_block *next;
} free_block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static free_block *free_lists[CLASS_COUNT];
/* peak_live_bytes is the measurement peak (reset by attn_alloc_peak_live_bytes);
 * live_peak the lifetime high-water mark that bounds the cache. */
static size_t live_bytes, cached_bytes, peak_live_bytes, live_peak;
static uint64_t clock_ticks, class_used[CLASS_COUNT]; /* when each class was last used */
static size_t cache_limit = (size_t)4 << 30;
static size_t max_request;

/* Class index and size: 64, 80, 96, 112, 128, 160, ... (four steps per octave). */
static int size_class(size_t n, size_t *class_bytes) {
  if (n <= MIN_BLOCK) {
    *class_bytes = MIN_BLOCK;
    return 0;
  }
  int octave = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^octave < n <= 2^(octave+1) */
  size_t base = (size_t)1 << octave, step = base / 4;
  size_t quarters = (n - base + step - 1) / step; /* 1..4 */
  *class_bytes = base + quarters * step;
  return (octave - 6) * 4 + (int)quarters;
}

/* Size in bytes of class index cls (the inverse of size_class). */
static size_t class_size(int cls) {
  if (cls == 0) return MIN_BLOCK;
  int octave = (cls - 1) / 4 + 6, quarters = (cls - 1) % 4 + 1;
  size_t base = (size_t)1 << octave;
  return base + (size_t)quarters * (base / 4);
}

static pthread_once_t max_request_once = PTHREAD_ONCE_INIT;

static void init_max_request(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  size_t phys = (pages > 0 && page > 0) ? (size_t)pages * (size_t)page : ((size_t)8 << 30);
  pthread_mutex_lock(&lock);
  if (max_request == 0) max_request = phys / 4 * 3;
  pthread_mutex_unlock(&lock);
}

size_t attn_alloc_max_request(void) {
  pthread_once(&max_request_once, init_max_request);
  pthread_mutex_lock(&lock);
  size_t v = max_request;
  pthread_mutex_unlock(&lock);
  return v;
}

void attn_alloc_set_max_request(size_t bytes) {
  pthread_once(&max_request_once, init_max_request);
  pthread_mutex_lock(&lock);
  max_request = bytes;
  pthread_mutex_unlock(&lock);
}

/* Counts bytes handed out (lock held). */
static void count_live(size_t bytes) {
  live_bytes += bytes;
  if (live_bytes > peak_live_bytes) peak_live_bytes = live_bytes;
  if (live_bytes > live_peak) live_peak = live_bytes;
}

void *attn_alloc(size_t nbytes, size_t *capacity) {
  pthread_once(&max_request_once, init_max_request);
  void *p = NULL;
  size_t bytes;
  /* one critical section for a cache hit: the limit, the list and the counts */
  pthread_mutex_lock(&lock);
  if (nbytes > max_request) { /* before size_class, which would overflow near SIZE_MAX */
    pthread_mutex_unlock(&lock);
    return NULL;
  }
  int cls = size_class(nbytes, &bytes);
  if (cls < CLASS_COUNT && free_lists[cls]) {
    p = free_lists[cls];
    free_lists[cls] = free_lists[cls]->next;
    cached_bytes -= bytes;
    class_used[cls] = ++clock_ticks;
    count_live(bytes);
  }
  pthread_mutex_unlock(&lock);
  if (!p) {
    if (posix_memalign(&p, 64, bytes) != 0) {
      attn_alloc_empty_cache(); /* cached blocks of other classes may be what is missing */
      if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    }
    pthread_mutex_lock(&lock);
    count_live(bytes);
    pthread_mutex_unlock(&lock);
  }
  *capacity = bytes;
  return p;
}

void attn_free(void *ptr, size_t capacity) {
  if (!ptr) return;
  size_t bytes;
  int cls = size_class(capacity, &bytes);
  free_block *evicted = NULL;
  pthread_mutex_lock(&lock);
  live_bytes -= capacity;
  /* The cache never holds more than twice the most ever live at once nor
   * more than the limit; to take this block it gives up blocks of the classes
   * used longest ago. Twice, not once: a training loop's garbage is freed a
   * collection cycle at a time, and cycles end at different points of the
   * loop, so blocks left over from one cycle join the next cycle's; with room
   * for only one peak, each collection evicted a few classes that the loop
   * then allocated afresh (the Bahdanau step: 23 evictions, 34 misses and 8
   * fresh page faults a step; none in the steady state with twice). */
  size_t bound = live_peak < cache_limit / 2 ? 2 * live_peak : cache_limit;
  if (cls < CLASS_COUNT && bytes == capacity && capacity <= bound) {
    while (cached_bytes + capacity > bound) {
      int victim = -1;
      for (int i = 0; i < CLASS_COUNT; i++)
        if (i != cls && free_lists[i] && (victim < 0 || class_used[i] < class_used[victim])) victim = i;
      if (victim < 0) break;
      free_block *b = free_lists[victim];
      free_lists[victim] = b->next;
      cached_bytes -= class_size(victim);
      b->next = evicted;
      evicted = b;
    }
    if (cached_bytes + capacity <= bound) {
      free_block *b = ptr;
      b->next = free_lists[cls];
      free_lists[cls] = b;
      cached_bytes += capacity;
      class_used[cls] = ++clock_ticks;
      ptr = NULL;
    }
  }
  pthread_mutex_unlock(&lock);
  free(ptr);
  while (evicted) {
    free_block *next = evicted->next;
    free(evicted);
    evicted = next;
  }
}

void attn_alloc_empty_cache(void) {
  free_block *lists[CLASS_COUNT];
  pthread_mutex_lock(&lock);
  for (int i = 0; i < CLASS_COUNT; i++) {
    lists[i] = free_lists[i];
    free_lists[i] = NULL;
  }
  cached_bytes = 0;
  pthread_mutex_unlock(&lock);
  for (int i = 0; i < CLASS_COUNT; i++)
    while (lists[i]) {
      free_block *next = lists[i]->next;
      free(lists[i]);
      lists[i] = next;
    }
}

size_t attn_alloc_live_bytes(void) {
  pthread_mutex_lock(&lock);
  size_t v = live_bytes;
  pthread_mutex_unlock(&lock);
  return v;
}

size_t attn_alloc_peak_bytes(int reset) {
  pthread_mutex_lock(&lock);
  size_t v = peak_live_bytes;
  if (reset) peak_live_bytes = live_bytes;
  pthread_mutex_unlock(&lock);
  return v;
}

size_t attn_alloc_cached_bytes(void) {
  pthread_mutex_lock(&lock);
  size_t v = cached_bytes;
  pthread_mutex_unlock(&lock);
  return v;
}

void attn_alloc_set_cache_limit(size_t bytes) {
  pthread_mutex_lock(&lock);
  cache_limit = bytes;
  pthread_mutex_unlock(&lock);
  if (attn_alloc_cached_bytes() > bytes) attn_alloc_empty_cache();
}
