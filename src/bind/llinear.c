/* Binding: linear attention (attn_linear.h). The autograd node and the feature maps of
 * attn.linear_attention / attn.performer_attention live in lua/attn/linear_attention.lua. */
#include "attention/attn_linear.h"
#include "bind/lbind.h"

/* The options at arg causal, arg+1 eps, arg+2 feature ("elu1" or "identity"). */
static void read_opts(lua_State *L, int arg, attn_linear_opts *o) {
  o->causal = lua_toboolean(L, arg);
  o->eps = attn_l_checknumber(L, arg + 1, "eps");
  const char *f = attn_l_checklstring(L, arg + 2, "feature", NULL);
  if (f[0] == 'e')
    o->feature = ATTN_LINEAR_ELU1;
  else if (f[0] == 'i')
    o->feature = ATTN_LINEAR_IDENTITY;
  else
    attn_l_argerror(L, arg + 2, "feature", "\"elu1\" or \"identity\"");
}

/* A (B, N, w) output for the operands x (rows from x, width from w_of), or an empty one when the
 * operands are not 3-D (the core then names the shapes). */
static attn_tensor *push_out(lua_State *L, const attn_tensor *x, int64_t n, int64_t w) {
  int64_t shape[3] = {x->ndim == 3 ? x->shape[0] : 0, n, w};
  return attn_l_push_alloc(L, x->dtype, 3, shape);
}

static int64_t dim_or0(const attn_tensor *t, int d) { return t->ndim == 3 ? t->shape[d] : 0; }

/***
 * Linear attention's kernel (src/attention/attn_linear.h): out_i = a^T S / (a^T z + eps) with
 * a = phi(q_i), S = sum_j phi(k_j) v_j^T, z = sum_j phi(k_j), over all keys or j <= i.
 * @function linear_attention_forward
 * @tparam Tensor q (B, Nq, d)
 * @tparam Tensor k (B, Nk, d)
 * @tparam Tensor v (B, Nk, dv)
 * @tparam boolean causal
 * @tparam number eps
 * @tparam string feature "elu1" (phi = elu + 1) or "identity"
 * @treturn Tensor out (B, Nq, dv)
 */
static int l_linear_attention_forward(lua_State *L) {
  attn_tensor *q = attn_l_check(L, 1), *k = attn_l_check(L, 2), *v = attn_l_check(L, 3);
  attn_linear_opts o;
  read_opts(L, 4, &o);
  attn_tensor *out = push_out(L, q, dim_or0(q, 1), dim_or0(v, 2));
  ATTN_L_TRY(L, attn_linear_attention_forward(q, k, v, &o, out));
  return 1;
}

/***
 * The gradients of linear_attention_forward.
 * @function linear_attention_backward
 * @tparam Tensor q (B, Nq, d)
 * @tparam Tensor k (B, Nk, d)
 * @tparam Tensor v (B, Nk, dv)
 * @tparam Tensor out (B, Nq, dv), the forward's result
 * @tparam Tensor g (B, Nq, dv), the gradient at out
 * @tparam boolean causal
 * @tparam number eps
 * @tparam string feature
 * @treturn Tensor dq (B, Nq, d)
 * @treturn Tensor dk (B, Nk, d)
 * @treturn Tensor dv (B, Nk, dv)
 */
static int l_linear_attention_backward(lua_State *L) {
  attn_tensor *q = attn_l_check(L, 1), *k = attn_l_check(L, 2), *v = attn_l_check(L, 3);
  attn_tensor *out = attn_l_check(L, 4), *g = attn_l_check(L, 5);
  attn_linear_opts o;
  read_opts(L, 6, &o);
  attn_tensor *dq = push_out(L, q, dim_or0(q, 1), dim_or0(q, 2));
  attn_tensor *dk = push_out(L, q, dim_or0(k, 1), dim_or0(k, 2));
  attn_tensor *dv = push_out(L, q, dim_or0(v, 1), dim_or0(v, 2));
  ATTN_L_TRY(L, attn_linear_attention_backward(q, k, v, out, g, &o, dq, dk, dv));
  return 3;
}

static const luaL_Reg linear_functions[] = {
    {"linear_attention_forward", l_linear_attention_forward},
    {"linear_attention_backward", l_linear_attention_backward},
    {NULL, NULL},
};

void attn_l_open_linear(lua_State *L) { attn_l_setfuncs(L, linear_functions); }
