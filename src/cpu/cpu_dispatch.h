/* attn_cpu: the one table of per-instruction-set kernels. Every ISA this build has (generic
 * always; avx2 and avx512 on x86-64) fills one attn_cpu_kernels with its row math (vmath), its
 * small float32 product (gemm), its short-row attention (sdpa_small), its flash attention
 * kernels and its Winograd convolution transforms (wino). One set is active for the whole
 * engine: chosen once, at first use, from the environment variable ATTN_ISA (a set this CPU
 * runs) or else the fastest set this CPU runs, and changed only by attn_cpu_select
 * (attn_vmath_set_isa, core.isa()). Every caller reads the active set or a named one from here;
 * there is no other chooser.
 *
 * Lower than the core: this header names the core's and the attention layer's types only by
 * their struct tags, so it needs no other header of the engine. */
#ifndef ATTN_CPU_DISPATCH_H
#define ATTN_CPU_DISPATCH_H

#include <stdint.h>

struct attn_dropout_rule;   /* core/attn_dropout.h */
struct attn_attention_job;  /* attention/attn_attention_internal.h */
struct attn_flash_kernels;  /* attention/attn_attention_internal.h */
struct attn_wino_kernels;   /* cpu/wino_cpu.h */

typedef struct attn_cpu_kernels {
  const char *name; /* "generic", "avx2", "avx512" */
  /* row math (cpu/vmath_body.h; the contracts are attn_vmath.h's) */
  void (*exp_f32)(const float *x, float *y, int64_t n);
  void (*log_f32)(const float *x, float *y, int64_t n);
  void (*tanh_f32)(const float *x, float *y, int64_t n);
  void (*sigmoid_f32)(const float *x, float *y, int64_t n);
  double (*exp_row_f32)(float *x, int64_t n, float m);
  void (*dropout_f32)(const struct attn_dropout_rule *r, const float *x, float *y, int64_t n, uint64_t base);
  void (*dropout_f64)(const struct attn_dropout_rule *r, const double *x, double *y, int64_t n, uint64_t base);
  void (*gru_fwd_f32)(int64_t B, int64_t H, const float *gi, const float *gh, const float *hp, float *hn, float *rz,
                      float *n, float *ghn);
  void (*gru_bwd_f32)(int64_t B, int64_t H, float *dh, const float *dy, const float *hp, const float *rz,
                      const float *n, const float *ghn, float *dgi, float *dgh);
  void (*colsum_f32)(const float *m, int64_t rows, int64_t cols, float *out);
  /* the small float32 product (cpu/gemm_body.h) and the most multiply-adds it is chosen for */
  void (*gemm_small_f32)(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                         const float *B, int64_t ldb, float beta, float *C, int64_t ldc, float *pack);
  const int64_t *gemm_small_max;
  /* short-row attention (cpu/sdpa_small_body.h) */
  int (*sdpa_small_forward)(const struct attn_attention_job *J, int64_t b, int64_t i0, int64_t r);
  int (*sdpa_small_backward)(const struct attn_attention_job *J, int64_t b, int64_t i0, int64_t i1, float *acc_k,
                             float *acc_v);
  /* flash attention (cpu/flash_body.h) */
  const struct attn_flash_kernels *flash;
  /* the Winograd convolution's transforms (cpu/wino_body.h) */
  const struct attn_wino_kernels *wino;
} attn_cpu_kernels;

/* The active set. */
const attn_cpu_kernels *attn_cpu(void);
/* The set of that name in this build, or NULL (avx2 and avx512 exist only on x86-64). */
const attn_cpu_kernels *attn_cpu_find(const char *name);
/* Whether this CPU runs set k. */
int attn_cpu_supported(const attn_cpu_kernels *k);
/* The fastest set this CPU runs. */
const attn_cpu_kernels *attn_cpu_best(void);
/* Makes k (a set this CPU runs) the active set. */
void attn_cpu_select(const attn_cpu_kernels *k);

#endif
