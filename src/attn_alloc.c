#define _POSIX_C_SOURCE 200809L
#include "attn_alloc.h"

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
static size_t live_bytes, cached_bytes, peak_live_bytes;
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

void *attn_alloc(size_t nbytes, size_t *capacity) {
  if (nbytes > attn_alloc_max_request()) return NULL;
  size_t bytes;
  int cls = size_class(nbytes, &bytes);
  void *p = NULL;
  pthread_mutex_lock(&lock);
  if (cls < CLASS_COUNT && free_lists[cls]) {
    p = free_lists[cls];
    free_lists[cls] = free_lists[cls]->next;
    cached_bytes -= bytes;
  }
  pthread_mutex_unlock(&lock);
  if (!p && posix_memalign(&p, 64, bytes) != 0) {
    attn_alloc_empty_cache(); /* cached blocks of other classes may be what is missing */
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
  }
  pthread_mutex_lock(&lock);
  live_bytes += bytes;
  if (live_bytes > peak_live_bytes) peak_live_bytes = live_bytes;
  pthread_mutex_unlock(&lock);
  *capacity = bytes;
  return p;
}

void attn_free(void *ptr, size_t capacity) {
  if (!ptr) return;
  size_t bytes;
  int cls = size_class(capacity, &bytes);
  pthread_mutex_lock(&lock);
  live_bytes -= capacity;
  if (cls < CLASS_COUNT && bytes == capacity && cached_bytes + capacity <= cache_limit) {
    free_block *b = ptr;
    b->next = free_lists[cls];
    free_lists[cls] = b;
    cached_bytes += capacity;
    ptr = NULL;
  }
  pthread_mutex_unlock(&lock);
  free(ptr);
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
