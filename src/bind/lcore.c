/* The attn.core module: entry point, per-state data (random generator, GC
 * debt), tensor userdata plumbing shared by all binding files, and the
 * memory/thread/seed functions. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "bind/lbind.h"

typedef struct {
  attn_rng rng;
  size_t held;     /* bytes of the storages this state allocated and has not released yet */
  size_t baseline; /* held after the last full collection, or less if releases went lower */
  size_t trigger;  /* held above this: collect (see settle) */
  size_t gc_debt;  /* tensor bytes allocated since the last GC step */
  int deferred;    /* frees requested by finalizers, not yet done */
} binding_state;

static const char state_key = 0, deferred_key = 0, tensor_mt_key = 0;

/* Lua states that have loaded the module; the last to close stops the worker
 * pool and empties the cache before Lua unloads the library. */
static pthread_mutex_t states_lock = PTHREAD_MUTEX_INITIALIZER;
static int open_states;

static binding_state *get_state(lua_State *L) {
  /* upvalue 2 of the binding's other C closures is a table or none: NULL here */
  binding_state *s = lua_touserdata(L, lua_upvalueindex(ATTN_L_UP_STATE));
  if (s) return s;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &state_key);
  s = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return s;
}

attn_rng *attn_l_rng(lua_State *L) { return &get_state(L)->rng; }

/* lua_gc refuses every request (returns -1) while a finalizer runs. */
int attn_l_in_finalizer(lua_State *L) { return lua_gc(L, LUA_GCISRUNNING) < 0; }

int attn_l_rawfield(lua_State *L, int idx, const char *key) {
  idx = lua_absindex(L, idx);
  lua_pushstring(L, key);
  return lua_rawget(L, idx);
}

#define MIN_GARBAGE_BYTES ((size_t)8 << 20)

/* The next full collection comes when held exceeds the baseline by the
 * baseline (the live tensors; 8 MiB at least). */
static void set_trigger(binding_state *s) {
  s->trigger = s->baseline + (s->baseline > MIN_GARBAGE_BYTES ? s->baseline : MIN_GARBAGE_BYTES);
}

/* Only counts: the collector runs in settle(), after the call that
 * allocated has finished with its operands. */
static void account(lua_State *L, size_t bytes) {
  binding_state *s = get_state(L);
  s->held += bytes;
  s->gc_debt += bytes;
}

#define STEP_BYTES ((size_t)1 << 20)

void attn_l_release(lua_State *L, attn_tensor *t) {
  if (t->storage && t->storage->refcount == 1) {
    binding_state *s = get_state(L);
    s->held -= s->held < t->storage->capacity ? s->held : t->storage->capacity;
    if (s->held < s->baseline) { /* the live tensors are fewer than thought: pace from there */
      s->baseline = s->held;
      set_trigger(s);
    }
  }
  attn_tensor_free(t);
}

static void drain_deferred(lua_State *L, binding_state *s) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &deferred_key) == LUA_TTABLE) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      attn_l_release(L, lua_touserdata(L, -1));
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &deferred_key);
  s->deferred = 0;
}

/* Runs after a binding function returned. Lua paces its collector by the Lua
 * heap, which does not see tensor bytes. Two rules pace it by the tensors:
 *
 * - a GC step per MiB of tensors allocated, so Lua feels them (in a small
 *   heap these steps finish cycles often and keep garbage low);
 * - the bound: a full collection once the bytes held (allocated and not
 *   released: live tensors plus uncollected garbage) exceed the baseline
 *   (held after the last finished cycle) by the baseline, 8 MiB at least.
 *
 * The bound counts held bytes, not allocated ones: a tensor released early
 * (t:free(), <close>, a composed optimizer's temporaries) never counts, and
 * a release below the baseline lowers it. So the garbage between collections
 * is bounded by the live tensors whatever the mix of allocations and frees
 * and whatever the size of the Lua heap. (Counting allocated bytes made the
 * bound depend on the mix: a loop that freed half its bytes early reached a
 * full collection at half the garbage of one that freed nothing, while in a
 * small heap the steps kept the garbage low either way, so RSS came to
 * depend on the heap once fused Adam stopped allocating temporaries.)
 * Skipped inside a finalizer, which may itself run inside another call's
 * allocation. */
static void settle(lua_State *L, binding_state *s) {
  if (attn_l_in_finalizer(L)) return;
  /* a collector stopped by the script stays stopped */
  if (lua_gc(L, LUA_GCISRUNNING)) {
    int cycle = 0;
    if (s->held > s->trigger) {
      lua_gc(L, LUA_GCCOLLECT);
      cycle = 1;
    } else if (s->gc_debt >= STEP_BYTES) {
      int kb = s->gc_debt / 1024 > 1 << 30 ? 1 << 30 : (int)(s->gc_debt / 1024);
      cycle = lua_gc(L, LUA_GCSTEP, kb);
    }
    s->gc_debt = 0;
    if (cycle) {
      s->baseline = s->held;
      set_trigger(s);
    }
  }
  if (s->deferred) drain_deferred(L, s);
}

static int guarded_call(lua_State *L) {
  const luaL_Reg *reg = lua_touserdata(L, lua_upvalueindex(ATTN_L_UP_REG));
  int n = reg->func(L);
  binding_state *s = lua_touserdata(L, lua_upvalueindex(ATTN_L_UP_STATE));
  if (s->gc_debt >= STEP_BYTES || s->held > s->trigger || s->deferred) settle(L, s);
  return n;
}

/* The tensor metatable is also kept under a light userdata key: luaL_testudata
 * and luaL_setmetatable look it up by name, which interns the name (a strcmp
 * in Lua's string cache) on every tensor test and creation. A binding closure
 * holds it as an upvalue (ATTN_L_UP_TENSOR_MT), cheaper still. */
static void push_tensor_mt(lua_State *L) {
  if (attn_l_bound(L)) /* every binding closure holds it */
    lua_pushvalue(L, lua_upvalueindex(ATTN_L_UP_TENSOR_MT));
  else
    lua_rawgetp(L, LUA_REGISTRYINDEX, &tensor_mt_key);
}

/* Pushes reg, then the per-state values a binding closure keeps (ATTN_L_UP_*). */
static void push_upvalues(lua_State *L, const luaL_Reg *reg, int saved_mt) {
  lua_pushlightuserdata(L, (void *)reg);
  lua_pushlightuserdata(L, get_state(L));
  push_tensor_mt(L);
  if (saved_mt)
    attn_l_push_saved_mt(L);
  else
    lua_pushnil(L);
}

void attn_l_setfuncs(lua_State *L, const luaL_Reg *fns) {
  for (; fns->name; fns++) {
    push_upvalues(L, fns, 1);
    lua_pushcclosure(L, guarded_call, ATTN_L_UPVALUES);
    lua_setfield(L, -2, fns->name);
  }
}

void attn_l_pushclosure(lua_State *L, lua_CFunction f) {
  push_upvalues(L, NULL, 0);
  lua_pushcclosure(L, f, ATTN_L_UPVALUES);
}

int attn_l_is_tensor(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TUSERDATA || !lua_getmetatable(L, idx)) return 0;
  /* One comparison when it is a tensor in a binding closure. Upvalue 3 of the binding's other C
   * functions is none or a table that is no userdata's metatable: the registry decides there, as
   * it does for a foreign userdata. */
  if (lua_rawequal(L, -1, lua_upvalueindex(ATTN_L_UP_TENSOR_MT))) {
    lua_pop(L, 1);
    return 1;
  }
  lua_rawgetp(L, LUA_REGISTRYINDEX, &tensor_mt_key);
  int is = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return is;
}

attn_tensor *attn_l_test(lua_State *L, int idx) {
  if (!attn_l_is_tensor(L, idx)) return NULL;
  attn_tensor *t = lua_touserdata(L, idx);
  if (!t->storage) attn_l_error(L, "use of freed tensor");
  return t;
}

const char *attn_l_fname(lua_State *L) {
  /* functions registered by attn_l_setfuncs carry their luaL_Reg as upvalue 1 */
  const luaL_Reg *reg =
      lua_type(L, lua_upvalueindex(1)) == LUA_TLIGHTUSERDATA ? lua_touserdata(L, lua_upvalueindex(1)) : NULL;
  return reg && reg->name ? reg->name : "attn";
}

/* "no value", "nil", "a table", or the number itself ("2.5"). */
static const char *got(lua_State *L, int arg) {
  if (lua_isnone(L, arg)) return "no value";
  if (lua_isnil(L, arg)) return "nil";
  if (lua_type(L, arg) == LUA_TNUMBER) return lua_pushfstring(L, "%s", lua_tostring(L, arg));
  if (attn_l_is_tensor(L, arg)) return "a tensor";
  return lua_pushfstring(L, "a %s", luaL_typename(L, arg));
}

int attn_l_argerror(lua_State *L, int arg, const char *what, const char *expected) {
  if (what)
    return attn_l_error(L, "%s: argument %d (%s) must be %s, got %s", attn_l_fname(L), arg, what, expected,
                        got(L, arg));
  return attn_l_error(L, "%s: argument %d must be %s, got %s", attn_l_fname(L), arg, expected, got(L, arg));
}

attn_tensor *attn_l_check(lua_State *L, int idx) {
  attn_tensor *t = attn_l_test(L, idx);
  if (!t) attn_l_argerror(L, idx, NULL, "a tensor");
  return t;
}

lua_Integer attn_l_checkinteger(lua_State *L, int arg, const char *what) {
  int isint;
  lua_Integer v = lua_tointegerx(L, arg, &isint);
  if (!isint || lua_type(L, arg) != LUA_TNUMBER) attn_l_argerror(L, arg, what, "an integer");
  return v;
}

lua_Integer attn_l_optinteger(lua_State *L, int arg, const char *what, lua_Integer def) {
  return lua_isnoneornil(L, arg) ? def : attn_l_checkinteger(L, arg, what);
}

double attn_l_checknumber(lua_State *L, int arg, const char *what) {
  if (lua_type(L, arg) != LUA_TNUMBER) attn_l_argerror(L, arg, what, "a number");
  return lua_tonumber(L, arg);
}

double attn_l_optnumber(lua_State *L, int arg, const char *what, double def) {
  return lua_isnoneornil(L, arg) ? def : attn_l_checknumber(L, arg, what);
}

const char *attn_l_checklstring(lua_State *L, int arg, const char *what, size_t *len) {
  if (lua_type(L, arg) != LUA_TSTRING) attn_l_argerror(L, arg, what, "a string");
  return lua_tolstring(L, arg, len);
}

void attn_l_checktable(lua_State *L, int arg, const char *what) {
  if (lua_type(L, arg) != LUA_TTABLE) attn_l_argerror(L, arg, what, "a table");
}

static attn_tensor *push_empty_tail(lua_State *L, size_t tail) {
  attn_tensor *t = lua_newuserdatauv(L, sizeof(attn_tensor) + tail, ATTN_L_USER_VALUES);
  memset(t, 0, sizeof *t);
  push_tensor_mt(L);
  lua_setmetatable(L, -2);
  return t;
}

static attn_tensor *push_empty(lua_State *L) { return push_empty_tail(L, 0); }

attn_tensor *attn_l_push_alloc_tail(lua_State *L, attn_dtype dtype, int ndim, const int64_t *shape, size_t tail) {
  attn_tensor *t = push_empty_tail(L, tail);
  if (attn_tensor_init(t, dtype, ndim, shape) != ATTN_OK) attn_l_raise(L);
  account(L, t->storage->capacity);
  return t;
}

attn_tensor *attn_l_push_alloc(lua_State *L, attn_dtype dtype, int ndim, const int64_t *shape) {
  attn_tensor *t = push_empty(L);
  if (attn_tensor_init(t, dtype, ndim, shape) != ATTN_OK) attn_l_raise(L);
  account(L, t->storage->capacity);
  return t;
}

attn_tensor *attn_l_push_like(lua_State *L, const attn_tensor *x) {
  return attn_l_push_alloc(L, x->dtype, x->ndim, x->shape);
}

attn_tensor *attn_l_push_view(lua_State *L, const attn_tensor *view) {
  attn_tensor *t = push_empty(L);
  attn_tensor_view(t, view);
  return t;
}

attn_tensor *attn_l_push_number(lua_State *L, int idx, attn_dtype dtype, const char *fn) {
  if (lua_type(L, idx) != LUA_TNUMBER) attn_l_argerror(L, idx, NULL, "a tensor or a number");
  double v = lua_tonumber(L, idx);
  attn_tensor *s = attn_l_push_alloc(L, dtype, 0, NULL);
  if (dtype == ATTN_I64 && lua_isinteger(L, idx))
    attn_tensor_set_i64(s, NULL, (int64_t)lua_tointeger(L, idx));
  else if (attn_scalar_to(fn, dtype, v, attn_tensor_data(s)) != ATTN_OK)
    attn_l_raise(L);
  return s;
}

int attn_l_error(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  return lua_error(L);
}

int attn_l_raise(lua_State *L) { return attn_l_error(L, "%s", attn_last_error()); }

int attn_l_checkdim(lua_State *L, int arg, int ndim, int extra, const char *fn) {
  lua_Integer given = attn_l_checkinteger(L, arg, "dim"), d = given;
  lua_Integer n = ndim + extra;
  d = attn_l_from_end(d, n);
  if (d < 1 || d > n) {
    if (n == 0) return attn_l_error(L, "%s: dim %I given for a 0-d tensor", fn, given);
    return attn_l_error(L, "%s: dim %I out of range (expected 1..%d or -%d..-1)", fn, given, (int)n, (int)n);
  }
  return (int)d - 1;
}

int64_t attn_l_checksize(lua_State *L, int idx, int pos, const char *fn) {
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint) {
    if (lua_type(L, idx) == LUA_TNUMBER)
      attn_l_error(L, "%s: size %d is %s, not an integer", fn, pos, lua_tostring(L, idx));
    else
      attn_l_error(L, "%s: size %d is a %s, not an integer", fn, pos, luaL_typename(L, idx));
  }
  return (int64_t)v;
}

int attn_l_checkshape(lua_State *L, int arg, int64_t *shape, const char *fn) {
  int ndim = 0;
  if (lua_istable(L, arg)) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, arg);
    if (n > ATTN_MAX_DIMS) attn_l_error(L, "%s: %I dims requested, at most %d supported", fn, n, ATTN_MAX_DIMS);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, arg, i);
      shape[ndim++] = attn_l_checksize(L, -1, (int)i, fn);
      lua_pop(L, 1);
    }
  } else {
    int top = lua_gettop(L);
    if (top - arg + 1 > ATTN_MAX_DIMS)
      attn_l_error(L, "%s: %d dims requested, at most %d supported", fn, top - arg + 1, ATTN_MAX_DIMS);
    for (int i = arg; i <= top; i++) shape[ndim++] = attn_l_checksize(L, i, i - arg + 1, fn);
  }
  return ndim;
}

void attn_l_check_sizes(lua_State *L, int ndim, const int64_t *shape, const char *fn) {
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0)
      attn_l_error(L, "%s: negative size %I in shape %s", fn, (lua_Integer)shape[d], attn_shape_str(ndim, shape));
}

attn_dtype attn_l_optdtype(lua_State *L, int arg, attn_dtype def) {
  if (lua_isnoneornil(L, arg)) return def;
  const char *name = attn_l_checklstring(L, arg, "dtype", NULL);
  attn_dtype dt;
  if (attn_dtype_parse(name, &dt) != 0)
    attn_l_error(L, "unknown dtype '%s' (expected \"float32\", \"float64\" or \"int64\")", name);
  return dt;
}

int64_t attn_l_checkindices(lua_State *L, int arg, int64_t **out, const char *fn) {
  attn_tensor *t = attn_l_test(L, arg);
  int64_t n;
  if (t) {
    n = attn_tensor_numel(t);
  } else {
    if (!lua_istable(L, arg)) attn_l_argerror(L, arg, "index", "a 1-D tensor or a table of indices");
    n = (int64_t)lua_rawlen(L, arg);
  }
  if ((uint64_t)n > attn_alloc_max_request() / sizeof(int64_t))
    attn_l_error(L, "%s: %f indices are more than can be held", fn, (double)n);
  if (t) { /* the core validates and shifts to 0-based into an int64 tensor left on the stack */
    if (t->ndim > 1) attn_l_error(L, "%s: index tensor must be 1-D, got %s", fn, attn_tensor_shape_str(t));
    attn_tensor *z = attn_l_push_alloc(L, ATTN_I64, t->ndim, t->shape);
    ATTN_L_TRY(L, attn_index_convert(fn, "index", NULL, t, 1, -1, z));
    *out = attn_tensor_data(z);
    return n;
  }
  int64_t *buf = lua_newuserdatauv(L, sizeof(int64_t) * (size_t)(n > 0 ? n : 1), 0);
  for (int64_t i = 0; i < n; i++) {
    lua_rawgeti(L, arg, (lua_Integer)i + 1);
    int isint;
    lua_Integer k = lua_tointegerx(L, -1, &isint);
    if (!isint) {
      if (!lua_isnumber(L, -1))
        attn_l_error(L, "%s: index %I is a %s, not a number", fn, (lua_Integer)i + 1, luaL_typename(L, -1));
      attn_l_error(L, "%s: index %f at position %I is not an integer", fn, lua_tonumber(L, -1), (lua_Integer)i + 1);
    }
    lua_pop(L, 1);
    buf[i] = (int64_t)k - 1;
  }
  *out = buf;
  return n;
}

/* The user value slot of an autograd key kept as a slot (see lbind.h:
 * grad_fn, _oi), else 0. */
static int autograd_slot(lua_State *L, int key) {
  size_t n;
  const char *k = lua_tolstring(L, key, &n);
  if (n == 7 && memcmp(k, "grad_fn", 7) == 0) return ATTN_L_UV_GRAD_FN;
  if (n == 3 && memcmp(k, "_oi", 3) == 0) return ATTN_L_UV_OUTPUT;
  return 0;
}

/* __index. A string key is a method (upvalue 1), else one of the tensor's
 * own fields (its fields table: grad, _rg of a leaf, ...; or an autograd
 * slot: grad_fn, _oi, and _rg = true for a tensor a node made), else a
 * computed property (upvalue 2, e.g. requires_grad), else nil; methods come
 * first so that t:method() costs one rawget. Any other key (an integer or a
 * Torch-style index table) goes to the Lua indexer hooks.get (upvalue 3). */
static int tensor_index(lua_State *L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1; /* no other key is in the methods table */
  lua_pop(L, 1);
  if (lua_type(L, 2) != LUA_TSTRING) {
    if (lua_getfield(L, lua_upvalueindex(3), "get") == LUA_TNIL) return 1;
    lua_insert(L, 1);
    lua_call(L, 2, 1);
    return 1;
  }
  if (lua_getiuservalue(L, 1, ATTN_L_UV_FIELDS) == LUA_TTABLE) {
    lua_pushvalue(L, 2);
    if (lua_rawget(L, -2) != LUA_TNIL) return 1;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  int slot = autograd_slot(L, 2);
  if (slot) {
    lua_getiuservalue(L, 1, slot);
    return 1;
  }
  size_t n;
  const char *k = lua_tolstring(L, 2, &n);
  if (n == 3 && memcmp(k, "_rg", 3) == 0) { /* a node's output requires grad */
    if (lua_getiuservalue(L, 1, ATTN_L_UV_GRAD_FN) != LUA_TNIL) lua_pushboolean(L, 1);
    else lua_pushnil(L);
    return 1;
  }
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(2)) == LUA_TNIL) return 1;
  lua_pushvalue(L, 1);
  lua_call(L, 1, 1);
  return 1;
}

/* __newindex. A string key with a setter (upvalue 1, e.g. requires_grad)
 * calls it; an autograd slot key (grad_fn, _oi) sets the slot; any other
 * string key is stored in the fields table. Other keys are element/slice
 * assignment, done by the Lua hook hooks.set (upvalue 2). */
static int tensor_newindex(lua_State *L) {
  if (lua_type(L, 2) != LUA_TSTRING) {
    if (lua_getfield(L, lua_upvalueindex(2), "set") == LUA_TNIL)
      return attn_l_error(L, "tensor: cannot assign to a %s key", luaL_typename(L, 2));
    lua_insert(L, 1);
    lua_call(L, 3, 0);
    return 0;
  }
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) {
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 3);
    lua_call(L, 2, 0);
    return 0;
  }
  lua_pop(L, 1);
  int slot = autograd_slot(L, 2);
  if (slot) {
    lua_settop(L, 3);
    lua_setiuservalue(L, 1, slot);
    return 0;
  }
  if (lua_getiuservalue(L, 1, ATTN_L_UV_FIELDS) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, 1, ATTN_L_UV_FIELDS);
  }
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_rawset(L, -3);
  return 0;
}

/* The tensor at 1, freed or not (the metamethods below release it). */
static attn_tensor *check_held(lua_State *L) {
  if (attn_l_is_tensor(L, 1)) return lua_touserdata(L, 1);
  return luaL_checkudata(L, 1, ATTN_TENSOR_MT); /* raises its usual error */
}

static int tensor_gc(lua_State *L) { /* unreachable: nothing can be using it */
  attn_l_release(L, check_held(L));
  return 0;
}

/* t:free() and __close. A finalizer may run inside another binding call (an
 * allocation there steps the collector) whose operand t may be: then the free
 * waits, in a registry list, until that call has returned (see settle). */
static int tensor_free(lua_State *L) {
  attn_tensor *t = check_held(L);
  if (t->storage && attn_l_in_finalizer(L)) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &deferred_key) != LUA_TTABLE) {
      lua_pop(L, 1);
      lua_newtable(L);
      lua_pushvalue(L, -1);
      lua_rawsetp(L, LUA_REGISTRYINDEX, &deferred_key);
    }
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    get_state(L)->deferred = 1;
    return 0;
  }
  attn_l_release(L, t);
  return 0;
}

/* ---- Lua's own allocations. Every tensor op makes a userdata, and recording
 * it a node table, an input list and a closure; the collector frees them in
 * batches of a sweep step, which overflow the C library's per-size caches, so
 * the next allocations took its slow paths (a third of a small op's time).
 * A state's allocator is wrapped by a cache of freed blocks by exact size,
 * handed back only for a request of that size: every block still comes from
 * the wrapped allocator, which gets back the cached ones when the state
 * closes. Bounded (CACHE_BYTES a state); not in the sanitized build, where
 * reuse would hide a use after free from ASan. */
#define CACHE_MAX_BLOCK 512
#define CACHE_BYTES ((size_t)4 << 20)

typedef struct cached_block {
  struct cached_block *next;
} cached_block;

typedef struct {
  lua_Alloc base;
  void *base_ud;
  size_t bytes;
  cached_block *free[CACHE_MAX_BLOCK + 1];
} lua_block_cache;

static void *cached_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  lua_block_cache *c = ud;
  if (nsize == 0) {
    if (ptr && osize >= sizeof(cached_block) && osize <= CACHE_MAX_BLOCK && c->bytes + osize <= CACHE_BYTES) {
      cached_block *b = ptr;
      b->next = c->free[osize];
      c->free[osize] = b;
      c->bytes += osize;
      return NULL;
    }
  } else if (!ptr && nsize <= CACHE_MAX_BLOCK && c->free[nsize]) { /* (osize is a type tag here) */
    cached_block *b = c->free[nsize];
    c->free[nsize] = b->next;
    c->bytes -= nsize;
    return b;
  }
  return c->base(c->base_ud, ptr, osize, nsize);
}

static void cache_lua_blocks(lua_State *L) {
#ifndef ATTN_SANITIZED_BUILD
  lua_block_cache *c = calloc(1, sizeof *c);
  if (!c) return; /* no cache: the allocator stays as it is */
  c->base = lua_getallocf(L, &c->base_ud);
  lua_setallocf(L, cached_alloc, c);
#else
  (void)L;
#endif
}

/* Gives the cached blocks back and restores the wrapped allocator (unless
 * another one was set since, which then keeps the cache's blocks). */
static void uncache_lua_blocks(lua_State *L) {
  void *ud;
  if (lua_getallocf(L, &ud) != cached_alloc) return;
  lua_block_cache *c = ud;
  lua_setallocf(L, c->base, c->base_ud);
  for (size_t n = 0; n <= CACHE_MAX_BLOCK; n++)
    for (cached_block *b = c->free[n], *next; b; b = next) {
      next = b->next;
      c->base(c->base_ud, b, n, 0);
    }
  free(c);
}

/* __gc of the per-state data: Lua finalises it after every tensor (it was
 * made before them) and before it unloads the library (package's table of
 * loaded C libraries is older still). */
static int state_gc(lua_State *L) {
  uncache_lua_blocks(L); /* the state is closing: what it frees from now on goes straight back */
  pthread_mutex_lock(&states_lock);
  int last = --open_states == 0;
  pthread_mutex_unlock(&states_lock);
  if (last) {
    attn_parallel_shutdown(); /* no worker may be running inside the library when it goes */
    attn_alloc_empty_cache();
  }
  return 0;
}

static int l_memory(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)attn_alloc_live_bytes());
  lua_pushinteger(L, (lua_Integer)attn_alloc_cached_bytes());
  return 2;
}

/* peak_memory([reset]): the most bytes live at once since the last reset. */
static int l_peak_memory(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)attn_alloc_peak_bytes(lua_toboolean(L, 1)));
  return 1;
}

static int l_empty_cache(lua_State *L) {
  (void)L;
  attn_alloc_empty_cache();
  return 0;
}

static int l_set_cache_limit(lua_State *L) {
  lua_Integer b = attn_l_checkinteger(L, 1, "bytes");
  if (b < 0) return attn_l_error(L, "set_cache_limit: bytes = %I must be >= 0", b);
  attn_alloc_set_cache_limit((size_t)b);
  return 0;
}

/* Largest single allocation accepted, in bytes (default 3/4 of physical
 * memory): lets a fuzzer or a service bound what one call can take. */
static int l_set_max_request(lua_State *L) {
  lua_Integer b = attn_l_checkinteger(L, 1, "bytes");
  if (b < 0) return attn_l_error(L, "set_max_request: bytes = %I must be >= 0", b);
  attn_alloc_set_max_request((size_t)b);
  return 0;
}

static int l_max_request(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)attn_alloc_max_request());
  return 1;
}

static int l_set_num_threads(lua_State *L) {
  lua_Integer n = attn_l_checkinteger(L, 1, "n");
  if (n < 1 || n > 64) return attn_l_error(L, "set_num_threads: n = %I must be in 1..64", n);
  attn_set_num_threads((int)n);
  return 0;
}

static int l_get_num_threads(lua_State *L) {
  lua_pushinteger(L, attn_get_num_threads());
  return 1;
}

/* OpenBLAS's own thread count: the engine keeps it at 1 and parallelises around it. */
static int l_blas_threads(lua_State *L) {
  attn_get_num_threads(); /* the pool pins OpenBLAS on first use */
  lua_pushinteger(L, openblas_get_num_threads());
  return 1;
}

static int l_manual_seed(lua_State *L) {
  lua_Integer seed = attn_l_checkinteger(L, 1, "seed");
  attn_rng_seed(attn_l_rng(L), (uint64_t)seed);
  return 0;
}

static int l_rng_state(lua_State *L) { /* for saving/restoring generator state */
  attn_rng *r = attn_l_rng(L);
  if (lua_istable(L, 1)) {
    for (int i = 0; i < 4; i++) {
      lua_rawgeti(L, 1, i + 1);
      r->s[i] = (uint64_t)attn_l_checkinteger(L, -1, "state entry");
      lua_pop(L, 1);
    }
    return 0;
  }
  lua_createtable(L, 4, 0);
  for (int i = 0; i < 4; i++) {
    lua_pushinteger(L, (lua_Integer)r->s[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* Seconds from a monotonic clock (wall time, unaffected by clock changes). */
static int l_clock(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
  return 1;
}

/* Seconds of CPU time used by the process (all threads): for one-thread timings that other
 * processes on a shared machine should not inflate. */
static int l_cpu_clock(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + 1e-9 * (lua_Number)ts.tv_nsec);
  return 1;
}

/* The process's minor page faults and peak RSS in bytes (getrusage). */
static int l_rusage(lua_State *L) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return attn_l_error(L, "rusage: getrusage failed");
  lua_pushinteger(L, (lua_Integer)ru.ru_minflt);
  lua_pushinteger(L, (lua_Integer)ru.ru_maxrss * 1024);
  return 2;
}

/* isa(): the active row-math path; isa(name): selects one ("auto" = the best)
 * and returns the previous; isa_supported(name): whether this CPU can run it. */
static int l_isa(lua_State *L) {
  const char *previous = attn_vmath_isa();
  if (!lua_isnoneornil(L, 1)) ATTN_L_TRY(L, attn_vmath_set_isa(attn_l_checklstring(L, 1, "name", NULL)));
  lua_pushstring(L, previous);
  return 1;
}

static int l_isa_supported(lua_State *L) {
  lua_pushboolean(L, attn_vmath_isa_supported(attn_l_checklstring(L, 1, "name", NULL)));
  return 1;
}

/* same_shape(a, b): whether two tensors have the same dims and sizes (no
 * tables made, for autograd's per-node checks). */
static int l_same_shape(lua_State *L) {
  const attn_tensor *a = attn_l_check(L, 1), *b = attn_l_check(L, 2);
  lua_pushboolean(L, attn_l_same_shape(a, b));
  return 1;
}

/* fits_last(v, ndim, last): whether v is a tensor of ndim dims whose last size is `last` (any
 * other value: false), so a layer picks its fused path with one call, not three per operand. */
static int l_fits_last(lua_State *L) {
  lua_Integer ndim = attn_l_checkinteger(L, 2, "ndim"), last = attn_l_checkinteger(L, 3, "last");
  const attn_tensor *t = attn_l_test(L, 1);
  lua_pushboolean(L, t && t->ndim == ndim && ndim > 0 && t->shape[t->ndim - 1] == last);
  return 1;
}

static const luaL_Reg core_functions[] = {
    {"clock", l_clock},
    {"same_shape", l_same_shape},
    {"fits_last", l_fits_last},
    {"cpu_clock", l_cpu_clock},
    {"isa", l_isa},
    {"isa_supported", l_isa_supported},
    {"rusage", l_rusage},
    {"memory", l_memory},
    {"peak_memory", l_peak_memory},
    {"empty_cache", l_empty_cache},
    {"set_cache_limit", l_set_cache_limit},
    {"set_max_request", l_set_max_request},
    {"max_request", l_max_request},
    {"set_num_threads", l_set_num_threads},
    {"get_num_threads", l_get_num_threads},
    {"blas_threads", l_blas_threads},
    {"manual_seed", l_manual_seed},
    {"rng_state", l_rng_state},
    {NULL, NULL},
};

ATTN_EXPORT int luaopen_attn_core(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &state_key);
  if (lua_isnil(L, -1)) {
    binding_state *s = lua_newuserdatauv(L, sizeof(binding_state), 0);
    memset(s, 0, sizeof *s);
    set_trigger(s);
    attn_rng_seed(&s->rng, 0);
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, state_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &state_key);
    cache_lua_blocks(L);
    pthread_mutex_lock(&states_lock);
    open_states++;
    pthread_mutex_unlock(&states_lock);
  }
  lua_pop(L, 1);

  lua_newtable(L); /* module */
  int created = luaL_newmetatable(L, ATTN_TENSOR_MT);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &tensor_mt_key);
  if (created) {
    /* Filled in by the Lua side (attn.tensor): methods, property getters
     * and setters, and the indexing hooks {get =, set =}. */
    static const char *const tables[] = {"__methods", "__getters", "__setters", "__hooks"};
    for (int i = 0; i < 4; i++) {
      lua_newtable(L);
      lua_setfield(L, -2, tables[i]);
    }
    lua_getfield(L, -1, "__methods");
    lua_getfield(L, -2, "__getters");
    lua_getfield(L, -3, "__hooks");
    lua_pushcclosure(L, tensor_index, 3);
    lua_setfield(L, -2, "__index");
    lua_getfield(L, -1, "__setters");
    lua_getfield(L, -2, "__hooks");
    lua_pushcclosure(L, tensor_newindex, 2);
    lua_setfield(L, -2, "__newindex");
    attn_l_pushclosure(L, tensor_gc);
    lua_setfield(L, -2, "__gc");
    attn_l_pushclosure(L, tensor_free);
    lua_setfield(L, -2, "__close");
    lua_pushstring(L, "attn.Tensor");
    lua_setfield(L, -2, "__name");
  }
  lua_getfield(L, -1, "__methods");
  lua_setfield(L, -3, "methods");
  lua_getfield(L, -1, "__close"); /* the same function: an error names it as Lua finds it (attn.tensor.free) */
  lua_setfield(L, -3, "free");
  lua_setfield(L, -2, "metatable");

  attn_l_setfuncs(L, core_functions);
  attn_l_open_tensor(L);
  attn_l_open_graph(L);
  attn_l_open_math(L);
  attn_l_open_linalg(L);
  attn_l_open_attention(L);
  attn_l_open_io(L);
  attn_l_open_rnn(L);
  attn_l_open_norm(L);
  attn_l_open_optim(L);
  attn_l_open_loss(L);
  attn_l_open_conv(L);
  attn_l_open_linear(L);
  attn_l_open_rope(L);
  attn_l_open_tokens(L);
  lua_pushfstring(L, "%d.%d.%d", ATTN_VERSION_MAJOR, ATTN_VERSION_MINOR, ATTN_VERSION_PATCH);
  lua_setfield(L, -2, "_VERSION");
#ifdef ATTN_SANITIZED_BUILD
  lua_pushboolean(L, 1); /* lets `make test-asan` prove it loaded this build */
#else
  lua_pushboolean(L, 0);
#endif
  lua_setfield(L, -2, "sanitized");
  return 1;
}
