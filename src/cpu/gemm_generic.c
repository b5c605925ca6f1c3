/* The small float32 product for the generic path: 4-float vectors (SSE2 on x86-64, NEON on
 * aarch64), 4 rows x 2 vectors of accumulators, which fit the 16 registers of the smaller set. */
#include "cpu/vmath_cpu.h"

#define GEMM_SUFFIX generic
#define GEMM_VW 4
#define GEMM_MR 4
#define GEMM_NV 2
/* attn_gemm takes this path for products of at most this many multiply-adds: never chosen by size: on x86-64 OpenBLAS's own AVX2 kernels are twice as fast, and
 * elsewhere it is unmeasured. */
#define GEMM_SMALL_MAX 0
#include "cpu/gemm_body.h"
