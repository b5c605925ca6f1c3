/* attn_sdpa_flash (internal): the per-ISA kernel sets behind the flash
 * attention dispatch. The AVX2 and AVX-512 sets exist only on x86-64. */
#ifndef ATTN_FLASH_CPU_H
#define ATTN_FLASH_CPU_H

#include "attention/attn_attention_internal.h"

extern const attn_flash_kernels attn_flash_kernels_generic;
#if defined(__x86_64__)
extern const attn_flash_kernels attn_flash_kernels_avx2, attn_flash_kernels_avx512;
#endif

#endif
