/* Binding: tensor creation, inspection, views and copies. */
#include <math.h>
#include <string.h>

#include "bind/lbind.h"

/* ---- creation from nested tables ---- */

static void infer_shape(lua_State *L, int idx, int depth, int *ndim, int64_t *shape) {
  if (lua_type(L, idx) != LUA_TTABLE) {
    *ndim = depth;
    return;
  }
  if (depth >= ATTN_MAX_DIMS) attn_l_error(L, "tensor: nesting deeper than %d dims", ATTN_MAX_DIMS);
  shape[depth] = (int64_t)lua_rawlen(L, idx);
  if (shape[depth] == 0) {
    *ndim = depth + 1;
    return;
  }
  lua_rawgeti(L, idx, 1);
  infer_shape(L, lua_gettop(L), depth + 1, ndim, shape);
  lua_pop(L, 1);
}

static void format_path(char *buf, size_t cap, const int64_t *path, int depth) {
  size_t len = 0;
  buf[0] = 0;
  for (int d = 0; d < depth && len < cap - 24; d++)
    len += (size_t)snprintf(buf + len, cap - len, "[%lld]", (long long)path[d] + 1);
}

static void fill_from_table(lua_State *L, int idx, int depth, int ndim, const int64_t *shape, int64_t *path,
                            attn_tensor *t, int64_t *flat) {
  char where[200];
  if (depth == ndim) {
    if (lua_type(L, idx) != LUA_TNUMBER) {
      format_path(where, sizeof where, path, depth);
      attn_l_error(L, "tensor: element at %s is a %s, not a number (shape %s)", where, luaL_typename(L, idx),
                 attn_shape_str(ndim, shape));
    }
    if (t->dtype == ATTN_I64) { /* exact for Lua integers; floats must hold an integer */
      int isint;
      lua_Integer k = lua_tointegerx(L, idx, &isint);
      if (!isint) {
        format_path(where, sizeof where, path, depth);
        lua_Number v = lua_tonumber(L, idx);
        if (v == floor(v) && isfinite(v))
          attn_l_error(L, "tensor: element at %s is %s, outside the int64 range", where, lua_tostring(L, idx));
        attn_l_error(L, "tensor: element at %s is %s, not an integer (dtype int64)", where, lua_tostring(L, idx));
      }
      ((int64_t *)t->storage->data)[(*flat)++] = (int64_t)k;
      return;
    }
    double v = lua_tonumber(L, idx);
    if (t->dtype == ATTN_F64)
      ((double *)t->storage->data)[(*flat)++] = v;
    else
      ((float *)t->storage->data)[(*flat)++] = (float)v;
    return;
  }
  if (lua_type(L, idx) != LUA_TTABLE || (int64_t)lua_rawlen(L, idx) != shape[depth]) {
    format_path(where, sizeof where, path, depth);
    attn_l_error(L, "tensor: table is not rectangular: entry %s has %s where a table of %I was expected (shape %s)",
               depth ? where : "(top)",
               lua_type(L, idx) == LUA_TTABLE ? lua_pushfstring(L, "%I entries", (lua_Integer)lua_rawlen(L, idx))
                                              : luaL_typename(L, idx),
               (lua_Integer)shape[depth], attn_shape_str(ndim, shape));
  }
  for (int64_t i = 0; i < shape[depth]; i++) {
    path[depth] = i;
    lua_rawgeti(L, idx, (lua_Integer)i + 1);
    fill_from_table(L, lua_gettop(L), depth + 1, ndim, shape, path, t, flat);
    lua_pop(L, 1);
  }
}

attn_tensor *attn_l_push_table(lua_State *L, int idx, attn_dtype dt) {
  int ndim = 0;
  int64_t shape[ATTN_MAX_DIMS], path[ATTN_MAX_DIMS], flat = 0;
  idx = lua_absindex(L, idx);
  infer_shape(L, idx, 0, &ndim, shape);
  attn_tensor *t = attn_l_push_alloc(L, dt, ndim, shape);
  fill_from_table(L, idx, 0, ndim, shape, path, t, &flat);
  return t;
}

/* tensor(data [, dtype]) */
static int l_tensor(lua_State *L) {
  attn_dtype dt = attn_l_optdtype(L, 2, ATTN_F32);
  attn_tensor *src = attn_l_test(L, 1);
  if (src) { /* a copy of an existing tensor */
    attn_tensor *t = attn_l_push_alloc(L, lua_isnoneornil(L, 2) ? src->dtype : dt, src->ndim, src->shape);
    ATTN_L_TRY(L, attn_copy(t, src));
    return 1;
  }
  if (lua_type(L, 1) != LUA_TNUMBER && lua_type(L, 1) != LUA_TTABLE)
    return attn_l_error(L, "tensor: expected a number or a nested table of numbers, got a %s", luaL_typename(L, 1));
  attn_l_push_table(L, 1, dt);
  return 1;
}

static int shape_and_dtype(lua_State *L, int64_t *shape, attn_dtype *dt, const char *fn) {
  attn_l_checktable(L, 1, "shape");
  int ndim = attn_l_checkshape(L, 1, shape, fn);
  attn_l_check_sizes(L, ndim, shape, fn);
  *dt = attn_l_optdtype(L, 2, ATTN_F32);
  return ndim;
}

static int l_empty(lua_State *L) {
  int64_t shape[ATTN_MAX_DIMS];
  attn_dtype dt;
  int nd = shape_and_dtype(L, shape, &dt, "empty");
  attn_l_push_alloc(L, dt, nd, shape);
  return 1;
}

/* full(shape, value [, dtype]) */
static int l_full(lua_State *L) {
  int64_t shape[ATTN_MAX_DIMS];
  attn_l_checktable(L, 1, "shape");
  int nd = attn_l_checkshape(L, 1, shape, "full");
  attn_l_check_sizes(L, nd, shape, "full");
  attn_l_checknumber(L, 2, "value");
  attn_tensor *t = attn_l_push_alloc(L, attn_l_optdtype(L, 3, ATTN_F32), nd, shape);
  if (t->dtype != ATTN_I64) { /* a float value fills directly (zeros: one memset) */
    ATTN_L_TRY(L, attn_fill(t, lua_tonumber(L, 2)));
    return 1;
  }
  attn_tensor *v = attn_l_push_number(L, 2, t->dtype, "full"); /* int64: exact past 2^53 */
  ATTN_L_TRY(L, attn_copy(t, v));
  lua_pop(L, 1);
  return 1;
}

static int checked_count(lua_State *L, double n, const char *fn) {
  if (!(n >= 0) || n > 9.0e15) return attn_l_error(L, "%s: would produce %f elements", fn, n);
  return 0;
}

/* arange(start, stop, step [, dtype]): values start, start+step, ... < stop */
static int l_arange(lua_State *L) {
  double start = attn_l_checknumber(L, 1, "start"), stop = attn_l_checknumber(L, 2, "stop"),
         step = attn_l_checknumber(L, 3, "step");
  if (step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step))
    return attn_l_error(L, "arange: need finite start, stop and a nonzero step, got %f, %f, %f", start, stop, step);
  double count = ceil((stop - start) / step);
  if (count < 0) count = 0;
  checked_count(L, count, "arange");
  int64_t n = (int64_t)count;
  attn_tensor *t = attn_l_push_alloc(L, attn_l_optdtype(L, 4, ATTN_F32), 1, &n);
  ATTN_L_TRY(L, attn_arange(t, start, step));
  return 1;
}

static int l_linspace(lua_State *L) {
  double start = attn_l_checknumber(L, 1, "start"), stop = attn_l_checknumber(L, 2, "stop");
  lua_Integer n = attn_l_checkinteger(L, 3, "steps");
  if (n < 0) return attn_l_error(L, "linspace: negative count %I", n);
  int64_t len = n;
  attn_tensor *t = attn_l_push_alloc(L, attn_l_optdtype(L, 4, ATTN_F32), 1, &len);
  ATTN_L_TRY(L, attn_linspace(t, start, stop));
  return 1;
}

/* eye(n [, m [, dtype]]) */
static int l_eye(lua_State *L) {
  lua_Integer n = attn_l_checkinteger(L, 1, "n"), m = attn_l_optinteger(L, 2, "m", n);
  if (n < 0 || m < 0) return attn_l_error(L, "eye: negative size %I x %I", n, m);
  int64_t shape[2] = {n, m};
  attn_tensor *t = attn_l_push_alloc(L, attn_l_optdtype(L, 3, ATTN_F32), 2, shape);
  ATTN_L_TRY(L, attn_eye(t));
  return 1;
}

/* rand(shape [, dtype]), randn(shape [, dtype]): U[0, 1) and N(0, 1) fills. */
static int random_tensor(lua_State *L, int normal) {
  int64_t shape[ATTN_MAX_DIMS];
  attn_dtype dt;
  int nd = shape_and_dtype(L, shape, &dt, normal ? "randn" : "rand");
  attn_tensor *t = attn_l_push_alloc(L, dt, nd, shape);
  ATTN_L_TRY(L, normal ? attn_rng_normal(attn_l_rng(L), t, 0, 1) : attn_rng_uniform(attn_l_rng(L), t, 0, 1));
  return 1;
}
static int l_rand(lua_State *L) { return random_tensor(L, 0); }
static int l_randn(lua_State *L) { return random_tensor(L, 1); }

/* bernoulli(shape, p [, dtype]) */
static int l_bernoulli(lua_State *L) {
  int64_t shape[ATTN_MAX_DIMS];
  attn_l_checktable(L, 1, "shape");
  int nd = attn_l_checkshape(L, 1, shape, "bernoulli");
  attn_l_check_sizes(L, nd, shape, "bernoulli");
  double p = attn_l_checknumber(L, 2, "p");
  attn_tensor *t = attn_l_push_alloc(L, attn_l_optdtype(L, 3, ATTN_F32), nd, shape);
  ATTN_L_TRY(L, attn_rng_bernoulli(attn_l_rng(L), t, p));
  return 1;
}

/* randint(shape, low, high [, dtype]): integers in [low, high), int64 by default. */
static int l_randint(lua_State *L) {
  int64_t shape[ATTN_MAX_DIMS];
  attn_l_checktable(L, 1, "shape");
  int nd = attn_l_checkshape(L, 1, shape, "randint");
  attn_l_check_sizes(L, nd, shape, "randint");
  lua_Integer low = attn_l_checkinteger(L, 2, "low"), high = attn_l_checkinteger(L, 3, "high");
  attn_tensor *t = attn_l_push_alloc(L, attn_l_optdtype(L, 4, ATTN_I64), nd, shape);
  ATTN_L_TRY(L, attn_rng_randint(attn_l_rng(L), t, (int64_t)low, (int64_t)high));
  return 1;
}

/* multinomial(probs, n [, replacement]): probs (C) or (R, C) -> 1-based int64
 * category ids (n) or (R, n). */
static int l_multinomial(lua_State *L) {
  attn_tensor p = *attn_l_check(L, 1);
  lua_Integer n = attn_l_checkinteger(L, 2, "num_samples");
  int replacement = lua_toboolean(L, 3);
  int vec = p.ndim == 1;
  if (p.ndim != 1 && p.ndim != 2)
    return attn_l_error(L, "multinomial: probabilities must be 1-D (C) or 2-D (rows, C), got %s",
                        attn_tensor_shape_str(&p));
  if (n < 0) return attn_l_error(L, "multinomial: num_samples %I must be >= 0", n);
  if (vec) attn_view_unsqueeze(&p, 0);
  int64_t shape[2] = {p.shape[0], n};
  attn_tensor *out = attn_l_push_alloc(L, ATTN_I64, 2, shape);
  ATTN_L_TRY(L, attn_rng_multinomial(attn_l_rng(L), &p, n, replacement, out));
  ATTN_L_TRY(L, attn_binary_scalar(ATTN_ADD, out, 1.0, 0, out));
  if (vec) attn_view_select(out, 0, 0);
  return 1;
}

/* uniform_(t, low, high), normal_(t, mean, std): in-place fills */
static int l_uniform_(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  ATTN_L_TRY(L, attn_rng_uniform(attn_l_rng(L), t, attn_l_optnumber(L, 2, "low", 0), attn_l_optnumber(L, 3, "high", 1)));
  attn_l_bump_version(t);
  lua_settop(L, 1);
  return 1;
}

static int l_normal_(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  ATTN_L_TRY(L, attn_rng_normal(attn_l_rng(L), t, attn_l_optnumber(L, 2, "mean", 0), attn_l_optnumber(L, 3, "std", 1)));
  attn_l_bump_version(t);
  lua_settop(L, 1);
  return 1;
}

/* ---- inspection ---- */

static int l_shape(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  lua_createtable(L, t->ndim, 0);
  for (int d = 0; d < t->ndim; d++) {
    lua_pushinteger(L, t->shape[d]);
    lua_rawseti(L, -2, d + 1);
  }
  return 1;
}

/* shape_str(t or {sizes}): "[2x3]", the format every error message uses.
 * A table may be any list of integers (a shape read from a file may be
 * negative or have too many dims: it is formatted, not checked); past what
 * the message buffer holds, attn_shape_str ends it with "...". */
static int l_shape_str(lua_State *L) {
  attn_tensor *t = attn_l_test(L, 1);
  if (t) {
    lua_pushstring(L, attn_tensor_shape_str(t));
    return 1;
  }
  attn_l_checktable(L, 1, "shape");
  enum { SHOWN = 96 }; /* more entries than the buffer's 160 characters hold */
  int64_t shape[SHOWN];
  lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
  int shown = n < SHOWN ? (int)n : SHOWN;
  for (int i = 0; i < shown; i++) {
    lua_rawgeti(L, 1, i + 1);
    shape[i] = attn_l_checksize(L, -1, i + 1, "shape_str");
    lua_pop(L, 1);
  }
  lua_pushstring(L, attn_shape_str(shown, shape));
  return 1;
}

static int l_stride(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  lua_createtable(L, t->ndim, 0);
  for (int d = 0; d < t->ndim; d++) {
    lua_pushinteger(L, t->stride[d]);
    lua_rawseti(L, -2, d + 1);
  }
  return 1;
}

static int l_size(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  if (lua_isnoneornil(L, 2)) return l_shape(L);
  lua_pushinteger(L, t->shape[attn_l_checkdim(L, 2, t->ndim, 0, "size")]);
  return 1;
}

static int l_dim(lua_State *L) {
  lua_pushinteger(L, attn_l_check(L, 1)->ndim);
  return 1;
}

static int l_numel(lua_State *L) {
  lua_pushinteger(L, attn_tensor_numel(attn_l_check(L, 1)));
  return 1;
}

static int l_dtype(lua_State *L) {
  lua_pushstring(L, attn_dtype_name(attn_l_check(L, 1)->dtype));
  return 1;
}

static int l_is_contiguous(lua_State *L) {
  lua_pushboolean(L, attn_tensor_is_contiguous(attn_l_check(L, 1)));
  return 1;
}

/* Identity of the underlying storage (views share it) and the view's offset. */
static int l_storage_id(lua_State *L) {
  lua_pushlightuserdata(L, attn_l_check(L, 1)->storage);
  return 1;
}

/* The storage's write version (see attn_storage.version). */
static int l_version(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)attn_l_check(L, 1)->storage->version);
  return 1;
}

/* The serial of the last storage made (attn_storage_serial). */
static int l_storage_serial(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)attn_storage_serial());
  return 1;
}

/* Whether t alone holds a storage made after serial s: the storage's one tensor, over all of it
 * in order. Such a tensor is a result nothing else can see unless a Lua value was made to refer
 * to it (autograd then keeps a new gradient as a leaf's grad without a copy). */
static int l_owns_new_storage(lua_State *L) {
  const attn_tensor *t = attn_l_check(L, 1);
  lua_Integer s = attn_l_checkinteger(L, 2, "serial");
  const attn_storage *st = t->storage;
  lua_pushboolean(L, st && st->serial > (uint64_t)s && st->refcount == 1 && t->offset == 0 &&
                         attn_tensor_is_contiguous(t) &&
                         (size_t)attn_tensor_numel(t) * attn_dtype_size(t->dtype) == st->nbytes);
  return 1;
}

static int l_storage_offset(lua_State *L) {
  lua_pushinteger(L, attn_l_check(L, 1)->offset);
  return 1;
}

/* One element as a Lua value: an integer for int64, a float otherwise. */
static void push_element(lua_State *L, const attn_tensor *t, const int64_t *pos) {
  if (t->dtype == ATTN_I64)
    lua_pushinteger(L, (lua_Integer)attn_tensor_get_i64(t, pos));
  else
    lua_pushnumber(L, attn_tensor_get(t, pos));
}

static void push_table_rec(lua_State *L, const attn_tensor *t, int depth, int64_t *pos) {
  if (depth == t->ndim) {
    push_element(L, t, pos);
    return;
  }
  lua_createtable(L, (int)t->shape[depth], 0);
  for (int64_t i = 0; i < t->shape[depth]; i++) {
    pos[depth] = i;
    push_table_rec(L, t, depth + 1, pos);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

static int l_totable(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  int64_t pos[ATTN_MAX_DIMS] = {0};
  /* Sized before building: an expanded or empty view can name far more
   * nested tables than memory holds (each Lua slot takes 16 bytes). */
  double slots = 0, tables = 1;
  for (int d = 0; d < t->ndim; d++) {
    slots += tables * (double)t->shape[d];
    tables *= (double)t->shape[d];
  }
  if (slots > (double)attn_alloc_max_request() / 16)
    return attn_l_error(L, "totable: a %s tensor would need %f Lua values, more than memory allows",
                        attn_tensor_shape_str(t), slots);
  luaL_checkstack(L, t->ndim + 4, "totable");
  push_table_rec(L, t, 0, pos);
  return 1;
}

static int l_item(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  if (attn_tensor_numel(t) != 1)
    return attn_l_error(L, "item: tensor %s has %I elements, item needs exactly 1", attn_tensor_shape_str(t),
                      (lua_Integer)attn_tensor_numel(t));
  int64_t pos[ATTN_MAX_DIMS] = {0};
  push_element(L, t, pos);
  return 1;
}

/* Reads a 1-based multi-index from arg..arg+ndim-1 into pos (0-based). */
static void check_index(lua_State *L, const attn_tensor *t, int arg, int64_t *pos, const char *fn) {
  int given = lua_gettop(L) - arg + 1;
  if (given < t->ndim)
    attn_l_error(L, "%s: %d indices given for %d-D tensor %s", fn, given < 0 ? 0 : given, t->ndim,
               attn_tensor_shape_str(t));
  for (int d = 0; d < t->ndim; d++) {
    lua_Integer given = attn_l_checkinteger(L, arg + d, "index"), i = given;
    i = attn_l_from_end(i, t->shape[d]);
    if (i < 1 || i > t->shape[d])
      attn_l_error(L, "%s: index %I out of range for dim %d of size %I (%s)", fn, given, d + 1,
                   (lua_Integer)t->shape[d], attn_tensor_shape_str(t));
    pos[d] = i - 1;
  }
}

static int l_get(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  int64_t pos[ATTN_MAX_DIMS];
  check_index(L, t, 2, pos, "get");
  push_element(L, t, pos);
  return 1;
}

/* set(t, value, i, j, ...) */
static int l_set(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  double v = attn_l_checknumber(L, 2, "value");
  int64_t pos[ATTN_MAX_DIMS];
  check_index(L, t, 3, pos, "set");
  if (t->dtype == ATTN_I64) {
    int isint;
    lua_Integer k = lua_tointegerx(L, 2, &isint);
    if (!isint) return attn_l_error(L, "set: %f is not an integer (int64 tensor %s)", v, attn_tensor_shape_str(t));
    attn_tensor_set_i64(t, pos, (int64_t)k);
  } else {
    attn_tensor_set(t, pos, v);
  }
  attn_l_bump_version(t);
  lua_settop(L, 1);
  return 1;
}

/* ---- views ---- */

static int push_transformed(lua_State *L, attn_tensor *v, attn_status st) {
  if (st != ATTN_OK) return attn_l_raise(L);
  attn_l_push_view(L, v);
  return 1;
}

static int l_transpose(lua_State *L) {
  attn_tensor v = *attn_l_check(L, 1);
  int d0 = attn_l_checkdim(L, 2, v.ndim, 0, "transpose"), d1 = attn_l_checkdim(L, 3, v.ndim, 0, "transpose");
  return push_transformed(L, &v, attn_view_transpose(&v, d0, d1));
}

static int l_permute(lua_State *L) {
  attn_tensor v = *attn_l_check(L, 1);
  int64_t dims[ATTN_MAX_DIMS];
  int perm[ATTN_MAX_DIMS];
  int n = attn_l_checkshape(L, 2, dims, "permute");
  if (n != v.ndim)
    return attn_l_error(L, "permute: %d dims given for %d-D tensor %s", n, v.ndim, attn_tensor_shape_str(&v));
  for (int d = 0; d < n; d++) {
    int64_t p = dims[d] < 0 ? dims[d] + n + 1 : dims[d];
    perm[d] = (p < 1 || p > n) ? -1 : (int)p - 1;
  }
  return push_transformed(L, &v, attn_view_permute(&v, perm));
}

/* narrow(t, dim, start, length), start 1-based */
static int l_narrow(lua_State *L) {
  attn_tensor v = *attn_l_check(L, 1);
  int dim = attn_l_checkdim(L, 2, v.ndim, 0, "narrow");
  lua_Integer start = attn_l_checkinteger(L, 3, "start"), len = attn_l_checkinteger(L, 4, "length");
  start = attn_l_from_end(start, v.shape[dim]);
  return push_transformed(L, &v, attn_view_narrow(&v, dim, start - 1, len));
}

static int l_select(lua_State *L) {
  attn_tensor v = *attn_l_check(L, 1);
  int dim = attn_l_checkdim(L, 2, v.ndim, 0, "select");
  lua_Integer i = attn_l_checkinteger(L, 3, "index");
  i = attn_l_from_end(i, v.shape[dim]);
  return push_transformed(L, &v, attn_view_select(&v, dim, i - 1));
}

static int l_unsqueeze(lua_State *L) {
  attn_tensor v = *attn_l_check(L, 1);
  int dim = attn_l_checkdim(L, 2, v.ndim, 1, "unsqueeze");
  return push_transformed(L, &v, attn_view_unsqueeze(&v, dim));
}

static int l_squeeze(lua_State *L) {
  attn_tensor v = *attn_l_check(L, 1);
  int dim = lua_isnoneornil(L, 2) ? -1 : attn_l_checkdim(L, 2, v.ndim, 0, "squeeze");
  return push_transformed(L, &v, attn_view_squeeze(&v, dim));
}

static int l_expand(lua_State *L) {
  attn_tensor v = *attn_l_check(L, 1);
  int64_t shape[ATTN_MAX_DIMS];
  int nd = attn_l_checkshape(L, 2, shape, "expand");
  return push_transformed(L, &v, attn_view_expand(&v, nd, shape));
}

/* view: never copies; reshape: copies when the strides do not allow a view. */
static int l_view(lua_State *L) {
  attn_tensor v = *attn_l_check(L, 1);
  int64_t shape[ATTN_MAX_DIMS];
  int nd = attn_l_checkshape(L, 2, shape, "view");
  return push_transformed(L, &v, attn_view_reshape("view", &v, nd, shape));
}

static int l_reshape(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  attn_tensor v = *x;
  int64_t shape[ATTN_MAX_DIMS];
  int nd = attn_l_checkshape(L, 2, shape, "reshape");
  attn_status st = attn_view_reshape("reshape", &v, nd, shape);
  if (st == ATTN_OK) return push_transformed(L, &v, st);
  ATTN_L_TRY(L, attn_shape_infer("reshape", attn_tensor_numel(x), nd, shape));
  attn_tensor *c = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_copy(c, x));
  attn_tensor cv = *c;
  ATTN_L_TRY(L, attn_view_reshape("reshape", &cv, nd, shape));
  *c = cv; /* same storage reference, new shape */
  return 1;
}

static int l_contiguous(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  if (attn_tensor_is_contiguous(x)) {
    lua_settop(L, 1);
    return 1;
  }
  attn_tensor *c = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_copy(c, x));
  return 1;
}

static int l_clone(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  attn_tensor *c = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_copy(c, x));
  return 1;
}

/* to(t, dtype): the same tensor if the dtype matches, else a converted copy. */
static int l_to(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  attn_l_checklstring(L, 2, "dtype", NULL);
  attn_dtype dt = attn_l_optdtype(L, 2, x->dtype);
  if (dt == x->dtype) {
    lua_settop(L, 1);
    return 1;
  }
  attn_tensor *c = attn_l_push_alloc(L, dt, x->ndim, x->shape);
  ATTN_L_TRY(L, attn_copy(c, x));
  return 1;
}

/* copy_(dst, src): src broadcast into dst, in place */
static int l_copy_(lua_State *L) {
  attn_tensor *dst = attn_l_check(L, 1), *src = attn_l_check(L, 2);
  ATTN_L_TRY(L, attn_copy(dst, src));
  attn_l_bump_version(dst);
  lua_settop(L, 1);
  return 1;
}

/* set_(t, src): t becomes a view of src (its storage, shape, strides, dtype)
 * while keeping its identity and Lua fields: how a parameter changes dtype in
 * place, so whoever holds it (an optimizer) sees the change. */
static int l_set_(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1), *src = attn_l_check(L, 2);
  /* a finalizer may run inside another call that is using t (see tensor_free) */
  if (attn_l_in_finalizer(L)) return attn_l_error(L, "set_: cannot replace a tensor's storage inside a finalizer");
  attn_tensor old = *t;
  attn_tensor_view(t, src);
  attn_l_release(L, &old);
  attn_l_bump_version(t);
  lua_settop(L, 1);
  return 1;
}

static int l_fill_(lua_State *L) {
  attn_tensor *t = attn_l_check(L, 1);
  attn_l_checknumber(L, 2, "value");
  attn_tensor *v = attn_l_push_number(L, 2, t->dtype, "fill_");
  ATTN_L_TRY(L, attn_copy(t, v));
  attn_l_bump_version(t);
  lua_settop(L, 1);
  return 1;
}

/* cat(list, dim) */
static int l_cat(lua_State *L) {
  attn_l_checktable(L, 1, "tensors");
  int n = (int)lua_rawlen(L, 1);
  if (n == 0) return attn_l_error(L, "cat: empty list of tensors");
  lua_rawgeti(L, 1, 1);
  attn_tensor *first = attn_l_check(L, -1);
  int dim = attn_l_checkdim(L, 2, first->ndim, 0, "cat");
  int64_t shape[ATTN_MAX_DIMS];
  memcpy(shape, first->shape, sizeof shape);
  int ndim = first->ndim;
  attn_dtype dt = first->dtype;
  shape[dim] = 0;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, i);
    attn_tensor *t = attn_l_test(L, -1);
    if (!t) return attn_l_error(L, "cat: element %d is a %s, not a tensor", i, luaL_typename(L, -1));
    int ok = t->ndim == ndim && t->dtype == dt;
    for (int d = 0; ok && d < ndim; d++) ok = d == dim || t->shape[d] == first->shape[d];
    if (!ok)
      return attn_l_error(L, "cat: tensor %d is %s %s, incompatible with tensor 1 %s %s along dim %d", i,
                        attn_dtype_name(t->dtype), attn_tensor_shape_str(t), attn_dtype_name(dt),
                        attn_tensor_shape_str(first), dim + 1);
    shape[dim] += t->shape[dim];
    lua_pop(L, 1);
  }
  attn_tensor *out = attn_l_push_alloc(L, dt, ndim, shape);
  int64_t at = 0;
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, i);
    attn_tensor *t = attn_l_check(L, -1), part = *out;
    attn_view_narrow(&part, dim, at, t->shape[dim]);
    ATTN_L_TRY(L, attn_copy(&part, t));
    at += t->shape[dim];
    lua_pop(L, 1);
  }
  return 1;
}

static const luaL_Reg tensor_functions[] = {
    {"tensor", l_tensor},       {"empty", l_empty},
    {"full", l_full},           {"arange", l_arange},
    {"linspace", l_linspace},   {"eye", l_eye},
    {"rand", l_rand},           {"randn", l_randn},
    {"bernoulli", l_bernoulli}, {"uniform_", l_uniform_},
    {"randint", l_randint},     {"multinomial", l_multinomial},
    {"normal_", l_normal_},     {"shape", l_shape},
    {"stride", l_stride},       {"size", l_size},
    {"shape_str", l_shape_str},
    {"dim", l_dim},             {"numel", l_numel},
    {"dtype", l_dtype},         {"is_contiguous", l_is_contiguous},
    {"storage_id", l_storage_id}, {"storage_offset", l_storage_offset},
    {"storage_serial", l_storage_serial}, {"owns_new_storage", l_owns_new_storage},
    {"totable", l_totable},     {"item", l_item},
    {"get", l_get},             {"set", l_set},
    {"transpose", l_transpose}, {"permute", l_permute},
    {"narrow", l_narrow},       {"select", l_select},
    {"unsqueeze", l_unsqueeze}, {"squeeze", l_squeeze},
    {"expand", l_expand},       {"view", l_view},
    {"reshape", l_reshape},     {"contiguous", l_contiguous},
    {"clone", l_clone},         {"to", l_to},
    {"copy_", l_copy_},         {"fill_", l_fill_},
    {"set_", l_set_},           {"version", l_version},
    {"cat", l_cat},
    {NULL, NULL},
};

void attn_l_open_tensor(lua_State *L) { attn_l_setfuncs(L, tensor_functions); }
