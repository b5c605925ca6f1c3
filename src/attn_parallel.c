#define _POSIX_C_SOURCE 200809L
#include "attn_parallel.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define MAX_THREADS 64
/* Ranges per thread: threads take the next range from a shared counter as they finish one, so
 * a thread that starts late or runs slower (woken late, or sharing its core with another
 * process) leaves its share to the others; four per thread keeps the per-range cost small. */
#define RANGES_PER_THREAD 4

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the fields below */
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time */
static pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER;
static pthread_cond_t work_done = PTHREAD_COND_INITIALIZER;
static int num_threads;      /* 0 until first use */
static int workers_started;  /* worker threads alive */
static uint64_t generation;  /* bumped per job */
static int pending;          /* workers still in the current job */
static attn_task_fn job_fn;
static void *job_ctx;
static int64_t job_n, job_step;
static atomic_llong job_next; /* first item of the next range to hand out */
static int job_chunks;        /* threads taking part, the caller included */
static uint64_t worker_start_generation[MAX_THREADS];
static pthread_t worker_threads[MAX_THREADS];
static int stopping; /* set by attn_parallel_shutdown */
static _Thread_local int inside_worker;

/* Runs ranges of the current job until none is left. */
static void run_ranges(void) {
  for (;;) {
    int64_t begin = atomic_fetch_add(&job_next, job_step);
    if (begin >= job_n) return;
    job_fn(job_ctx, begin, begin + job_step < job_n ? begin + job_step : job_n);
  }
}

static void *worker_main(void *arg) {
  int id = (int)(intptr_t)arg; /* 1-based: chunk 0 belongs to the caller */
  /* The generation at creation time, so a job posted before this thread first
   * takes the lock is not missed. */
  uint64_t seen = worker_start_generation[id];
  inside_worker = 1;
  pthread_mutex_lock(&pool_lock);
  for (;;) {
    while (generation == seen && !stopping) pthread_cond_wait(&work_ready, &pool_lock);
    if (stopping) break;
    seen = generation;
    if (id >= job_chunks) continue;
    pthread_mutex_unlock(&pool_lock);
    run_ranges();
    pthread_mutex_lock(&pool_lock);
    if (--pending == 0) pthread_cond_signal(&work_done);
  }
  pthread_mutex_unlock(&pool_lock);
  return NULL;
}

static void ensure_workers(void) {
  if (num_threads == 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    num_threads = cores < 1 ? 1 : (cores > MAX_THREADS ? MAX_THREADS : (int)cores);
    openblas_set_num_threads(1);
  }
  while (workers_started < num_threads - 1) {
    worker_start_generation[workers_started + 1] = generation;
    if (pthread_create(&worker_threads[workers_started + 1], NULL, worker_main,
                       (void *)(intptr_t)(workers_started + 1)) != 0) {
      num_threads = workers_started + 1; /* run with what we have */
      break;
    }
    workers_started++;
  }
}

void attn_set_num_threads(int n) {
  if (n < 1) n = 1;
  if (n > MAX_THREADS) n = MAX_THREADS;
  pthread_mutex_lock(&job_lock);
  pthread_mutex_lock(&pool_lock);
  if (num_threads == 0) openblas_set_num_threads(1);
  num_threads = n;
  ensure_workers();
  pthread_mutex_unlock(&pool_lock);
  pthread_mutex_unlock(&job_lock);
}

int attn_get_num_threads(void) {
  pthread_mutex_lock(&pool_lock);
  ensure_workers();
  int n = num_threads;
  pthread_mutex_unlock(&pool_lock);
  return n;
}

void attn_parallel_for(int64_t n, int64_t grain, attn_task_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int threads = inside_worker ? 1 : attn_get_num_threads();
  int64_t max_chunks = (n + grain - 1) / grain;
  if (threads > max_chunks) threads = (int)max_chunks;
  if (threads <= 1 || pthread_mutex_trylock(&job_lock) != 0) {
    fn(ctx, 0, n);
    return;
  }
  pthread_mutex_lock(&pool_lock);
  job_fn = fn;
  job_ctx = ctx;
  job_n = n;
  job_step = (n + (int64_t)threads * RANGES_PER_THREAD - 1) / ((int64_t)threads * RANGES_PER_THREAD);
  if (job_step < grain) job_step = grain;
  atomic_store(&job_next, 0);
  job_chunks = threads;
  pending = threads - 1;
  generation++;
  pthread_cond_broadcast(&work_ready);
  pthread_mutex_unlock(&pool_lock);
  inside_worker = 1; /* nested calls from the caller's ranges run serially */
  run_ranges();
  inside_worker = 0;
  pthread_mutex_lock(&pool_lock);
  while (pending > 0) pthread_cond_wait(&work_done, &pool_lock);
  pthread_mutex_unlock(&pool_lock);
  pthread_mutex_unlock(&job_lock);
}

void attn_parallel_shutdown(void) {
  pthread_mutex_lock(&job_lock); /* waits for a running job */
  pthread_mutex_lock(&pool_lock);
  stopping = 1;
  pthread_cond_broadcast(&work_ready);
  int n = workers_started;
  pthread_mutex_unlock(&pool_lock);
  for (int i = 1; i <= n; i++) pthread_join(worker_threads[i], NULL);
  pthread_mutex_lock(&pool_lock);
  stopping = 0;
  workers_started = 0;
  pthread_mutex_unlock(&pool_lock);
  pthread_mutex_unlock(&job_lock);
}
