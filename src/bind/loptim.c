/* Binding: fused optimizer updates and gradient norms (attn_optim.h); the
 * optimizers and clip_grad_norm_ that call them live in lua/attn/optim.lua and
 * lua/attn/nn/clip.lua. */
#include "bind/lbind.h"

/* adam_step(p, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay,
 * decoupled, step[, maximize, max_exp_avg_sq|nil]): updates p, exp_avg and
 * exp_avg_sq (and max_exp_avg_sq: amsgrad) in place; returns p. */
static int l_adam_step(lua_State *L) {
  attn_tensor *p = attn_l_check(L, 1), *g = attn_l_check(L, 2), *m = attn_l_check(L, 3), *v = attn_l_check(L, 4);
  attn_adam_options o = {attn_l_checknumber(L, 5, "lr"), attn_l_checknumber(L, 6, "beta1"),
                         attn_l_checknumber(L, 7, "beta2"), attn_l_checknumber(L, 8, "eps"),
                         attn_l_checknumber(L, 9, "weight_decay"), lua_toboolean(L, 10),
                         (int64_t)attn_l_checkinteger(L, 11, "step"), lua_toboolean(L, 12)};
  attn_tensor *vmax = lua_isnoneornil(L, 13) ? NULL : attn_l_check(L, 13);
  ATTN_L_TRY(L, attn_adam_step(p, g, m, v, vmax, &o));
  attn_l_bump_version(p);
  attn_l_bump_version(m);
  attn_l_bump_version(v);
  if (vmax) attn_l_bump_version(vmax);
  lua_settop(L, 1);
  return 1;
}

/* sgd_step(p, grad, buf|nil, lr, momentum, dampening, weight_decay, nesterov,
 * first[, maximize]): updates p (and buf) in place; returns p. */
static int l_sgd_step(lua_State *L) {
  attn_tensor *p = attn_l_check(L, 1), *g = attn_l_check(L, 2);
  attn_tensor *buf = lua_isnil(L, 3) ? NULL : attn_l_check(L, 3);
  attn_sgd_options o = {attn_l_checknumber(L, 4, "lr"), attn_l_checknumber(L, 5, "momentum"),
                        attn_l_checknumber(L, 6, "dampening"), attn_l_checknumber(L, 7, "weight_decay"),
                        lua_toboolean(L, 8), lua_toboolean(L, 9), lua_toboolean(L, 10)};
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

/* grads_norm(list[, p]) -> the p-norm (default 2; math.huge: max |x|) of the
 * tensors taken together (contiguous) */
static int l_grads_norm(lua_State *L) {
  double p = lua_isnoneornil(L, 2) ? 2 : attn_l_checknumber(L, 2, "p");
  lua_settop(L, 1);
  int64_t n;
  attn_tensor **list = check_list(L, 1, &n);
  double norm;
  ATTN_L_TRY(L, attn_grads_norm_p(n, (const attn_tensor *const *)list, p, &norm));
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

/* grads_clamp_(list, lo, hi): every tensor clamped in place to [lo, hi] */
static int l_grads_clamp_(lua_State *L) {
  double lo = attn_l_checknumber(L, 2, "lo"), hi = attn_l_checknumber(L, 3, "hi");
  lua_settop(L, 1);
  int64_t n;
  attn_tensor **list = check_list(L, 1, &n);
  ATTN_L_TRY(L, attn_grads_clamp_(n, list, lo, hi));
  for (int64_t i = 0; i < n; i++) attn_l_bump_version(list[i]);
  return 0;
}

/* The per-step lists of adam_steps / sgd_steps: `count` lists of tensors
 * (args 1..count, the first `nlist` required, later ones may be nil) read
 * into one pointer block of the userdata pushed on the stack, nothing
 * allocated after the first pointer is taken. Entries whose operands are all
 * contiguous are packed at the front (their count in *fused); the others'
 * 1-based positions go to `left`, which has room for n. */
typedef struct {
  attn_tensor **t;   /* count arrays of n: list j's packed entries at t + j * n */
  int64_t *position; /* n: the list position of each packed entry */
  int64_t *left;     /* n: positions left to the caller */
  int64_t n, fused, nleft;
} step_lists;

static void read_step_lists(lua_State *L, int count, const char *const *names, step_lists *s) {
  attn_l_checktable(L, 1, "params");
  int64_t n = (int64_t)lua_rawlen(L, 1);
  int present[5] = {0, 0, 0, 0, 0};
  for (int j = 0; j < count; j++) {
    if (j >= 2 && lua_isnil(L, j + 1)) continue; /* sgd_steps without momentum buffers, adam without amsgrad */
    attn_l_checktable(L, j + 1, names[j]);
    if ((int64_t)lua_rawlen(L, j + 1) != n)
      attn_l_error(L, "%s: %s has %d entries, params %d", attn_l_fname(L), names[j], (int)lua_rawlen(L, j + 1), (int)n);
    present[j] = 1;
  }
  size_t per = (size_t)(n ? n : 1);
  char *block = lua_newuserdatauv(L, per * ((size_t)count * sizeof(attn_tensor *) + 3 * sizeof(int64_t)), 0);
  s->t = (attn_tensor **)block;
  s->position = (int64_t *)(block + per * (size_t)count * sizeof(attn_tensor *));
  s->left = s->position + per;
  s->n = n, s->fused = 0, s->nleft = 0;
  for (int64_t i = 0; i < n; i++) {
    attn_tensor *row[5] = {NULL, NULL, NULL, NULL, NULL};
    int contiguous = 1;
    for (int j = 0; j < count; j++) {
      if (!present[j]) continue;
      lua_rawgeti(L, j + 1, (lua_Integer)i + 1);
      row[j] = attn_l_test(L, -1);
      if (!row[j]) attn_l_error(L, "%s: %s[%d] is not a tensor", attn_l_fname(L), names[j], (int)i + 1);
      lua_pop(L, 1); /* the list keeps it alive */
      contiguous = contiguous && attn_tensor_is_contiguous(row[j]);
    }
    if (!contiguous) {
      s->left[s->nleft++] = i + 1;
      continue;
    }
    for (int j = 0; j < count; j++) s->t[(int64_t)j * n + s->fused] = row[j];
    s->position[s->fused++] = i + 1;
  }
}

/* Returns nil, or the list of positions left to the caller. */
static int push_left(lua_State *L, const step_lists *s) {
  if (s->nleft == 0) return 0;
  lua_createtable(L, (int)s->nleft, 0);
  for (int64_t i = 0; i < s->nleft; i++) {
    lua_pushinteger(L, (lua_Integer)s->left[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

/* adam_steps(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2,
 * eps, weight_decay, decoupled[, maximize, max_exp_avg_sqs|nil]): one Adam
 * update per position (steps[i] its step count; amsgrad when the list of
 * max_exp_avg_sqs is given), every parameter checked before any changes.
 * Entries with an operand that is not contiguous are left to the caller:
 * returns nil, or the list of their positions. */
static int l_adam_steps(lua_State *L) {
  attn_adam_options o = {attn_l_checknumber(L, 6, "lr"), attn_l_checknumber(L, 7, "beta1"),
                         attn_l_checknumber(L, 8, "beta2"), attn_l_checknumber(L, 9, "eps"),
                         attn_l_checknumber(L, 10, "weight_decay"), lua_toboolean(L, 11), 0, lua_toboolean(L, 12)};
  attn_l_checktable(L, 5, "steps");
  int has_max = !lua_isnoneornil(L, 13);
  lua_settop(L, 13);
  lua_copy(L, 13, 6); /* the max list becomes list 5, after steps (read below from 5) */
  lua_settop(L, 6);
  int64_t n = (int64_t)lua_rawlen(L, 1);
  if ((int64_t)lua_rawlen(L, 5) != n) attn_l_error(L, "adam_steps: steps has %d entries, params %d",
                                                   (int)lua_rawlen(L, 5), (int)n);
  int64_t *steps = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *steps, 0);
  for (int64_t i = 0; i < n; i++) {
    lua_rawgeti(L, 5, (lua_Integer)i + 1);
    int isint;
    steps[i] = (int64_t)lua_tointegerx(L, -1, &isint);
    if (!isint) attn_l_error(L, "adam_steps: steps[%d] must be an integer", (int)i + 1);
    lua_pop(L, 1);
  }
  lua_copy(L, 6, 5); /* steps read: the max list (or nil) takes its place as list 5 */
  static const char *const names[] = {"params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"};
  step_lists s;
  read_step_lists(L, 5, names, &s);
  for (int64_t k = 0; k < s.fused; k++) steps[k] = steps[s.position[k] - 1]; /* packed like the tensors */
  ATTN_L_TRY(L, attn_adam_steps(s.fused, s.t, (const attn_tensor *const *)s.t + n, s.t + 2 * n, s.t + 3 * n,
                                has_max ? s.t + 4 * n : NULL, steps, &o));
  for (int64_t k = 0; k < s.fused; k++) {
    attn_l_bump_version(s.t[k]);
    attn_l_bump_version(s.t[2 * n + k]);
    attn_l_bump_version(s.t[3 * n + k]);
    if (has_max) attn_l_bump_version(s.t[4 * n + k]);
  }
  return push_left(L, &s);
}

/* sgd_steps(params, grads, bufs|nil, firsts|nil, lr, momentum, dampening,
 * weight_decay, nesterov[, maximize]): one SGD update per position; bufs nil when
 * momentum is 0; firsts[i] true when bufs[i] holds nothing yet (nil: none). Returns as
 * adam_steps. */
static int l_sgd_steps(lua_State *L) {
  attn_sgd_options o = {attn_l_checknumber(L, 5, "lr"), attn_l_checknumber(L, 6, "momentum"),
                        attn_l_checknumber(L, 7, "dampening"), attn_l_checknumber(L, 8, "weight_decay"),
                        lua_toboolean(L, 9), 0, lua_toboolean(L, 10)};
  int has_first = !lua_isnil(L, 4);
  if (has_first) attn_l_checktable(L, 4, "firsts");
  lua_settop(L, 4);
  int64_t n = (int64_t)lua_rawlen(L, 1);
  if (has_first && (int64_t)lua_rawlen(L, 4) != n)
    attn_l_error(L, "sgd_steps: firsts has %d entries, params %d", (int)lua_rawlen(L, 4), (int)n);
  unsigned char *first = lua_newuserdatauv(L, (size_t)(n ? n : 1), 0);
  for (int64_t i = 0; i < n; i++) {
    first[i] = 0;
    if (!has_first) continue;
    lua_rawgeti(L, 4, (lua_Integer)i + 1);
    first[i] = (unsigned char)lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  int has_buf = !lua_isnil(L, 3);
  static const char *const names[] = {"params", "grads", "bufs"};
  step_lists s;
  read_step_lists(L, 3, names, &s);
  for (int64_t k = 0; k < s.fused; k++) first[k] = first[s.position[k] - 1];
  ATTN_L_TRY(L, attn_sgd_steps(s.fused, s.t, (const attn_tensor *const *)s.t + n, has_buf ? s.t + 2 * n : NULL,
                               first, &o));
  for (int64_t k = 0; k < s.fused; k++) {
    attn_l_bump_version(s.t[k]);
    if (has_buf) attn_l_bump_version(s.t[2 * n + k]);
  }
  return push_left(L, &s);
}

static const luaL_Reg optim_functions[] = {
    {"adam_steps", l_adam_steps},
    {"sgd_steps", l_sgd_steps},
    {"adam_step", l_adam_step},
    {"sgd_step", l_sgd_step},
    {"grads_norm", l_grads_norm},
    {"grads_scale_", l_grads_scale_},
    {"grads_clamp_", l_grads_clamp_},
    {NULL, NULL},
};

void attn_l_open_optim(lua_State *L) { attn_l_setfuncs(L, optim_functions); }
