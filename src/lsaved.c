/* Binding: a fused op's saved buffer (attn_saved.h) as a Lua table of named views, and back. */
#include "lbind.h"

attn_tensor attn_l_push_saved(lua_State *L, const attn_saved_layout *l, attn_dtype dt) {
  luaL_checkstack(L, 4, l->op);
  attn_tensor *buf = attn_l_push_alloc(L, dt, 1, &l->numel);
  lua_createtable(L, 0, l->nparts + 2); /* room for the fields an op adds (flash, lse) */
  for (int i = 0; i < l->nparts; i++) {
    attn_tensor v = attn_saved_view(buf, l, i);
    attn_l_push_view(L, &v);
    lua_setfield(L, -2, l->part[i].name);
  }
  attn_tensor flat = *buf; /* borrowed: the views hold the storage */
  lua_remove(L, -2);
  return flat;
}

attn_tensor attn_l_check_saved(lua_State *L, int idx, const attn_saved_layout *l, attn_dtype dt, const char *fn) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx))
    attn_l_error(L, "%s: saved must be the forward's table of parts, got a %s", fn, luaL_typename(L, idx));
  attn_tensor flat = {0};
  for (int i = 0; i < l->nparts; i++) {
    const attn_saved_part *p = &l->part[i];
    attn_l_rawfield(L, idx, p->name);
    attn_tensor *t = attn_l_test(L, -1);
    if (!t) attn_l_error(L, "%s: saved part %s must be a tensor, got a %s", fn, p->name, luaL_typename(L, -1));
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same)
      attn_l_error(L, "%s: saved part %s is %s, expected %s from the operands", fn, p->name, attn_tensor_shape_str(t),
                   attn_shape_str(p->ndim, p->shape));
    if (i == 0) { /* the buffer the forward allocated: every part must be its block */
      flat = *t;
      flat.ndim = 1;
      flat.shape[0] = l->numel;
      flat.stride[0] = 1;
      flat.offset = t->offset - p->offset;
    }
    if (t->dtype != dt || t->storage != flat.storage || t->offset != flat.offset + p->offset ||
        !attn_tensor_is_contiguous(t))
      attn_l_error(L, "%s: saved part %s is not the forward's (a contiguous %s block of the saved buffer)", fn, p->name,
                   attn_dtype_name(dt));
    lua_pop(L, 1);
  }
  size_t es = attn_dtype_size(dt);
  if (l->nparts == 0 || flat.offset < 0 || (size_t)(flat.offset + l->numel) > flat.storage->nbytes / es)
    attn_l_error(L, "%s: saved parts do not lie in one buffer", fn);
  return flat;
}
