/* Binding: fused optimizer updates and gradient norms (attn_optim.h); the
 * optimizers and clip_grad_norm_ that call them live in lua/attn/optim.lua and
 * lua/attn/nn/clip.lua. */
#include "lbind.h"

/* adam_step(p, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay,
 * decoupled, step): updates p, exp_avg and exp_avg_sq in place; returns p. */
static int l_adam_step(lua_State *L) {
  attn_tensor *p = attn_l_check(L, 1), *g = attn_l_check(L, 2), *m = attn_l_check(L, 3), *v = attn_l_check(L, 4);
  attn_adam_options o = {attn_l_checknumber(L, 5, "lr"), attn_l_checknumber(L, 6, "beta1"),
                         attn_l_checknumber(L, 7, "beta2"), attn_l_checknumber(L, 8, "eps"),
                         attn_l_checknumber(L, 9, "weight_decay"), lua_toboolean(L, 10),
                         (int64_t)attn_l_checkinteger(L, 11, "step")};
  ATTN_L_TRY(L, attn_adam_step(p, g, m, v, &o));
  attn_l_bump_version(p);
  attn_l_bump_version(m);
  attn_l_bump_version(v);
  lua_settop(L, 1);
  return 1;
}

/* sgd_step(p, grad, buf|nil, lr, momentum, dampening, weight_decay, nesterov,
 * first): updates p (and buf) in place; returns p. */
static int l_sgd_step(lua_State *L) {
  attn_tensor *p = attn_l_check(L, 1), *g = attn_l_check(L, 2);
  attn_tensor *buf = lua_isnil(L, 3) ? NULL : attn_l_check(L, 3);
  attn_sgd_options o = {attn_l_checknumber(L, 4, "lr"), attn_l_checknumber(L, 5, "momentum"),
                        attn_l_checknumber(L, 6, "dampening"), attn_l_checknumber(L, 7, "weight_decay"),
                        lua_toboolean(L, 8), lua_toboolean(L, 9)};
  ATTN_L_TRY(L, attn_sgd_step(p, g, buf, &o));
  attn_l_bump_version(p);
  if (buf) attn_l_bump_version(buf);
  lua_settop(L, 1);
  return 1;
}

/* The tensors of the list at arg, in a pointer array owned by a userdata
 * pushed on the stack (allocated before any pointer is taken). */
static attn_tensor **check_list(lua_State *L, int arg, int64_t *n) {
  attn_l_checktable(L, arg, "tensors");
  *n = (int64_t)lua_rawlen(L, arg);
  attn_tensor **list = lua_newuserdatauv(L, (size_t)(*n ? *n : 1) * sizeof *list, 0);
  for (int64_t i = 0; i < *n; i++) {
    lua_rawgeti(L, arg, (lua_Integer)i + 1);
    list[i] = attn_l_test(L, -1);
    if (!list[i]) attn_l_error(L, "%s: tensors[%d] is not a tensor", attn_l_fname(L), (int)i + 1);
    lua_pop(L, 1); /* the list keeps it alive */
  }
  return list;
}

/* grads_norm(list) -> the L2 norm of the tensors taken together (contiguous) */
static int l_grads_norm(lua_State *L) {
  int64_t n;
  attn_tensor **list = check_list(L, 1, &n);
  double norm;
  ATTN_L_TRY(L, attn_grads_norm(n, (const attn_tensor *const *)list, &norm));
  lua_pushnumber(L, norm);
  return 1;
}

/* grads_scale_(list, scale): every tensor multiplied in place by scale */
static int l_grads_scale_(lua_State *L) {
  double scale = attn_l_checknumber(L, 2, "scale");
  int64_t n;
  attn_tensor **list = check_list(L, 1, &n);
  ATTN_L_TRY(L, attn_grads_scale_(n, list, scale));
  for (int64_t i = 0; i < n; i++) attn_l_bump_version(list[i]);
  return 0;
}

static const luaL_Reg optim_functions[] = {
    {"adam_step", l_adam_step},
    {"sgd_step", l_sgd_step},
    {"grads_norm", l_grads_norm},
    {"grads_scale_", l_grads_scale_},
    {NULL, NULL},
};

void attn_l_open_optim(lua_State *L) { attn_l_setfuncs(L, optim_functions); }
