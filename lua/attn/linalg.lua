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

--- PyTorch's `linalg.vector_norm(x, ord, dim, keepdim)`: the vector ord-norm over dim (all
-- entries when nil), as `Tensor.norm` (ord 2 default, 1, math.huge, -math.huge, 0, any p).
-- Differentiable (unlike the factorizations above); 0 gradient at a zero norm.
-- @function vector_norm
-- @tparam Tensor x float
-- @tparam[opt=2] number ord
-- @tparam[opt] integer|{integer,...} dim
-- @tparam[opt=false] boolean keepdim
-- @treturn Tensor
-- @usage attn.linalg.vector_norm(x, 1, -1)
function linalg.vector_norm(x, ord, dim, keepdim) return require("attn.tensor").norm(x, ord, dim, keepdim) end

--- PyTorch's `linalg.norm(x, ord, dim, keepdim)` for vector norms: with dim nil and ord nil
-- (or "fro") the 2-norm of all entries (the Frobenius norm of a matrix); with an integer dim
-- (or a 1-D x) the vector ord-norm, as `vector_norm`. Matrix ords (a number over two dims, or
-- "nuc") are refused.
-- @function norm
-- @tparam Tensor x float
-- @param[opt] ord number or "fro"
-- @tparam[opt] integer|{integer,...} dim
-- @tparam[opt=false] boolean keepdim
-- @treturn Tensor
-- @raise "linalg.norm: matrix norms (ord 1 over 2 dims) are not supported; use linalg.vector_norm"
-- @usage attn.linalg.norm(attn.tensor({3, 4})) --> 5
function linalg.norm(x, ord, dim, keepdim)
  local two_dims = (dim == nil and core.dim(x) == 2) or (type(dim) == "table" and #dim == 2)
  if (ord ~= nil and ord ~= "fro" and two_dims) or ord == "nuc" then
    error(string.format("linalg.norm: matrix norms (ord %s over 2 dims) are not supported; use linalg.vector_norm",
      tostring(ord)), 2)
  end
  if ord == "fro" and not two_dims and dim ~= nil then
    error("linalg.norm: ord 'fro' needs 2 dims (or dim nil)", 2)
  end
  return require("attn.tensor").norm(x, ord, dim, keepdim)
end

return linalg
