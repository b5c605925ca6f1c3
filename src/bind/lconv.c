/* Binding: convolution and pooling kernels (attn_conv.h, attn_pool.h); the autograd nodes and
 * modules live in lua/attn/nn/conv.lua, which passes contiguous operands and checked sizes. */
#include "bind/lbind.h"

#include <string.h>

/* n integers from the table at arg (read raw: no Lua code runs) into v. */
static void check_ints(lua_State *L, int arg, int n, int64_t *v, const char *what) {
  attn_l_checktable(L, arg, what);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, arg, i + 1);
    int ok;
    lua_Integer k = lua_tointegerx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok) attn_l_argerror(L, arg, what, "a table of integers");
    v[i] = (int64_t)k;
  }
}

/* {stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups} */
static attn_conv2d_params conv_params(lua_State *L, int arg) {
  int64_t v[7];
  check_ints(L, arg, 7, v, "params");
  attn_conv2d_params p = {{v[0], v[1]}, {v[2], v[3]}, {v[4], v[5]}, v[6]};
  return p;
}

/* The path at arg: "auto" (or nil), "reference", "im2col", "winograd" or "winograd4" (attn_conv.h). */
static attn_conv2d_kernel conv_kernel(lua_State *L, int arg) {
  static const char *const names[] = {"auto", "reference", "im2col", "winograd", "winograd4"};
  if (lua_isnoneornil(L, arg)) return ATTN_CONV_AUTO;
  const char *s = attn_l_checklstring(L, arg, "kernel", NULL);
  for (int i = 0; i < 5; i++)
    if (strcmp(s, names[i]) == 0) return (attn_conv2d_kernel)i;
  return (attn_conv2d_kernel)attn_l_argerror(L, arg, "kernel",
                                             "'auto', 'reference', 'im2col', 'winograd' or 'winograd4'");
}

/* {kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w}, count_include_pad */
static attn_pool2d_params pool_params(lua_State *L, int arg, int count_include_pad) {
  int64_t v[6];
  check_ints(L, arg, 6, v, "params");
  attn_pool2d_params p = {{v[0], v[1]}, {v[2], v[3]}, {v[4], v[5]}, count_include_pad};
  return p;
}

/* conv2d_forward(x, weight, bias|nil, params, kernel) -> y (N, O, Ho, Wo) */
static int l_conv2d_forward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1), *w = attn_l_check(L, 2);
  attn_tensor *b = lua_toboolean(L, 3) ? attn_l_check(L, 3) : NULL;
  attn_conv2d_params p = conv_params(L, 4);
  attn_conv2d_kernel kernel = conv_kernel(L, 5);
  int64_t ys[4];
  ATTN_L_TRY(L, attn_conv2d_shape("conv2d", x, w, &p, ys));
  lua_settop(L, 5);
  attn_tensor *y = attn_l_push_alloc(L, x->dtype, 4, ys);
  ATTN_L_TRY(L, attn_conv2d_forward(x, w, b, &p, kernel, y));
  return 1;
}

/* conv2d_backward(x, weight, dy, params, want_dx, want_dweight, want_dbias, kernel)
 * -> dx|nil, dweight|nil, dbias|nil */
static int l_conv2d_backward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1), *w = attn_l_check(L, 2), *dy = attn_l_check(L, 3);
  attn_conv2d_params p = conv_params(L, 4);
  int want_dx = lua_toboolean(L, 5), want_dw = lua_toboolean(L, 6), want_db = lua_toboolean(L, 7);
  attn_conv2d_kernel kernel = conv_kernel(L, 8);
  int64_t ys[4];
  ATTN_L_TRY(L, attn_conv2d_shape("conv2d backward", x, w, &p, ys));
  lua_settop(L, 8);
  attn_tensor *dx = NULL, *dw = NULL, *db = NULL;
  if (want_dx) dx = attn_l_push_like(L, x); else lua_pushnil(L);
  if (want_dw) dw = attn_l_push_like(L, w); else lua_pushnil(L);
  if (want_db) db = attn_l_push_alloc(L, x->dtype, 1, &ys[1]); else lua_pushnil(L);
  ATTN_L_TRY(L, attn_conv2d_backward(x, w, &p, dy, kernel, dx, dw, db));
  return 3;
}

/* max_pool2d_forward(x, params) -> y, indices (int64, index in the H x W plane, 0-based) */
static int l_max_pool2d_forward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  attn_pool2d_params p = pool_params(L, 2, 0);
  int64_t ys[4];
  ATTN_L_TRY(L, attn_pool2d_shape("max_pool2d", x, &p, ys));
  lua_settop(L, 2);
  attn_tensor *y = attn_l_push_alloc(L, x->dtype, 4, ys);
  attn_tensor *idx = attn_l_push_alloc(L, ATTN_I64, 4, ys);
  ATTN_L_TRY(L, attn_max_pool2d_forward(x, &p, y, idx));
  return 2;
}

/* max_pool2d_backward(x, indices, dy) -> dx (x's shape) */
static int l_max_pool2d_backward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1), *idx = attn_l_check(L, 2), *dy = attn_l_check(L, 3);
  lua_settop(L, 3);
  attn_tensor *dx = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_max_pool2d_backward(idx, dy, dx));
  return 1;
}

/* avg_pool2d_forward(x, params, count_include_pad) -> y */
static int l_avg_pool2d_forward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  attn_pool2d_params p = pool_params(L, 2, lua_toboolean(L, 3));
  int64_t ys[4];
  ATTN_L_TRY(L, attn_pool2d_shape("avg_pool2d", x, &p, ys));
  lua_settop(L, 3);
  attn_tensor *y = attn_l_push_alloc(L, x->dtype, 4, ys);
  ATTN_L_TRY(L, attn_avg_pool2d_forward(x, &p, y));
  return 1;
}

/* avg_pool2d_backward(x, params, count_include_pad, dy) -> dx (x's shape) */
static int l_avg_pool2d_backward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  attn_pool2d_params p = pool_params(L, 2, lua_toboolean(L, 3));
  attn_tensor *dy = attn_l_check(L, 4);
  lua_settop(L, 4);
  attn_tensor *dx = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_avg_pool2d_backward(&p, dy, dx));
  return 1;
}

/* adaptive_avg_pool2d_forward(x, out_h, out_w) -> y (N, C, out_h, out_w) */
static int l_adaptive_avg_pool2d_forward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  int64_t oh = (int64_t)attn_l_checkinteger(L, 2, "out_h"), ow = (int64_t)attn_l_checkinteger(L, 3, "out_w");
  if (x->ndim != 4)
    return attn_l_error(L, "adaptive_avg_pool2d: input %s must be 4-D (N, C, H, W)", attn_tensor_shape_str(x));
  if (oh < 1 || ow < 1)
    return attn_l_error(L, "adaptive_avg_pool2d: output_size %dx%d must be positive", (int)oh, (int)ow);
  lua_settop(L, 3);
  int64_t ys[4] = {x->shape[0], x->shape[1], oh, ow};
  attn_tensor *y = attn_l_push_alloc(L, x->dtype, 4, ys);
  ATTN_L_TRY(L, attn_adaptive_avg_pool2d_forward(x, y));
  return 1;
}

/* adaptive_avg_pool2d_backward(x, dy) -> dx (x's shape) */
static int l_adaptive_avg_pool2d_backward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1), *dy = attn_l_check(L, 2);
  lua_settop(L, 2);
  attn_tensor *dx = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_adaptive_avg_pool2d_backward(dy, dx));
  return 1;
}

static const luaL_Reg conv_functions[] = {
    {"conv2d_forward", l_conv2d_forward},
    {"conv2d_backward", l_conv2d_backward},
    {"max_pool2d_forward", l_max_pool2d_forward},
    {"max_pool2d_backward", l_max_pool2d_backward},
    {"avg_pool2d_forward", l_avg_pool2d_forward},
    {"avg_pool2d_backward", l_avg_pool2d_backward},
    {"adaptive_avg_pool2d_forward", l_adaptive_avg_pool2d_forward},
    {"adaptive_avg_pool2d_backward", l_adaptive_avg_pool2d_backward},
    {NULL, NULL},
};

void attn_l_open_conv(lua_State *L) { attn_l_setfuncs(L, conv_functions); }
