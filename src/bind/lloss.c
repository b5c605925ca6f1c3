/* Binding: softmax cross-entropy kernels (attn_loss.h); the autograd node
 * lives in lua/attn/nn/loss.lua. */
#include <stdio.h>

#include "bind/lbind.h"

/* Optional valid lengths at arg (nil: none) and their steps at arg + 1. */
static attn_tensor *opt_valid(lua_State *L, int arg, int64_t *steps) {
  if (lua_isnil(L, arg)) return *steps = 0, NULL;
  attn_tensor *v = attn_l_check(L, arg);
  *steps = (int64_t)attn_l_checkinteger(L, arg + 1, "steps");
  return v;
}

/* softmax_ce_forward(logits, labels, valid_len|nil, steps|nil, op, smoothing|nil) -> loss
 * (labels' shape), saved (table of the parts of attn_softmax_ce_saved_layout:
 * stats (R, 2); and index, the 0-based int64 ids in labels' shape, riding
 * along), count: labels (any dtype, 1-based) are checked against logits
 * (..., C) here, errors named by op; smoothing is the label smoothing (0). */
static int l_softmax_ce_forward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1), *labels = attn_l_check(L, 2);
  int64_t steps;
  attn_tensor *valid = opt_valid(L, 3, &steps);
  const char *op = attn_l_checklstring(L, 5, "op", NULL);
  double eps = luaL_optnumber(L, 6, 0);
  int same = labels->ndim == x->ndim - 1;
  for (int d = 0; same && d < labels->ndim; d++) same = labels->shape[d] == x->shape[d];
  if (!same)
    return attn_l_error(L, "%s: labels %s must have the shape of logits %s without its last (class) dim", op,
                        attn_tensor_shape_str(labels), attn_tensor_shape_str(x));
  char ctx[160];
  snprintf(ctx, sizeof ctx, "labels %s, logits %s", attn_tensor_shape_str(labels), attn_tensor_shape_str(x));
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_softmax_ce_saved_layout(attn_tensor_numel(labels), &lay));
  lua_settop(L, 6);
  attn_tensor *loss = attn_l_push_alloc(L, x->dtype, labels->ndim, labels->shape);
  attn_tensor saved = attn_l_push_saved(L, &lay, x->dtype, 1);
  attn_tensor *index = attn_l_push_alloc(L, ATTN_I64, labels->ndim, labels->shape);
  ATTN_L_TRY(L, attn_index_convert(op, "label", ctx, labels, 1, x->shape[x->ndim - 1], index));
  int64_t count;
  ATTN_L_TRY(L, attn_softmax_ce_smoothed_forward(x, index, valid, steps, eps, loss, &saved, &count));
  lua_setfield(L, -2, "index");
  lua_pushinteger(L, (lua_Integer)count);
  return 3;
}

/* softmax_ce_backward(logits, valid_len|nil, steps|nil, saved, dloss, smoothing|nil) -> dlogits:
 * saved is the forward's table, its parts checked against the layout for logits' rows, its index
 * read; smoothing is the forward's. */
static int l_softmax_ce_backward(lua_State *L) {
  const char *fn = "softmax_ce_backward";
  attn_tensor *x = attn_l_check(L, 1);
  int64_t steps;
  attn_tensor *valid = opt_valid(L, 2, &steps);
  attn_tensor *dloss = attn_l_check(L, 5);
  double eps = luaL_optnumber(L, 6, 0);
  int64_t C = x->ndim > 0 ? x->shape[x->ndim - 1] : 0;
  if (C < 1)
    return attn_l_error(L, "%s: logits %s must be (..., C) with C >= 1", fn, attn_tensor_shape_str(x));
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_softmax_ce_saved_layout(attn_tensor_numel(x) / C, &lay));
  attn_tensor saved = attn_l_check_saved(L, 4, &lay, x->dtype, fn);
  lua_settop(L, 6);
  attn_l_rawfield(L, 4, "index");
  attn_tensor *index = attn_l_test(L, -1);
  if (!index) return attn_l_error(L, "%s: saved index must be a tensor, got a %s", fn, luaL_typename(L, -1));
  attn_tensor *dx = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_softmax_ce_smoothed_backward(x, index, valid, steps, eps, &saved, dloss, dx));
  return 1;
}

static const luaL_Reg loss_functions[] = {
    {"softmax_ce_forward", l_softmax_ce_forward},
    {"softmax_ce_backward", l_softmax_ce_backward},
    {NULL, NULL},
};

void attn_l_open_loss(lua_State *L) { attn_l_setfuncs(L, loss_functions); }
