--- Dense linear algebra through LAPACK: solve, least squares, QR, SVD,
-- symmetric eigendecomposition, inverse and determinant.
--
-- Inputs are float32 or float64 tensors of any layout (transposed and
-- narrowed views are fine; they are copied before LAPACK sees them). A matrix
-- argument is 2-D (m, n); leading dims, if any, are a batch and every result
-- carries them in front. Results are fresh tensors of the input's dtype and
-- are not recorded by autograd. Errors name the function and the shapes, e.g.
-- "linalg.solve: A [3x3] and B [4x2] differ in rows".
-- @module attn.linalg
local core = require "attn.core"

local linalg = {}

--- Solves `A X = B` for square `A` (LU with partial pivoting).
-- @function solve
-- @tparam Tensor A (n, n)
-- @tparam Tensor B (n) (one right-hand side) or (n, k)
-- @treturn Tensor X, shaped like B
-- @raise "linalg.solve: A must be square, got [2x3]", rows that differ, or
-- "linalg.solve: matrix [3x3] is singular (U(2,2) = 0)"
-- @usage local x = attn.linalg.solve(A, b)
linalg.solve = core.linalg_solve

--- Least-squares solution of `A X ~= B`: minimises ||A X - B||; when A is
-- wide or rank-deficient, the solution of least norm. Singular values below
-- eps * max(m, n) * s_max count as zero.
-- @function lstsq
-- @tparam Tensor A (m, n)
-- @tparam Tensor B (m) or (m, k)
-- @treturn Tensor X (n) or (n, k)
-- @treturn integer effective rank of A (over a batch: the smallest)
-- @raise when the rows differ or A or B has NaN or infinite entries
linalg.lstsq = core.linalg_lstsq

--- Reduced QR decomposition `A = Q R`.
-- @function qr
-- @tparam Tensor A (m, n)
-- @treturn Tensor Q (m, k) with orthonormal columns, k = min(m, n)
-- @treturn Tensor R (k, n), upper triangular (its diagonal may be negative)
linalg.qr = core.linalg_qr

--- Thin singular value decomposition `A = U diag(S) Vt`.
-- Singular vectors are unique only up to sign.
-- @function svd
-- @tparam Tensor A (m, n)
-- @treturn Tensor U (m, k), orthonormal columns, k = min(m, n)
-- @treturn Tensor S (k), non-negative, descending
-- @treturn Tensor Vt (k, n), orthonormal rows
-- @raise "linalg.svd: no convergence ..." or NaN/infinite entries
linalg.svd = core.linalg_svd

--- Eigendecomposition of a symmetric matrix: `A V = V diag(w)`.
-- Only the lower triangle of A is read; symmetry is not checked.
-- @function eigh
-- @tparam Tensor A (n, n)
-- @treturn Tensor w (n), eigenvalues in ascending order
-- @treturn Tensor V (n, n), orthonormal eigenvectors as columns (up to sign)
-- @raise "linalg.eigh: no convergence ..." or NaN/infinite entries
linalg.eigh = core.linalg_eigh

--- Inverse of a square matrix (LU).
-- @function inv
-- @tparam Tensor A (n, n)
-- @treturn Tensor (n, n)
-- @raise "linalg.inv: matrix [3x3] is singular (U(2,2) = 0)"
linalg.inv = core.linalg_inv

--- Determinant of a square matrix (LU); 0 for a singular matrix, 1 for 0x0.
-- @function det
-- @tparam Tensor A (n, n)
-- @treturn Tensor 0-d tensor (use `:item()` for the number)
linalg.det = core.linalg_det

return linalg
