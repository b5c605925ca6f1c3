/* Binding: linear algebra (attn.core.linalg_*), over the attn_linalg_*
 * kernels. Every function allocates fresh outputs with the shapes the core
 * computes, runs the kernel and raises the core's message on failure. Inputs
 * may be any view (transposed, narrowed); float32 and float64. */
#include "core/attn_linalg.h"
#include "bind/lbind.h"

/* Validates a (and b) for op and pushes its fresh outputs; raises on bad input. */
static void push_outputs(lua_State *L, attn_linalg_op op, const attn_tensor *a, const attn_tensor *b,
                         attn_tensor **outs) {
  attn_linalg_shapes sh;
  if (attn_linalg_out_shapes(op, a, b, &sh) != ATTN_OK) attn_l_raise(L);
  for (int i = 0; i < sh.nout; i++) outs[i] = attn_l_push_alloc(L, a->dtype, sh.ndim[i], sh.shape[i]);
}

/***
 * Solves `A X = B` for square `A` (LU with partial pivoting).
 * @function linalg_solve
 * @tparam Tensor A (n, n), or a batch (..., n, n)
 * @tparam Tensor B (n) or (n, k), with A's batch dims in front
 * @treturn Tensor X, shaped like B
 * @raise when A is not square, the rows differ, or A is singular
 */
static int l_linalg_solve(lua_State *L) {
  attn_tensor *a = attn_l_check(L, 1), *b = attn_l_check(L, 2), *x;
  push_outputs(L, ATTN_LINALG_SOLVE, a, b, &x);
  ATTN_L_TRY(L, attn_linalg_solve(a, b, x));
  return 1;
}

/***
 * Least-squares (minimum-norm when underdetermined or rank-deficient) solution of `A X ~= B`.
 * @function linalg_lstsq
 * @tparam Tensor A (m, n), or a batch (..., m, n)
 * @tparam Tensor B (m) or (m, k), with A's batch dims in front
 * @treturn Tensor X (n) or (n, k)
 * @treturn integer effective rank of A (the smallest over a batch)
 */
static int l_linalg_lstsq(lua_State *L) {
  attn_tensor *a = attn_l_check(L, 1), *b = attn_l_check(L, 2), *x;
  int64_t rank = 0;
  push_outputs(L, ATTN_LINALG_LSTSQ, a, b, &x);
  ATTN_L_TRY(L, attn_linalg_lstsq(a, b, x, &rank));
  lua_pushinteger(L, (lua_Integer)rank);
  return 2;
}

/***
 * Reduced QR decomposition `A = Q R`.
 * @function linalg_qr
 * @tparam Tensor A (m, n), or a batch (..., m, n)
 * @treturn Tensor Q (m, k), orthonormal columns, k = min(m, n)
 * @treturn Tensor R (k, n), upper triangular
 */
static int l_linalg_qr(lua_State *L) {
  attn_tensor *a = attn_l_check(L, 1), *outs[2];
  push_outputs(L, ATTN_LINALG_QR, a, NULL, outs);
  ATTN_L_TRY(L, attn_linalg_qr(a, outs[0], outs[1]));
  return 2;
}

/***
 * Thin singular value decomposition `A = U diag(S) Vt`.
 * @function linalg_svd
 * @tparam Tensor A (m, n), or a batch (..., m, n)
 * @treturn Tensor U (m, k), k = min(m, n)
 * @treturn Tensor S (k), descending, non-negative
 * @treturn Tensor Vt (k, n)
 */
static int l_linalg_svd(lua_State *L) {
  attn_tensor *a = attn_l_check(L, 1), *outs[3];
  push_outputs(L, ATTN_LINALG_SVD, a, NULL, outs);
  ATTN_L_TRY(L, attn_linalg_svd(a, outs[0], outs[1], outs[2]));
  return 3;
}

/***
 * Eigendecomposition of a symmetric matrix (only its lower triangle is read).
 * @function linalg_eigh
 * @tparam Tensor A (n, n), or a batch (..., n, n)
 * @treturn Tensor eigenvalues (n), ascending
 * @treturn Tensor eigenvectors (n, n), as columns
 */
static int l_linalg_eigh(lua_State *L) {
  attn_tensor *a = attn_l_check(L, 1), *outs[2];
  push_outputs(L, ATTN_LINALG_EIGH, a, NULL, outs);
  ATTN_L_TRY(L, attn_linalg_eigh(a, outs[0], outs[1]));
  return 2;
}

/***
 * Inverse of a square matrix.
 * @function linalg_inv
 * @tparam Tensor A (n, n), or a batch (..., n, n)
 * @treturn Tensor (n, n)
 * @raise when A is singular
 */
static int l_linalg_inv(lua_State *L) {
  attn_tensor *a = attn_l_check(L, 1), *out;
  push_outputs(L, ATTN_LINALG_INV, a, NULL, &out);
  ATTN_L_TRY(L, attn_linalg_inv(a, out));
  return 1;
}

/***
 * Determinant of a square matrix (0 when singular).
 * @function linalg_det
 * @tparam Tensor A (n, n), or a batch (..., n, n)
 * @treturn Tensor 0-d (or A's batch shape)
 */
static int l_linalg_det(lua_State *L) {
  attn_tensor *a = attn_l_check(L, 1), *out;
  push_outputs(L, ATTN_LINALG_DET, a, NULL, &out);
  ATTN_L_TRY(L, attn_linalg_det(a, out));
  return 1;
}

static const luaL_Reg linalg_functions[] = {
    {"linalg_solve", l_linalg_solve}, {"linalg_lstsq", l_linalg_lstsq}, {"linalg_qr", l_linalg_qr},
    {"linalg_svd", l_linalg_svd},     {"linalg_eigh", l_linalg_eigh},   {"linalg_inv", l_linalg_inv},
    {"linalg_det", l_linalg_det},     {NULL, NULL},
};

void attn_l_open_linalg(lua_State *L) { attn_l_setfuncs(L, linalg_functions); }
