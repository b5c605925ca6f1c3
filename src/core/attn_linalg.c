/* Dense linear algebra through LAPACKE's column-major *_work routines.
 *
 * Every kernel follows the same pattern: validate shapes and outputs, ask
 * LAPACK for its workspace size once (it depends only on m and n, not on the
 * batch), take one scratch block from the caching allocator, and then, for
 * each matrix of the batch, copy the strided input into column-major scratch,
 * run LAPACK in place, and copy the results out into the strided outputs.
 * The *_work entry points are used (not the high-level LAPACKE_* ones) so that
 * nothing is allocated per matrix and LAPACKE does no hidden NaN scan or
 * layout transposition. */
#include <float.h>
#include <lapacke.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "core/attn_linalg.h"

/* Calls LAPACKE_s<fn>_work or LAPACKE_d<fn>_work in column-major layout; the
 * buffers are void* and convert to float* or double* implicitly. */
#define LAPACK_CALL(dt, fn, ...)                                       \
  ((dt) == ATTN_F64 ? LAPACKE_d##fn##_work(LAPACK_COL_MAJOR, __VA_ARGS__) \
                    : LAPACKE_s##fn##_work(LAPACK_COL_MAJOR, __VA_ARGS__))

#define LAPACK_INT_LIMIT ((int64_t)INT32_MAX)

static const char *const op_names[] = {"linalg.solve", "linalg.lstsq", "linalg.qr",  "linalg.svd",
                                       "linalg.eigh",  "linalg.inv",   "linalg.det"};

const char *attn_linalg_name(attn_linalg_op op) {
  if ((unsigned)op >= sizeof op_names / sizeof op_names[0]) return "linalg.?";
  return op_names[op];
}

static int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- shapes ---- */

static int needs_square(attn_linalg_op op) {
  return op == ATTN_LINALG_SOLVE || op == ATTN_LINALG_EIGH || op == ATTN_LINALG_INV || op == ATTN_LINALG_DET;
}

/* Output i of sh: a's nb batch dims followed by nextra dims d0 (, d1). */
static void set_out(attn_linalg_shapes *sh, int i, const attn_tensor *a, int nb, int nextra, int64_t d0,
                    int64_t d1) {
  memcpy(sh->shape[i], a->shape, sizeof(int64_t) * (size_t)nb);
  if (nextra > 0) sh->shape[i][nb] = d0;
  if (nextra > 1) sh->shape[i][nb + 1] = d1;
  sh->ndim[i] = nb + nextra;
}

attn_status attn_linalg_out_shapes(attn_linalg_op op, const attn_tensor *a, const attn_tensor *b,
                                   attn_linalg_shapes *out) {
  const char *name = attn_linalg_name(op);
  memset(out, 0, sizeof *out);
  attn_status fst = attn_check_float(name, a);
  if (fst == ATTN_OK && b) fst = attn_check_float(name, b);
  if (fst != ATTN_OK) return fst;
  if (a->ndim < 2)
    return attn_error(ATTN_ERR_SHAPE, "%s: A must be a matrix (2-D) or a batch of matrices, got %s", name,
                      attn_tensor_shape_str(a));
  int nb = a->ndim - 2;
  int64_t m = a->shape[nb], n = a->shape[nb + 1], k = imin(m, n), r = 1;
  if (needs_square(op) && m != n)
    return attn_error(ATTN_ERR_SHAPE, "%s: A must be square, got %s", name, attn_tensor_shape_str(a));
  if (m > LAPACK_INT_LIMIT || n > LAPACK_INT_LIMIT)
    return attn_error(ATTN_ERR_ARG, "%s: matrix %s is too large for LAPACK's 32-bit indices", name,
                      attn_tensor_shape_str(a));
  int bvec = 0;
  if (op == ATTN_LINALG_SOLVE || op == ATTN_LINALG_LSTSQ) {
    if (!b) return attn_error(ATTN_ERR_ARG, "%s: right-hand side B is missing", name);
    if (b->dtype != a->dtype)
      return attn_error(ATTN_ERR_DTYPE, "%s: dtypes differ: A %s %s, B %s %s", name, attn_dtype_name(a->dtype),
                        attn_tensor_shape_str(a), attn_dtype_name(b->dtype), attn_tensor_shape_str(b));
    if (b->ndim == a->ndim - 1)
      bvec = 1;
    else if (b->ndim != a->ndim)
      return attn_error(ATTN_ERR_SHAPE, "%s: B must be %d-D (vector) or %d-D (matrix) for A %s, got %s", name,
                        a->ndim - 1, a->ndim, attn_tensor_shape_str(a), attn_tensor_shape_str(b));
    for (int d = 0; d < nb; d++)
      if (b->shape[d] != a->shape[d])
        return attn_error(ATTN_ERR_SHAPE, "%s: A %s and B %s differ in batch dims", name, attn_tensor_shape_str(a),
                          attn_tensor_shape_str(b));
    if (b->shape[nb] != m)
      return attn_error(ATTN_ERR_SHAPE, "%s: A %s and B %s differ in rows", name, attn_tensor_shape_str(a),
                        attn_tensor_shape_str(b));
    if (!bvec) r = b->shape[nb + 1];
    if (r > LAPACK_INT_LIMIT)
      return attn_error(ATTN_ERR_ARG, "%s: B %s is too large for LAPACK's 32-bit indices", name,
                        attn_tensor_shape_str(b));
  } else if (b) {
    return attn_error(ATTN_ERR_ARG, "%s: takes one matrix, got a second operand %s", name,
                      attn_tensor_shape_str(b));
  }
  switch (op) {
    case ATTN_LINALG_SOLVE:
      out->nout = 1;
      set_out(out, 0, a, nb, bvec ? 1 : 2, n, r);
      break;
    case ATTN_LINALG_LSTSQ:
      out->nout = 1;
      set_out(out, 0, a, nb, bvec ? 1 : 2, n, r);
      break;
    case ATTN_LINALG_QR:
      out->nout = 2;
      set_out(out, 0, a, nb, 2, m, k);
      set_out(out, 1, a, nb, 2, k, n);
      break;
    case ATTN_LINALG_SVD:
      out->nout = 3;
      set_out(out, 0, a, nb, 2, m, k);
      set_out(out, 1, a, nb, 1, k, 0);
      set_out(out, 2, a, nb, 2, k, n);
      break;
    case ATTN_LINALG_EIGH:
      out->nout = 2;
      set_out(out, 0, a, nb, 1, n, 0);
      set_out(out, 1, a, nb, 2, n, n);
      break;
    case ATTN_LINALG_INV:
      out->nout = 1;
      set_out(out, 0, a, nb, 2, n, n);
      break;
    case ATTN_LINALG_DET:
      out->nout = 1;
      set_out(out, 0, a, nb, 0, 0, 0);
      break;
  }
  return ATTN_OK;
}

/* Validates the inputs and the caller's outputs of op; fills sh. */
static attn_status check_call(attn_linalg_op op, const attn_tensor *a, const attn_tensor *b, attn_tensor *const *outs,
                              const char *const *labels, attn_linalg_shapes *sh) {
  attn_status st = attn_linalg_out_shapes(op, a, b, sh);
  if (st != ATTN_OK) return st;
  for (int i = 0; i < sh->nout; i++) {
    const attn_tensor *o = outs[i];
    int same = o && o->storage && o->dtype == a->dtype && o->ndim == sh->ndim[i];
    for (int d = 0; same && d < o->ndim; d++) same = o->shape[d] == sh->shape[i][d];
    if (!same)
      return attn_error(ATTN_ERR_ARG, "%s: output %s must be %s %s for A %s, got %s %s", attn_linalg_name(op),
                        labels[i], attn_dtype_name(a->dtype), attn_shape_str(sh->ndim[i], sh->shape[i]),
                        attn_tensor_shape_str(a), o ? attn_dtype_name(o->dtype) : "none",
                        o ? attn_tensor_shape_str(o) : "");
  }
  return ATTN_OK;
}

/* ---- batches, packing ---- */

static int64_t batch_count(const attn_tensor *a) {
  int64_t c = 1;
  for (int d = 0; d < a->ndim - 2; d++) c *= a->shape[d];
  return c;
}

/* v = t with its first nb dims fixed at flat (row-major) batch number bi.
 * A borrowed view: no storage reference is taken. */
static void batch_slice(const attn_tensor *t, int nb, int64_t bi, attn_tensor *v) {
  *v = *t;
  for (int d = nb - 1; d >= 0; d--) {
    v->offset += (bi % t->shape[d]) * t->stride[d];
    bi /= t->shape[d];
  }
  v->ndim = t->ndim - nb;
  memmove(v->shape, t->shape + nb, sizeof(int64_t) * (size_t)v->ndim);
  memmove(v->stride, t->stride + nb, sizeof(int64_t) * (size_t)v->ndim);
}

/* Copies the matrix view v (a 1-D view counts as one column) into buf in
 * column-major order with leading dim ld. Returns 0 if an entry is NaN or
 * infinite, 1 otherwise. */
static int pack(const attn_tensor *v, void *buf, int64_t ld) {
  int64_t rows = v->shape[0], cols = v->ndim > 1 ? v->shape[1] : 1;
  int64_t rs = v->stride[0], cs = v->ndim > 1 ? v->stride[1] : 0;
  double probe = 0.0; /* x * 0 is NaN exactly when x is NaN or infinite */
  if (rows == 0 || cols == 0) return 1;
  if (v->dtype == ATTN_F64) {
    const double *src = attn_tensor_data(v);
    double *dst = buf;
    for (int64_t j = 0; j < cols; j++)
      for (int64_t i = 0; i < rows; i++) {
        double x = src[i * rs + j * cs];
        dst[i + j * ld] = x;
        probe += x * 0.0;
      }
  } else {
    const float *src = attn_tensor_data(v);
    float *dst = buf;
    for (int64_t j = 0; j < cols; j++)
      for (int64_t i = 0; i < rows; i++) {
        float x = src[i * rs + j * cs];
        dst[i + j * ld] = x;
        probe += (double)x * 0.0;
      }
  }
  return probe == 0.0;
}

/* Whether the lower triangle (i >= j) of the n x n column-major buf is finite. */
static int lower_finite(attn_dtype dt, const void *buf, int64_t n, int64_t ld) {
  double probe = 0.0;
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = j; i < n; i++)
      probe += (dt == ATTN_F64 ? ((const double *)buf)[i + j * ld] : (double)((const float *)buf)[i + j * ld]) * 0.0;
  return probe == 0.0;
}

/* Writes the view v (1-D: one column) from column-major buf with leading dim
 * ld. With upper set, entries below the diagonal are written as 0. */
static void unpack(const void *buf, int64_t ld, attn_tensor *v, int upper) {
  int64_t rows = v->shape[0], cols = v->ndim > 1 ? v->shape[1] : 1;
  int64_t rs = v->stride[0], cs = v->ndim > 1 ? v->stride[1] : 0;
  if (rows == 0 || cols == 0) return;
  if (v->dtype == ATTN_F64) {
    const double *src = buf;
    double *dst = attn_tensor_data(v);
    for (int64_t j = 0; j < cols; j++)
      for (int64_t i = 0; i < rows; i++) dst[i * rs + j * cs] = upper && i > j ? 0.0 : src[i + j * ld];
  } else {
    const float *src = buf;
    float *dst = attn_tensor_data(v);
    for (int64_t j = 0; j < cols; j++)
      for (int64_t i = 0; i < rows; i++) dst[i * rs + j * cs] = upper && i > j ? 0.0f : src[i + j * ld];
  }
}

static double buf_get(attn_dtype dt, const void *buf, int64_t i) {
  return dt == ATTN_F64 ? ((const double *)buf)[i] : (double)((const float *)buf)[i];
}

/* Stores x in the 0-d view v. */
static void set_scalar(attn_tensor *v, double x) {
  if (v->dtype == ATTN_F64)
    *(double *)attn_tensor_data(v) = x;
  else
    *(float *)attn_tensor_data(v) = (float)x;
}

/* ---- scratch ---- */

typedef struct {
  void *base;
  size_t capacity;
} scratch;

enum { SCRATCH_MAX_PARTS = 6 };

/* Carves nparts regions of count[i] elements of elem[i] bytes (each 64-byte
 * aligned) out of one attn_alloc block. */
static attn_status scratch_take(const char *name, scratch *s, int nparts, const int64_t *count, const size_t *elem,
                                void **ptrs) {
  size_t offs[SCRATCH_MAX_PARTS], total = 0;
  s->base = NULL;
  s->capacity = 0;
  for (int i = 0; i < nparts; i++) {
    size_t c = count[i] > 0 ? (size_t)count[i] : 0;
    if (c > (SIZE_MAX / 2) / elem[i] || total > SIZE_MAX / 2)
      return attn_error(ATTN_ERR_MEMORY, "%s: scratch size overflows", name);
    offs[i] = total;
    total += (c * elem[i] + 63) & ~(size_t)63;
  }
  s->base = attn_alloc(total ? total : 64, &s->capacity);
  if (!s->base) return attn_error(ATTN_ERR_MEMORY, "%s: cannot allocate %zu bytes of scratch", name, total);
  for (int i = 0; i < nparts; i++) ptrs[i] = (char *)s->base + offs[i];
  return ATTN_OK;
}

static void scratch_release(scratch *s) {
  if (s->base) attn_free(s->base, s->capacity);
  s->base = NULL;
}

/* Workspace size from a LAPACK query result (a float for s-routines: round up). */
static attn_status lwork_from(const char *name, attn_dtype dt, const void *query, lapack_int *lwork) {
  double q = buf_get(dt, query, 0);
  q = ceil(q * (1.0 + 1e-6)) + 1.0;
  if (!(q < (double)INT32_MAX))
    return attn_error(ATTN_ERR_MEMORY, "%s: LAPACK workspace of %.0f elements exceeds 32-bit indices", name, q);
  *lwork = (lapack_int)(q < 1.0 ? 1.0 : q);
  return ATTN_OK;
}

/* "matrix [3x3]" or "matrix 2 of batch [4x3x3]" (1-based) into buf. */
static const char *which(char *buf, size_t cap, const attn_tensor *a, int64_t bi) {
  if (a->ndim == 2)
    snprintf(buf, cap, "matrix %s", attn_tensor_shape_str(a));
  else
    snprintf(buf, cap, "matrix %lld of batch %s", (long long)bi + 1, attn_tensor_shape_str(a));
  return buf;
}

static attn_status lapack_failed(const char *name, const char *routine, lapack_int info, const attn_tensor *a) {
  return attn_error(ATTN_ERR_ARG, "%s: LAPACK %s rejected argument %d for A %s (internal error)", name, routine,
                    (int)-info, attn_tensor_shape_str(a));
}

static attn_status singular(const char *name, const attn_tensor *a, int64_t bi, lapack_int info) {
  char w[128];
  return attn_error(ATTN_ERR_NUMERIC, "%s: %s is singular (U(%d,%d) = 0)", name, which(w, sizeof w, a, bi),
                    (int)info, (int)info);
}

static attn_status not_finite(const char *name, const attn_tensor *a, int64_t bi) {
  char w[128];
  return attn_error(ATTN_ERR_NUMERIC, "%s: %s has NaN or infinite entries", name, which(w, sizeof w, a, bi));
}

static attn_status no_convergence(const char *name, const attn_tensor *a, int64_t bi, lapack_int info) {
  char w[128];
  return attn_error(ATTN_ERR_NUMERIC, "%s: no convergence for %s (LAPACK info %d)", name, which(w, sizeof w, a, bi),
                    (int)info);
}

/* ---- kernels ---- */

attn_status attn_linalg_solve(const attn_tensor *a, const attn_tensor *b, attn_tensor *x) {
  const char *name = "linalg.solve";
  static const char *const labels[] = {"X"};
  attn_linalg_shapes sh;
  attn_status st = check_call(ATTN_LINALG_SOLVE, a, b, &x, labels, &sh);
  if (st != ATTN_OK) return st;
  int nb = a->ndim - 2;
  attn_dtype dt = a->dtype;
  int64_t n = a->shape[nb], r = b->ndim == a->ndim ? b->shape[nb + 1] : 1, batches = batch_count(a);
  if (n == 0 || r == 0 || batches == 0) return ATTN_OK;
  lapack_int ld = (lapack_int)n;
  size_t es = attn_dtype_size(dt);
  int64_t counts[] = {n * n, n * r, n};
  size_t elems[] = {es, es, sizeof(lapack_int)};
  void *p[3];
  scratch s;
  if ((st = scratch_take(name, &s, 3, counts, elems, p)) != ATTN_OK) return st;
  for (int64_t bi = 0; bi < batches && st == ATTN_OK; bi++) {
    attn_tensor av, bv, xv;
    batch_slice(a, nb, bi, &av);
    batch_slice(b, nb, bi, &bv);
    batch_slice(x, nb, bi, &xv);
    pack(&av, p[0], n);
    pack(&bv, p[1], n);
    lapack_int info = LAPACK_CALL(dt, gesv, ld, (lapack_int)r, p[0], ld, p[2], p[1], ld);
    if (info > 0)
      st = singular(name, a, bi, info);
    else if (info < 0)
      st = lapack_failed(name, "gesv", info, a);
    else
      unpack(p[1], n, &xv, 0);
  }
  scratch_release(&s);
  return st;
}

attn_status attn_linalg_lstsq(const attn_tensor *a, const attn_tensor *b, attn_tensor *x, int64_t *rank) {
  const char *name = "linalg.lstsq";
  static const char *const labels[] = {"X"};
  attn_linalg_shapes sh;
  attn_status st = check_call(ATTN_LINALG_LSTSQ, a, b, &x, labels, &sh);
  if (st != ATTN_OK) return st;
  int nb = a->ndim - 2;
  attn_dtype dt = a->dtype;
  int64_t m = a->shape[nb], n = a->shape[nb + 1], k = imin(m, n), batches = batch_count(a);
  int64_t r = b->ndim == a->ndim ? b->shape[nb + 1] : 1;
  int64_t min_rank = k;
  if (m == 0 || n == 0) { /* the minimum-norm solution of an empty system is 0 */
    if (rank) *rank = 0;
    return attn_fill(x, 0.0);
  }
  if (r == 0) { /* no right-hand side: LAPACK refuses NRHS = 0, so the rank comes from one zero column */
    if (!rank) return ATTN_OK;
    attn_tensor b1, x1;
    int64_t bshape[ATTN_MAX_DIMS], xshape[ATTN_MAX_DIMS];
    for (int d = 0; d < b->ndim; d++) bshape[d] = b->shape[d];
    for (int d = 0; d < x->ndim; d++) xshape[d] = x->shape[d];
    bshape[b->ndim - 1] = 1;
    xshape[x->ndim - 1] = 1;
    st = attn_tensor_init_zeros(&b1, dt, b->ndim, bshape);
    if (st != ATTN_OK) return st;
    st = attn_tensor_init(&x1, dt, x->ndim, xshape);
    if (st == ATTN_OK) st = attn_linalg_lstsq(a, &b1, &x1, rank);
    attn_tensor_free(&b1);
    attn_tensor_free(&x1);
    return st;
  }
  if (batches == 0) {
    if (rank) *rank = k;
    return ATTN_OK;
  }
  lapack_int lda = (lapack_int)m, ldb = (lapack_int)imax(m, n), qrank = 0, iq = 0, lwork = 1;
  double rcond = (dt == ATTN_F64 ? DBL_EPSILON : (double)FLT_EPSILON) * (double)imax(m, n);
  double qbuf[2] = {0.0, 0.0}, dbuf[2] = {0.0, 0.0};
  void *query = qbuf, *dummy = dbuf; /* typeless for the s/d dispatch */
  lapack_int info = LAPACK_CALL(dt, gelsd, (lapack_int)m, (lapack_int)n, (lapack_int)r, dummy, lda, dummy, ldb,
                                dummy, rcond, &qrank, query, -1, &iq);
  if (info != 0) return lapack_failed(name, "gelsd", info, a);
  if ((st = lwork_from(name, dt, query, &lwork)) != ATTN_OK) return st;
  size_t es = attn_dtype_size(dt);
  int64_t counts[] = {m * n, (int64_t)ldb * r, k, lwork, imax(iq, 1)};
  size_t elems[] = {es, es, es, es, sizeof(lapack_int)};
  void *p[5];
  scratch s;
  if ((st = scratch_take(name, &s, 5, counts, elems, p)) != ATTN_OK) return st;
  for (int64_t bi = 0; bi < batches && st == ATTN_OK; bi++) {
    attn_tensor av, bv, xv;
    batch_slice(a, nb, bi, &av);
    batch_slice(b, nb, bi, &bv);
    batch_slice(x, nb, bi, &xv);
    if (!pack(&av, p[0], m)) {
      st = not_finite(name, a, bi);
      break;
    }
    if (ldb > m) memset(p[1], 0, (size_t)ldb * (size_t)r * es); /* rows m..n-1 receive the solution */
    if (!pack(&bv, p[1], ldb)) {
      char w[128];
      st = attn_error(ATTN_ERR_NUMERIC, "%s: B %s has NaN or infinite entries (for %s)", name,
                      attn_tensor_shape_str(b), which(w, sizeof w, a, bi));
      break;
    }
    lapack_int rk = 0;
    info = LAPACK_CALL(dt, gelsd, (lapack_int)m, (lapack_int)n, (lapack_int)r, p[0], lda, p[1], ldb, p[2], rcond, &rk,
                       p[3], lwork, p[4]);
    if (info > 0)
      st = no_convergence(name, a, bi, info);
    else if (info < 0)
      st = lapack_failed(name, "gelsd", info, a);
    else {
      unpack(p[1], ldb, &xv, 0);
      if (rk < min_rank) min_rank = rk;
    }
  }
  scratch_release(&s);
  if (st == ATTN_OK && rank) *rank = min_rank;
  return st;
}

attn_status attn_linalg_qr(const attn_tensor *a, attn_tensor *q, attn_tensor *r) {
  const char *name = "linalg.qr";
  static const char *const labels[] = {"Q", "R"};
  attn_tensor *outs[] = {q, r};
  attn_linalg_shapes sh;
  attn_status st = check_call(ATTN_LINALG_QR, a, NULL, outs, labels, &sh);
  if (st != ATTN_OK) return st;
  int nb = a->ndim - 2;
  attn_dtype dt = a->dtype;
  int64_t m = a->shape[nb], n = a->shape[nb + 1], k = imin(m, n), batches = batch_count(a);
  if (k == 0 || batches == 0) return ATTN_OK; /* q and r are empty */
  lapack_int lda = (lapack_int)m, lw1 = 1, lw2 = 1, info;
  double qbuf[2] = {0.0, 0.0}, dbuf[2] = {0.0, 0.0};
  void *query = qbuf, *dummy = dbuf; /* typeless for the s/d dispatch */
  info = LAPACK_CALL(dt, geqrf, (lapack_int)m, (lapack_int)n, dummy, lda, dummy, query, -1);
  if (info != 0) return lapack_failed(name, "geqrf", info, a);
  if ((st = lwork_from(name, dt, query, &lw1)) != ATTN_OK) return st;
  info = LAPACK_CALL(dt, orgqr, (lapack_int)m, (lapack_int)k, (lapack_int)k, dummy, lda, dummy, query, -1);
  if (info != 0) return lapack_failed(name, "orgqr", info, a);
  if ((st = lwork_from(name, dt, query, &lw2)) != ATTN_OK) return st;
  lapack_int lwork = lw1 > lw2 ? lw1 : lw2;
  size_t es = attn_dtype_size(dt);
  int64_t counts[] = {m * n, k, lwork};
  size_t elems[] = {es, es, es};
  void *p[3];
  scratch s;
  if ((st = scratch_take(name, &s, 3, counts, elems, p)) != ATTN_OK) return st;
  for (int64_t bi = 0; bi < batches && st == ATTN_OK; bi++) {
    attn_tensor av, qv, rv;
    batch_slice(a, nb, bi, &av);
    batch_slice(q, nb, bi, &qv);
    batch_slice(r, nb, bi, &rv);
    pack(&av, p[0], m);
    info = LAPACK_CALL(dt, geqrf, (lapack_int)m, (lapack_int)n, p[0], lda, p[1], p[2], lwork);
    if (info != 0) {
      st = lapack_failed(name, "geqrf", info, a);
      break;
    }
    unpack(p[0], m, &rv, 1); /* R: upper triangle of the first k rows */
    info = LAPACK_CALL(dt, orgqr, (lapack_int)m, (lapack_int)k, (lapack_int)k, p[0], lda, p[1], p[2], lwork);
    if (info != 0) {
      st = lapack_failed(name, "orgqr", info, a);
      break;
    }
    unpack(p[0], m, &qv, 0); /* Q: the first k columns */
  }
  scratch_release(&s);
  return st;
}

attn_status attn_linalg_svd(const attn_tensor *a, attn_tensor *u, attn_tensor *sv, attn_tensor *vt) {
  const char *name = "linalg.svd";
  static const char *const labels[] = {"U", "S", "Vt"};
  attn_tensor *outs[] = {u, sv, vt};
  attn_linalg_shapes sh;
  attn_status st = check_call(ATTN_LINALG_SVD, a, NULL, outs, labels, &sh);
  if (st != ATTN_OK) return st;
  int nb = a->ndim - 2;
  attn_dtype dt = a->dtype;
  int64_t m = a->shape[nb], n = a->shape[nb + 1], k = imin(m, n), batches = batch_count(a);
  if (k == 0 || batches == 0) return ATTN_OK;
  lapack_int lda = (lapack_int)m, ldu = (lapack_int)m, ldvt = (lapack_int)k, lwork = 1, info, iq = 0;
  double qbuf[2] = {0.0, 0.0}, dbuf[2] = {0.0, 0.0};
  void *query = qbuf, *dummy = dbuf; /* typeless for the s/d dispatch */
  info = LAPACK_CALL(dt, gesdd, 'S', (lapack_int)m, (lapack_int)n, dummy, lda, dummy, dummy, ldu, dummy, ldvt, query,
                     -1, &iq);
  if (info != 0) return lapack_failed(name, "gesdd", info, a);
  if ((st = lwork_from(name, dt, query, &lwork)) != ATTN_OK) return st;
  size_t es = attn_dtype_size(dt);
  int64_t counts[] = {m * n, k, m * k, k * n, lwork, 8 * k};
  size_t elems[] = {es, es, es, es, es, sizeof(lapack_int)};
  void *p[6];
  scratch s;
  if ((st = scratch_take(name, &s, 6, counts, elems, p)) != ATTN_OK) return st;
  for (int64_t bi = 0; bi < batches && st == ATTN_OK; bi++) {
    attn_tensor av, uv, sv1, vv;
    batch_slice(a, nb, bi, &av);
    batch_slice(u, nb, bi, &uv);
    batch_slice(sv, nb, bi, &sv1);
    batch_slice(vt, nb, bi, &vv);
    if (!pack(&av, p[0], m)) {
      st = not_finite(name, a, bi);
      break;
    }
    info = LAPACK_CALL(dt, gesdd, 'S', (lapack_int)m, (lapack_int)n, p[0], lda, p[1], p[2], ldu, p[3], ldvt, p[4],
                       lwork, p[5]);
    if (info > 0)
      st = no_convergence(name, a, bi, info);
    else if (info < 0)
      st = lapack_failed(name, "gesdd", info, a);
    else {
      unpack(p[2], m, &uv, 0);
      unpack(p[1], k, &sv1, 0);
      unpack(p[3], k, &vv, 0);
    }
  }
  scratch_release(&s);
  return st;
}

attn_status attn_linalg_eigh(const attn_tensor *a, attn_tensor *w, attn_tensor *v) {
  const char *name = "linalg.eigh";
  static const char *const labels[] = {"w", "V"};
  attn_tensor *outs[] = {w, v};
  attn_linalg_shapes sh;
  attn_status st = check_call(ATTN_LINALG_EIGH, a, NULL, outs, labels, &sh);
  if (st != ATTN_OK) return st;
  int nb = a->ndim - 2;
  attn_dtype dt = a->dtype;
  int64_t n = a->shape[nb], batches = batch_count(a);
  if (n == 0 || batches == 0) return ATTN_OK;
  lapack_int ld = (lapack_int)n, lwork = 1, liwork = 0, info;
  double qbuf[2] = {0.0, 0.0}, dbuf[2] = {0.0, 0.0};
  void *query = qbuf, *dummy = dbuf; /* typeless for the s/d dispatch */
  info = LAPACK_CALL(dt, syevd, 'V', 'L', ld, dummy, ld, dummy, query, -1, &liwork, -1);
  if (info != 0) return lapack_failed(name, "syevd", info, a);
  if ((st = lwork_from(name, dt, query, &lwork)) != ATTN_OK) return st;
  if (liwork < 1) liwork = 1;
  size_t es = attn_dtype_size(dt);
  int64_t counts[] = {n * n, n, lwork, liwork};
  size_t elems[] = {es, es, es, sizeof(lapack_int)};
  void *p[4];
  scratch s;
  if ((st = scratch_take(name, &s, 4, counts, elems, p)) != ATTN_OK) return st;
  for (int64_t bi = 0; bi < batches && st == ATTN_OK; bi++) {
    attn_tensor av, wv, vv;
    batch_slice(a, nb, bi, &av);
    batch_slice(w, nb, bi, &wv);
    batch_slice(v, nb, bi, &vv);
    pack(&av, p[0], n);
    if (!lower_finite(dt, p[0], n, n)) {
      st = not_finite(name, a, bi);
      break;
    }
    info = LAPACK_CALL(dt, syevd, 'V', 'L', ld, p[0], ld, p[1], p[2], lwork, p[3], liwork);
    if (info > 0)
      st = no_convergence(name, a, bi, info);
    else if (info < 0)
      st = lapack_failed(name, "syevd", info, a);
    else {
      unpack(p[1], n, &wv, 0);
      unpack(p[0], n, &vv, 0);
    }
  }
  scratch_release(&s);
  return st;
}

attn_status attn_linalg_inv(const attn_tensor *a, attn_tensor *out) {
  const char *name = "linalg.inv";
  static const char *const labels[] = {"out"};
  attn_linalg_shapes sh;
  attn_status st = check_call(ATTN_LINALG_INV, a, NULL, &out, labels, &sh);
  if (st != ATTN_OK) return st;
  int nb = a->ndim - 2;
  attn_dtype dt = a->dtype;
  int64_t n = a->shape[nb], batches = batch_count(a);
  if (n == 0 || batches == 0) return ATTN_OK;
  lapack_int ld = (lapack_int)n, lwork = 1, info, ipiv_dummy = 0;
  double qbuf[2] = {0.0, 0.0}, dbuf[2] = {0.0, 0.0};
  void *query = qbuf, *dummy = dbuf; /* typeless for the s/d dispatch */
  info = LAPACK_CALL(dt, getri, ld, dummy, ld, &ipiv_dummy, query, -1);
  if (info != 0) return lapack_failed(name, "getri", info, a);
  if ((st = lwork_from(name, dt, query, &lwork)) != ATTN_OK) return st;
  size_t es = attn_dtype_size(dt);
  int64_t counts[] = {n * n, n, lwork};
  size_t elems[] = {es, sizeof(lapack_int), es};
  void *p[3];
  scratch s;
  if ((st = scratch_take(name, &s, 3, counts, elems, p)) != ATTN_OK) return st;
  for (int64_t bi = 0; bi < batches && st == ATTN_OK; bi++) {
    attn_tensor av, ov;
    batch_slice(a, nb, bi, &av);
    batch_slice(out, nb, bi, &ov);
    pack(&av, p[0], n);
    info = LAPACK_CALL(dt, getrf, ld, ld, p[0], ld, p[1]);
    if (info == 0) info = LAPACK_CALL(dt, getri, ld, p[0], ld, p[1], p[2], lwork);
    if (info > 0)
      st = singular(name, a, bi, info);
    else if (info < 0)
      st = lapack_failed(name, "getrf/getri", info, a);
    else
      unpack(p[0], n, &ov, 0);
  }
  scratch_release(&s);
  return st;
}

attn_status attn_linalg_det(const attn_tensor *a, attn_tensor *out) {
  const char *name = "linalg.det";
  static const char *const labels[] = {"out"};
  attn_linalg_shapes sh;
  attn_status st = check_call(ATTN_LINALG_DET, a, NULL, &out, labels, &sh);
  if (st != ATTN_OK) return st;
  int nb = a->ndim - 2;
  attn_dtype dt = a->dtype;
  int64_t n = a->shape[nb], batches = batch_count(a);
  if (batches == 0) return ATTN_OK;
  if (n == 0) return attn_fill(out, 1.0);
  lapack_int ld = (lapack_int)n;
  size_t es = attn_dtype_size(dt);
  int64_t counts[] = {n * n, n};
  size_t elems[] = {es, sizeof(lapack_int)};
  void *p[2];
  scratch s;
  if ((st = scratch_take(name, &s, 2, counts, elems, p)) != ATTN_OK) return st;
  const lapack_int *ipiv = p[1];
  for (int64_t bi = 0; bi < batches && st == ATTN_OK; bi++) {
    attn_tensor av, ov;
    batch_slice(a, nb, bi, &av);
    batch_slice(out, nb, bi, &ov);
    pack(&av, p[0], n);
    lapack_int info = LAPACK_CALL(dt, getrf, ld, ld, p[0], ld, p[1]);
    if (info < 0) {
      st = lapack_failed(name, "getrf", info, a);
      break;
    }
    double det = 0.0;
    if (info == 0) { /* mantissa in [0.5, 1) times 2^expo */
      double mant = 1.0;
      long expo = 0;
      for (int64_t i = 0; i < n; i++) {
        int e1, e2;
        mant *= frexp(buf_get(dt, p[0], i + i * n), &e1);
        mant = frexp(mant, &e2);
        expo += (long)e1 + e2;
        if (ipiv[i] != (lapack_int)(i + 1)) mant = -mant;
      }
      if (expo > INT_MAX) expo = INT_MAX;
      if (expo < INT_MIN) expo = INT_MIN;
      det = ldexp(mant, (int)expo);
    }
    set_scalar(&ov, det);
  }
  scratch_release(&s);
  return st;
}
