#define _POSIX_C_SOURCE 200809L
#include "core/attn_parallel.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64
/* Guided ranges: each range a thread takes is the items left divided by GUIDE_DIV * threads (at
 * least the grain), so ranges start large (few counter updates and workspace setups) and shrink
 * to single grains at the end, where a thread woken late, or sharing its core with another
 * process, would otherwise leave the others waiting on its last large range. */
#define GUIDE_DIV 2
/* How long a thread polls before it sleeps on a condition variable: a worker between two jobs
 * (the next call usually follows within microseconds: the backward's passes, a bench loop), and
 * the caller waiting for the last range. Waking a sleeping thread costs 15-50 us on these
 * machines, a real share of a call at N = 128; a poll costs a core for at most this long. */
#define SPIN_NS 60000

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the fields below */
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time */
static pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER;
static pthread_cond_t work_done = PTHREAD_COND_INITIALIZER;
static int num_threads;            /* 0 until first use */
static int workers_started;        /* worker threads alive */
static _Atomic uint64_t generation; /* bumped per job (written under pool_lock, polled without it) */
/* The current job's crew: its generation's low 32 bits, CREW_CLOSED once the caller has run out of
 * ranges, and the count of workers inside it. A worker joins only while the job is open, so the
 * caller waits for the workers that took part, never for one the scheduler has not run yet (on a
 * loaded machine that wait was a time slice, longer than a small job). */
static _Atomic uint64_t crew;
#define CREW_CLOSED ((uint64_t)1 << 31)
#define CREW_COUNT (CREW_CLOSED - 1)
static attn_task_fn job_fn;
static void *job_ctx;
static int64_t job_n, job_grain, job_div;
static atomic_llong job_next; /* first item of the next range to hand out */
static int job_chunks;        /* threads taking part, the caller included */
static uint64_t worker_start_generation[MAX_THREADS];
static pthread_t worker_threads[MAX_THREADS];
static atomic_int stopping; /* set by attn_parallel_shutdown */
static _Thread_local int inside_worker;

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Polls until done(arg) holds or SPIN_NS have passed; returns whether it holds. */
static int spin_until(int (*done)(uint64_t), uint64_t arg) {
  int64_t t0 = now_ns();
  for (int i = 1;; i++) {
    if (done(arg)) return 1;
    cpu_relax();
    if (i % 64 == 0 && now_ns() - t0 > SPIN_NS) return done(arg);
  }
}

/* Runs ranges of the current job until none is left. */
static void run_ranges(void) {
  int64_t begin = atomic_load_explicit(&job_next, memory_order_relaxed);
  for (;;) {
    if (begin >= job_n) return;
    int64_t step = (job_n - begin) / job_div;
    if (step < job_grain) step = job_grain;
    if (step > job_n - begin) step = job_n - begin;
    if (!atomic_compare_exchange_weak(&job_next, &begin, begin + step)) continue; /* begin reloaded */
    job_fn(job_ctx, begin, begin + step);
    begin = atomic_load_explicit(&job_next, memory_order_relaxed);
  }
}

static int job_posted(uint64_t seen) {
  return atomic_load_explicit(&generation, memory_order_acquire) != seen || atomic_load(&stopping);
}

static int job_finished(uint64_t unused) {
  (void)unused;
  return (atomic_load_explicit(&crew, memory_order_acquire) & CREW_COUNT) == 0;
}

/* Enters the job of generation gen if it is still open; 0 when it is closed or already replaced. */
static int crew_join(uint64_t gen) {
  uint64_t s = atomic_load_explicit(&crew, memory_order_acquire);
  do {
    if (s >> 32 != (gen & 0xffffffffu) || (s & CREW_CLOSED)) return 0;
  } while (!atomic_compare_exchange_weak_explicit(&crew, &s, s + 1, memory_order_acq_rel, memory_order_acquire));
  return 1;
}

static void *worker_main(void *arg) {
  int id = (int)(intptr_t)arg; /* 1-based: chunk 0 belongs to the caller */
  /* The generation at creation time, so a job posted before this thread first
   * takes the lock is not missed. */
  uint64_t seen = worker_start_generation[id];
  inside_worker = 1;
  for (;;) {
    spin_until(job_posted, seen);
    pthread_mutex_lock(&pool_lock);
    while (atomic_load(&generation) == seen && !atomic_load(&stopping)) pthread_cond_wait(&work_ready, &pool_lock);
    if (atomic_load(&stopping)) break;
    seen = atomic_load(&generation);
    int takes_part = id < job_chunks;
    pthread_mutex_unlock(&pool_lock);
    if (!takes_part || !crew_join(seen)) continue;
    run_ranges();
    if ((atomic_fetch_sub_explicit(&crew, 1, memory_order_acq_rel) & (CREW_CLOSED | CREW_COUNT)) == (CREW_CLOSED | 1)) {
      pthread_mutex_lock(&pool_lock); /* the caller may be asleep: wake it under the lock it waits with */
      pthread_cond_signal(&work_done);
      pthread_mutex_unlock(&pool_lock);
    }
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
  job_grain = grain;
  job_div = (int64_t)threads * GUIDE_DIV;
  atomic_store(&job_next, 0);
  job_chunks = threads;
  uint64_t gen = atomic_load(&generation) + 1;
  atomic_store_explicit(&crew, (gen & 0xffffffffu) << 32, memory_order_release);
  atomic_store_explicit(&generation, gen, memory_order_release);
  pthread_cond_broadcast(&work_ready);
  pthread_mutex_unlock(&pool_lock);
  inside_worker = 1; /* nested calls from the caller's ranges run serially */
  run_ranges();
  inside_worker = 0;
  /* no range is left: close the job to workers not yet in it, then wait for those inside */
  if ((atomic_fetch_or_explicit(&crew, CREW_CLOSED, memory_order_acq_rel) & CREW_COUNT) != 0 &&
      !spin_until(job_finished, 0)) {
    pthread_mutex_lock(&pool_lock);
    while (!job_finished(0)) pthread_cond_wait(&work_done, &pool_lock);
    pthread_mutex_unlock(&pool_lock);
  }
  pthread_mutex_unlock(&job_lock);
}

void attn_parallel_shutdown(void) {
  pthread_mutex_lock(&job_lock); /* waits for a running job */
  pthread_mutex_lock(&pool_lock);
  atomic_store(&stopping, 1);
  pthread_cond_broadcast(&work_ready);
  int n = workers_started;
  pthread_mutex_unlock(&pool_lock);
  for (int i = 1; i <= n; i++) pthread_join(worker_threads[i], NULL);
  pthread_mutex_lock(&pool_lock);
  atomic_store(&stopping, 0);
  workers_started = 0;
  pthread_mutex_unlock(&pool_lock);
  pthread_mutex_unlock(&job_lock);
}
