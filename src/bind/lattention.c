/* Binding: the attention kernels (raw, no autograd; lua/attn/attention.lua
 * wraps them). Shapes and masking semantics are documented in
 * src/attention/attn_attention.h. Options arrive as a table:
 *   valid_lens (tensor or table, 1-D (B) or 2-D (B, Nq)), mask (keep-mask
 *   tensor or nested table), causal (boolean), window (integer >= 0), scale
 *   (number), dropout (probability; > 0 turns it on), training (boolean,
 *   default true: false keeps dropout off), seed (integer; drawn from the
 *   generator when dropout is on and none is given), need_weights (boolean,
 *   default true), kernel (name), name (string for error messages of the
 *   scores kernels), bias (tensor: the additive bias), alibi (tensor: ALiBi's slopes),
 *   heads (integer: 3-D rows are batch-major heads), pattern ("strided" or "fixed") with
 *   stride and summary, global (table of 1-based positions).
 * This file only converts Lua values to C: it checks types (and that window
 * is not negative, as C's window < 0 means "off"); shapes, ranges and
 * dtypes are the core's to check (attn_attention.c), and option-table keys
 * are Lua's (lua/attn/attention.lua). */
#include <string.h>

#include "attention/attn_attention.h"
#include "bind/lbind.h"

/* valid lengths at idx: nil -> NULL; a tensor; or a table of numbers (1-D) or of
 * rows (2-D), converted to a float64 tensor left on the stack. */
static const attn_tensor *opt_lens(lua_State *L, int idx, const char *fn, const char *arg) {
  idx = lua_absindex(L, idx);
  if (lua_isnoneornil(L, idx)) return NULL;
  attn_tensor *t = attn_l_test(L, idx);
  if (t) return t;
  if (!lua_istable(L, idx))
    attn_l_error(L, "%s: %s must be a tensor or a table of integers, got a %s", fn, arg, luaL_typename(L, idx));
  int64_t shape[2] = {(int64_t)lua_rawlen(L, idx), 0};
  int ndim = 1;
  if (shape[0] > 0 && lua_rawgeti(L, idx, 1) == LUA_TTABLE) {
    ndim = 2;
    shape[1] = (int64_t)lua_rawlen(L, -1);
  }
  lua_pop(L, shape[0] > 0 ? 1 : 0);
  attn_tensor *out = attn_l_push_alloc(L, ATTN_F64, ndim, shape);
  double *data = attn_tensor_data(out);
  for (int64_t r = 0; r < shape[0]; r++) {
    lua_rawgeti(L, idx, (lua_Integer)r + 1);
    if (ndim == 1) {
      if (lua_type(L, -1) != LUA_TNUMBER)
        attn_l_error(L, "%s: %s entry %I is a %s, not a number", fn, arg, (lua_Integer)r + 1, luaL_typename(L, -1));
      data[r] = lua_tonumber(L, -1);
    } else {
      if (!lua_istable(L, -1) || (int64_t)lua_rawlen(L, -1) != shape[1])
        attn_l_error(L, "%s: %s must be a table of numbers or of rows of equal length %I (row %I differs)", fn, arg,
                   (lua_Integer)shape[1], (lua_Integer)r + 1);
      for (int64_t c = 0; c < shape[1]; c++) {
        lua_rawgeti(L, -1, (lua_Integer)c + 1);
        if (lua_type(L, -1) != LUA_TNUMBER)
          attn_l_error(L, "%s: %s entry [%I][%I] is a %s, not a number", fn, arg, (lua_Integer)r + 1, (lua_Integer)c + 1,
                     luaL_typename(L, -1));
        data[r * shape[1] + c] = lua_tonumber(L, -1);
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);
  }
  return out;
}

/* Raises "fn: name must be <what>, got <the value>" for the value at idx: a number or string is
 * shown itself (it says most), anything else by its type. */
static int bad_value(lua_State *L, int idx, const char *fn, const char *name, const char *what) {
  int t = lua_type(L, idx);
  if (t == LUA_TNUMBER || t == LUA_TSTRING) {
    lua_pushvalue(L, idx); /* lua_tostring converts in place: a copy */
    return attn_l_error(L, "%s: %s must be %s, got %s", fn, name, what, lua_tostring(L, -1));
  }
  return attn_l_error(L, "%s: %s must be %s, got a %s", fn, name, what, luaL_typename(L, idx));
}

/* The options read_opts knows; it reads them in this order (so raises on the first bad one). */
enum {
  O_VALID_LENS, O_MASK, O_CAUSAL, O_TRAINING, O_WINDOW, O_PATTERN, O_STRIDE, O_SUMMARY, O_GLOBAL,
  O_SCALE, O_DROPOUT, O_SEED, O_KERNEL, O_BIAS, O_ALIBI, O_HEADS, O_NEED_WEIGHTS, O_COUNT
};

/* The option named k (n bytes), or -1: a switch on the first byte and one comparison. */
static int opt_key(const char *k, size_t n) {
#define IS(s, o) (n == sizeof(s) - 1 && memcmp(k, s, n) == 0 ? (o) : -1)
  switch (k[0]) {
  case 'a': return IS("alibi", O_ALIBI);
  case 'b': return IS("bias", O_BIAS);
  case 'c': return IS("causal", O_CAUSAL);
  case 'd': return IS("dropout", O_DROPOUT);
  case 'g': return IS("global", O_GLOBAL);
  case 'h': return IS("heads", O_HEADS);
  case 'k': return IS("kernel", O_KERNEL);
  case 'm': return IS("mask", O_MASK);
  case 'n': return IS("need_weights", O_NEED_WEIGHTS);
  case 'p': return IS("pattern", O_PATTERN);
  case 's':
    if (n > 1 && k[1] == 'c') return IS("scale", O_SCALE);
    if (n > 1 && k[1] == 'e') return IS("seed", O_SEED);
    if (n > 2 && k[2] == 'r') return IS("stride", O_STRIDE);
    return IS("summary", O_SUMMARY);
  case 't': return IS("training", O_TRAINING);
  case 'v': return IS("valid_lens", O_VALID_LENS);
  case 'w': return IS("window", O_WINDOW);
  default: return -1;
  }
#undef IS
}

/* Copies the known options of the table at idx (absolute) into O_COUNT stack slots from the
 * returned index on (nil when absent), in one raw pass over the keys the table has: a layer's
 * call passes a handful of the seventeen, and a lookup per known option cost more than its
 * kernel's setup. */
static int gather_opts(lua_State *L, int idx) {
  luaL_checkstack(L, O_COUNT + 2, "options");
  int slot = lua_gettop(L) + 1;
  lua_settop(L, slot + O_COUNT - 1);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) == LUA_TSTRING) { /* (lua_tolstring on another key would confuse lua_next) */
      size_t n;
      const char *k = lua_tolstring(L, -2, &n);
      int i = n ? opt_key(k, n) : -1;
      if (i >= 0) lua_copy(L, -1, slot + i);
    }
    lua_pop(L, 1);
  }
  return slot;
}

/* The boolean option `key` in stack slot at: def when absent. */
static int opt_bool(lua_State *L, int at, const char *fn, const char *key, int def) {
  int t = lua_type(L, at);
  if (t == LUA_TNIL) return def;
  if (t != LUA_TBOOLEAN) bad_value(L, at, fn, key, "a boolean");
  return lua_toboolean(L, at);
}

/* The integer option `key` in stack slot at: def when absent. */
static int64_t opt_int(lua_State *L, int at, const char *fn, const char *key, const char *what, int64_t def) {
  if (lua_isnil(L, at)) return def;
  int isint;
  lua_Integer v = lua_tointegerx(L, at, &isint);
  if (!isint) bad_value(L, at, fn, key, what);
  return (int64_t)v;
}

/* pattern ("strided" or "fixed"), stride, summary and global (a table of 1-based positions, made
 * 0-based in a userdata that stays on the stack); the C core checks the values. s: the slots. */
static void read_pattern(lua_State *L, int s, const char *fn, attn_attention_opts *o) {
  int at = s + O_PATTERN;
  if (!lua_isnil(L, at)) {
    const char *str = lua_type(L, at) == LUA_TSTRING ? lua_tostring(L, at) : NULL;
    if (str && strcmp(str, "strided") == 0)
      o->pattern = ATTN_PATTERN_STRIDED;
    else if (str && strcmp(str, "fixed") == 0)
      o->pattern = ATTN_PATTERN_FIXED;
    else
      bad_value(L, at, fn, "pattern", "\"strided\" or \"fixed\"");
  }
  o->stride = opt_int(L, s + O_STRIDE, fn, "stride", "an integer >= 1", 0);
  o->summary = opt_int(L, s + O_SUMMARY, fn, "summary", "an integer in 1..stride", 0);
  if (o->pattern == ATTN_PATTERN_NONE && (o->stride || o->summary))
    attn_l_error(L, "%s: %s is given without a pattern (\"strided\" or \"fixed\")", fn, o->stride ? "stride" : "summary");
  at = s + O_GLOBAL;
  if (!lua_isnil(L, at)) {
    if (!lua_istable(L, at)) bad_value(L, at, fn, "global", "a table of 1-based positions");
    int64_t n = (int64_t)lua_rawlen(L, at);
    int64_t *g = lua_newuserdatauv(L, sizeof(int64_t) * (size_t)(n ? n : 1), 0); /* stays on the stack */
    for (int64_t i = 0; i < n; i++) {
      lua_rawgeti(L, at, (lua_Integer)(i + 1));
      int isint;
      lua_Integer p = lua_tointegerx(L, -1, &isint);
      if (!isint) bad_value(L, -1, fn, "global", "a table of integer positions");
      g[i] = (int64_t)p - 1;
      lua_pop(L, 1);
    }
    o->global = g;
    o->nglobal = n;
  }
}

/* Reads the options table at idx (may be nil). Its values and the tensors it creates stay on the
 * stack. */
static void read_opts(lua_State *L, int idx, const char *fn, attn_attention_opts *o, int *need_weights) {
  attn_attention_opts_init(o);
  *need_weights = 1;
  if (lua_isnoneornil(L, idx)) return;
  idx = lua_absindex(L, idx);
  attn_l_checktable(L, idx, "options");
  int s = gather_opts(L, idx), at;

  o->valid_lens = opt_lens(L, s + O_VALID_LENS, fn, "valid_lens"); /* a converted table stays on the stack */

  at = s + O_MASK;
  if (!lua_isnil(L, at)) {
    o->mask = attn_l_test(L, at);
    if (!o->mask && lua_type(L, at) == LUA_TTABLE)
      o->mask = attn_l_push_table(L, at, ATTN_F32); /* stays on the stack */
    if (!o->mask)
      attn_l_error(L, "%s: mask must be a keep-mask tensor or nested table (1 attend, 0 ignore), got a %s", fn,
                   luaL_typename(L, at));
    if (o->mask && o->mask->dtype == ATTN_I64) { /* a comparison of ids: the kernels read float masks */
      attn_tensor *m = attn_l_push_alloc(L, ATTN_F64, o->mask->ndim, o->mask->shape);
      if (attn_copy(m, o->mask) != ATTN_OK) attn_l_raise(L);
      o->mask = m; /* stays on the stack */
    }
  }

  o->causal = opt_bool(L, s + O_CAUSAL, fn, "causal", 0);
  o->training = opt_bool(L, s + O_TRAINING, fn, "training", 1);

  at = s + O_WINDOW;
  if (!lua_isnil(L, at)) {
    int isint;
    lua_Integer w = lua_tointegerx(L, at, &isint);
    if (!isint || w < 0) {
      lua_pushvalue(L, at); /* lua_tostring converts in place: a copy */
      attn_l_error(L, "%s: window must be an integer >= 0 (keys within that distance), got %s", fn,
                   lua_type(L, at) == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, at));
    }
    o->window = (int64_t)w;
  }

  read_pattern(L, s, fn, o);

  at = s + O_SCALE;
  if (!lua_isnil(L, at)) {
    if (lua_type(L, at) != LUA_TNUMBER) attn_l_error(L, "%s: scale must be a number, got a %s", fn, luaL_typename(L, at));
    o->scale = lua_tonumber(L, at);
  }

  at = s + O_DROPOUT;
  if (!lua_isnil(L, at)) {
    if (lua_type(L, at) != LUA_TNUMBER)
      attn_l_error(L, "%s: dropout must be a probability in [0, 1], got a %s", fn, luaL_typename(L, at));
    o->dropout = lua_tonumber(L, at);
  }

  at = s + O_SEED;
  if (!lua_isnil(L, at)) {
    int isint;
    lua_Integer seed = lua_tointegerx(L, at, &isint);
    if (!isint) attn_l_error(L, "%s: seed must be an integer", fn);
    o->seed = (uint64_t)seed;
  } else if (o->dropout > 0 && o->training) {
    o->seed = attn_rng_next(attn_l_rng(L));
  }

  at = s + O_KERNEL;
  if (!lua_isnil(L, at)) {
    static const char *const names[] = {"auto", "reference", "flash", "flash_generic", "flash_avx2", "flash_avx512",
                                        "tiny", NULL};
    const char *str = lua_type(L, at) == LUA_TSTRING ? lua_tostring(L, at) : "";
    int found = -1;
    for (int i = 0; names[i]; i++)
      if (strcmp(str, names[i]) == 0) found = i;
    if (found < 0)
      attn_l_error(L, "%s: kernel must be one of auto, reference, flash, flash_generic, flash_avx2, flash_avx512, tiny", fn);
    o->kernel = found; /* the names follow the ATTN_KERNEL_* order */
  }

  /* the scores' additive parts: tensors (Lua makes alibi = true the slopes) */
  static const char *const extra[2] = {"bias", "alibi"};
  for (int n = 0; n < 2; n++) {
    at = s + O_BIAS + n;
    if (!lua_isnil(L, at)) {
      const attn_tensor *t = attn_l_test(L, at);
      if (!t) attn_l_error(L, "%s: %s must be a tensor, got a %s", fn, extra[n], luaL_typename(L, at));
      if (n == 0)
        o->bias = t;
      else
        o->alibi = t;
    }
  }
  at = s + O_HEADS;
  if (!lua_isnil(L, at)) {
    int isint;
    lua_Integer h = lua_tointegerx(L, at, &isint);
    if (!isint || h < 1) bad_value(L, at, fn, "heads", "an integer >= 1");
    o->heads = (int64_t)h;
  }

  *need_weights = opt_bool(L, s + O_NEED_WEIGHTS, fn, "need_weights", 1);
}

static const char *opt_name(lua_State *L, int idx, const char *def) {
  if (!lua_istable(L, idx)) return def;
  attn_l_rawfield(L, idx, "name");
  /* only a real string: the opts table then keeps it alive (a number would be
   * converted in a stack slot that is popped, leaving a dangling pointer) */
  const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : def;
  lua_pop(L, 1);
  return s;
}

/* want[k]: whether gradient k ("q", "k", "v" / "scores", "values") is wanted; table at idx or nil (all). */
static int wants(lua_State *L, int idx, const char *key) {
  if (!lua_istable(L, idx)) return 1;
  attn_l_rawfield(L, idx, key);
  int w = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return w;
}

static void push_seed(lua_State *L, const attn_attention_opts *o) {
  if (o->dropout > 0 && o->training)
    lua_pushinteger(L, (lua_Integer)o->seed);
  else
    lua_pushnil(L);
}

/***
 * Scaled dot-product attention forward.
 * @function sdpa_forward
 * @tparam Tensor q (B, Nq, d) or (B, H, Nq, d)
 * @tparam Tensor k (B, Nk, d) or (B, Hkv, Nk, d)
 * @tparam Tensor v (B, Nk, dv) or (B, Hkv, Nk, dv)
 * @tparam[opt] table opts see the file comment
 * @treturn Tensor out (B, Nq, dv) or (B, H, Nq, dv)
 * @treturn ?Tensor weights (B, Nq, Nk) or (B, H, Nq, Nk), nil when need_weights is false
 * @treturn ?integer the dropout seed (nil without dropout)
 * @treturn ?Tensor lse (B, Nq), each row's log-sum-exp for the flash backward (nil when the
 *   reference path ran)
 */
static int l_sdpa_forward(lua_State *L) {
  attn_tensor *q = attn_l_check(L, 1), *k = attn_l_check(L, 2), *v = attn_l_check(L, 3);
  attn_attention_opts o;
  int need_weights;
  read_opts(L, 4, "dot_product_attention", &o, &need_weights);
  /* outputs sized from 3-D or 4-D operands (empty otherwise: the core then names the operand at
   * fault): out (B, [H,] Nq, dv), weights (B, [H,] Nq, Nk), lse (B*H, Nq) */
  int nd = q->ndim, ok = (nd == 3 || nd == 4) && k->ndim == nd && v->ndim == nd, r = nd - 3;
  int64_t os[4] = {0}, ws[4] = {0}, ls[2] = {0};
  if (ok) {
    for (int d = 0; d < nd - 1; d++) os[d] = ws[d] = q->shape[d];
    os[nd - 1] = v->shape[nd - 1];
    ws[nd - 1] = k->shape[nd - 2];
    ls[0] = q->shape[0] * (r ? q->shape[1] : 1);
    ls[1] = q->shape[1 + r];
  } else {
    nd = 3;
  }
  attn_tensor *out = attn_l_push_alloc(L, q->dtype, nd, os);
  int out_idx = lua_gettop(L);
  attn_tensor *w = need_weights ? attn_l_push_alloc(L, q->dtype, nd, ws) : (lua_pushnil(L), NULL);
  int flash = q->dtype == ATTN_F32 && attn_sdpa_flash_size(ls[1], ws[nd - 1], o.kernel);
  attn_tensor *lse = flash ? attn_l_push_alloc(L, ATTN_F64, 2, ls) : NULL;
  int flash_ran;
  ATTN_L_TRY(L, attn_sdpa_forward(q, k, v, &o, out, w, lse, &flash_ran));
  lua_pushvalue(L, out_idx);
  lua_pushvalue(L, out_idx + 1);
  push_seed(L, &o);
  if (flash_ran)
    lua_pushvalue(L, out_idx + 2);
  else
    lua_pushnil(L);
  return 4;
}

/***
 * Gradients of sdpa_forward.
 * @function sdpa_backward
 * @tparam Tensor q
 * @tparam Tensor k
 * @tparam Tensor v
 * @tparam table opts the forward's options, including its seed
 * @tparam ?Tensor dout gradient of out (or nil)
 * @tparam ?Tensor dweights gradient of weights (or nil)
 * @tparam ?Tensor weights the stored weights (nil: recomputed)
 * @tparam[opt] table want {q = bool, k = bool, v = bool} (default: all)
 * @tparam[opt] Tensor out the forward's output (with lse: the flash backward)
 * @tparam[opt] Tensor lse the forward's fourth result
 * @treturn ?Tensor dq
 * @treturn ?Tensor dk
 * @treturn ?Tensor dv
 */
static int l_sdpa_backward(lua_State *L) {
  attn_tensor *q = attn_l_check(L, 1), *k = attn_l_check(L, 2), *v = attn_l_check(L, 3);
  attn_tensor *dout = lua_isnoneornil(L, 5) ? NULL : attn_l_check(L, 5);
  attn_tensor *dw = lua_isnoneornil(L, 6) ? NULL : attn_l_check(L, 6);
  attn_tensor *w = lua_isnoneornil(L, 7) ? NULL : attn_l_check(L, 7);
  int want_q = wants(L, 8, "q"), want_k = wants(L, 8, "k"), want_v = wants(L, 8, "v");
  attn_tensor *out = lua_isnoneornil(L, 9) ? NULL : attn_l_check(L, 9);
  attn_tensor *lse = lua_isnoneornil(L, 10) ? NULL : attn_l_check(L, 10);
  attn_attention_opts o;
  int need_weights;
  read_opts(L, 4, "dot_product_attention backward", &o, &need_weights);
  attn_tensor *dq = want_q ? attn_l_push_like(L, q) : (lua_pushnil(L), NULL);
  attn_tensor *dk = want_k ? attn_l_push_like(L, k) : (lua_pushnil(L), NULL);
  attn_tensor *dv = want_v ? attn_l_push_like(L, v) : (lua_pushnil(L), NULL);
  ATTN_L_TRY(L, attn_sdpa_backward(q, k, v, &o, w, out, lse, dout, dw, dq, dk, dv));
  return 3;
}

/***
 * The FMA peak of one core (see attn_flash_fma_peak).
 * @function fma_peak
 * @treturn number FLOP/s
 * @treturn string the instruction set measured ("avx512", "avx2" or "generic")
 */
static int l_fma_peak(lua_State *L) {
  const char *isa = "generic";
  lua_pushnumber(L, attn_flash_fma_peak(&isa));
  lua_pushstring(L, isa);
  return 2;
}

/***
 * Test hook: the score tiles the flash forward has computed in this process (see attn_flash_tiles).
 * @function flash_tiles
 * @treturn int tiles of up to 64 queries x 128 keys
 */
static int l_flash_tiles(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)attn_flash_tiles());
  return 1;
}

/***
 * Masking, softmax, dropout and weighted sum over given scores.
 * @function scores_attention_forward
 * @tparam Tensor scores (B, Nq, Nk)
 * @tparam ?Tensor v (B, Nk, dv) or nil (weights only)
 * @tparam[opt] table opts
 * @treturn ?Tensor out (nil without v)
 * @treturn ?Tensor weights
 * @treturn ?integer seed
 */
static int l_scores_attention_forward(lua_State *L) {
  attn_tensor *s = attn_l_check(L, 1);
  attn_tensor *v = lua_isnoneornil(L, 2) ? NULL : attn_l_check(L, 2);
  const char *name = opt_name(L, 3, "attention");
  attn_attention_opts o;
  int need_weights;
  read_opts(L, 3, name, &o, &need_weights);
  if (!v) need_weights = 1;
  int ok = s->ndim == 3 && (!v || v->ndim == 3); /* else empty outputs: the core names the operand */
  int64_t os[3] = {ok ? s->shape[0] : 0, ok ? s->shape[1] : 0, ok && v ? v->shape[2] : 0};
  attn_tensor *out = v ? attn_l_push_alloc(L, s->dtype, 3, os) : (lua_pushnil(L), NULL);
  attn_tensor *w = need_weights ? attn_l_push_like(L, s) : (lua_pushnil(L), NULL);
  ATTN_L_TRY(L, attn_attention_scores_forward(name, s, v, &o, out, w));
  push_seed(L, &o);
  return 3;
}

/***
 * Gradients of scores_attention_forward.
 * @function scores_attention_backward
 * @tparam Tensor scores
 * @tparam ?Tensor v
 * @tparam table opts the forward's options, including its seed
 * @tparam ?Tensor dout
 * @tparam ?Tensor dweights
 * @tparam ?Tensor weights stored weights or nil
 * @tparam[opt] table want {scores = bool, v = bool}
 * @treturn ?Tensor dscores
 * @treturn ?Tensor dv
 */
static int l_scores_attention_backward(lua_State *L) {
  attn_tensor *s = attn_l_check(L, 1);
  attn_tensor *v = lua_isnoneornil(L, 2) ? NULL : attn_l_check(L, 2);
  attn_tensor *dout = lua_isnoneornil(L, 4) ? NULL : attn_l_check(L, 4);
  attn_tensor *dw = lua_isnoneornil(L, 5) ? NULL : attn_l_check(L, 5);
  attn_tensor *w = lua_isnoneornil(L, 6) ? NULL : attn_l_check(L, 6);
  int want_s = wants(L, 7, "scores"), want_v = v && wants(L, 7, "v");
  const char *name = opt_name(L, 3, "attention");
  attn_attention_opts o;
  int need_weights;
  read_opts(L, 3, name, &o, &need_weights);
  attn_tensor *ds = want_s ? attn_l_push_like(L, s) : (lua_pushnil(L), NULL);
  attn_tensor *dv = want_v ? attn_l_push_like(L, v) : (lua_pushnil(L), NULL);
  ATTN_L_TRY(L, attn_attention_scores_backward(name, s, v, &o, w, dout, dw, ds, dv));
  return 2;
}

/***
 * d2l's masked softmax over the last dim of X (B, Q, K).
 * @function masked_softmax_forward
 * @tparam Tensor x
 * @tparam ?Tensor|table valid_lens (B) or (B, Q)
 * @treturn Tensor
 */
static int l_masked_softmax_forward(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  const attn_tensor *lens = opt_lens(L, 2, "masked_softmax", "valid_lens");
  attn_tensor *out = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_attention_masked_softmax_forward(x, lens, out));
  return 1;
}

/***
 * Gradient of masked_softmax_forward.
 * @function masked_softmax_backward
 * @tparam Tensor y the forward output
 * @tparam Tensor dy its gradient
 * @tparam ?Tensor|table valid_lens
 * @treturn Tensor dx
 */
static int l_masked_softmax_backward(lua_State *L) {
  attn_tensor *y = attn_l_check(L, 1), *dy = attn_l_check(L, 2);
  const attn_tensor *lens = opt_lens(L, 3, "masked_softmax", "valid_lens");
  attn_tensor *dx = attn_l_push_like(L, y);
  ATTN_L_TRY(L, attn_attention_masked_softmax_backward(y, dy, lens, dx));
  return 1;
}

/***
 * d2l's sequence_mask: entries of sample b at time steps past valid_len[b] become value.
 * @function sequence_mask
 * @tparam Tensor x (B, T, ...)
 * @tparam Tensor|table valid_len (B)
 * @tparam[opt=0] number value
 * @treturn Tensor
 */
static int l_sequence_mask(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  double value = attn_l_optnumber(L, 3, "value", 0);
  if (lua_isnoneornil(L, 2)) return attn_l_error(L, "sequence_mask: valid_len is required");
  const attn_tensor *lens = opt_lens(L, 2, "sequence_mask", "valid_len");
  attn_tensor *out = attn_l_push_like(L, x);
  ATTN_L_TRY(L, attn_attention_sequence_mask(x, lens, value, out));
  return 1;
}

/***
 * Additive attention scores w_v . tanh(qh[b,i] + kh[b,j]).
 * @function additive_scores_forward
 * @tparam Tensor qh (B, Nq, h)
 * @tparam Tensor kh (B, Nk, h)
 * @tparam Tensor w_v (h)
 * @treturn Tensor scores (B, Nq, Nk)
 */
static int l_additive_scores_forward(lua_State *L) {
  attn_tensor *qh = attn_l_check(L, 1), *kh = attn_l_check(L, 2), *wv = attn_l_check(L, 3);
  int ok = qh->ndim == 3 && kh->ndim == 3; /* else an empty output: the core names the operand */
  int64_t shape[3] = {ok ? qh->shape[0] : 0, ok ? qh->shape[1] : 0, ok ? kh->shape[1] : 0};
  attn_tensor *out = attn_l_push_alloc(L, qh->dtype, 3, shape);
  ATTN_L_TRY(L, attn_attention_additive_scores_forward(qh, kh, wv, out));
  return 1;
}

/***
 * Gradients of additive_scores_forward.
 * @function additive_scores_backward
 * @tparam Tensor qh
 * @tparam Tensor kh
 * @tparam Tensor w_v
 * @tparam Tensor dscores (B, Nq, Nk)
 * @tparam[opt] table want {qh = bool, kh = bool, w_v = bool}
 * @treturn ?Tensor dqh
 * @treturn ?Tensor dkh
 * @treturn ?Tensor dw_v
 */
static int l_additive_scores_backward(lua_State *L) {
  attn_tensor *qh = attn_l_check(L, 1), *kh = attn_l_check(L, 2), *wv = attn_l_check(L, 3);
  attn_tensor *ds = attn_l_check(L, 4);
  int wq = wants(L, 5, "qh"), wk = wants(L, 5, "kh"), ww = wants(L, 5, "w_v");
  attn_tensor *dq = wq ? attn_l_push_like(L, qh) : (lua_pushnil(L), NULL);
  attn_tensor *dk = wk ? attn_l_push_like(L, kh) : (lua_pushnil(L), NULL);
  attn_tensor *dw = ww ? attn_l_push_like(L, wv) : (lua_pushnil(L), NULL);
  ATTN_L_TRY(L, attn_attention_additive_scores_backward(qh, kh, wv, ds, dq, dk, dw));
  return 3;
}

/* Shared by split_heads and merge_heads: the output's shape comes from a 3-D x (an empty one
 * otherwise, so the core names x in its message). */
static int head_move(lua_State *L, int split) {
  attn_tensor *x = attn_l_check(L, 1);
  lua_Integer heads = attn_l_checkinteger(L, 2, "num_heads");
  int ok = x->ndim == 3 && heads >= 1 && (split ? x->shape[2] : x->shape[0]) % heads == 0;
  int64_t shape[3] = {0, 0, 0}, grown; /* left empty when a dim would pass int64: the core names x */
  if (ok && split && !__builtin_mul_overflow(x->shape[0], (int64_t)heads, &grown)) {
    shape[0] = grown, shape[1] = x->shape[1], shape[2] = x->shape[2] / heads;
  } else if (ok && !split && !__builtin_mul_overflow(x->shape[2], (int64_t)heads, &grown)) {
    shape[0] = x->shape[0] / heads, shape[1] = x->shape[1], shape[2] = grown;
  }
  attn_tensor *out = attn_l_push_alloc(L, x->dtype, 3, shape);
  ATTN_L_TRY(L, split ? attn_attention_split_heads(x, (int64_t)heads, out)
                      : attn_attention_merge_heads(x, (int64_t)heads, out));
  return 1;
}

/***
 * d2l's transpose_qkv as one copy: (B, N, H*dh) -> (B*H, N, dh), batch-major.
 * @function split_heads
 * @tparam Tensor x (B, N, H*dh)
 * @tparam integer num_heads H
 * @treturn Tensor (B*H, N, dh), contiguous
 */
static int l_split_heads(lua_State *L) { return head_move(L, 1); }

/***
 * d2l's transpose_output as one copy: (B*H, N, dh) -> (B, N, H*dh).
 * @function merge_heads
 * @tparam Tensor x (B*H, N, dh)
 * @tparam integer num_heads H
 * @treturn Tensor (B, N, H*dh), contiguous
 */
static int l_merge_heads(lua_State *L) { return head_move(L, 0); }

/* The tensor field `key` of the table at idx (read raw): NULL when absent; left on the stack
 * (the table keeps it alive anyway). */
static const attn_tensor *param_field(lua_State *L, int idx, const char *fn, const char *key, int required) {
  attn_l_rawfield(L, idx, key);
  if (lua_isnil(L, -1)) {
    if (required) attn_l_error(L, "%s: parameter %s is required", fn, key);
    return NULL;
  }
  attn_tensor *t = attn_l_test(L, -1);
  if (!t) attn_l_error(L, "%s: parameter %s must be a tensor, got a %s", fn, key, luaL_typename(L, -1));
  return t;
}

/* A float tensor of `dt` for an output, sized from the given dims (empty when an operand has the
 * wrong rank: the core then names it). */
static attn_tensor *push_out(lua_State *L, attn_dtype dt, int ok, int ndim, int64_t a, int64_t b, int64_t c) {
  int64_t shape[3] = {ok ? a : 0, ok ? b : 0, ok ? c : 0};
  return attn_l_push_alloc(L, dt, ndim, shape);
}

/***
 * d2l's AdditiveAttention forward in one call (see attn_attention_additive_layer_forward).
 * @function additive_layer_forward
 * @tparam Tensor queries (B, Nq, q)
 * @tparam Tensor keys (B, Nk, k)
 * @tparam Tensor values (B, Nk, dv)
 * @tparam Tensor w_q (h, q)
 * @tparam Tensor w_k (h, k)
 * @tparam Tensor w_v (1, h) or (h)
 * @tparam[opt] table opts as for sdpa_forward (name: the operation in errors)
 * @treturn Tensor out (B, Nq, dv)
 * @treturn ?Tensor weights (B, Nq, Nk), nil when need_weights is false
 * @treturn ?integer the dropout seed
 * @treturn table saved, for the backward: views qh (B, Nq, h), kh (B, Nk, h) and scores
 *   (B, Nq, Nk) of one buffer (attn_additive_saved_layout)
 */
static int l_additive_layer_forward(lua_State *L) {
  luaL_checkstack(L, 16, "projected_additive_attention");
  attn_tensor *q = attn_l_check(L, 1), *k = attn_l_check(L, 2), *v = attn_l_check(L, 3);
  attn_tensor *wq = attn_l_check(L, 4), *wk = attn_l_check(L, 5), *wv = attn_l_check(L, 6);
  attn_attention_opts o;
  int need_weights;
  read_opts(L, 7, "projected_additive_attention", &o, &need_weights);
  int ok = q->ndim == 3 && k->ndim == 3 && v->ndim == 3 && wq->ndim == 2;
  int64_t B = ok ? q->shape[0] : 0, Nq = ok ? q->shape[1] : 0, Nk = ok ? k->shape[1] : 0, h = ok ? wq->shape[0] : 0;
  int top = lua_gettop(L);
  attn_tensor *out = push_out(L, q->dtype, ok, 3, B, Nq, ok ? v->shape[2] : 0);
  attn_tensor *w = need_weights ? push_out(L, q->dtype, ok, 3, B, Nq, Nk) : (lua_pushnil(L), NULL);
  push_seed(L, &o);
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_additive_saved_layout(B, Nq, Nk, h, &lay));
  attn_tensor saved = attn_l_push_saved(L, &lay, q->dtype, 0);
  ATTN_L_TRY(L, attn_attention_additive_layer_forward(q, k, v, wq, wk, wv, &o, out, w, &saved));
  return lua_gettop(L) - top;
}

/***
 * Checks the saved table of additive_layer_forward before its backward reads saved.qh,
 * saved.kh and saved.scores: each part must have the shape the layout gives for these operands.
 * @function additive_layer_saved
 * @tparam table saved additive_layer_forward's fourth result
 * @tparam Tensor queries (B, Nq, q)
 * @tparam Tensor keys (B, Nk, k)
 * @tparam Tensor w_q (h, q)
 * @treturn table saved
 */
static int l_additive_layer_saved(lua_State *L) {
  const char *fn = "projected_additive_attention backward";
  attn_tensor *q = attn_l_check(L, 2), *k = attn_l_check(L, 3), *wq = attn_l_check(L, 4);
  if (q->ndim != 3 || k->ndim != 3 || wq->ndim != 2)
    return attn_l_error(L, "%s: queries %s, keys %s and W_q %s must be (B, Nq, q), (B, Nk, k) and (h, q)", fn,
                        attn_tensor_shape_str(q), attn_tensor_shape_str(k), attn_tensor_shape_str(wq));
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_additive_saved_layout(q->shape[0], q->shape[1], k->shape[1], wq->shape[0], &lay));
  attn_l_check_saved(L, 1, &lay, q->dtype, fn);
  lua_settop(L, 1);
  return 1;
}

/***
 * d2l's MultiHeadAttention forward in one call (see attn_attention_mha_forward).
 * @function mha_forward
 * @tparam Tensor queries (B, Nq, q)
 * @tparam Tensor keys (B, Nk, k)
 * @tparam Tensor values (B, Nk, v)
 * @tparam integer num_heads H
 * @tparam table params W_q, W_k, W_v, W_o and optional b_q, b_k, b_v, b_o
 * @tparam[opt] table opts as for sdpa_forward, per sample (valid_lens are repeated for the heads)
 * @treturn Tensor out (B, Nq, h)
 * @treturn ?Tensor weights (B*H, Nq, Nk), nil when need_weights is false
 * @treturn ?integer the dropout seed
 * @treturn table saved, for the backward: views qh (B*H, Nq, dh), kh and vh (B*H, Nk, dh), ctx
 *   (B*H, Nq, dh) and merged (B*Nq, h) of one buffer (attn_mha_saved_layout); flash, whether the
 *   flash kernel ran; lse (B*H, Nq), its row statistics for the flash backward (only when it ran)
 */
static int l_mha_forward(lua_State *L) {
  const char *fn = "multi_head_attention";
  luaL_checkstack(L, 24, fn); /* 8 parameters, the options' temporaries and 9 results */
  attn_tensor *q = attn_l_check(L, 1), *k = attn_l_check(L, 2), *v = attn_l_check(L, 3);
  attn_mha_params p;
  p.heads = (int64_t)attn_l_checkinteger(L, 4, "num_heads");
  attn_l_checktable(L, 5, "params");
  p.w_q = param_field(L, 5, fn, "W_q", 1), p.w_k = param_field(L, 5, fn, "W_k", 1);
  p.w_v = param_field(L, 5, fn, "W_v", 1), p.w_o = param_field(L, 5, fn, "W_o", 1);
  p.b_q = param_field(L, 5, fn, "b_q", 0), p.b_k = param_field(L, 5, fn, "b_k", 0);
  p.b_v = param_field(L, 5, fn, "b_v", 0), p.b_o = param_field(L, 5, fn, "b_o", 0);
  attn_attention_opts o;
  int need_weights;
  read_opts(L, 6, fn, &o, &need_weights);
  int64_t H = p.heads;
  int ok = q->ndim == 3 && k->ndim == 3 && p.w_q->ndim == 2 && H >= 1 && p.w_q->shape[0] % H == 0;
  int64_t B = ok ? q->shape[0] : 0, Nq = ok ? q->shape[1] : 0, Nk = ok ? k->shape[1] : 0;
  int64_t h = ok ? p.w_q->shape[0] : 0;
  int top = lua_gettop(L);
  attn_tensor *out = push_out(L, q->dtype, ok, 3, B, Nq, h);
  attn_tensor *w = need_weights ? push_out(L, q->dtype, ok, 3, B * H, Nq, Nk) : (lua_pushnil(L), NULL);
  push_seed(L, &o);
  int flash = q->dtype == ATTN_F32 && attn_sdpa_flash_size(Nq, Nk, o.kernel);
  attn_tensor *lse = flash ? push_out(L, ATTN_F64, ok, 2, B * H, Nq, 0) : NULL;
  int lse_idx = lua_gettop(L);
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_mha_saved_layout(B, Nq, Nk, h, ok ? H : 1, &lay));
  attn_tensor saved = attn_l_push_saved(L, &lay, q->dtype, 2);
  int flash_ran;
  ATTN_L_TRY(L, attn_attention_mha_forward(q, k, v, &p, &o, out, w, lse, &saved, &flash_ran));
  /* which path ran, said explicitly; the lse rides along only when the flash backward can use it */
  lua_pushboolean(L, flash_ran);
  lua_setfield(L, -2, "flash");
  if (flash_ran) {
    lua_pushvalue(L, lse_idx);
    lua_setfield(L, -2, "lse");
  }
  if (lse) lua_remove(L, lse_idx);
  return lua_gettop(L) - top;
}

/***
 * Checks the saved table of mha_forward before its backward reads its parts (qh, kh, vh, ctx,
 * merged): each must have the shape the layout gives for these operands.
 * @function mha_saved
 * @tparam table saved mha_forward's fourth result
 * @tparam Tensor queries (B, Nq, q)
 * @tparam Tensor keys (B, Nk, k)
 * @tparam integer num_heads H
 * @tparam Tensor w_q (h, q)
 * @treturn table saved
 */
static int l_mha_saved(lua_State *L) {
  const char *fn = "multi_head_attention backward";
  attn_tensor *q = attn_l_check(L, 2), *k = attn_l_check(L, 3);
  lua_Integer heads = attn_l_checkinteger(L, 4, "num_heads");
  attn_tensor *wq = attn_l_check(L, 5);
  if (q->ndim != 3 || k->ndim != 3 || wq->ndim != 2)
    return attn_l_error(L, "%s: queries %s, keys %s and W_q %s must be (B, Nq, q), (B, Nk, k) and (h, q)", fn,
                        attn_tensor_shape_str(q), attn_tensor_shape_str(k), attn_tensor_shape_str(wq));
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_mha_saved_layout(q->shape[0], q->shape[1], k->shape[1], wq->shape[0], (int64_t)heads, &lay));
  attn_l_check_saved(L, 1, &lay, q->dtype, fn);
  lua_settop(L, 1);
  return 1;
}

/***
 * Rows of x repeated: (R, ...) -> (R*n, ...), row r at rows r*n .. r*n+n-1.
 * @function repeat_rows
 * @tparam Tensor x (R, ...)
 * @tparam integer n
 * @treturn Tensor (R*n, ...)
 */
static int l_repeat_rows(lua_State *L) {
  attn_tensor *x = attn_l_check(L, 1);
  lua_Integer n = attn_l_checkinteger(L, 2, "n");
  int64_t shape[ATTN_MAX_DIMS] = {0};
  for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[d];
  if (x->ndim > 0 && n >= 1 && x->shape[0] <= INT64_MAX / n) shape[0] = x->shape[0] * n;
  attn_tensor *out = attn_l_push_alloc(L, x->dtype, x->ndim, shape);
  ATTN_L_TRY(L, attn_attention_repeat_rows(x, (int64_t)n, out));
  return 1;
}

/***
 * The sinusoidal positional encoding table.
 * @function positional_encoding
 * @tparam integer max_len
 * @tparam integer d
 * @tparam[opt="float32"] string dtype
 * @treturn Tensor (max_len, d)
 */
static int l_positional_encoding(lua_State *L) {
  int64_t shape[2];
  static const char *const names[2] = {"max_len", "d"};
  for (int a = 0; a < 2; a++) { /* the table's sizes: the binding allocates it */
    int isint;
    lua_Integer v = lua_tointegerx(L, a + 1, &isint);
    if (!isint || lua_type(L, a + 1) != LUA_TNUMBER || v < 0)
      bad_value(L, a + 1, "positional_encoding", names[a], "an integer >= 0");
    shape[a] = (int64_t)v;
  }
  attn_tensor *out = attn_l_push_alloc(L, attn_l_optdtype(L, 3, ATTN_F32), 2, shape);
  ATTN_L_TRY(L, attn_attention_positional_encoding(out));
  return 1;
}

static const luaL_Reg attention_functions[] = {
    {"sdpa_forward", l_sdpa_forward},
    {"sdpa_backward", l_sdpa_backward},
    {"fma_peak", l_fma_peak},
    {"flash_tiles", l_flash_tiles},
    {"scores_attention_forward", l_scores_attention_forward},
    {"scores_attention_backward", l_scores_attention_backward},
    {"masked_softmax_forward", l_masked_softmax_forward},
    {"masked_softmax_backward", l_masked_softmax_backward},
    {"sequence_mask", l_sequence_mask},
    {"additive_scores_forward", l_additive_scores_forward},
    {"additive_scores_backward", l_additive_scores_backward},
    {"positional_encoding", l_positional_encoding},
    {"split_heads", l_split_heads},
    {"merge_heads", l_merge_heads},
    {"additive_layer_forward", l_additive_layer_forward},
    {"additive_layer_saved", l_additive_layer_saved},
    {"mha_forward", l_mha_forward},
    {"mha_saved", l_mha_saved},
    {"repeat_rows", l_repeat_rows},
    {NULL, NULL},
};

void attn_l_open_attention(lua_State *L) { attn_l_setfuncs(L, attention_functions); }
