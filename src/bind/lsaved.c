/* Binding: a fused op's saved buffer (attn_saved.h) as a Lua table of named views, and back.
 *
 * The views are lazy: the forward pushes a table holding only saved.buffer and a copy of the
 * layout (one small userdata without finalizer); the shared metatable's __index makes a part's
 * view on its first read and stores it, and __pairs makes them all first. An eval call whose
 * saved table nobody reads so pays for no views. */
#include <string.h>

#include "bind/lbind.h"

typedef struct saved_state {
  attn_saved_layout layout;
  attn_dtype dtype; /* the buffer's (attn_saved_dtype resolved) */
} saved_state;

static const char table_mt_key = 't'; /* registry keys: the saved tables' metatable, */
static const char state_mt_key = 's'; /* the state userdata's, */
static const char state_key = 'k';    /* and the (light userdata) field holding the state */

/* The state of the saved table at idx (absolute) when it is one of ours, else NULL. */
static const saved_state *table_state(lua_State *L, int idx) {
  lua_rawgetp(L, idx, &state_key);
  const saved_state *s = NULL;
  if (lua_type(L, -1) == LUA_TUSERDATA && lua_getmetatable(L, -1)) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &state_mt_key);
    if (lua_rawequal(L, -1, -2)) s = lua_touserdata(L, -3);
    lua_pop(L, 2);
  }
  lua_pop(L, 1); /* the table keeps the userdata alive */
  return s;
}

/* Whether the table at idx (absolute) has the lazy saved tables' metatable. */
static int is_lazy(lua_State *L, int idx) {
  if (!lua_getmetatable(L, idx)) return 0;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &table_mt_key);
  int same = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return same;
}

/* Pushes part i's view of the table at idx (absolute, state s) and stores it there. */
static void materialise(lua_State *L, int idx, const saved_state *s, int i) {
  const attn_saved_layout *l = &s->layout;
  attn_l_rawfield(L, idx, "buffer");
  attn_tensor *buf = attn_l_test(L, -1);
  /* a replaced buffer must still fit the layout, or the view would run past it */
  if (!buf) attn_l_error(L, "%s: saved.buffer must be a tensor, got a %s", l->op, luaL_typename(L, -1));
  if (attn_saved_check(l->op, l, buf, s->dtype) != ATTN_OK) attn_l_raise(L);
  attn_tensor v = attn_saved_view(buf, l, i);
  attn_l_push_view(L, &v);
  lua_remove(L, -2);
  lua_pushvalue(L, -1);
  lua_setfield(L, idx, l->part[i].name); /* a raw set: the metatable has no __newindex */
}

static int saved_index(lua_State *L) {
  const saved_state *s = table_state(L, 1);
  const char *key = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
  int i = s && key ? attn_saved_find(&s->layout, key) : -1;
  if (i < 0) return 0;
  materialise(L, 1, s, i);
  return 1;
}

/* next over the table itself (the metatable has no __index for pairs to trip on: rawnext) */
static int saved_next(lua_State *L) {
  lua_settop(L, 2);
  if (lua_next(L, 1)) return 2;
  lua_pushnil(L);
  return 1;
}

static int saved_pairs(lua_State *L) {
  const saved_state *s = table_state(L, 1);
  for (int i = 0; s && i < s->layout.nparts; i++) {
    if (attn_l_rawfield(L, 1, s->layout.part[i].name) == LUA_TNIL) {
      materialise(L, 1, s, i);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pushcfunction(L, saved_next);
  lua_pushvalue(L, 1);
  lua_pushnil(L);
  return 3;
}

/* Pushes the registry table at key (a metatable), made on first use. */
static void push_registry(lua_State *L, const void *key, int with_methods) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, key) != LUA_TNIL) return;
  lua_pop(L, 1);
  lua_createtable(L, 0, 2);
  if (with_methods) {
    lua_pushcfunction(L, saved_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, saved_pairs);
    lua_setfield(L, -2, "__pairs");
  }
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, key);
}

attn_tensor attn_l_push_saved(lua_State *L, const attn_saved_layout *l, attn_dtype dt) {
  luaL_checkstack(L, 4, l->op);
  dt = attn_saved_dtype(l, dt);
  attn_tensor *buf = attn_l_push_alloc(L, dt, 1, &l->numel);
  lua_createtable(L, 0, l->nparts + 5); /* the parts once read, buffer, state, and what an op adds */
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, "buffer");
  saved_state *s = lua_newuserdatauv(L, sizeof *s, 0);
  memcpy(&s->layout, l, sizeof *l);
  s->dtype = dt;
  push_registry(L, &state_mt_key, 0);
  lua_setmetatable(L, -2);
  lua_rawsetp(L, -2, &state_key);
  push_registry(L, &table_mt_key, 1);
  lua_setmetatable(L, -2);
  lua_remove(L, -2);
  return *buf; /* the table keeps the userdata, and the struct in it, alive */
}

/* The tensor t[key] of the table at idx (pushed), else raises naming fn, what and key. */
static attn_tensor *field_tensor(lua_State *L, int idx, const char *what, const char *key, const char *fn) {
  attn_l_rawfield(L, idx, key);
  attn_tensor *t = attn_l_test(L, -1);
  if (!t) attn_l_error(L, "%s: saved %s %s must be a tensor, got a %s", fn, what, key, luaL_typename(L, -1));
  return t;
}

/* Raises unless the part p (of the recomputed layout) has shape ndim, shape. */
static void check_shape(lua_State *L, const attn_saved_part *p, int ndim, const int64_t *shape, const char *fn) {
  int same = ndim == p->ndim;
  for (int d = 0; same && d < p->ndim; d++) same = shape[d] == p->shape[d];
  if (!same)
    attn_l_error(L, "%s: saved part %s is %s, expected %s from the operands", fn, p->name, attn_shape_str(ndim, shape),
                 attn_shape_str(p->ndim, p->shape));
}

attn_tensor attn_l_check_saved(lua_State *L, int idx, const attn_saved_layout *l, attn_dtype dt, const char *fn) {
  idx = lua_absindex(L, idx);
  dt = attn_saved_dtype(l, dt);
  if (!lua_istable(L, idx))
    attn_l_error(L, "%s: saved must be the forward's table of parts, got a %s", fn, luaL_typename(L, idx));
  attn_tensor *buf = field_tensor(L, idx, "field", "buffer", fn);
  lua_pop(L, 1);
  /* a lazy table's parts never read are the forward's by construction: its layout's */
  const saved_state *s = is_lazy(L, idx) ? table_state(L, idx) : NULL;
  for (int i = 0; i < l->nparts; i++) {
    const attn_saved_part *p = &l->part[i];
    int j = s && attn_l_rawfield(L, idx, p->name) == LUA_TNIL ? attn_saved_find(&s->layout, p->name) : -1;
    if (s) lua_pop(L, 1);
    if (j >= 0) {
      const attn_saved_part *f = &s->layout.part[j];
      check_shape(L, p, f->ndim, f->shape, fn);
      if (f->offset != p->offset || s->dtype != dt)
        attn_l_error(L, "%s: saved part %s is not the forward's (a contiguous %s block of saved.buffer)", fn, p->name,
                     attn_dtype_name(dt));
      continue;
    }
    attn_tensor *t = field_tensor(L, idx, "part", p->name, fn);
    check_shape(L, p, t->ndim, t->shape, fn);
    /* the backward reads the buffer: each part must be its block, as the forward made it */
    if (t->dtype != dt || t->storage != buf->storage || t->offset != buf->offset + p->offset ||
        !attn_tensor_is_contiguous(t))
      attn_l_error(L, "%s: saved part %s is not the forward's (a contiguous %s block of saved.buffer)", fn, p->name,
                   attn_dtype_name(dt));
    lua_pop(L, 1);
  }
  if (attn_saved_check(fn, l, buf, dt) != ATTN_OK) attn_l_raise(L);
  return *buf;
}
