/* The small float32 product for AVX-512: 16-float vectors, 8 rows x 2 vectors of accumulators (16
 * of the 32 registers, two loads of B and eight broadcasts of A per step). A 32-column panel
 * covers the book's hidden sizes in one piece and the GRU's gates in three. */
#if defined(__x86_64__)
#include "vmath_cpu.h"

#define GEMM_SUFFIX avx512
#define GEMM_VW 16
#define GEMM_MR 8
#define GEMM_NV 2
/* attn_gemm takes this path for products of at most this many multiply-adds: measured 1.2-2.3x OpenBLAS from 16^3 to 512^3 on Zen 5 (bench/gemm_bench.lua). */
#define GEMM_SMALL_MAX (1 << 22)
#include "gemm_body.h"
#endif
