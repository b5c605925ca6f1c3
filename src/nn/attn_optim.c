/* Fused optimizer updates and gradient norms: see attn_optim.h for the model. */
#include "nn/attn_optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn_ops.h"
#include "core/attn_parallel.h"

/* The update loops test loop-invariant options and take a square root: GCC
 * vectorises them only when it may unswitch the loops on the options (here)
 * and needs no errno path around sqrt (the Makefile builds this file with
 * -fno-math-errno; the radicand is never negative). Same results either way:
 * the square root is correctly rounded in both. */
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORISE __attribute__((optimize("unswitch-loops")))
#else
#define VECTORISE
#endif

/* Below about this many entries an update stays on the calling thread. */
#define GRAIN_ELEMENTS 32768

/* Lua's x ^ 2 is x * x, any other power pow(): the composed path's scalars
 * are computed that way, so the fused ones are too. */
static double lua_pow(double x, double y) { return y == 2 ? x * x : pow(x, y); }

/* Whether two contiguous operands of n entries share an element (the same
 * view included: two buffers of an update must be distinct memory). */
static int overlap(const attn_tensor *a, const attn_tensor *b, int64_t n) {
  return a->storage == b->storage && a->offset < b->offset + n && b->offset < a->offset + n;
}

/* Checks the operands of one update: float dtype shared with p, n entries
 * each, contiguous, and the written ones aliasing nothing else. */
static attn_status check_operands(const char *op, int count, const attn_tensor *const *t, int written) {
  attn_status st = attn_check_float(op, t[0]);
  if (st != ATTN_OK) return st;
  int64_t n = attn_tensor_numel(t[0]);
  for (int i = 0; i < count; i++) {
    if (t[i]->dtype != t[0]->dtype || attn_tensor_numel(t[i]) != n)
      return attn_error(ATTN_ERR_SHAPE, "%s: operand %d is %s %s, the parameter %s %s", op, i + 1,
                        attn_dtype_name(t[i]->dtype), attn_tensor_shape_str(t[i]), attn_dtype_name(t[0]->dtype),
                        attn_tensor_shape_str(t[0]));
    if (!attn_tensor_is_contiguous(t[i]))
      return attn_error(ATTN_ERR_ARG, "%s: operand %d %s is not contiguous", op, i + 1, attn_tensor_shape_str(t[i]));
  }
  for (int i = 0; i < count; i++)
    for (int j = 0; j < count; j++)
      if (i != j && ((written >> i) & 1) && overlap(t[i], t[j], n))
        return attn_error(ATTN_ERR_ARG, "%s: operand %d shares memory with operand %d", op, i + 1, j + 1);
  return ATTN_OK;
}

/* A list of tensors cut into blocks of a fixed number of entries (first[i]: tensor i's first block;
 * first[n]: all blocks), the blocks spread over the worker pool: one pool job for a whole list, so
 * a training step's small parameters need no job (and no wake-up of the workers) each. The cut
 * depends on the sizes alone. */
typedef void (*block_fn)(void *ctx, int64_t tensor, int64_t block, int64_t i0, int64_t i1);
typedef struct {
  const attn_tensor *const *t;
  const int64_t *first;
  int64_t size;
  block_fn fn;
  void *ctx;
} blocks_job;

static void run_blocks(void *arg, int64_t begin, int64_t end) {
  const blocks_job *j = arg;
  int64_t t = 0;
  for (int64_t b = begin; b < end; b++) {
    while (j->first[t + 1] <= b) t++;
    int64_t i0 = (b - j->first[t]) * j->size, i1 = attn_tensor_numel(j->t[t]);
    j->fn(j->ctx, t, b, i0, i1 - i0 > j->size ? i0 + j->size : i1);
  }
}

/* Fills first (n + 1 entries) for blocks of size entries; returns the number of blocks. */
static int64_t block_index(int64_t n, const attn_tensor *const *t, int64_t size, int64_t *first) {
  first[0] = 0;
  for (int64_t i = 0; i < n; i++) first[i + 1] = first[i] + (attn_tensor_numel(t[i]) + size - 1) / size;
  return first[n];
}

static void run_tensor_blocks(int64_t n, const attn_tensor *const *t, const int64_t *first, int64_t size,
                              block_fn fn, void *ctx) {
  blocks_job j = {t, first, size, fn, ctx};
  attn_parallel_for(first[n], 1, run_blocks, &j);
}

/* Whether two entries of a list of updates share a storage that one of them writes (rows: n
 * entries of `count` operands, operand k of entry i at t[k][i], NULL skipped; written: a bit per
 * operand): then the updates must run one after the other, in list order. */
typedef struct {
  const attn_storage *s;
  int64_t entry;
  int written;
} operand_ref;

static int by_storage(const void *a, const void *b) {
  const operand_ref *x = a, *y = b;
  return x->s < y->s ? -1 : x->s > y->s;
}

static int entries_share(int64_t n, int count, const attn_tensor *const *const *t, int written, int *failed) {
  operand_ref *r = malloc((size_t)(n * count) * sizeof *r + 1);
  if (!r) return *failed = 1;
  int64_t m = 0;
  for (int k = 0; k < count; k++)
    for (int64_t i = 0; t[k] && i < n; i++)
      if (t[k][i]) r[m++] = (operand_ref){t[k][i]->storage, i, (written >> k) & 1};
  qsort(r, (size_t)m, sizeof *r, by_storage);
  int shared = 0;
  for (int64_t a = 0; a < m && !shared; a++) /* within a run of one storage: two entries, one writing */
    for (int64_t b = a + 1; b < m && r[b].s == r[a].s && !shared; b++)
      shared = r[b].entry != r[a].entry && (r[a].written || r[b].written);
  free(r);
  return shared;
}

typedef struct {
  void *p, *m, *v;
  const void *g;
  double wd, decay, b1, omb1, b2, omb2, bc2, eps, step_size;
  int l2;
  int maximize;
  void *vmax; /* amsgrad's running maximum of v, or NULL */
} adam_job;

/* One statement per composed op, each rounded to T as the tensor op rounds. */
#define DEFINE_ADAM(S, T)                                                              \
  VECTORISE static void adam_##S(void *ctx, int64_t i0, int64_t i1) {                            \
    const adam_job *J = ctx;                                                           \
    T *p = J->p, *m = J->m, *v = J->v, *vmax = J->vmax;                                \
    const T *g = J->g;                                                                 \
    const T wd = (T)J->wd, decay = (T)J->decay, b1 = (T)J->b1, omb1 = (T)J->omb1;      \
    const T b2 = (T)J->b2, omb2 = (T)J->omb2, bc2 = (T)J->bc2, eps = (T)J->eps;        \
    const T step_size = (T)J->step_size;                                               \
    for (int64_t i = i0; i < i1; i++) {                                                \
      T pi = p[i], gi = J->maximize ? -g[i] : g[i];                                    \
      if (J->decay != 1) pi = pi * decay;                                              \
      if (J->l2) {                                                                     \
        T d = pi * wd;                                                                 \
        gi = d + gi;                                                                   \
      }                                                                                \
      T mi = m[i] * b1, vi = v[i] * b2;                                                \
      T w = gi * omb1;                                                                 \
      mi = mi + w;                                                                     \
      w = gi * gi;                                                                     \
      w = w * omb2;                                                                    \
      vi = vi + w;                                                                     \
      T vd = vi;                                                                       \
      if (vmax) {                                                                      \
        T mx = vmax[i];                                                                \
        vd = (mx > vi || mx != mx) ? mx : vi;                                          \
        vmax[i] = vd;                                                                  \
      }                                                                                \
      T denom = SQRT_##S(vd);                                                          \
      denom = denom / bc2;                                                             \
      denom = denom + eps;                                                             \
      w = mi / denom;                                                                  \
      w = w * step_size;                                                               \
      p[i] = pi - w, m[i] = mi, v[i] = vi;                                             \
    }                                                                                  \
  }
#define SQRT_f32 sqrtf
#define SQRT_f64 sqrt
DEFINE_ADAM(f32, float)
DEFINE_ADAM(f64, double)

/* The multi-parameter steps take a grad of exactly the parameter's shape
 * (the single ones only compare entry counts). */
static attn_status same_shape(const char *op, const attn_tensor *p, const attn_tensor *grad) {
  int same = p->ndim == grad->ndim;
  for (int d = 0; same && d < p->ndim; d++) same = p->shape[d] == grad->shape[d];
  if (same) return ATTN_OK;
  return attn_error(ATTN_ERR_SHAPE, "%s: grad %s, the parameter %s", op, attn_tensor_shape_str(grad),
                    attn_tensor_shape_str(p));
}

/* The last error with the failing parameter's position appended (formatted
 * only on failure: a step checks every parameter). */
static attn_status at_parameter(attn_status st, int64_t i) {
  char msg[960];
  snprintf(msg, sizeof msg, "%s", attn_last_error());
  return attn_error(st, "%s (parameter %lld)", msg, (long long)i + 1);
}

static attn_status adam_check(const char *op, attn_tensor *p, const attn_tensor *grad, attn_tensor *exp_avg,
                              attn_tensor *exp_avg_sq, attn_tensor *vmax, int64_t step) {
  const attn_tensor *ops[5] = {p, grad, exp_avg, exp_avg_sq, vmax};
  attn_status st = check_operands(op, vmax ? 5 : 4, ops, 1 | 4 | 8 | 16);
  if (st != ATTN_OK) return st;
  if (step < 1) return attn_error(ATTN_ERR_ARG, "%s: step must be >= 1, got %lld", op, (long long)step);
  return ATTN_OK;
}

/* The job of one checked update at step t. */
static adam_job adam_make(attn_tensor *p, const attn_tensor *grad, attn_tensor *exp_avg, attn_tensor *exp_avg_sq,
                          attn_tensor *vmax, const attn_adam_options *o, int64_t step) {
  double t = (double)step;
  adam_job J = {attn_tensor_data(p), attn_tensor_data(exp_avg), attn_tensor_data(exp_avg_sq),
                attn_tensor_data(grad), o->weight_decay,
                o->decoupled && o->weight_decay != 0 ? 1 - o->lr * o->weight_decay : 1,
                o->beta1, 1 - o->beta1, o->beta2, 1 - o->beta2, sqrt(1 - lua_pow(o->beta2, t)), o->eps,
                o->lr / (1 - lua_pow(o->beta1, t)), !o->decoupled && o->weight_decay != 0, o->maximize,
                vmax ? attn_tensor_data(vmax) : NULL};
  return J;
}

/* One checked update at step t. */
static void adam_run(attn_tensor *p, const attn_tensor *grad, attn_tensor *exp_avg, attn_tensor *exp_avg_sq,
                     attn_tensor *vmax, const attn_adam_options *o, int64_t step) {
  adam_job J = adam_make(p, grad, exp_avg, exp_avg_sq, vmax, o, step);
  attn_parallel_for(attn_tensor_numel(p), GRAIN_ELEMENTS, p->dtype == ATTN_F32 ? adam_f32 : adam_f64, &J);
}

typedef struct {
  adam_job *jobs;
  attn_tensor *const *p;
} adam_list;

static void adam_block(void *ctx, int64_t t, int64_t b, int64_t i0, int64_t i1) {
  const adam_list *L = ctx;
  (void)b;
  (L->p[t]->dtype == ATTN_F32 ? adam_f32 : adam_f64)(&L->jobs[t], i0, i1);
}

attn_status attn_adam_step(attn_tensor *p, const attn_tensor *grad, attn_tensor *exp_avg, attn_tensor *exp_avg_sq,
                           attn_tensor *max_exp_avg_sq, const attn_adam_options *o) {
  attn_status st = adam_check("adam_step", p, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, o->step);
  if (st != ATTN_OK) return st;
  adam_run(p, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, o, o->step);
  return ATTN_OK;
}

attn_status attn_adam_steps(int64_t n, attn_tensor *const *p, const attn_tensor *const *grad,
                            attn_tensor *const *exp_avg, attn_tensor *const *exp_avg_sq,
                            attn_tensor *const *max_exp_avg_sq, const int64_t *step, const attn_adam_options *o) {
  for (int64_t i = 0; i < n; i++) {
    attn_tensor *vmax = max_exp_avg_sq ? max_exp_avg_sq[i] : NULL;
    attn_status st = adam_check("adam_steps", p[i], grad[i], exp_avg[i], exp_avg_sq[i], vmax, step[i]);
    if (st == ATTN_OK) st = same_shape("adam_steps", p[i], grad[i]);
    if (st != ATTN_OK) return at_parameter(st, i);
  }
  const attn_tensor *const *ops[5] = {(const attn_tensor *const *)p, grad, (const attn_tensor *const *)exp_avg,
                                      (const attn_tensor *const *)exp_avg_sq,
                                      (const attn_tensor *const *)max_exp_avg_sq};
  int failed = 0;
  /* the jobs, then the blocks' index (bookkeeping, outside the tensors' allocator and its counts) */
  adam_job *jobs = entries_share(n, 5, ops, 1 | 4 | 8 | 16, &failed) || failed
                       ? NULL
                       : malloc((size_t)n * sizeof *jobs + (size_t)(n + 1) * sizeof(int64_t));
  if (!jobs) { /* one after the other, each over the pool */
    for (int64_t i = 0; i < n; i++)
      adam_run(p[i], grad[i], exp_avg[i], exp_avg_sq[i], max_exp_avg_sq ? max_exp_avg_sq[i] : NULL, o, step[i]);
    return ATTN_OK;
  }
  for (int64_t i = 0; i < n; i++)
    jobs[i] = adam_make(p[i], grad[i], exp_avg[i], exp_avg_sq[i], max_exp_avg_sq ? max_exp_avg_sq[i] : NULL, o,
                        step[i]);
  int64_t *first = (int64_t *)(jobs + n);
  adam_list L = {jobs, p};
  block_index(n, ops[0], GRAIN_ELEMENTS, first);
  run_tensor_blocks(n, ops[0], first, GRAIN_ELEMENTS, adam_block, &L);
  free(jobs);
  return ATTN_OK;
}

typedef struct {
  void *p, *buf;
  const void *g;
  double lr, mom, omd, wd;
  int nesterov, first, maximize;
} sgd_job;

#define DEFINE_SGD(S, T)                                                               \
  VECTORISE static void sgd_##S(void *ctx, int64_t i0, int64_t i1) {                             \
    const sgd_job *J = ctx;                                                            \
    T *p = J->p, *buf = J->buf;                                                        \
    const T *g = J->g;                                                                 \
    const T lr = (T)J->lr, mom = (T)J->mom, omd = (T)J->omd, wd = (T)J->wd;            \
    for (int64_t i = i0; i < i1; i++) {                                                \
      T gi = J->maximize ? -g[i] : g[i];                                               \
      T d = gi;                                                                        \
      if (J->wd != 0) {                                                                \
        d = p[i] * wd;                                                                 \
        d = d + gi;                                                                    \
      }                                                                                \
      if (buf) {                                                                       \
        T b = d;                                                                       \
        if (!J->first) {                                                               \
          b = buf[i] * mom;                                                            \
          b = J->omd != 1 ? b + d * omd : b + d;                                       \
        }                                                                              \
        buf[i] = b;                                                                    \
        d = J->nesterov ? d + b * mom : b;                                             \
      }                                                                                \
      d = d * lr;                                                                      \
      p[i] = p[i] - d;                                                                 \
    }                                                                                  \
  }
DEFINE_SGD(f32, float)
DEFINE_SGD(f64, double)

static attn_status sgd_check(const char *op, attn_tensor *p, const attn_tensor *grad, attn_tensor *buf) {
  const attn_tensor *ops[3] = {p, grad, buf};
  return check_operands(op, buf ? 3 : 2, ops, 1 | 4);
}

static void sgd_run(attn_tensor *p, const attn_tensor *grad, attn_tensor *buf, const attn_sgd_options *o, int first) {
  sgd_job J = {attn_tensor_data(p), buf ? attn_tensor_data(buf) : NULL, attn_tensor_data(grad), o->lr, o->momentum,
               1 - o->dampening, o->weight_decay, o->nesterov, first, o->maximize};
  attn_parallel_for(attn_tensor_numel(p), GRAIN_ELEMENTS, p->dtype == ATTN_F32 ? sgd_f32 : sgd_f64, &J);
}

attn_status attn_sgd_step(attn_tensor *p, const attn_tensor *grad, attn_tensor *buf, const attn_sgd_options *o) {
  attn_status st = sgd_check("sgd_step", p, grad, buf);
  if (st != ATTN_OK) return st;
  sgd_run(p, grad, buf, o, o->first);
  return ATTN_OK;
}

attn_status attn_sgd_steps(int64_t n, attn_tensor *const *p, const attn_tensor *const *grad, attn_tensor *const *buf,
                           const unsigned char *first, const attn_sgd_options *o) {
  for (int64_t i = 0; i < n; i++) {
    attn_status st = sgd_check("sgd_steps", p[i], grad[i], buf ? buf[i] : NULL);
    if (st == ATTN_OK) st = same_shape("sgd_steps", p[i], grad[i]);
    if (st != ATTN_OK) return at_parameter(st, i);
  }
  for (int64_t i = 0; i < n; i++) sgd_run(p[i], grad[i], buf ? buf[i] : NULL, o, first ? first[i] : 0);
  return ATTN_OK;
}

/* Squares summed in double through eight accumulators added in a fixed order:
 * one serial chain would be bound by the add latency; the fixed order keeps
 * the norm the same on every run and thread count. */
#define DEFINE_SUMSQ(S, T)                                                             \
  static double sumsq_##S(const T *x, int64_t n) {                                     \
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                            \
    int64_t i = 0;                                                                     \
    for (; i + 8 <= n; i += 8)                                                         \
      for (int k = 0; k < 8; k++) a[k] += (double)x[i + k] * (double)x[i + k];         \
    for (; i < n; i++) a[0] += (double)x[i] * (double)x[i];                            \
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));          \
  }
DEFINE_SUMSQ(f32, float)
DEFINE_SUMSQ(f64, double)

/* Per dtype: the largest |x| (NaN when any entry is NaN) and the sum of
 * |x|^p in double, for the norms other than 2. */
#define DEFINE_PNORM(S, T)                                                             \
  static double absmax_##S(const T *x, int64_t n, double m) {                          \
    for (int64_t i = 0; i < n; i++) {                                                  \
      double a = fabs((double)x[i]);                                                   \
      if (a > m || a != a) m = a;                                                      \
      if (m != m) break;                                                               \
    }                                                                                  \
    return m;                                                                          \
  }                                                                                    \
  static double sumpow_##S(const T *x, int64_t n, double p) {                          \
    double s = 0;                                                                      \
    for (int64_t i = 0; i < n; i++) s += p == 1 ? fabs((double)x[i]) : pow(fabs((double)x[i]), p); \
    return s;                                                                          \
  }
DEFINE_PNORM(f32, float)
DEFINE_PNORM(f64, double)

static attn_status check_grads(const char *op, int64_t n, const attn_tensor *const *grads) {
  for (int64_t i = 0; i < n; i++) {
    const attn_tensor *g = grads[i];
    attn_status st = attn_check_float(op, g);
    if (st != ATTN_OK) return st;
    if (!attn_tensor_is_contiguous(g))
      return attn_error(ATTN_ERR_ARG, "%s: tensor %lld %s is not contiguous", op, (long long)i + 1,
                        attn_tensor_shape_str(g));
  }
  return ATTN_OK;
}

attn_status attn_grads_norm_p(int64_t n, const attn_tensor *const *grads, double p, double *norm) {
  if (p == 2) return attn_grads_norm(n, grads, norm);
  if (!(p > 0)) return attn_error(ATTN_ERR_ARG, "grads_norm_p: norm_type must be > 0, got %g", p);
  attn_status st = check_grads("grads_norm_p", n, grads);
  if (st != ATTN_OK) return st;
  double total = 0;
  for (int64_t i = 0; i < n; i++) {
    const attn_tensor *g = grads[i];
    int64_t k = attn_tensor_numel(g);
    int f32 = g->dtype == ATTN_F32;
    if (isinf(p))
      total = f32 ? absmax_f32(attn_tensor_data(g), k, total) : absmax_f64(attn_tensor_data(g), k, total);
    else
      total += f32 ? sumpow_f32(attn_tensor_data(g), k, p) : sumpow_f64(attn_tensor_data(g), k, p);
  }
  *norm = isinf(p) ? total : p == 1 ? total : pow(total, 1 / p);
  return ATTN_OK;
}

attn_status attn_grads_clamp_(int64_t n, attn_tensor *const *grads, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) {
    attn_status st = attn_binary_scalar(ATTN_MAXIMUM, grads[i], lo, 0, grads[i]);
    if (st == ATTN_OK) st = attn_binary_scalar(ATTN_MINIMUM, grads[i], hi, 0, grads[i]);
    if (st != ATTN_OK) return st;
  }
  return ATTN_OK;
}

/* attn_grads_norm cuts each tensor into blocks of this many entries, whatever the thread count:
 * a block's squares are one sumsq, a tensor's sum adds its blocks in order, and the norm adds the
 * tensors in order, so the bits do not depend on the threads (and a tensor of one block sums as
 * it did before the cut). */
#define NORM_BLOCK 65536

typedef struct {
  const attn_tensor *const *grads;
  double *partial; /* one sum of squares per block */
} norm_job;

static void norm_block(void *ctx, int64_t t, int64_t b, int64_t i0, int64_t i1) {
  const norm_job *j = ctx;
  const attn_tensor *g = j->grads[t];
  j->partial[b] = g->dtype == ATTN_F32 ? sumsq_f32((const float *)attn_tensor_data(g) + i0, i1 - i0)
                                       : sumsq_f64((const double *)attn_tensor_data(g) + i0, i1 - i0);
}

attn_status attn_grads_norm(int64_t n, const attn_tensor *const *grads, double *norm) {
  attn_status st = check_grads("grads_norm", n, grads);
  if (st != ATTN_OK) return st;
  int64_t blocks = 0; /* counted before the index exists: the partials follow it */
  for (int64_t i = 0; i < n; i++) blocks += (attn_tensor_numel(grads[i]) + NORM_BLOCK - 1) / NORM_BLOCK;
  int64_t *first = malloc((size_t)(n + 1 + blocks) * sizeof(int64_t)); /* the partials after it */
  if (!first)
    return attn_error(ATTN_ERR_MEMORY, "grads_norm: out of memory for %lld partial sums", (long long)blocks);
  double *partial = (double *)(first + n + 1);
  norm_job j = {grads, partial};
  block_index(n, grads, NORM_BLOCK, first);
  run_tensor_blocks(n, grads, first, NORM_BLOCK, norm_block, &j);
  double total = 0;
  for (int64_t i = 0; i < n; i++) {
    double sum = 0;
    for (int64_t b = first[i]; b < first[i + 1]; b++) sum += partial[b];
    total += sum;
  }
  free(first);
  *norm = sqrt(total);
  return ATTN_OK;
}

typedef struct {
  const attn_tensor *const *grads;
  float f32;
  double f64;
} scale_job;

/* x * s in x's dtype, attn_binary_scalar's ATTN_MUL. */
static void scale_block(void *ctx, int64_t t, int64_t b, int64_t i0, int64_t i1) {
  const scale_job *j = ctx;
  const attn_tensor *g = j->grads[t];
  (void)b;
  if (g->dtype == ATTN_F32) {
    float *x = attn_tensor_data(g), s = j->f32;
    for (int64_t i = i0; i < i1; i++) x[i] = x[i] * s;
  } else {
    double *x = attn_tensor_data(g), s = j->f64;
    for (int64_t i = i0; i < i1; i++) x[i] = x[i] * s;
  }
}

attn_status attn_grads_scale_(int64_t n, attn_tensor *const *grads, double scale) {
  /* contiguous float grads that share no storage (clip_grad_norm_'s): one pool job, as Adam's */
  scale_job j = {(const attn_tensor *const *)grads, 0, 0};
  char b32[8], b64[8]; /* the scalar as attn_binary_scalar rounds it */
  int batch = attn_scalar_to("mul", ATTN_F32, scale, b32) == ATTN_OK &&
              attn_scalar_to("mul", ATTN_F64, scale, b64) == ATTN_OK;
  memcpy(&j.f32, b32, sizeof j.f32);
  memcpy(&j.f64, b64, sizeof j.f64);
  for (int64_t i = 0; batch && i < n; i++)
    batch = (grads[i]->dtype == ATTN_F32 || grads[i]->dtype == ATTN_F64) && attn_tensor_is_contiguous(grads[i]);
  int failed = 0;
  int64_t *first = batch && !entries_share(n, 1, &j.grads, 1, &failed) && !failed
                       ? malloc((size_t)(n + 1) * sizeof *first)
                       : NULL;
  if (first) {
    block_index(n, j.grads, GRAIN_ELEMENTS, first);
    run_tensor_blocks(n, j.grads, first, GRAIN_ELEMENTS, scale_block, &j);
    free(first);
    return ATTN_OK;
  }
  for (int64_t i = 0; i < n; i++) {
    attn_status st = attn_binary_scalar(ATTN_MUL, grads[i], scale, 0, grads[i]);
    if (st != ATTN_OK) return st;
  }
  return ATTN_OK;
}
