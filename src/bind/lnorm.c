/* Binding: LayerNorm kernels (attn_layernorm.h); the autograd node lives in
 * lua/attn/nn/linear.lua. Operands must be contiguous (the caller makes them so). */
#include "bind/lbind.h"

/* Optional tensor at arg: nil or false give NULL. */
static attn_tensor *opt_tensor(lua_State *L, int arg) { return lua_toboolean(L, arg) ? attn_l_check(L, arg) : NULL; }

/* layer_norm_forward(x, n, weight|nil, bias|nil, eps) -> out (x's shape),
 * mean, rstd (float64, one entry per row) */
static int l_layer_norm_forward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  int64_t n = (int64_t)attn_l_checkinteger(L, 2, "n");
  attn_tensor *w = opt_tensor(L, 3), *b = opt_tensor(L, 4);
  double eps = attn_l_checknumber(L, 5, "eps");
  int64_t rows;
  ATTN_L_TRY(L, attn_layer_norm_rows("layer_norm", x, n, &rows));
  lua_settop(L, 5);
  attn_tensor *out = attn_l_push_like(L, x);
  attn_tensor *mean = attn_l_push_alloc(L, ATTN_F64, 1, &rows);
  attn_tensor *rstd = attn_l_push_alloc(L, ATTN_F64, 1, &rows);
  ATTN_L_TRY(L, attn_layer_norm_forward(x, n, w, b, eps, out, mean, rstd));
  return 3;
}

/* layer_norm_backward(x, n, weight|nil, mean, rstd, dout, want_params)
 * -> dx, dweight, dbias (the last two only when want_params; shaped as
 * weight, or as n entries without a weight) */
static int l_layer_norm_backward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  int64_t n = (int64_t)attn_l_checkinteger(L, 2, "n");
  attn_tensor *w = opt_tensor(L, 3);
  attn_tensor *mean = attn_l_check(L, 4), *rstd = attn_l_check(L, 5), *dout = attn_l_check(L, 6);
  int want = lua_toboolean(L, 7);
  lua_settop(L, 7);
  attn_tensor *dx = attn_l_push_like(L, x);
  attn_tensor *dw = NULL, *db = NULL;
  if (want) {
    dw = w ? attn_l_push_like(L, w) : attn_l_push_alloc(L, x->dtype, 1, &n);
    db = attn_l_push_alloc(L, x->dtype, dw->ndim, dw->shape);
  }
  ATTN_L_TRY(L, attn_layer_norm_backward(x, n, w, mean, rstd, dout, dx, dw, db));
  return want ? 3 : 1;
}

static const luaL_Reg norm_functions[] = {
    {"layer_norm_forward", l_layer_norm_forward},
    {"layer_norm_backward", l_layer_norm_backward},
    {NULL, NULL},
};

void attn_l_open_norm(lua_State *L) { attn_l_setfuncs(L, norm_functions); }
