/* The small float32 product for AVX2 + FMA: 8-float vectors, 6 rows x 2 vectors of accumulators
 * (12 of the 16 registers, with two for B and one for the broadcast of A). */
#if defined(__x86_64__)
#include "vmath_cpu.h"

#define GEMM_SUFFIX avx2
#define GEMM_VW 8
#define GEMM_MR 6
#define GEMM_NV 2
/* attn_gemm takes this path for products of at most this many multiply-adds: measured 0.8-1.2x OpenBLAS's AVX2 kernel, 1.0-1.2x on the book's shapes. */
#define GEMM_SMALL_MAX (1 << 22)
#include "gemm_body.h"
#endif
