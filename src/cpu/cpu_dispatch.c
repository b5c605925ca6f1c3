/* The table of per-ISA kernel sets and the run-time choice among them (cpu_dispatch.h). */
#include "cpu/cpu_dispatch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/flash_cpu.h"
#include "cpu/sdpa_small_cpu.h"
#include "cpu/vmath_cpu.h"
#include "cpu/wino_cpu.h"

#define CPU_SET(isa)                                                                                        \
  {                                                                                                         \
    #isa, attn_vmath_exp_f32_##isa, attn_vmath_log_f32_##isa, attn_vmath_tanh_f32_##isa,                    \
        attn_vmath_sigmoid_f32_##isa, attn_vmath_exp_row_f32_##isa, attn_vmath_dropout_f32_##isa,           \
        attn_vmath_dropout_f64_##isa, attn_vmath_gru_fwd_f32_##isa, attn_vmath_gru_bwd_f32_##isa,           \
        attn_vmath_colsum_f32_##isa, attn_vmath_gemm_small_f32_##isa, &attn_vmath_gemm_small_max_##isa,     \
        attn_sdpa_small_forward_##isa, attn_sdpa_small_backward_##isa, &attn_flash_kernels_##isa,           \
        &attn_wino_kernels_##isa                                                                            \
  }

/* From the most portable to the fastest. */
static const attn_cpu_kernels sets[] = {
    CPU_SET(generic),
#if defined(__x86_64__)
    CPU_SET(avx2),
    CPU_SET(avx512),
#endif
};
#define NSETS ((int)(sizeof sets / sizeof sets[0]))

int attn_cpu_supported(const attn_cpu_kernels *k) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (strcmp(k->name, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (strcmp(k->name, "avx512") == 0)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
#endif
  return strcmp(k->name, "generic") == 0;
}

const attn_cpu_kernels *attn_cpu_find(const char *name) {
  for (int k = 0; k < NSETS; k++)
    if (strcmp(sets[k].name, name) == 0) return &sets[k];
  return NULL;
}

const attn_cpu_kernels *attn_cpu_best(void) {
  const attn_cpu_kernels *b = &sets[0];
  for (int k = 0; k < NSETS; k++)
    if (attn_cpu_supported(&sets[k])) b = &sets[k];
  return b;
}

static const attn_cpu_kernels *active;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void choose(void) {
  const char *env = getenv("ATTN_ISA");
  const attn_cpu_kernels *k = env && *env ? attn_cpu_find(env) : NULL;
  __atomic_store_n(&active, k && attn_cpu_supported(k) ? k : attn_cpu_best(), __ATOMIC_RELEASE);
}

/* Once chosen, the set is read without pthread_once: a small call asks for it several times
 * (the sets are static constants, so seeing the pointer is seeing them). */
const attn_cpu_kernels *attn_cpu(void) {
  const attn_cpu_kernels *k = __atomic_load_n(&active, __ATOMIC_ACQUIRE);
  if (k) return k;
  pthread_once(&once, choose);
  return __atomic_load_n(&active, __ATOMIC_ACQUIRE);
}

void attn_cpu_select(const attn_cpu_kernels *k) {
  pthread_once(&once, choose); /* a later first use must not replace the choice with ATTN_ISA's */
  __atomic_store_n(&active, k, __ATOMIC_RELEASE);
}
