/* The choice between the engine's small-product kernel and OpenBLAS: see attn_gemm.h. */
#include "core/attn_gemm.h"

#include <cblas.h>

#include "core/attn_alloc.h"
#include "core/attn_parallel.h"
#include "core/attn_vmath.h"

/* The kernel's workspace on the stack: 64 KiB, a panel of 32 columns for K up to 512. */
#define STACK_PACK 16384
/* attn_gemm_split's grid: about this many blocks (row blocks first, see attn_gemm_row_block) */
#define GRID_BLOCKS 4
/* Column blocks: a multiple of the small kernel's panels (16 or 32 columns), at least COL_MIN wide,
 * from products of COL_MIN_FLOPS up (one (1, 32) x (32, V) output-layer row at batch 1). */
#define COL_ALIGN 64
#define COL_MIN 256
#define COL_MIN_FLOPS 5e5

/* Floats the small kernel packs for this shape (see attn_vmath.h): only a transposed B. */
static int64_t pack_floats(int tb, int64_t N, int64_t K) {
  if (!tb) return 0;
  return ATTN_VMATH_GEMM_PACK(N < ATTN_VMATH_GEMM_PANEL ? N : ATTN_VMATH_GEMM_PANEL, K);
}

int attn_gemm_is_small(int tb, int64_t M, int64_t N, int64_t K) {
  return (double)M * (double)N * (double)K <= (double)attn_vmath_gemm_small_max() && pack_floats(tb, N, K) <= STACK_PACK;
}

static void blas(attn_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                 int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
  CBLAS_TRANSPOSE a = ta ? CblasTrans : CblasNoTrans, b = tb ? CblasTrans : CblasNoTrans;
  if (dt == ATTN_F32)
    cblas_sgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, (float)alpha, A, (int)lda, B, (int)ldb, (float)beta, C,
                (int)ldc);
  else
    cblas_dgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* The small path with its workspace on the stack, or from the allocator past STACK_PACK (only
 * when forced: attn_gemm_is_small keeps AUTO within the stack). 0 when that fails. */
static int small(int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, double beta, float *C, int64_t ldc) {
  float stack[STACK_PACK], *pack = stack;
  size_t cap = 0;
  int64_t need = pack_floats(tb, N, K);
  if (need > STACK_PACK && !(pack = attn_alloc((size_t)need * sizeof *pack, &cap))) return 0;
  attn_vmath_gemm_small_f32(ta, tb, M, N, K, (float)alpha, A, lda, B, ldb, (float)beta, C, ldc, pack);
  if (pack != stack) attn_free(pack, cap);
  return 1;
}

void attn_gemm(attn_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
               int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
  if (dt == ATTN_F32 && attn_gemm_is_small(tb, M, N, K) &&
      small(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
    return;
  blas(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int64_t attn_gemm_row_block(int64_t M, int64_t N, int64_t K) {
  if (2.0 * (double)M * (double)N * (double)K < 2e6 || M < 16) return M;
  int64_t rows = 16 * ((M + 4 * 16 - 1) / (4 * 16));
  return rows < 64 ? 64 : rows;
}

int64_t attn_gemm_col_block(attn_dtype dt, int tb, int64_t M, int64_t N, int64_t K) {
  int64_t rows = attn_gemm_row_block(M, N, K), row_blocks = (M + rows - 1) / rows;
  if (row_blocks >= GRID_BLOCKS || 2.0 * (double)M * (double)N * (double)K < COL_MIN_FLOPS || dt != ATTN_F32 ||
      !attn_gemm_is_small(tb, rows < M ? rows : M, N, K))
    return N;
  int64_t parts = (GRID_BLOCKS + row_blocks - 1) / row_blocks, cols = (N + parts - 1) / parts;
  cols = (cols + COL_ALIGN - 1) / COL_ALIGN * COL_ALIGN;
  if (cols < COL_MIN) cols = COL_MIN;
  return cols < N ? cols : N;
}

typedef struct {
  attn_dtype dt;
  int ta, tb;
  int64_t M, N, K, lda, ldb, ldc, rows, cols, col_blocks;
  double alpha, beta;
  const char *A, *B;
  char *C;
} grid_job;

/* One attn_gemm per block, whatever range of blocks a thread is given. Column blocks come only
 * from row blocks on the small path, so they are on it too (fewer multiply-adds, the same K). */
static void run_blocks(void *arg, int64_t begin, int64_t end) {
  const grid_job *j = arg;
  size_t es = attn_dtype_size(j->dt);
  for (int64_t b = begin; b < end; b++) {
    int64_t r0 = b / j->col_blocks * j->rows, c0 = b % j->col_blocks * j->cols;
    int64_t m = r0 + j->rows < j->M ? j->rows : j->M - r0, n = c0 + j->cols < j->N ? j->cols : j->N - c0;
    attn_gemm(j->dt, j->ta, j->tb, m, n, j->K, j->alpha, j->A + (size_t)(j->ta ? r0 : r0 * j->lda) * es, j->lda,
              j->B + (size_t)(j->tb ? c0 * j->ldb : c0) * es, j->ldb, j->beta, j->C + (size_t)(r0 * j->ldc + c0) * es,
              j->ldc);
  }
}

void attn_gemm_split(attn_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                     int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
  grid_job j = {dt, ta, tb, M, N, K, lda, ldb, ldc, attn_gemm_row_block(M, N, K), attn_gemm_col_block(dt, tb, M, N, K),
                1, alpha, beta, A, B, C};
  if (j.rows >= M && j.cols >= N) {
    attn_gemm(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  j.col_blocks = (N + j.cols - 1) / j.cols;
  attn_parallel_for((M + j.rows - 1) / j.rows * j.col_blocks, 1, run_blocks, &j);
}

int attn_gemm_layout(const attn_tensor *t, int *trans, int64_t *ld) {
  int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
  int64_t rs = t->stride[t->ndim - 2], cs = t->stride[t->ndim - 1];
  if ((cs == 1 || cols == 1) && rs >= (cols > 1 ? cols : 1)) {
    *trans = 0;
    *ld = rs;
    return 1;
  }
  if ((rs == 1 || rows == 1) && cs >= (rows > 1 ? rows : 1)) {
    *trans = 1;
    *ld = cs;
    return 1;
  }
  return 0;
}

attn_status attn_gemm_views(attn_gemm_path path, double alpha, const attn_tensor *a, const attn_tensor *b, double beta,
                            attn_tensor *c) {
  /* the shapes are formatted only for a message: a benchmark times tiny products through here */
#define GEMM_SHAPES attn_tensor_shape_str(c), attn_tensor_shape_str(a), attn_tensor_shape_str(b)
  if (a->ndim != 2 || b->ndim != 2 || c->ndim != 2 || a->shape[1] != b->shape[0] || c->shape[0] != a->shape[0] ||
      c->shape[1] != b->shape[1])
    return attn_error(ATTN_ERR_SHAPE, "gemm: expected c (M, N) = a (M, K) b (K, N), got %s = %s %s", GEMM_SHAPES);
  attn_status st = attn_check_float("gemm", a);
  if (st != ATTN_OK) return st;
  if (b->dtype != a->dtype || c->dtype != a->dtype)
    return attn_error(ATTN_ERR_DTYPE, "gemm: dtypes differ: %s %s = %s %s %s %s", attn_dtype_name(c->dtype),
                      attn_tensor_shape_str(c), attn_dtype_name(a->dtype), attn_tensor_shape_str(a),
                      attn_dtype_name(b->dtype), attn_tensor_shape_str(b));
  if (path == ATTN_GEMM_SMALL && a->dtype != ATTN_F32)
    return attn_error(ATTN_ERR_DTYPE, "gemm: the small path is float32 only, got %s", attn_dtype_name(a->dtype));
  int ta, tb, tc;
  int64_t lda, ldb, ldc, M = c->shape[0], N = c->shape[1], K = a->shape[1];
  if (!attn_gemm_layout(a, &ta, &lda) || !attn_gemm_layout(b, &tb, &ldb) || !attn_gemm_layout(c, &tc, &ldc) ||
      (tc && N > 1))
    return attn_error(ATTN_ERR_SHAPE, "gemm: a %s and b %s need a unit stride in one dim, c %s in its columns",
                      attn_tensor_shape_str(a), attn_tensor_shape_str(b), attn_tensor_shape_str(c));
  if (c->storage == a->storage || c->storage == b->storage)
    return attn_error(ATTN_ERR_ARG, "gemm: c %s shares storage with a or b", attn_tensor_shape_str(c));
  if (M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff || lda > 0x7fffffff || ldb > 0x7fffffff ||
      ldc > 0x7fffffff)
    return attn_error(ATTN_ERR_SHAPE, "gemm: %s = %s %s exceeds BLAS's 32-bit sizes", GEMM_SHAPES);
#undef GEMM_SHAPES
  if (M == 0 || N == 0) return ATTN_OK;
  if (lda < 1) lda = 1;
  if (ldb < 1) ldb = 1;
  if (ldc < N) ldc = N; /* one row: its stride is never used */
  const void *A = attn_tensor_data(a), *B = attn_tensor_data(b);
  void *C = attn_tensor_data(c);
  if (path == ATTN_GEMM_SMALL) {
    if (!small(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
      return attn_error(ATTN_ERR_MEMORY, "gemm: out of memory for the small path's workspace of %s",
                        attn_tensor_shape_str(b));
  } else if (path == ATTN_GEMM_BLAS) {
    blas(a->dtype, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    attn_get_num_threads(); /* first use pins OpenBLAS to one thread */
    attn_gemm_split(a->dtype, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  return ATTN_OK;
}
