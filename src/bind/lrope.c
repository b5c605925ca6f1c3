/* Binding: RoPE kernels (attn_rope.h); the autograd node and the dispatch between this fused path
 * and the composed one live in lua/attn/rope.lua. */
#include "bind/lbind.h"

/* Optional tensor at arg: nil or false give NULL. */
static attn_tensor *opt_tensor(lua_State *L, int arg) { return lua_toboolean(L, arg) ? attn_l_check(L, arg) : NULL; }

/* rope(x, positions|nil, cos|nil, sin|nil, base, interleaved, inverse) -> out (x's shape, contiguous):
 * x rotated by the angles of its positions (by the opposite angles when inverse, the backward). */
static int l_rope(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  attn_rope_opts o = {0};
  o.positions = opt_tensor(L, 2);
  o.cos = opt_tensor(L, 3), o.sin = opt_tensor(L, 4);
  o.base = attn_l_checknumber(L, 5, "base");
  o.interleaved = lua_toboolean(L, 6);
  int inverse = lua_toboolean(L, 7);
  lua_settop(L, 7);
  attn_tensor *out = attn_l_push_like(L, x);
  if (inverse) ATTN_L_TRY(L, attn_rope_backward("rope backward", x, &o, out));
  else ATTN_L_TRY(L, attn_rope_forward("rope", x, &o, out));
  return 1;
}

/* rope_tables(P, d, base, dtype) -> cos, sin: (P, d/2) each, row p the angles of position p. */
static int l_rope_tables(lua_State *L) {
  int64_t shape[2];
  shape[0] = (int64_t)attn_l_checkinteger(L, 1, "P");
  int64_t d = (int64_t)attn_l_checkinteger(L, 2, "d");
  double base = attn_l_checknumber(L, 3, "base");
  attn_dtype dt = attn_l_optdtype(L, 4, ATTN_F32);
  if (shape[0] < 0 || d < 0 || d % 2 != 0)
    return attn_l_error(L, "rope_tables: P = %I and d = %I must be >= 0, d even", (lua_Integer)shape[0], (lua_Integer)d);
  shape[1] = d / 2;
  lua_settop(L, 4);
  attn_tensor *c = attn_l_push_alloc(L, dt, 2, shape);
  attn_tensor *s = attn_l_push_alloc(L, dt, 2, shape);
  ATTN_L_TRY(L, attn_rope_tables(base, c, s));
  return 2;
}

static const luaL_Reg rope_functions[] = {
    {"rope", l_rope},
    {"rope_tables", l_rope_tables},
    {NULL, NULL},
};

void attn_l_open_rope(lua_State *L) { attn_l_setfuncs(L, rope_functions); }
