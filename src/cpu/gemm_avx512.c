/* The small float32 product for AVX-512: 16-float vectors, 8 rows x 2 vectors of accumulators (16
 * of the 32 registers, two loads of B and eight broadcasts of A per step). A 32-column panel
 * covers the book's hidden sizes in one piece and the GRU's gates in three. */
#if defined(__x86_64__)
#include "cpu/vmath_cpu.h"

#define GEMM_SUFFIX avx512
#define GEMM_VW 16
#define GEMM_MR 8
#define GEMM_NV 2
#include <immintrin.h>
/* n (1..16) lanes under a mask: lanes past n are neither read nor written (no fault past an edge) */
#define GEMM_LOADN(p, n) ((gemm_vf)_mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1u), (p)))
#define GEMM_STOREN(p, v, n) _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1u), (__m512)(v))
/* attn_gemm takes this path for products of at most this many multiply-adds: measured 1.2-2.3x OpenBLAS from 16^3 to 512^3 on Zen 5 (bench/gemm_bench.lua). */
#define GEMM_SMALL_MAX (1 << 22)
#include "cpu/gemm_body.h"
#endif
