/* The small float32 product for AVX2 + FMA: 8-float vectors, 6 rows x 2 vectors of accumulators
 * (12 of the 16 registers, with two for B and one for the broadcast of A). */
#if defined(__x86_64__)
#include "cpu/vmath_cpu.h"

#define GEMM_SUFFIX avx2
#define GEMM_VW 8
#define GEMM_MR 6
#define GEMM_NV 2
#include <immintrin.h>
/* n (1..8) lanes under a mask from a sliding window of this table: masked-off lanes are neither
 * read nor written (no fault past an edge) */
static const int32_t gemm_avx2_lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define GEMM_MASK8(n) _mm256_loadu_si256((const __m256i *)(gemm_avx2_lanes + 8 - (n)))
#define GEMM_LOADN(p, n) ((gemm_vf)_mm256_maskload_ps((p), GEMM_MASK8(n)))
#define GEMM_STOREN(p, v, n) _mm256_maskstore_ps((p), GEMM_MASK8(n), (__m256)(v))
/* attn_gemm takes this path for products of at most this many multiply-adds: measured 0.8-1.2x OpenBLAS's AVX2 kernel, 1.0-1.2x on the book's shapes. */
#define GEMM_SMALL_MAX (1 << 22)
#include "cpu/gemm_body.h"
#endif
