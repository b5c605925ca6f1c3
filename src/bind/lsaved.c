/* Binding: a fused op's saved buffer (attn_saved.h) as a Lua table of named views, and back.
 *
 * The views are lazy: the forward pushes a table holding saved.buffer and, under a hidden key, the
 * same buffer again; the layout's parts ride in that buffer's userdata, after its tensor struct
 * (attn_l_push_alloc_tail), so the table costs no object besides itself. The shared metatable's
 * __index makes a part's view of that buffer on its first read and stores it, and __pairs makes
 * them all first. An eval call whose saved table nobody reads so pays for no views, and the parts
 * read are what the eager table held: views of the forward's buffer, even when saved.buffer was
 * reassigned since. */
#include <string.h>

#include "bind/lbind.h"

/* A part as the state keeps it: its offset and size follow from the shapes (state_layout). */
typedef struct saved_shape {
  const char *name;
  int64_t ndim;
  int64_t shape[ATTN_SAVED_MAX_DIMS];
} saved_shape;

/* The layout, its parts cut to the ones it has and to their shapes: a call's buffer grows by
 * a few hundred bytes, not the ten parts' worth of attn_saved_layout (the GC paces itself by
 * bytes, so every byte kept per call costs collector work). */
typedef struct saved_state {
  uint64_t magic; /* STATE_MAGIC: a tensor with this tail is a saved buffer */
  const char *op;
  int nparts, fixed;
  attn_dtype layout_dtype, dtype; /* the layout's fixed one, and the buffer's (resolved) */
  saved_shape part[];             /* nparts */
} saved_state;

#define STATE_MAGIC UINT64_C(0x6174746e73617665) /* "attnsave" */

static const char table_mt_key = 't'; /* registry key: the saved tables' metatable, */
static const char state_key = 'k';    /* and the (light userdata) field holding the forward's buffer */

static size_t state_size(int nparts) { return sizeof(saved_state) + sizeof(saved_shape) * (size_t)nparts; }

/* Pushes the forward's buffer of the saved table at idx (absolute) and returns its state when the
 * table is one of ours; else pushes nothing and returns NULL. Only a buffer made by
 * attn_l_push_saved has a tail of its size with the mark (a plain tensor has no tail). */
static const saved_state *push_state(lua_State *L, int idx) {
  lua_rawgetp(L, idx, &state_key);
  if (attn_l_is_tensor(L, -1)) {
    size_t len = lua_rawlen(L, -1);
    attn_tensor *t = lua_touserdata(L, -1);
    const saved_state *s = attn_l_tail(t);
    if (len >= sizeof(attn_tensor) + sizeof(saved_state) && s->magic == STATE_MAGIC &&
        len == sizeof(attn_tensor) + state_size(s->nparts))
      return s;
  }
  lua_pop(L, 1);
  return NULL;
}

/* The layout of state s, whole again: the same additions as the forward's layout function made
 * (which succeeded, so these do). */
static void state_layout(const saved_state *s, attn_saved_layout *l) {
  attn_saved_begin(l, s->op);
  for (int i = 0; i < s->nparts; i++) attn_saved_add(l, s->part[i].name, (int)s->part[i].ndim, s->part[i].shape);
  l->fixed = s->fixed;
  l->dtype = s->layout_dtype;
}

/* The forward's buffer at -1 (pushed by push_state). */
static attn_tensor *state_buffer(lua_State *L) { return attn_l_test(L, -1); }

/* Whether the table at idx (absolute) has the lazy saved tables' metatable. */
static int is_lazy(lua_State *L, int idx) {
  if (!lua_getmetatable(L, idx)) return 0;
  attn_l_push_saved_mt(L);
  int same = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return same;
}

static int saved_index(lua_State *L) {
  if (lua_type(L, 2) != LUA_TSTRING) return 0;
  const saved_state *s = push_state(L, 1);
  if (!s) return 0;
  attn_saved_layout l;
  state_layout(s, &l);
  int i = attn_saved_find(&l, lua_tostring(L, 2));
  if (i < 0) return 0;
  attn_tensor v = attn_saved_view(state_buffer(L), &l, i);
  attn_l_push_view(L, &v); /* holds the storage: a view keeps it alive */
  lua_pushvalue(L, -1);
  lua_setfield(L, 1, l.part[i].name); /* a raw set: the metatable has no __newindex */
  return 1;
}

/* next over the table itself (raw), leaving out the hidden field */
static int saved_next(lua_State *L) {
  lua_settop(L, 2);
  while (lua_next(L, 1)) {
    if (lua_touserdata(L, -2) != (void *)&state_key) return 2;
    lua_pop(L, 1);
  }
  lua_pushnil(L);
  return 1;
}

static int saved_pairs(lua_State *L) {
  const saved_state *s = push_state(L, 1);
  for (int i = 0; s && i < s->nparts; i++) {
    if (attn_l_rawfield(L, 1, s->part[i].name) == LUA_TNIL) {
      lua_getfield(L, 1, s->part[i].name); /* __index makes and stores it */
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pushcfunction(L, saved_next);
  lua_pushvalue(L, 1);
  lua_pushnil(L);
  return 3;
}

/* A binding closure keeps the metatable as an upvalue (lbind.h); the registry holds it for the
 * others, and for registering them. */
void attn_l_push_saved_mt(lua_State *L) {
  int up = attn_l_kept(L, ATTN_L_UP_SAVED_MT);
  if (up) {
    lua_pushvalue(L, up);
    return;
  }
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &table_mt_key) != LUA_TNIL) return;
  lua_pop(L, 1);
  lua_createtable(L, 0, 2);
  attn_l_pushclosure(L, saved_index);
  lua_setfield(L, -2, "__index");
  attn_l_pushclosure(L, saved_pairs);
  lua_setfield(L, -2, "__pairs");
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &table_mt_key);
}

attn_tensor attn_l_push_saved(lua_State *L, const attn_saved_layout *l, attn_dtype dt, int extra) {
  luaL_checkstack(L, 4, l->op);
  dt = attn_saved_dtype(l, dt);
  attn_tensor *buf = attn_l_push_alloc_tail(L, dt, 1, &l->numel, state_size(l->nparts));
  saved_state *s = attn_l_tail(buf);
  s->magic = STATE_MAGIC;
  s->op = l->op;
  s->nparts = l->nparts;
  s->fixed = l->fixed;
  s->layout_dtype = l->dtype;
  s->dtype = dt;
  for (int i = 0; i < l->nparts; i++) {
    const attn_saved_part *p = &l->part[i];
    s->part[i].name = p->name;
    s->part[i].ndim = p->ndim;
    memcpy(s->part[i].shape, p->shape, sizeof p->shape[0] * (size_t)p->ndim);
  }
  /* buffer, the hidden buffer and the `extra` fields the op adds (flash, lse, index); the parts
   * read later (a backward's) rehash it */
  lua_createtable(L, 0, 2 + extra);
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, "buffer");
  lua_pushvalue(L, -2);
  lua_rawsetp(L, -2, &state_key);
  attn_l_push_saved_mt(L);
  lua_setmetatable(L, -2);
  lua_remove(L, -2);
  return *buf; /* the table keeps the buffer, and its storage, alive */
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
  /* a lazy table's part never read is the view its forward would have made (of its buffer) */
  attn_saved_layout fl;
  const attn_tensor *fbuf = NULL;
  if (is_lazy(L, idx)) {
    const saved_state *s = push_state(L, idx);
    if (s) {
      state_layout(s, &fl);
      fbuf = state_buffer(L); /* the table holds the state, the state its buffer */
      lua_pop(L, 1);
    }
  }
  for (int i = 0; i < l->nparts; i++) {
    const attn_saved_part *p = &l->part[i];
    int j = fbuf && attn_l_rawfield(L, idx, p->name) == LUA_TNIL ? attn_saved_find(&fl, p->name) : -1;
    if (fbuf) lua_pop(L, 1);
    attn_tensor unread;
    const attn_tensor *t;
    if (j >= 0) {
      unread = attn_saved_view(fbuf, &fl, j);
      t = &unread;
      lua_pushnil(L); /* (popped below, as the field) */
    } else {
      t = field_tensor(L, idx, "part", p->name, fn);
    }
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
