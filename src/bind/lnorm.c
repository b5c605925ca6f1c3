/* Binding: LayerNorm kernels (attn_layernorm.h); the autograd node lives in
 * lua/attn/nn/linear.lua. Operands must be contiguous (the caller makes them so). */
#include "bind/lbind.h"

/* Optional tensor at arg: nil or false give NULL. */
static attn_tensor *opt_tensor(lua_State *L, int arg) { return lua_toboolean(L, arg) ? attn_l_check(L, arg) : NULL; }

/* layer_norm_forward(x, n, weight|nil, bias|nil, eps) -> out (x's shape),
 * saved (table of the parts of attn_layer_norm_saved_layout: mean and rstd,
 * float64, one entry per row); rms_norm_forward(x, n, weight|nil, eps) the same
 * without the bias (RMSNorm: the saved mean is all zeros). */
static int norm_forward(lua_State *L, int rms) {
  const char *fn = rms ? "rms_norm" : "layer_norm";
  attn_tensor *x = attn_l_check(L, 1);
  int64_t n = (int64_t)attn_l_checkinteger(L, 2, "n");
  attn_tensor *w = opt_tensor(L, 3), *b = rms ? NULL : opt_tensor(L, 4);
  double eps = attn_l_checknumber(L, rms ? 4 : 5, "eps");
  int64_t rows;
  ATTN_L_TRY(L, attn_layer_norm_rows(fn, x, n, &rows));
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_layer_norm_saved_layout(rows, &lay));
  lua_settop(L, 5);
  attn_tensor *out = attn_l_push_like(L, x);
  attn_tensor saved = attn_l_push_saved(L, &lay, x->dtype, 0);
  if (rms) ATTN_L_TRY(L, attn_rms_norm_forward(x, n, w, eps, out, &saved));
  else ATTN_L_TRY(L, attn_layer_norm_forward(x, n, w, b, eps, out, &saved));
  return 2;
}
static int l_layer_norm_forward(lua_State *L) { return norm_forward(L, 0); }
static int l_rms_norm_forward(lua_State *L) { return norm_forward(L, 1); }

/* layer_norm_backward(x, n, weight|nil, saved, dout, want_params)
 * -> dx, dweight, dbias (the last two only when want_params; shaped as
 * weight, or as n entries without a weight); rms_norm_backward the same
 * -> dx, dweight (no bias). */
static int norm_backward(lua_State *L, int rms) {
  const char *fn = rms ? "rms_norm backward" : "layer_norm backward";
  attn_tensor *x = attn_l_check(L, 1);
  int64_t n = (int64_t)attn_l_checkinteger(L, 2, "n");
  attn_tensor *w = opt_tensor(L, 3);
  attn_tensor *dout = attn_l_check(L, 5);
  int want = lua_toboolean(L, 6);
  int64_t rows;
  ATTN_L_TRY(L, attn_layer_norm_rows(fn, x, n, &rows));
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_layer_norm_saved_layout(rows, &lay));
  attn_tensor saved = attn_l_check_saved(L, 4, &lay, x->dtype, fn);
  lua_settop(L, 6);
  attn_tensor *dx = attn_l_push_like(L, x);
  attn_tensor *dw = NULL, *db = NULL;
  if (want) {
    dw = w ? attn_l_push_like(L, w) : attn_l_push_alloc(L, x->dtype, 1, &n);
    if (!rms) db = attn_l_push_alloc(L, x->dtype, dw->ndim, dw->shape);
  }
  if (rms) ATTN_L_TRY(L, attn_rms_norm_backward(x, n, w, &saved, dout, dx, dw));
  else ATTN_L_TRY(L, attn_layer_norm_backward(x, n, w, &saved, dout, dx, dw, db));
  return want ? (rms ? 2 : 3) : 1;
}
static int l_layer_norm_backward(lua_State *L) { return norm_backward(L, 0); }
static int l_rms_norm_backward(lua_State *L) { return norm_backward(L, 1); }

static const luaL_Reg norm_functions[] = {
    {"layer_norm_forward", l_layer_norm_forward},
    {"layer_norm_backward", l_layer_norm_backward},
    {"rms_norm_forward", l_rms_norm_forward},
    {"rms_norm_backward", l_rms_norm_backward},
    {NULL, NULL},
};

void attn_l_open_norm(lua_State *L) { attn_l_setfuncs(L, norm_functions); }
