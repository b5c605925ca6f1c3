/* Binding: elementwise math, reductions, softmax, matmul and indexing. */
#include <string.h>

#include "bind/lbind.h"

/* Replaces the Lua number at idx with a 0-d tensor of dtype (see attn_l_push_number). */
static attn_tensor *number_to_tensor(lua_State *L, int idx, attn_dtype dtype, const char *fn) {
  attn_tensor *s = attn_l_push_number(L, idx, dtype, fn);
  lua_replace(L, idx);
  return s;
}

/* binary(a, b): tensor or number on either side; output is fresh. */
static int binary(lua_State *L, attn_binary_op op) {
  attn_tensor *a = attn_l_test(L, 1), *b = attn_l_test(L, 2);
  const char *name = attn_binary_name(op);
  /* an integer next to an int64 tensor becomes a 0-d int64 tensor: exact past 2^53 */
  if (a && !b && a->dtype == ATTN_I64 && lua_isinteger(L, 2)) b = number_to_tensor(L, 2, ATTN_I64, name);
  if (b && !a && b->dtype == ATTN_I64 && lua_isinteger(L, 1)) a = number_to_tensor(L, 1, ATTN_I64, name);
  if (a && b) {
    int nd;
    int64_t shape[ATTN_MAX_DIMS];
    ATTN_L_TRY(L, attn_broadcast_shape(name, a->ndim, a->shape, b->ndim, b->shape, &nd, shape));
    attn_tensor *out = attn_l_push_alloc(L, a->dtype, nd, shape);
    ATTN_L_TRY(L, attn_binary(op, a, b, out));
    return 1;
  }
  if (a && lua_type(L, 2) == LUA_TNUMBER) {
    attn_tensor *out = attn_l_push_like(L, a);
    ATTN_L_TRY(L, attn_binary_scalar(op, a, lua_tonumber(L, 2), 0, out));
    return 1;
  }
  if (b && lua_type(L, 1) == LUA_TNUMBER) {
    attn_tensor *out = attn_l_push_like(L, b);
    ATTN_L_TRY(L, attn_binary_scalar(op, b, lua_tonumber(L, 1), 1, out));
    return 1;
  }
  return attn_l_error(L, "%s: expected tensors or numbers, got %s and %s", name,
                    attn_l_test(L, 1) ? ATTN_TENSOR_MT : luaL_typename(L, 1),
                    attn_l_test(L, 2) ? ATTN_TENSOR_MT : luaL_typename(L, 2));
}

/* binary_(a, b): a = a op b in place; b (tensor or number) broadcasts to a. */
static int binary_inplace(lua_State *L, attn_binary_op op) {
  attn_tensor *a = attn_l_check(L, 1), *b = attn_l_test(L, 2);
  if (!b && a->dtype == ATTN_I64 && lua_isinteger(L, 2)) b = number_to_tensor(L, 2, ATTN_I64, attn_binary_name(op));
  if (b) {
    ATTN_L_TRY(L, attn_binary(op, a, b, a));
  } else {
    if (lua_type(L, 2) != LUA_TNUMBER) return attn_l_argerror(L, 2, "other", "a tensor or a number");
    ATTN_L_TRY(L, attn_binary_scalar(op, a, lua_tonumber(L, 2), 0, a));
  }
  attn_l_bump_version(a);
  lua_settop(L, 1);
  return 1;
}

#define BINARY_FN(NAME, OP)                                            \
  static int l_##NAME(lua_State *L) { return binary(L, OP); }
#define BINARY_INPLACE_FN(NAME, OP)                                    \
  static int l_##NAME##_(lua_State *L) { return binary_inplace(L, OP); }

BINARY_FN(add, ATTN_ADD)
BINARY_FN(sub, ATTN_SUB)
BINARY_FN(mul, ATTN_MUL)
BINARY_FN(div, ATTN_DIV)
BINARY_FN(pow, ATTN_POW)
BINARY_FN(maximum, ATTN_MAXIMUM)
BINARY_FN(minimum, ATTN_MINIMUM)
BINARY_FN(eq, ATTN_EQ)
BINARY_FN(ne, ATTN_NE)
BINARY_FN(lt, ATTN_LT)
BINARY_FN(le, ATTN_LE)
BINARY_FN(gt, ATTN_GT)
BINARY_FN(ge, ATTN_GE)
BINARY_FN(tanh_backward, ATTN_TANH_GRAD)
BINARY_FN(sigmoid_backward, ATTN_SIGMOID_GRAD)
BINARY_FN(gelu_backward, ATTN_GELU_GRAD)
BINARY_INPLACE_FN(add, ATTN_ADD)
BINARY_INPLACE_FN(sub, ATTN_SUB)
BINARY_INPLACE_FN(mul, ATTN_MUL)
BINARY_INPLACE_FN(div, ATTN_DIV)

static int unary(lua_State *L, attn_unary_op op) {
  attn_tensor *x = attn_l_check(L, 1);
  attn_tensor *out = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_unary(op, x, out));
  return 1;
}

#define UNARY_FN(NAME, OP)                                             \
  static int l_##NAME(lua_State *L) { return unary(L, OP); }
UNARY_FN(neg, ATTN_NEG)
UNARY_FN(exp, ATTN_EXP)
UNARY_FN(log, ATTN_LOG)
UNARY_FN(sqrt, ATTN_SQRT)
UNARY_FN(tanh, ATTN_TANH)
UNARY_FN(sigmoid, ATTN_SIGMOID)
UNARY_FN(relu, ATTN_RELU)
UNARY_FN(abs, ATTN_ABS)
UNARY_FN(sign, ATTN_SIGN)
UNARY_FN(square, ATTN_SQUARE)
UNARY_FN(reciprocal, ATTN_RECIPROCAL)
UNARY_FN(sin, ATTN_SIN)
UNARY_FN(cos, ATTN_COS)
UNARY_FN(erf, ATTN_ERF)
UNARY_FN(gelu, ATTN_GELU)

/* where(cond, a, b): a and b tensors or numbers (at least one tensor among all three). */
static int l_where(lua_State *L) {
  attn_tensor *c = attn_l_check(L, 1);
  attn_tensor *a = attn_l_test(L, 2), *b = attn_l_test(L, 3);
  attn_dtype dt = a ? a->dtype : (b ? b->dtype : c->dtype);
  /* numbers become 0-d tensors of the common dtype */
  for (int i = 2; i <= 3; i++)
    if (!attn_l_test(L, i)) {
      if (lua_type(L, i) != LUA_TNUMBER) attn_l_argerror(L, i, NULL, "a tensor or a number");
      number_to_tensor(L, i, dt, "where");
    }
  a = attn_l_check(L, 2);
  b = attn_l_check(L, 3);
  int nd, nd2;
  int64_t shape[ATTN_MAX_DIMS], shape2[ATTN_MAX_DIMS];
  ATTN_L_TRY(L, attn_broadcast_shape("where", a->ndim, a->shape, b->ndim, b->shape, &nd, shape));
  ATTN_L_TRY(L, attn_broadcast_shape("where", c->ndim, c->shape, nd, shape, &nd2, shape2));
  attn_tensor *out = attn_l_push_alloc(L, dt, nd2, shape2);
  ATTN_L_TRY(L, attn_where(c, a, b, out));
  return 1;
}

/* masked_fill(x, mask, value): where mask != 0, value */
static int l_masked_fill(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1), *m = attn_l_check(L, 2);
  double v = attn_l_checknumber(L, 3, "value");
  attn_tensor *out = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_masked_fill(x, m, v, out));
  return 1;
}

/* reduce(x [, dim [, keepdim]]): over all elements when dim is nil (0-d result). */
static int reduce(lua_State *L, attn_reduce_op op, const char *name, int want_indices, int only_indices) {
  attn_tensor *x = attn_l_check(L, 1);
  attn_tensor flat;
  int dim;
  int keepdim = lua_toboolean(L, 3);
  if (lua_isnoneornil(L, 2)) {
    if (x->ndim == 0) { /* a 0-d tensor reduces to itself */
      attn_l_push_view(L, x);
      lua_replace(L, 1);
      x = attn_l_check(L, 1);
      int64_t one = 1;
      attn_view_reshape(name, x, 1, &one);
    } else if (!attn_tensor_is_contiguous(x)) {
      attn_tensor *c = attn_l_push_like(L, x);
      ATTN_L_TRY(L, attn_copy(c, x));
      lua_replace(L, 1);
      x = attn_l_check(L, 1);
    }
    flat = *x;
    int64_t n = attn_tensor_numel(x);
    ATTN_L_TRY(L, attn_view_reshape(name, &flat, 1, &n));
    dim = 0;
    keepdim = 0;
  } else {
    dim = attn_l_checkdim(L, 2, x->ndim, 0, name);
    flat = *x;
  }
  int64_t shape[ATTN_MAX_DIMS];
  memcpy(shape, flat.shape, sizeof shape);
  shape[dim] = 1;
  attn_tensor *out = attn_l_push_alloc(L, flat.dtype, flat.ndim, shape);
  attn_tensor *idx = want_indices ? attn_l_push_alloc(L, ATTN_I64, flat.ndim, shape) : NULL;
  ATTN_L_TRY(L, attn_reduce(op, &flat, dim, out, idx));
  int nret = want_indices ? 2 : 1;
  if (idx) ATTN_L_TRY(L, attn_binary_scalar(ATTN_ADD, idx, 1.0, 0, idx)); /* 1-based positions */
  if (!keepdim) {
    for (int k = 0; k < nret; k++) {
      attn_tensor *t = attn_l_check(L, -nret + k);
      attn_view_select(t, dim, 0);
    }
  }
  if (only_indices) return 1; /* the indices are on top */
  return nret;
}

static int l_sum(lua_State *L) { return reduce(L, ATTN_SUM, "sum", 0, 0); }
static int l_mean(lua_State *L) { return reduce(L, ATTN_MEAN, "mean", 0, 0); }
static int l_prod(lua_State *L) { return reduce(L, ATTN_PROD, "prod", 0, 0); }
/* max/min over a dim return values and 1-based indices; over everything, the value. */
static int l_max(lua_State *L) { return reduce(L, ATTN_MAX, "max", !lua_isnoneornil(L, 2), 0); }
static int l_min(lua_State *L) { return reduce(L, ATTN_MIN, "min", !lua_isnoneornil(L, 2), 0); }
static int l_argmax(lua_State *L) { return reduce(L, ATTN_MAX, "argmax", 1, 1); }
static int l_argmin(lua_State *L) { return reduce(L, ATTN_MIN, "argmin", 1, 1); }

static int softmax(lua_State *L, int log) {
  attn_tensor *x = attn_l_check(L, 1);
  int dim = attn_l_checkdim(L, 2, x->ndim, 0, log ? "log_softmax" : "softmax");
  attn_tensor *out = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_softmax(x, dim, log, out));
  return 1;
}
static int l_softmax(lua_State *L) { return softmax(L, 0); }
static int l_log_softmax(lua_State *L) { return softmax(L, 1); }

/* matmul(a, b): NumPy semantics; the core decides the 1-D promotion. */
static int l_matmul(lua_State *L) {
  attn_tensor *a = attn_l_check(L, 1), *b = attn_l_check(L, 2);
  int nd;
  int64_t shape[ATTN_MAX_DIMS];
  ATTN_L_TRY(L, attn_matmul_shape(a, b, &nd, shape));
  attn_tensor *out = attn_l_push_alloc(L, a->dtype, nd, shape);
  ATTN_L_TRY(L, attn_matmul(a, b, out));
  return 1;
}

/* addmm(bias, a, b): bias (N) + a (M, K) @ b (K, N) in one pass (a Linear's forward). */
static int l_addmm(lua_State *L) {
  attn_tensor *bias = attn_l_check(L, 1), *a = attn_l_check(L, 2), *b = attn_l_check(L, 3);
  int64_t shape[2] = {a->ndim == 2 ? a->shape[0] : 0, b->ndim == 2 ? b->shape[1] : 0};
  attn_tensor *out = attn_l_push_alloc(L, a->dtype, 2, shape);
  ATTN_L_TRY(L, attn_addmm(bias, a, b, out));
  return 1;
}

/* bmm(a, b): strictly 3-D batches of equal size. */
static int l_bmm(lua_State *L) {
  attn_tensor *a = attn_l_check(L, 1), *b = attn_l_check(L, 2);
  if (a->ndim != 3 || b->ndim != 3 || a->shape[0] != b->shape[0])
    return attn_l_error(L, "bmm: expected (B, n, m) @ (B, m, p), got %s @ %s", attn_tensor_shape_str(a),
                      attn_tensor_shape_str(b));
  return l_matmul(L);
}

/* gemm_(c, a, b [, alpha [, beta [, path [, reps]]]]): c = alpha a b + beta c in place on 2-D float
 * views, by the path "auto" (default: as matmul chooses), "small" (the engine's kernel, float32)
 * or "blas" (OpenBLAS): the specs and benchmarks compare the two with it. reps (default 1) runs
 * it that many times in one call, so that bench/gemm_bench.lua can time products that take less
 * than the binding itself (at most 2^30 multiply-adds in all). Returns c. */
static int l_gemm_(lua_State *L) {
  attn_tensor *c = attn_l_check(L, 1), *a = attn_l_check(L, 2), *b = attn_l_check(L, 3);
  double alpha = attn_l_optnumber(L, 4, "alpha", 1), beta = attn_l_optnumber(L, 5, "beta", 0);
  const char *name = lua_isnoneornil(L, 6) ? "auto" : attn_l_checklstring(L, 6, "path", NULL);
  attn_gemm_path path = strcmp(name, "small") == 0 ? ATTN_GEMM_SMALL
                        : strcmp(name, "blas") == 0 ? ATTN_GEMM_BLAS
                                                    : ATTN_GEMM_AUTO;
  if (path == ATTN_GEMM_AUTO && strcmp(name, "auto") != 0)
    return attn_l_argerror(L, 6, "path", "'auto', 'small' or 'blas'");
  lua_Integer reps = attn_l_optinteger(L, 7, "reps", 1);
  /* bounded work, so that a hostile count cannot keep the call running for hours */
  double work = a->ndim == 2 && c->ndim == 2 ? (double)c->shape[0] * (double)c->shape[1] * (double)a->shape[1] : 1;
  if (reps < 1 || (double)reps * (work > 1 ? work : 1) > 0x1p30)
    return attn_l_argerror(L, 7, "reps", "a positive integer with reps M N K at most 2^30");
  for (lua_Integer r = 0; r < reps; r++) ATTN_L_TRY(L, attn_gemm_views(path, alpha, a, b, beta, c));
  attn_l_bump_version(c);
  lua_settop(L, 1);
  return 1;
}

/* index_select(x, dim, indices) with 1-based indices (table or 1-D tensor) */
static int l_index_select(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  int dim = attn_l_checkdim(L, 2, x->ndim, 0, "index_select");
  int64_t *idx;
  /* the output is sized before the indices are read: a huge expanded index fails at once */
  attn_tensor *it = attn_l_test(L, 3);
  int64_t shape[ATTN_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[dim] = it ? attn_tensor_numel(it) : (lua_istable(L, 3) ? (int64_t)lua_rawlen(L, 3) : 0);
  /* (an index list too long to convert at all keeps attn_l_checkindices' own message) */
  if ((uint64_t)shape[dim] <= attn_alloc_max_request() / sizeof(int64_t))
    ATTN_L_TRY(L, attn_tensor_check_size("index_select", "output", x->dtype, x->ndim, shape));
  int64_t n = attn_l_checkindices(L, 3, &idx, "index_select");
  shape[dim] = n;
  attn_tensor *out = attn_l_push_alloc(L, x->dtype, x->ndim, shape);
  ATTN_L_TRY(L, attn_index_select(x, dim, idx, n, out));
  return 1;
}

/* index_add_(out, dim, indices, src): in place */
static int l_index_add_(lua_State *L) {
  attn_tensor *out = attn_l_check(L, 1);
  int dim = attn_l_checkdim(L, 2, out->ndim, 0, "index_add_");
  int64_t *idx;
  int64_t n = attn_l_checkindices(L, 3, &idx, "index_add_");
  attn_tensor *src = attn_l_check(L, 4);
  ATTN_L_TRY(L, attn_index_add(out, dim, idx, n, src));
  attn_l_bump_version(out);
  lua_settop(L, 1);
  return 1;
}

/* The core takes 0-based int64 index values: a 1-based index tensor of any
 * dtype is validated (integers >= 1) and shifted once here. */
static attn_tensor *zero_based(lua_State *L, int arg, const char *fn) {
  attn_tensor *idx = attn_l_test(L, arg);
  if (!idx) {
    attn_l_argerror(L, arg, "index", "a tensor of 1-based indices");
    return NULL; /* not reached: the error is raised */
  }
  attn_tensor *z = attn_l_push_alloc(L, ATTN_I64, idx->ndim, idx->shape);
  if (attn_index_convert(fn, "index", NULL, idx, 1, -1, z) != ATTN_OK) attn_l_raise(L);
  return z;
}

static int l_gather(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  int dim = attn_l_checkdim(L, 2, x->ndim, 0, "gather");
  attn_tensor *idx = zero_based(L, 3, "gather");
  attn_tensor *out = attn_l_push_alloc(L, x->dtype, idx->ndim, idx->shape);
  ATTN_L_TRY(L, attn_gather(x, dim, idx, out));
  return 1;
}

/* scatter_add_(out, dim, index, src): in place */
static int l_scatter_add_(lua_State *L) {
  attn_tensor *out = attn_l_check(L, 1);
  int dim = attn_l_checkdim(L, 2, out->ndim, 0, "scatter_add_");
  attn_tensor *src = attn_l_check(L, 4);
  attn_tensor *idx = zero_based(L, 3, "scatter_add_");
  ATTN_L_TRY(L, attn_scatter_add(out, dim, idx, src));
  attn_l_bump_version(out);
  lua_settop(L, 1);
  return 1;
}

/* sort(x, dim, descending): values and 1-based int64 indices, stable. */
static int l_sort(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  if (x->ndim == 0) return attn_l_error(L, "sort: needs at least 1 dim, got a 0-d tensor");
  int dim = attn_l_checkdim(L, 2, x->ndim, 0, "sort");
  int descending = lua_toboolean(L, 3);
  attn_tensor *values = attn_l_push_like(L, x);
  attn_tensor *indices = attn_l_push_alloc(L, ATTN_I64, x->ndim, x->shape);
  ATTN_L_TRY(L, attn_sort(x, dim, descending, values, indices));
  ATTN_L_TRY(L, attn_binary_scalar(ATTN_ADD, indices, 1.0, 0, indices));
  return 2;
}

/* topk(x, dim, k, largest): sort's first k values and 1-based int64 indices along dim, k at most
 * TOPK_MAX (the Lua side sorts for more). */
static int l_topk(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  if (x->ndim == 0) return attn_l_error(L, "topk: needs at least 1 dim, got a 0-d tensor");
  int dim = attn_l_checkdim(L, 2, x->ndim, 0, "topk");
  lua_Integer k = attn_l_checkinteger(L, 3, "k");
  if (k < 0 || k > x->shape[dim] || k > ATTN_TOPK_MAX)
    return attn_l_error(L, "topk: k = %lld must be in 0..%lld and at most %d", (long long)k,
                        (long long)x->shape[dim], ATTN_TOPK_MAX);
  int largest = lua_toboolean(L, 4);
  int64_t shape[ATTN_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) shape[d] = d == dim ? (int64_t)k : x->shape[d];
  attn_tensor *values = attn_l_push_alloc(L, x->dtype, x->ndim, shape);
  attn_tensor *indices = attn_l_push_alloc(L, ATTN_I64, x->ndim, shape);
  ATTN_L_TRY(L, attn_topk(x, dim, (int64_t)k, largest, values, indices));
  ATTN_L_TRY(L, attn_binary_scalar(ATTN_ADD, indices, 1.0, 0, indices));
  return 2;
}

/* check_ids(ids, limit, op, what [, ctx]): raises unless every value of the
 * tensor ids (any dtype) is an integer in 1..limit; errors name op and what. */
static int l_check_ids(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  lua_Integer limit = attn_l_checkinteger(L, 2, "limit");
  const char *op = attn_l_checklstring(L, 3, "op", NULL), *what = attn_l_checklstring(L, 4, "what", NULL);
  const char *ctx = lua_isnoneornil(L, 5) ? NULL : attn_l_checklstring(L, 5, "context", NULL);
  ATTN_L_TRY(L, attn_index_convert(op, what, ctx, t, 1, (int64_t)limit, NULL));
  lua_settop(L, 1);
  return 1;
}

/* check_size(fn, what, shape, dtype): raises (naming fn, what and the bytes) when a tensor of
 * that shape and dtype is larger than the allocator may hand out; for callers that walk their
 * inputs before making their output (attn_tensor_check_size). Returns nothing. */
static int l_check_size(lua_State *L) {
  const char *fn = attn_l_checklstring(L, 1, "fn", NULL), *what = attn_l_checklstring(L, 2, "what", NULL);
  int64_t shape[ATTN_MAX_DIMS];
  attn_l_checktable(L, 3, "shape");
  lua_settop(L, 4);
  int nd = attn_l_checkshape(L, 3, shape, fn);
  attn_dtype dt = attn_l_optdtype(L, 4, ATTN_F32);
  ATTN_L_TRY(L, attn_tensor_check_size(fn, what, dt, nd, shape));
  return 0;
}

/* cumsum(x, dim [, reverse]), cumprod(x, dim): fresh tensors of x's shape (attn_cumulative). */
static int scan(lua_State *L, attn_scan_op op, const char *fn) {
  attn_tensor *x = attn_l_check(L, 1);
  int dim = attn_l_checkdim(L, 2, x->ndim, 0, fn);
  if (op == ATTN_CUMSUM && lua_toboolean(L, 3)) op = ATTN_CUMSUM_REVERSE;
  attn_tensor *out = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_cumulative(op, x, dim, out));
  return 1;
}
static int l_cumsum(lua_State *L) { return scan(L, ATTN_CUMSUM, "cumsum"); }
static int l_cumprod(lua_State *L) { return scan(L, ATTN_CUMPROD, "cumprod"); }

/* cumprod_backward(x, y, g, dim): the gradient of y = cumprod(x, dim), zeros in x included. */
static int l_cumprod_backward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1), *y = attn_l_check(L, 2), *g = attn_l_check(L, 3);
  int dim = attn_l_checkdim(L, 4, x->ndim, 0, "cumprod_backward");
  attn_tensor *out = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_cumprod_backward(x, y, g, dim, out));
  return 1;
}

/* tril(x [, k]), triu(x [, k]): the lower / upper triangle of the last two dims (attn_triangle). */
static int triangle(lua_State *L, int upper) {
  attn_tensor *x = attn_l_check(L, 1);
  lua_Integer k = attn_l_optinteger(L, 2, "diagonal", 0);
  attn_tensor *out = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_triangle(x, (int64_t)k, upper, out));
  return 1;
}
static int l_tril(lua_State *L) { return triangle(L, 0); }
static int l_triu(lua_State *L) { return triangle(L, 1); }

/* dropout(x, p [, seed]) -> out, seed: the engine's dropout (attn_dropout.h).
 * Without a seed one is drawn from the generator; backward passes it again
 * to rebuild the same mask. */
static int l_dropout(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  double p = attn_l_checknumber(L, 2, "p");
  uint64_t seed = lua_isnoneornil(L, 3) ? attn_rng_next(attn_l_rng(L)) : (uint64_t)attn_l_checkinteger(L, 3, "seed");
  attn_tensor *out = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_dropout("dropout", x, p, seed, out));
  lua_pushinteger(L, (lua_Integer)seed);
  return 2;
}

static const luaL_Reg math_functions[] = {
    {"tanh_backward", l_tanh_backward}, {"sigmoid_backward", l_sigmoid_backward},
    {"gelu_backward", l_gelu_backward}, {"erf", l_erf}, {"gelu", l_gelu},
    {"check_ids", l_check_ids}, {"sort", l_sort}, {"topk", l_topk},
    {"add", l_add},         {"sub", l_sub},         {"mul", l_mul},
    {"div", l_div},         {"pow", l_pow},         {"maximum", l_maximum},
    {"minimum", l_minimum}, {"eq", l_eq},           {"ne", l_ne},
    {"lt", l_lt},           {"le", l_le},           {"gt", l_gt},
    {"ge", l_ge},           {"add_", l_add_},       {"sub_", l_sub_},
    {"mul_", l_mul_},       {"div_", l_div_},       {"neg", l_neg},
    {"exp", l_exp},         {"log", l_log},         {"sqrt", l_sqrt},
    {"tanh", l_tanh},       {"sigmoid", l_sigmoid}, {"relu", l_relu},
    {"abs", l_abs},         {"sign", l_sign},       {"square", l_square},
    {"reciprocal", l_reciprocal}, {"sin", l_sin},   {"cos", l_cos},
    {"where", l_where},     {"masked_fill", l_masked_fill},
    {"sum", l_sum},         {"mean", l_mean},       {"prod", l_prod},
    {"max", l_max},         {"min", l_min},         {"argmax", l_argmax},
    {"argmin", l_argmin},   {"softmax", l_softmax}, {"log_softmax", l_log_softmax},
    {"matmul", l_matmul},   {"bmm", l_bmm},         {"gemm_", l_gemm_},
    {"addmm", l_addmm},
    {"index_select", l_index_select},
    {"index_add_", l_index_add_}, {"gather", l_gather}, {"scatter_add_", l_scatter_add_},
    {"dropout", l_dropout},
    {"check_size", l_check_size}, {"cumsum", l_cumsum}, {"cumprod", l_cumprod},
    {"cumprod_backward", l_cumprod_backward}, {"tril", l_tril}, {"triu", l_triu},
    {NULL, NULL},
};

void attn_l_open_math(lua_State *L) {
  attn_l_setfuncs(L, math_functions);
  lua_pushinteger(L, ATTN_TOPK_MAX);
  lua_setfield(L, -2, "TOPK_MAX");
}
