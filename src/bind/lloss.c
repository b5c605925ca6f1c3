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

/* softmax_ce_forward(logits, labels, valid_len|nil, steps|nil, op) -> loss
 * (labels' shape), stats, index (0-based int64 ids), count: labels (any
 * dtype, 1-based) are checked against logits (..., C) here, errors named by op. */
static int l_softmax_ce_forward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1), *labels = attn_l_check(L, 2);
  int64_t steps;
  attn_tensor *valid = opt_valid(L, 3, &steps);
  const char *op = attn_l_checklstring(L, 5, "op", NULL);
  int same = labels->ndim == x->ndim - 1;
  for (int d = 0; same && d < labels->ndim; d++) same = labels->shape[d] == x->shape[d];
  if (!same)
    return attn_l_error(L, "%s: labels %s must have the shape of logits %s without its last (class) dim", op,
                        attn_tensor_shape_str(labels), attn_tensor_shape_str(x));
  char ctx[160];
  snprintf(ctx, sizeof ctx, "labels %s, logits %s", attn_tensor_shape_str(labels), attn_tensor_shape_str(x));
  lua_settop(L, 5);
  attn_tensor *loss = attn_l_push_alloc(L, x->dtype, labels->ndim, labels->shape);
  int64_t rows2 = 2 * attn_tensor_numel(labels);
  attn_tensor *stats = attn_l_push_alloc(L, x->dtype, 1, &rows2);
  attn_tensor *index = attn_l_push_alloc(L, ATTN_I64, labels->ndim, labels->shape);
  ATTN_L_TRY(L, attn_index_convert(op, "label", ctx, labels, 1, x->shape[x->ndim - 1], index));
  int64_t count;
  ATTN_L_TRY(L, attn_softmax_ce_forward(x, index, valid, steps, loss, stats, &count));
  lua_pushinteger(L, (lua_Integer)count);
  return 4;
}

/* softmax_ce_backward(logits, index, valid_len|nil, steps|nil, stats, dloss) -> dlogits */
static int l_softmax_ce_backward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1), *index = attn_l_check(L, 2);
  int64_t steps;
  attn_tensor *valid = opt_valid(L, 3, &steps);
  attn_tensor *stats = attn_l_check(L, 5), *dloss = attn_l_check(L, 6);
  lua_settop(L, 6);
  attn_tensor *dx = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_softmax_ce_backward(x, index, valid, steps, stats, dloss, dx));
  return 1;
}

static const luaL_Reg loss_functions[] = {
    {"softmax_ce_forward", l_softmax_ce_forward},
    {"softmax_ce_backward", l_softmax_ce_backward},
    {NULL, NULL},
};

void attn_l_open_loss(lua_State *L) { attn_l_setfuncs(L, loss_functions); }
