/* attn_gemm: the one entry of the core's matrix products (matmul, bmm, Linear, the fused GRU).
 *
 * A float32 product small enough that OpenBLAS's per-call setup and packing would cost more than
 * its arithmetic runs through the engine's own register-blocked kernel (attn_vmath_gemm_small_f32,
 * per instruction set); larger ones, and every float64 one, go to OpenBLAS. The choice depends on
 * the shape alone (attn_gemm_is_small), never on the thread count or on where a caller cuts the
 * rows, so results stay the same bits on any number of threads. */
#ifndef ATTN_GEMM_H
#define ATTN_GEMM_H

#include <stdint.h>

#include "core/attn_error.h"
#include "core/attn_tensor.h"

typedef enum { ATTN_GEMM_AUTO = 0, ATTN_GEMM_SMALL, ATTN_GEMM_BLAS } attn_gemm_path;

/* C (M x N, row-major, ldc) = alpha op(A) op(B) + beta C with op(A) M x K and op(B) K x N
 * row-major with leading dims lda, ldb (ta, tb: transposed), float32 or float64 by dt. Sizes and
 * leading dims below 2^31 (BLAS's ints; callers check). C is not read when beta is 0. */
void attn_gemm(attn_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
               int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);

/* The height of the row blocks attn_gemm_split cuts an M x N x K product into: M (one block) below
 * 2e6 FLOPs or 16 rows, else a quarter of M rounded up to 16 rows, at least 64. It depends on the
 * shape alone, as OpenBLAS's bits for a row depend on the height of the call it comes in. */
int64_t attn_gemm_row_block(int64_t M, int64_t N, int64_t K);

/* The width of the column blocks attn_gemm_split cuts each row block into: N (no cut) below 5e5
 * FLOPs, with four row blocks, or when the row blocks go to OpenBLAS, else N over the blocks still
 * wanted (four over the row blocks), rounded up to 64 columns, at least 256. Also by the shape
 * alone (and the active instruction set's small-path limit, as attn_gemm's own choice). Only the
 * small kernel is cut: its entries are the same multiply-adds in any panel (src/cpu/gemm_body.h),
 * while OpenBLAS 0.3.21's bits for a column follow where the call's column range starts and ends
 * (its packing grid), so a cut there would change results. */
int64_t attn_gemm_col_block(attn_dtype dt, int tb, int64_t M, int64_t N, int64_t K);

/* attn_gemm over the worker pool: one attn_gemm per block of attn_gemm_row_block(M, N, K) rows by
 * attn_gemm_col_block(dt, tb, M, N, K) columns (each re-packs its part of B, a few per cent of a
 * large product on one thread), blocks spread over the threads, so the result is the same bits on
 * any thread count, and the same as one attn_gemm per row block. Same operands as attn_gemm. */
void attn_gemm_split(attn_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                     int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);

/* 1 when attn_gemm runs a float32 product of this shape (tb: B transposed) on the small path: at
 * most attn_vmath_gemm_small_max() multiply-adds (M N K; the active instruction set's measured
 * limit, see src/cpu/gemm_<isa>.c and bench/gemm_bench.lua) and B's panel fits the kernel's stack
 * workspace (K <= 512 when B must be packed). */
int attn_gemm_is_small(int tb, int64_t M, int64_t N, int64_t K);

/* How BLAS reads a matrix view t (its last two dims): not transposed with leading dim *ld when
 * its columns have unit stride, transposed when its rows do; 0 when neither (copy it first). */
int attn_gemm_layout(const attn_tensor *t, int *trans, int64_t *ld);

/* c (M, N) = alpha a b + beta c in place on 2-D float views (a (M, K), b (K, N), one dtype), by
 * the given path (AUTO: as matmul, attn_gemm_split over the worker pool; SMALL, BLAS: one call on
 * the calling thread, SMALL float32 only): the specs and benchmarks compare the paths with it. a and b need a unit stride in one dim (transposed views are read as such), c in
 * its columns, and c shares storage with neither. Fails naming the shapes. */
attn_status attn_gemm_views(attn_gemm_path path, double alpha, const attn_tensor *a, const attn_tensor *b, double beta,
                            attn_tensor *c);

#endif
