/* Run-time choice among the row-math paths of src/cpu/. */
#include "core/attn_vmath.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/vmath_cpu.h"

typedef struct {
  const char *name;
  void (*exp_f32)(const float *, float *, int64_t);
  void (*log_f32)(const float *, float *, int64_t);
  void (*tanh_f32)(const float *, float *, int64_t);
  void (*sigmoid_f32)(const float *, float *, int64_t);
  double (*exp_row_f32)(float *, int64_t, float);
  void (*dropout_f32)(const attn_dropout_rule *, const float *, float *, int64_t, uint64_t);
  void (*dropout_f64)(const attn_dropout_rule *, const double *, double *, int64_t, uint64_t);
  void (*gemm_small_f32)(int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                         float, float *, int64_t, float *);
  const int64_t *gemm_small_max;
  void (*gru_fwd_f32)(int64_t, int64_t, const float *, const float *, const float *, float *, float *, float *,
                      float *);
  void (*gru_bwd_f32)(int64_t, int64_t, float *, const float *, const float *, const float *, const float *,
                      const float *, float *, float *);
  void (*colsum_f32)(const float *, int64_t, int64_t, float *);
} vmath_set;

#define VMATH_SET(isa)                                                                        \
  {                                                                                           \
    #isa, attn_vmath_exp_f32_##isa, attn_vmath_log_f32_##isa, attn_vmath_tanh_f32_##isa,       \
        attn_vmath_sigmoid_f32_##isa, attn_vmath_exp_row_f32_##isa, attn_vmath_dropout_f32_##isa, \
        attn_vmath_dropout_f64_##isa, attn_vmath_gemm_small_f32_##isa, &attn_vmath_gemm_small_max_##isa, \
        attn_vmath_gru_fwd_f32_##isa, attn_vmath_gru_bwd_f32_##isa, attn_vmath_colsum_f32_##isa \
  }

static const vmath_set sets[] = {
    VMATH_SET(generic),
#if defined(__x86_64__)
    VMATH_SET(avx2),
    VMATH_SET(avx512),
#endif
};
#define NSETS ((int)(sizeof sets / sizeof sets[0]))

static int supported(int k) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (strcmp(sets[k].name, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (strcmp(sets[k].name, "avx512") == 0)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
#endif
  return strcmp(sets[k].name, "generic") == 0;
}

static int find(const char *name) {
  for (int k = 0; k < NSETS; k++)
    if (strcmp(sets[k].name, name) == 0) return k;
  return -1;
}

static int best(void) {
  int b = 0;
  for (int k = 0; k < NSETS; k++)
    if (supported(k)) b = k; /* sets are listed from the most portable to the fastest */
  return b;
}

static const vmath_set *active;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void choose(void) {
  const char *env = getenv("ATTN_ISA");
  int k = env && *env ? find(env) : -1;
  active = &sets[k >= 0 && supported(k) ? k : best()];
}

static const vmath_set *get(void) {
  pthread_once(&once, choose);
  return active;
}

const char *attn_vmath_isa(void) { return get()->name; }

int attn_vmath_isa_supported(const char *name) {
  int k = find(name);
  return k >= 0 && supported(k);
}

attn_status attn_vmath_set_isa(const char *name) {
  get();
  int k = strcmp(name, "auto") == 0 ? best() : find(name);
  if (k < 0) return attn_error(ATTN_ERR_ARG, "set_isa: unknown path '%s' (generic, avx2, avx512 or auto)", name);
  if (!supported(k)) return attn_error(ATTN_ERR_ARG, "set_isa: this CPU or build cannot run the '%s' path", name);
  active = &sets[k];
  return ATTN_OK;
}

void attn_vmath_exp_f32(const float *x, float *y, int64_t n) { get()->exp_f32(x, y, n); }
void attn_vmath_log_f32(const float *x, float *y, int64_t n) { get()->log_f32(x, y, n); }
void attn_vmath_tanh_f32(const float *x, float *y, int64_t n) { get()->tanh_f32(x, y, n); }
void attn_vmath_sigmoid_f32(const float *x, float *y, int64_t n) { get()->sigmoid_f32(x, y, n); }
double attn_vmath_exp_row_f32(float *x, int64_t n, float m) { return get()->exp_row_f32(x, n, m); }
void attn_vmath_dropout_f32(const attn_dropout_rule *r, const float *x, float *y, int64_t n, uint64_t base) {
  get()->dropout_f32(r, x, y, n, base);
}
void attn_vmath_dropout_f64(const attn_dropout_rule *r, const double *x, double *y, int64_t n, uint64_t base) {
  get()->dropout_f64(r, x, y, n, base);
}
void attn_vmath_gemm_small_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                               float *pack) {
  get()->gemm_small_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
}

int64_t attn_vmath_gemm_small_max(void) { return *get()->gemm_small_max; }

void attn_vmath_gru_fwd_f32(int64_t B, int64_t H, const float *gi, const float *gh, const float *hp, float *hn,
                            float *rz, float *n, float *ghn) {
  get()->gru_fwd_f32(B, H, gi, gh, hp, hn, rz, n, ghn);
}
void attn_vmath_gru_bwd_f32(int64_t B, int64_t H, float *dh, const float *dy, const float *hp, const float *rz,
                            const float *n, const float *ghn, float *dgi, float *dgh) {
  get()->gru_bwd_f32(B, H, dh, dy, hp, rz, n, ghn, dgi, dgh);
}
void attn_vmath_colsum_f32(const float *m, int64_t rows, int64_t cols, float *out) {
  get()->colsum_f32(m, rows, cols, out);
}

double attn_vmath_exp_row_f64(double *x, int64_t n, double m) {
  double s = 0;
  for (int64_t j = 0; j < n; j++) {
    double e = exp(x[j] - m);
    x[j] = e;
    s += e;
  }
  return s;
}
