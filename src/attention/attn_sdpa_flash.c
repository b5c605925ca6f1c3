/* Flash attention drivers (float32): pick the kernel set for this CPU, split
 * the work over the pool and give every worker its own small workspace. The
 * per-ISA kernels live in src/cpu/flash_*.c (one source, src/cpu/flash_body.h).
 *
 * Work split: items are (head, block of 64 queries) for the forward and dq,
 * (head, block of 64 keys) for dk and dv; each item writes its own rows, so
 * nothing is reduced across threads and results do not depend on the thread
 * count. Within a head the items are visited outside-in (0, n-1, 1, n-2, ...),
 * so the contiguous chunks attn_parallel_for hands out carry equal work even
 * when causal masking makes later query blocks dearer. */
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "core/attn_alloc.h"
#include "attention/attn_attention_internal.h"
#include "core/attn_parallel.h"
#include "cpu/cpu_dispatch.h"

#define TW ATTN_FLASH_TILE

/* The instruction set is the engine's one switch (cpu/cpu_dispatch.h: ATTN_ISA,
 * attn_vmath_set_isa) unless the caller names one. */
attn_status attn_attention_flash_kernels(int kernel, const char *op, const attn_flash_kernels **ks) {
  const char *name = kernel == ATTN_KERNEL_FLASH_GENERIC  ? "generic"
                     : kernel == ATTN_KERNEL_FLASH_AVX2   ? "avx2"
                     : kernel == ATTN_KERNEL_FLASH_AVX512 ? "avx512"
                                                          : NULL;
  const attn_cpu_kernels *set = name ? attn_cpu_find(name) : attn_cpu();
  if (!set || !attn_cpu_supported(set))
    return attn_error(ATTN_ERR_ARG, "%s: kernel flash_%s needs an instruction set this CPU or build lacks", op,
                      name ? name : set->name);
  *ks = set->flash;
  return ATTN_OK;
}

static double thread_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double attn_flash_fma_peak(const char **isa) {
  const attn_flash_kernels *ks = NULL;
  if (attn_attention_flash_kernels(ATTN_KERNEL_AUTO, "fma_peak", &ks) != ATTN_OK) return 0;
  if (isa) *isa = ks->name;
  volatile double sink = 0;
  double best = 0;
  int64_t iters = 1 << 16;
  for (int rep = 0; rep < 7; rep++) {
    double t0 = thread_seconds();
    sink += ks->fma_loop(iters);
    double t = thread_seconds() - t0;
    if (t < 2e-3 && iters < ((int64_t)1 << 30)) { /* too short to time: grow, do not count */
      iters *= 4;
      rep--;
      continue;
    }
    double rate = (double)iters * ks->fma_flops / t;
    if (rate > best) best = rate;
  }
  (void)sink;
  return best;
}

typedef struct {
  const attn_flash_job *F;
  attn_flash_item_fn fn;
  const attn_flash_mat *first; /* the operand whose block rows an item packs first */
  int64_t width;               /* its row width */
  int64_t per_head;            /* blocks per head */
  atomic_int failed;
  atomic_int unclean; /* an item returned 0: the rest may stop, the reference reruns the call */
} flash_run;

/* Head and first row of an item: within a head the blocks go outside-in (0, n-1, 1, n-2, ...). */
static void item_block(const flash_run *R, int64_t item, int64_t *b, int64_t *i0) {
  int64_t p = item % R->per_head;
  *b = item / R->per_head;
  *i0 = (p % 2 == 0 ? p / 2 : R->per_head - 1 - p / 2) * TW;
}

/* Asks for the rows the next item packs first while this one computes: they come from memory
 * or L3 (each block's own rows are read once per call), and their misses were ~3% of a causal
 * forward at N 1024. Into L2, so the current item's tiles in L1 stay. */
static void prefetch_block(const flash_run *R, int64_t item) {
  int64_t b, i0, rows = R->first == &R->F->k ? R->F->J->Nk : R->F->J->Nq;
  item_block(R, item, &b, &i0);
  const float *p = attn_flash_head(R->first, b) + i0 * R->first->sr;
  int64_t n = rows - i0 < TW ? rows - i0 : TW;
  for (int64_t o = 0; o < n; o++) {
    for (int64_t c = 0; c < R->width; c += 16) __builtin_prefetch(p + o * R->first->sr + c, 0, 2);
    __asm__ __volatile__(""); /* GCC 12 at -O2 deleted the loop as one without side effects */
  }
}

static void flash_task(void *ctx, int64_t begin, int64_t end) {
  flash_run *R = ctx;
  const attn_attention_job *J = R->F->J;
  size_t cap = 0;
  float *ws = attn_alloc(attn_flash_workspace(J->d, J->dv) * sizeof(float), &cap);
  if (!ws) {
    atomic_store(&R->failed, 1);
    return;
  }
  for (int64_t item = begin; item < end && !atomic_load_explicit(&R->unclean, memory_order_relaxed); item++) {
    if (item + 1 < end) prefetch_block(R, item + 1);
    int64_t b, i0;
    item_block(R, item, &b, &i0);
    if (!R->fn(R->F, b, i0, ws)) atomic_store(&R->unclean, 1);
  }
  attn_free(ws, cap);
}

/* Runs fn over every block: -1 out of memory, 0 a block came out not finite, 1 done. */
static int run_items(const attn_flash_job *F, attn_flash_item_fn fn, const attn_flash_mat *first, int64_t width,
                     int64_t rows, double flops_per_block) {
  flash_run R = {.F = F, .fn = fn, .first = first, .width = width, .per_head = (rows + TW - 1) / TW};
  atomic_init(&R.failed, 0);
  atomic_init(&R.unclean, 0);
  attn_parallel_for(F->J->B * R.per_head, (int64_t)(2e5 / flops_per_block) + 1, flash_task, &R);
  return atomic_load(&R.failed) ? -1 : !atomic_load(&R.unclean);
}

static atomic_llong flash_tiles;

long long attn_flash_tiles(void) { return atomic_load(&flash_tiles); }

attn_status attn_attention_run_flash_forward(const attn_flash_job *F0, const attn_flash_kernels *ks, const char *op,
                                             int *done) {
  attn_flash_job G = *F0;
  G.tiles = &flash_tiles;
  const attn_flash_job *F = &G;
  const attn_attention_job *J = F->J;
  double flops = 2.0 * TW * (double)J->Nk * (double)(J->d + J->dv);
  int r = run_items(F, ks->forward, &F->q, J->d, J->Nq, flops);
  *done = r == 1;
  if (r < 0) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the workspace", op);
  return ATTN_OK;
}

typedef struct {
  attn_flash_job *F;
  attn_flash_mat o;
  const double *lse;
  int64_t lse_sb;
  float *lse2, *D, *fillp;
  atomic_int nan_lse; /* the forward ran on the reference path (or a row had no finite softmax) */
} prep_ctx;

/* D = dout . out, lse in base 2 and the weight of a filled key, per (b, i). */
static void prep_task(void *ctx, int64_t begin, int64_t end) {
  prep_ctx *P = ctx;
  const attn_attention_job *J = P->F->J;
  for (int64_t item = begin; item < end; item++) {
    int64_t b = item / J->Nq, i = item % J->Nq;
    const float *g = attn_flash_head(&P->F->dout, b) + i * P->F->dout.sr, *o = attn_flash_head(&P->o, b) + i * P->o.sr;
    double s[8] = {0}; /* eight running sums: one chain was bound by the add latency (4% of a backward) */
    int64_t c = 0;
    for (; c + 8 <= J->dv; c += 8)
      for (int u = 0; u < 8; u++) s[u] += (double)g[c + u] * o[c + u];
    for (; c < J->dv; c++) s[0] += (double)g[c] * o[c];
    P->D[item] = (float)(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
    double l = P->lse[b * P->lse_sb + i];
    if (isnan(l)) atomic_store_explicit(&P->nan_lse, 1, memory_order_relaxed);
    P->lse2[item] = (float)(l * 1.4426950408889634);
    /* the kernels' own fill value; only valid_lens fills keys (and exp2's underflow path is slow) */
    P->fillp[item] = J->lens ? (float)exp2((double)P->F->fill2 - l * 1.4426950408889634) : 0.0f;
  }
}

attn_status attn_attention_run_flash_backward(attn_flash_job *F, const attn_flash_kernels *ks, attn_flash_mat out,
                                              const double *lse, int64_t lse_sb, const char *op, int *done) {
  const attn_attention_job *J = F->J;
  size_t cap = 0, n = (size_t)(J->B * J->Nq);
  *done = 0;
  float *buf = attn_alloc(3 * (n ? n : 1) * sizeof(float), &cap);
  if (!buf) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the row statistics", op);
  prep_ctx P = {.F = F, .o = out, .lse = lse, .lse_sb = lse_sb, .lse2 = buf, .D = buf + n, .fillp = buf + 2 * n};
  atomic_init(&P.nan_lse, 0);
  attn_parallel_for((int64_t)n, 256, prep_task, &P);
  F->lse2 = P.lse2;
  F->D = P.D;
  F->fillp = P.fillp;
  double flops = 2.0 * TW * (double)(J->Nk > J->Nq ? J->Nk : J->Nq) * (double)(2 * J->d + 2 * J->dv);
  int r = atomic_load(&P.nan_lse) ? 0 : 1;
  if (r == 1 && F->dq) r = run_items(F, ks->backward_q, &F->q, J->d, J->Nq, flops);
  if (r == 1 && (F->dk || F->dv)) r = run_items(F, ks->backward_k, &F->k, J->d, J->Nk, flops);
  attn_free(buf, cap);
  F->lse2 = F->D = F->fillp = NULL;
  *done = r == 1;
  if (r < 0) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the workspace", op);
  return ATTN_OK;
}
