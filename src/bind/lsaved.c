/* Binding: a fused op's saved buffer (attn_saved.h) as a Lua table of named views, and back. */
#include "bind/lbind.h"

attn_tensor attn_l_push_saved(lua_State *L, const attn_saved_layout *l, attn_dtype dt) {
  luaL_checkstack(L, 4, l->op);
  attn_tensor *buf = attn_l_push_alloc(L, attn_saved_dtype(l, dt), 1, &l->numel);
  lua_createtable(L, 0, l->nparts + 3); /* room for the fields an op adds (flash, lse, index) */
  for (int i = 0; i < l->nparts; i++) {
    attn_tensor v = attn_saved_view(buf, l, i);
    attn_l_push_view(L, &v);
    lua_setfield(L, -2, l->part[i].name);
  }
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, "buffer");
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

attn_tensor attn_l_check_saved(lua_State *L, int idx, const attn_saved_layout *l, attn_dtype dt, const char *fn) {
  idx = lua_absindex(L, idx);
  dt = attn_saved_dtype(l, dt);
  if (!lua_istable(L, idx))
    attn_l_error(L, "%s: saved must be the forward's table of parts, got a %s", fn, luaL_typename(L, idx));
  attn_tensor *buf = field_tensor(L, idx, "field", "buffer", fn);
  lua_pop(L, 1);
  for (int i = 0; i < l->nparts; i++) {
    const attn_saved_part *p = &l->part[i];
    attn_tensor *t = field_tensor(L, idx, "part", p->name, fn);
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same)
      attn_l_error(L, "%s: saved part %s is %s, expected %s from the operands", fn, p->name, attn_tensor_shape_str(t),
                   attn_shape_str(p->ndim, p->shape));
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
