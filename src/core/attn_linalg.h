/* attn_linalg: dense linear algebra through LAPACKE (solve, least squares,
 * QR, SVD, symmetric eigendecomposition, inverse, determinant).
 *
 * Conventions
 * - Inputs are const views of any strides (transposed, narrowed, expanded);
 *   they are copied into a column-major scratch matrix before LAPACK sees
 *   them, so they are never modified and never read out of bounds.
 * - A matrix argument has shape (..., m, n): the last two dims are the matrix,
 *   any leading dims are a batch, and every output carries the same batch dims
 *   in front. "2-D" below means one matrix; batches loop over it.
 * - Outputs are passed in, already allocated by the caller with the shapes
 *   attn_linalg_out_shapes() gives, and the dtype of the inputs (float32 or
 *   float64; float32 inputs run the single-precision LAPACK routines). Outputs
 *   may be any strided view but must not overlap an input or each other.
 *   Nothing is allocated for the caller: the kernels only take a temporary
 *   scratch block (attn_alloc) that they release before returning.
 * - Every function returns ATTN_OK or a status with a message naming the op
 *   as "linalg.<op>" and the shapes involved, e.g.
 *   "linalg.solve: A [3x3] and B [4x2] differ in rows". Numeric failures are
 *   ATTN_ERR_NUMERIC: "linalg.inv: matrix [3x3] is singular (U(2,2) = 0)"
 *   (1-based diagonal position, as LAPACK reports it; batched inputs also
 *   name the 1-based matrix number) and "linalg.eigh: no convergence ...".
 *   When a batch fails part way, earlier matrices of the outputs are written
 *   and later ones are unspecified.
 * - Sizes are limited to what 32-bit LAPACK integers can index. */
#ifndef ATTN_LINALG_H
#define ATTN_LINALG_H

#include "core/attn_tensor.h"

typedef enum {
  ATTN_LINALG_SOLVE,
  ATTN_LINALG_LSTSQ,
  ATTN_LINALG_QR,
  ATTN_LINALG_SVD,
  ATTN_LINALG_EIGH,
  ATTN_LINALG_INV,
  ATTN_LINALG_DET
} attn_linalg_op;

#define ATTN_LINALG_MAX_OUTPUTS 3

/* Output shapes of one op, in the order of the kernel's output arguments. */
typedef struct {
  int nout;
  int ndim[ATTN_LINALG_MAX_OUTPUTS];
  int64_t shape[ATTN_LINALG_MAX_OUTPUTS][ATTN_MAX_DIMS];
} attn_linalg_shapes;

/* "linalg.solve", "linalg.qr", ... */
const char *attn_linalg_name(attn_linalg_op op);

/* Validates the inputs of op (b only for SOLVE and LSTSQ, NULL otherwise) and
 * fills the shapes of its outputs. Checks: a has at least 2 dims; a is square
 * for SOLVE, EIGH, INV and DET; a and b share the dtype; b has a's batch dims
 * followed by (m) (a vector right-hand side) or (m, k) (a matrix), and its
 * m equals a's rows; sizes fit LAPACK's integers. Output shapes, with "..."
 * the batch dims of a, k = min(m, n):
 *   SOLVE  a (..., n, n), b (..., n) or (..., n, r)  -> x like b
 *   LSTSQ  a (..., m, n), b (..., m) or (..., m, r)  -> x (..., n) or (..., n, r)
 *   QR     a (..., m, n)                             -> q (..., m, k), r (..., k, n)
 *   SVD    a (..., m, n)                             -> u (..., m, k), s (..., k), vt (..., k, n)
 *   EIGH   a (..., n, n)                             -> w (..., n), v (..., n, n)
 *   INV    a (..., n, n)                             -> out (..., n, n)
 *   DET    a (..., n, n)                             -> out (...) (0-d for one matrix) */
attn_status attn_linalg_out_shapes(attn_linalg_op op, const attn_tensor *a, const attn_tensor *b,
                                   attn_linalg_shapes *out);

/* Solves a x = b for square a by LU with partial pivoting (?gesv).
 * a (..., n, n); b (..., n) or (..., n, r); x has b's shape (caller-allocated).
 * Fails with ATTN_ERR_NUMERIC when a is exactly singular. */
attn_status attn_linalg_solve(const attn_tensor *a, const attn_tensor *b, attn_tensor *x);

/* Least-squares / minimum-norm solution of a x ~= b through the SVD (?gelsd):
 * minimises ||a x - b||_2, and among minimisers returns the one of least norm,
 * so rank-deficient and wide a are fine. Singular values below
 * eps * max(m, n) * s_max count as zero (eps of the dtype), as NumPy does.
 * a (..., m, n); b (..., m) or (..., m, r); x (..., n) or (..., n, r)
 * (caller-allocated). rank (may be NULL) receives the effective rank: the
 * smallest over the batch (0 when m or n is 0, min(m, n) for an empty batch).
 * a and b must be finite (ATTN_ERR_NUMERIC otherwise). */
attn_status attn_linalg_lstsq(const attn_tensor *a, const attn_tensor *b, attn_tensor *x, int64_t *rank);

/* Reduced QR (?geqrf + ?orgqr): a = q r with q's columns orthonormal and r
 * upper triangular (zeros below the diagonal are written). The diagonal of r
 * may be negative (LAPACK's Householder convention).
 * a (..., m, n) -> q (..., m, k), r (..., k, n), k = min(m, n) (caller-allocated). */
attn_status attn_linalg_qr(const attn_tensor *a, attn_tensor *q, attn_tensor *r);

/* Thin SVD by divide and conquer (?gesdd): a = u diag(s) vt, s descending and
 * >= 0, u's columns and vt's rows orthonormal. Singular vectors are unique
 * only up to sign (and rotation within repeated singular values).
 * a (..., m, n) -> u (..., m, k), s (..., k), vt (..., k, n), k = min(m, n)
 * (caller-allocated). a must be finite (ATTN_ERR_NUMERIC otherwise). */
attn_status attn_linalg_svd(const attn_tensor *a, attn_tensor *u, attn_tensor *s, attn_tensor *vt);

/* Eigendecomposition of a symmetric matrix (?syevd): a v = v diag(w), w
 * ascending, v orthogonal with eigenvectors as columns (each unique up to
 * sign). Only the lower triangle of a (row >= column) is read; symmetry is
 * not checked. a (..., n, n) -> w (..., n), v (..., n, n) (caller-allocated).
 * a must be finite (ATTN_ERR_NUMERIC otherwise). */
attn_status attn_linalg_eigh(const attn_tensor *a, attn_tensor *w, attn_tensor *v);

/* Inverse by LU (?getrf + ?getri). a (..., n, n) -> out (..., n, n)
 * (caller-allocated). Fails with ATTN_ERR_NUMERIC when a is exactly singular. */
attn_status attn_linalg_inv(const attn_tensor *a, attn_tensor *out);

/* Determinant by LU (?getrf): product of U's diagonal times the permutation's
 * sign, accumulated in double with a separate exponent so intermediate
 * products neither overflow nor underflow. A singular matrix gives 0 (no
 * error); a 0x0 matrix gives 1. a (..., n, n) -> out (...) (caller-allocated;
 * 0-d for one matrix). */
attn_status attn_linalg_det(const attn_tensor *a, attn_tensor *out);

#endif
