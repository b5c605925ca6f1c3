/* The per-ISA short-row kernels of dot-product attention (cpu/sdpa_small_body.h), gathered in
 * cpu_dispatch.c. The AVX2 and AVX-512 sets exist only on x86-64. */
#ifndef ATTN_SDPA_SMALL_CPU_H
#define ATTN_SDPA_SMALL_CPU_H

#include <stdint.h>

struct attn_attention_job; /* attention/attn_attention_internal.h */

#define ATTN_SDPA_SMALL_DECLARE(isa)                                                                   \
  int attn_sdpa_small_forward_##isa(const struct attn_attention_job *J, int64_t b, int64_t i0, int64_t r); \
  int attn_sdpa_small_backward_##isa(const struct attn_attention_job *J, int64_t b, int64_t i0, int64_t i1, \
                                     float *acc_k, float *acc_v);

ATTN_SDPA_SMALL_DECLARE(generic)
#if defined(__x86_64__)
ATTN_SDPA_SMALL_DECLARE(avx2)
ATTN_SDPA_SMALL_DECLARE(avx512)
#endif

#endif
