/* The per-ISA flash attention kernel sets (cpu/flash_body.h), gathered in cpu_dispatch.c. The
 * AVX2 and AVX-512 sets exist only on x86-64. */
#ifndef ATTN_FLASH_CPU_H
#define ATTN_FLASH_CPU_H

struct attn_flash_kernels; /* attention/attn_attention_internal.h */

extern const struct attn_flash_kernels attn_flash_kernels_generic;
#if defined(__x86_64__)
extern const struct attn_flash_kernels attn_flash_kernels_avx2, attn_flash_kernels_avx512;
#endif

#endif
