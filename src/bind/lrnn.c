/* Binding: the fused GRU (attn_rnn.h), the fused LSTM (attn_lstm.h), the fused Bahdanau
 * decoder (attn_decoder.h) and the fused captioning decoder (attn_caption.h). Weights arrive as
 * one flat table of 4 entries per layer, {weight_ih, weight_hh, bias_ih, bias_hh, ...}, with false
 * for a missing bias (the captioning decoder's one cell: its own arguments); the autograd nodes
 * live in lua/attn/nn/gru.lua, lua/attn/nn/lstm.lua and lua/attn/nn/captioning.lua. */
#include "bind/lbind.h"

#define MAX_LAYERS 64

/* Reads the parameter table at arg; returns the number of layers. The tensors
 * stay referenced by the table, which stays on the stack. */
static int read_params(lua_State *L, int arg, const attn_tensor **w_ih, const attn_tensor **w_hh,
                       const attn_tensor **b_ih, const attn_tensor **b_hh, const char *fn) {
  attn_l_checktable(L, arg, "parameters");
  lua_Integer n = luaL_len(L, arg);
  if (n < 4 || n % 4 != 0 || n / 4 > MAX_LAYERS)
    attn_l_error(L, "%s: parameters must be 4 entries per layer (1 to %d layers), got %I entries", fn, MAX_LAYERS,
                 n);
  int layers = (int)(n / 4);
  const attn_tensor **slots[4] = {w_ih, w_hh, b_ih, b_hh};
  for (int k = 0; k < layers; k++)
    for (int j = 0; j < 4; j++) {
      lua_rawgeti(L, arg, 4 * k + j + 1);
      attn_tensor *t = attn_l_test(L, -1);
      if (!t && (j < 2 || lua_toboolean(L, -1)))
        attn_l_error(L, "%s: parameter %d of layer %d must be a tensor%s", fn, j + 1, k,
                     j < 2 ? "" : " or false");
      slots[j][k] = t;
      lua_pop(L, 1);
    }
  return layers;
}

static double check_dropout(lua_State *L, int arg, const char *fn) {
  double p = attn_l_optnumber(L, arg, "dropout", 0);
  if (!(p >= 0 && p < 1)) attn_l_error(L, "%s: dropout %f must be in [0, 1)", fn, p);
  return p;
}

/* Pushes a table of gradient tensors shaped like the parameters (4 per layer, false for a missing
 * bias) and points the d* arrays at them (NULL for a missing bias). */
static void push_param_grads(lua_State *L, int layers, const attn_tensor **w_ih, const attn_tensor **w_hh,
                             const attn_tensor **b_ih, const attn_tensor **b_hh, attn_tensor **dw_ih,
                             attn_tensor **dw_hh, attn_tensor **db_ih, attn_tensor **db_hh) {
  lua_createtable(L, 4 * layers, 0);
  const attn_tensor *const *src[4] = {w_ih, w_hh, b_ih, b_hh};
  attn_tensor **dst[4] = {dw_ih, dw_hh, db_ih, db_hh};
  for (int k = 0; k < layers; k++)
    for (int j = 0; j < 4; j++) {
      if (src[j][k]) {
        dst[j][k] = attn_l_push_like(L, src[j][k]);
      } else {
        dst[j][k] = NULL;
        lua_pushboolean(L, 0);
      }
      lua_rawseti(L, -2, 4 * k + j + 1);
    }
}

/* gru_forward(x, h0|nil, params, dropout, seed|nil) -> out, hn, saved (table of the parts of
 * attn_gru_saved_layout: hs, rz, n, ghn), seed */
static int l_gru_forward(lua_State *L) {
  const char *fn = "gru";
  const attn_tensor *w_ih[MAX_LAYERS], *w_hh[MAX_LAYERS], *b_ih[MAX_LAYERS], *b_hh[MAX_LAYERS];
  attn_tensor *x = attn_l_check(L, 1);
  attn_tensor *h0 = lua_isnoneornil(L, 2) ? NULL : attn_l_check(L, 2);
  int layers = read_params(L, 3, w_ih, w_hh, b_ih, b_hh, fn);
  double p = check_dropout(L, 4, fn);
  uint64_t seed = lua_isnoneornil(L, 5) ? (p > 0 ? attn_rng_next(attn_l_rng(L)) : 0)
                                        : (uint64_t)attn_l_checkinteger(L, 5, "seed");
  if (x->ndim != 3 || w_hh[0]->ndim != 2)
    return attn_l_error(L, "%s: input %s must be (T, B, input_size) and weight_hh_l0 %s (3h, h)", fn,
                        attn_tensor_shape_str(x), attn_tensor_shape_str(w_hh[0]));
  int64_t T = x->shape[0], B = x->shape[1], H = w_hh[0]->shape[1];
  int64_t out_shape[3] = {T, B, H}, hn_shape[3] = {layers, B, H};
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_gru_saved_layout(T, B, H, layers, &lay));
  attn_tensor *out = attn_l_push_alloc(L, x->dtype, 3, out_shape);
  attn_tensor *hn = attn_l_push_alloc(L, x->dtype, 3, hn_shape);
  attn_tensor saved = attn_l_push_saved(L, &lay, x->dtype, 0);
  ATTN_L_TRY(L, attn_gru_forward(x, h0, layers, w_ih, w_hh, b_ih, b_hh, p, seed, out, hn, &saved));
  lua_pushinteger(L, (lua_Integer)seed);
  return 4;
}

/* gru_backward(x, h0|nil, params, dropout, seed, saved, dout|nil, dhn|nil)
 * -> dx, dh0 (nil without h0), grads (4 per layer, false for a missing bias) */
static int l_gru_backward(lua_State *L) {
  const char *fn = "gru backward";
  const attn_tensor *w_ih[MAX_LAYERS], *w_hh[MAX_LAYERS], *b_ih[MAX_LAYERS], *b_hh[MAX_LAYERS];
  attn_tensor *dw_ih[MAX_LAYERS], *dw_hh[MAX_LAYERS], *db_ih[MAX_LAYERS], *db_hh[MAX_LAYERS];
  attn_tensor *x = attn_l_check(L, 1);
  attn_tensor *h0 = lua_isnoneornil(L, 2) ? NULL : attn_l_check(L, 2);
  int layers = read_params(L, 3, w_ih, w_hh, b_ih, b_hh, fn);
  double p = check_dropout(L, 4, fn);
  uint64_t seed = (uint64_t)attn_l_checkinteger(L, 5, "seed");
  if (x->ndim != 3 || w_hh[0]->ndim != 2)
    return attn_l_error(L, "%s: input %s must be (T, B, input_size) and weight_hh_l0 %s (3h, h)", fn,
                        attn_tensor_shape_str(x), attn_tensor_shape_str(w_hh[0]));
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_gru_saved_layout(x->shape[0], x->shape[1], w_hh[0]->shape[1], layers, &lay));
  attn_tensor saved = attn_l_check_saved(L, 6, &lay, x->dtype, fn);
  attn_tensor *dout = lua_isnoneornil(L, 7) ? NULL : attn_l_check(L, 7);
  attn_tensor *dhn = lua_isnoneornil(L, 8) ? NULL : attn_l_check(L, 8);
  lua_settop(L, 8);
  attn_tensor *dx = attn_l_push_like(L, x);
  attn_tensor *dh0 = NULL;
  if (h0)
    dh0 = attn_l_push_like(L, h0);
  else
    lua_pushnil(L);
  push_param_grads(L, layers, w_ih, w_hh, b_ih, b_hh, dw_ih, dw_hh, db_ih, db_hh);
  ATTN_L_TRY(L, attn_gru_backward(x, h0, layers, w_ih, w_hh, p, seed, &saved, dout, dhn, dx, dh0, dw_ih, dw_hh,
                                  db_ih, db_hh));
  return 3;
}

static attn_tensor *opt_tensor(lua_State *L, int arg) { return lua_isnoneornil(L, arg) ? NULL : attn_l_check(L, arg); }

/* One step of one layer (x (B, I), the LSTMCell's call) runs the sequence kernel on (1, B, n)
 * views of its 2-D operands: t (B, n) as *view (a borrowed struct copy sharing t's storage,
 * never freed), or t itself for a sequence; NULL stays NULL. */
static attn_tensor *as_sequence(lua_State *L, attn_tensor *t, attn_tensor *view, int step, const char *fn,
                                const char *what) {
  if (!t || !step) return t;
  if (t->ndim != 2 || !attn_tensor_is_contiguous(t))
    attn_l_error(L, "%s: %s %s must be a contiguous (B, n) tensor for one step", fn, what, attn_tensor_shape_str(t));
  *view = *t;
  int64_t shape[3] = {1, t->shape[0], t->shape[1]};
  view->ndim = 3;
  for (int d = 0; d < 3; d++) view->shape[d] = shape[d];
  attn_contiguous_strides(3, view->shape, view->stride);
  return view;
}

/* The input x and weight_hh_l0 the LSTM's output sizes come from, checked before allocating:
 * x (T, B, I), or (B, I) for one step of one layer. Returns whether x is one step. */
static int check_lstm_sizes(lua_State *L, const attn_tensor *x, const attn_tensor *w_hh0, int layers,
                            const char *fn) {
  int step = x->ndim == 2;
  if ((x->ndim != 3 && !(step && layers == 1)) || w_hh0->ndim != 2)
    attn_l_error(L, "%s: input %s must be (T, B, input_size) (or (B, input_size) for one step of one layer) and "
                 "weight_hh_l0 %s (4h, h)", fn, attn_tensor_shape_str(x), attn_tensor_shape_str(w_hh0));
  return step;
}

/* lstm_forward(x, h0|nil, c0|nil, params, dropout, seed|nil) -> out, hn, cn, saved (table of the
 * parts of attn_lstm_saved_layout: hs, cs, gates, tc), seed. With x (B, I) and one layer: one
 * step, h0, c0, hn, cn (B, H) and out nil. */
static int l_lstm_forward(lua_State *L) {
  const char *fn = "lstm";
  const attn_tensor *w_ih[MAX_LAYERS], *w_hh[MAX_LAYERS], *b_ih[MAX_LAYERS], *b_hh[MAX_LAYERS];
  attn_tensor *x = attn_l_check(L, 1), *h0 = opt_tensor(L, 2), *c0 = opt_tensor(L, 3);
  int layers = read_params(L, 4, w_ih, w_hh, b_ih, b_hh, fn);
  double p = check_dropout(L, 5, fn);
  uint64_t seed = lua_isnoneornil(L, 6) ? (p > 0 ? attn_rng_next(attn_l_rng(L)) : 0)
                                        : (uint64_t)attn_l_checkinteger(L, 6, "seed");
  int step = check_lstm_sizes(L, x, w_hh[0], layers, fn);
  lua_settop(L, 6);
  attn_tensor v[6];
  x = as_sequence(L, x, &v[0], step, fn, "input");
  h0 = as_sequence(L, h0, &v[1], step, fn, "h0");
  c0 = as_sequence(L, c0, &v[2], step, fn, "c0");
  int64_t T = x->shape[0], B = x->shape[1], H = w_hh[0]->shape[1];
  int64_t out_shape[3] = {T, B, H}, hn_shape[3] = {layers, B, H};
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_lstm_saved_layout(T, B, H, layers, &lay));
  attn_tensor *out = NULL;
  if (step)
    lua_pushnil(L);
  else
    out = attn_l_push_alloc(L, x->dtype, 3, out_shape);
  attn_tensor *hn = attn_l_push_alloc(L, x->dtype, 3 - step, hn_shape + step);
  attn_tensor *cn = attn_l_push_alloc(L, x->dtype, 3 - step, hn_shape + step);
  hn = as_sequence(L, hn, &v[3], step, fn, "final state");
  cn = as_sequence(L, cn, &v[4], step, fn, "final cell");
  if (step) out = hn; /* one step: the output is the final state */
  attn_tensor saved = attn_l_push_saved(L, &lay, x->dtype, 0);
  ATTN_L_TRY(L, attn_lstm_forward(x, h0, c0, layers, w_ih, w_hh, b_ih, b_hh, p, seed, out, hn, cn, &saved));
  lua_pushinteger(L, (lua_Integer)seed);
  return 5;
}

/* lstm_backward(x, h0|nil, c0|nil, params, dropout, seed, saved, dout|nil, dhn|nil, dcn|nil)
 * -> dx, dh0 (nil without h0), dc0 (nil without c0), grads (4 per layer, false for a missing
 * bias). One step (x (B, I)) as lstm_forward's: dout nil, the rest (B, n). */
static int l_lstm_backward(lua_State *L) {
  const char *fn = "lstm backward";
  const attn_tensor *w_ih[MAX_LAYERS], *w_hh[MAX_LAYERS], *b_ih[MAX_LAYERS], *b_hh[MAX_LAYERS];
  attn_tensor *dw_ih[MAX_LAYERS], *dw_hh[MAX_LAYERS], *db_ih[MAX_LAYERS], *db_hh[MAX_LAYERS];
  attn_tensor *x = attn_l_check(L, 1), *h0 = opt_tensor(L, 2), *c0 = opt_tensor(L, 3);
  int layers = read_params(L, 4, w_ih, w_hh, b_ih, b_hh, fn);
  double p = check_dropout(L, 5, fn);
  uint64_t seed = (uint64_t)attn_l_checkinteger(L, 6, "seed");
  int step = check_lstm_sizes(L, x, w_hh[0], layers, fn);
  attn_tensor v[8];
  attn_tensor *xs = as_sequence(L, x, &v[0], step, fn, "input");
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_lstm_saved_layout(xs->shape[0], xs->shape[1], w_hh[0]->shape[1], layers, &lay));
  attn_tensor saved = attn_l_check_saved(L, 7, &lay, x->dtype, fn);
  attn_tensor *dout = opt_tensor(L, 8), *dhn = opt_tensor(L, 9), *dcn = opt_tensor(L, 10);
  if (step && dout) attn_l_error(L, "%s: one step has no output gradient apart from the final state's", fn);
  dhn = as_sequence(L, dhn, &v[1], step, fn, "final state gradient");
  dcn = as_sequence(L, dcn, &v[2], step, fn, "final cell gradient");
  lua_settop(L, 10);
  attn_tensor *dx = as_sequence(L, attn_l_push_like(L, x), &v[3], step, fn, "input gradient"), *d0[2] = {NULL, NULL};
  attn_tensor *s0[2] = {h0, c0};
  for (int i = 0; i < 2; i++) {
    if (s0[i])
      d0[i] = as_sequence(L, attn_l_push_like(L, s0[i]), &v[4 + i], step, fn, i ? "c0 gradient" : "h0 gradient");
    else
      lua_pushnil(L);
  }
  push_param_grads(L, layers, w_ih, w_hh, b_ih, b_hh, dw_ih, dw_hh, db_ih, db_hh);
  ATTN_L_TRY(L, attn_lstm_backward(xs, layers, w_ih, w_hh, p, seed, &saved, dout, dhn, dcn, dx, d0[0], d0[1], dw_ih,
                                   dw_hh, db_ih, db_hh));
  return 4;
}

/* The decoder's operands at args 1..11: W_k, values, valid_lens|nil, emb, h0, W_q, w_v, params,
 * attention dropout, GRU dropout, seed|nil (drawn when nil and some dropout is on). The layer
 * arrays are the caller's (MAX_LAYERS entries). */
static void read_decoder(lua_State *L, attn_decoder_args *a, const attn_tensor **w_ih, const attn_tensor **w_hh,
                         const attn_tensor **b_ih, const attn_tensor **b_hh, const char *fn) {
  a->w_k = attn_l_check(L, 1);
  a->values = attn_l_check(L, 2);
  a->valid_lens = lua_isnoneornil(L, 3) ? NULL : attn_l_check(L, 3);
  a->emb = attn_l_check(L, 4);
  a->h0 = attn_l_check(L, 5);
  a->w_q = attn_l_check(L, 6);
  a->w_v = attn_l_check(L, 7);
  a->layers = read_params(L, 8, w_ih, w_hh, b_ih, b_hh, fn);
  a->w_ih = w_ih, a->w_hh = w_hh, a->b_ih = b_ih, a->b_hh = b_hh;
  a->attention_dropout = attn_l_optnumber(L, 9, "attention dropout", 0);
  a->rnn_dropout = check_dropout(L, 10, fn);
  int drop = a->attention_dropout > 0 || a->rnn_dropout > 0;
  a->seed = lua_isnoneornil(L, 11) ? (drop ? attn_rng_next(attn_l_rng(L)) : 0)
                                   : (uint64_t)attn_l_checkinteger(L, 11, "seed");
}

/* decoder_forward(W_k, values, valid_lens|nil, emb, h0, W_q, w_v, params, p_attention, p_rnn,
 * seed|nil) -> out (B, T, H), hn (L, B, H), weights (B, T, Nk), saved (table of the parts of
 * attn_decoder_saved_layout), seed */
static int l_decoder_forward(lua_State *L) {
  const char *fn = "attention_decoder";
  const attn_tensor *w_ih[MAX_LAYERS], *w_hh[MAX_LAYERS], *b_ih[MAX_LAYERS], *b_hh[MAX_LAYERS];
  attn_decoder_args a;
  attn_decoder_dims d;
  read_decoder(L, &a, w_ih, w_hh, b_ih, b_hh, fn);
  lua_settop(L, 11);
  ATTN_L_TRY(L, attn_decoder_check(fn, &a, &d)); /* shapes first: the outputs' sizes come from them */
  int64_t out_shape[3] = {d.B, d.T, d.H}, hn_shape[3] = {d.layers, d.B, d.H}, w_shape[3] = {d.B, d.T, d.Nk};
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_decoder_saved_layout(&d, &lay));
  attn_dtype dt = a.emb->dtype;
  attn_tensor *out = attn_l_push_alloc(L, dt, 3, out_shape);
  attn_tensor *hn = attn_l_push_alloc(L, dt, 3, hn_shape);
  attn_tensor *weights = attn_l_push_alloc(L, dt, 3, w_shape);
  attn_tensor saved = attn_l_push_saved(L, &lay, dt, 0);
  ATTN_L_TRY(L, attn_decoder_forward(&a, out, hn, weights, &saved));
  lua_pushinteger(L, (lua_Integer)a.seed);
  return 5;
}

/* decoder_backward(W_k, values, valid_lens|nil, emb, h0, W_q, w_v, params, p_attention, p_rnn,
 * seed, saved, dout|nil, dhn|nil) -> dW_k, dvalues, demb, dh0, dW_q, dw_v, grads (4 per layer,
 * false for a missing bias) */
static int l_decoder_backward(lua_State *L) {
  const char *fn = "attention_decoder backward";
  const attn_tensor *w_ih[MAX_LAYERS], *w_hh[MAX_LAYERS], *b_ih[MAX_LAYERS], *b_hh[MAX_LAYERS];
  attn_tensor *dw_ih[MAX_LAYERS], *dw_hh[MAX_LAYERS], *db_ih[MAX_LAYERS], *db_hh[MAX_LAYERS];
  attn_decoder_args a;
  attn_decoder_dims d;
  read_decoder(L, &a, w_ih, w_hh, b_ih, b_hh, fn);
  a.seed = (uint64_t)attn_l_checkinteger(L, 11, "seed");
  attn_tensor *dout = lua_isnoneornil(L, 13) ? NULL : attn_l_check(L, 13);
  attn_tensor *dhn = lua_isnoneornil(L, 14) ? NULL : attn_l_check(L, 14);
  lua_settop(L, 14);
  ATTN_L_TRY(L, attn_decoder_check(fn, &a, &d));
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_decoder_saved_layout(&d, &lay));
  attn_tensor saved = attn_l_check_saved(L, 12, &lay, a.emb->dtype, fn);
  attn_decoder_grads g = {.w_ih = dw_ih, .w_hh = dw_hh, .b_ih = db_ih, .b_hh = db_hh};
  g.w_k = attn_l_push_like(L, a.w_k);
  g.values = attn_l_push_like(L, a.values);
  g.emb = attn_l_push_like(L, a.emb);
  g.h0 = attn_l_push_like(L, a.h0);
  g.w_q = attn_l_push_like(L, a.w_q);
  g.w_v = attn_l_push_like(L, a.w_v);
  push_param_grads(L, a.layers, w_ih, w_hh, b_ih, b_hh, dw_ih, dw_hh, db_ih, db_hh);
  ATTN_L_TRY(L, attn_decoder_backward(&a, &saved, dout, dhn, &g));
  return 7;
}

/* The captioning decoder's operands at args 1..13: feats, keys, w_v, emb, h0, c0, W_q, w_beta,
 * b_beta|nil, w_ih, w_hh, b_ih|nil, b_hh|nil. */
static void read_caption(lua_State *L, attn_caption_args *a) {
  a->feats = attn_l_check(L, 1);
  a->keys = attn_l_check(L, 2);
  a->w_v = attn_l_check(L, 3);
  a->emb = attn_l_check(L, 4);
  a->h0 = attn_l_check(L, 5);
  a->c0 = attn_l_check(L, 6);
  a->w_q = attn_l_check(L, 7);
  a->w_beta = attn_l_check(L, 8);
  a->b_beta = opt_tensor(L, 9);
  a->w_ih = attn_l_check(L, 10);
  a->w_hh = attn_l_check(L, 11);
  a->b_ih = opt_tensor(L, 12);
  a->b_hh = opt_tensor(L, 13);
}

/* caption_forward(feats, keys, w_v, emb, h0, c0, W_q, w_beta, b_beta|nil, w_ih, w_hh, b_ih|nil,
 * b_hh|nil) -> out (B, T, H + D), alphas (B, T, L), betas (B, T), saved (table of the parts of
 * attn_caption_saved_layout) */
static int l_caption_forward(lua_State *L) {
  const char *fn = "show_attend_tell";
  attn_caption_args a;
  attn_caption_dims d;
  read_caption(L, &a);
  lua_settop(L, 13);
  ATTN_L_TRY(L, attn_caption_check(fn, &a, &d)); /* shapes first: the outputs' sizes come from them */
  int64_t out_shape[3] = {d.B, d.T, d.H + d.D}, a_shape[3] = {d.B, d.T, d.L};
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_caption_saved_layout(&d, &lay));
  attn_dtype dt = a.emb->dtype;
  attn_tensor *out = attn_l_push_alloc(L, dt, 3, out_shape);
  attn_tensor *alphas = attn_l_push_alloc(L, dt, 3, a_shape);
  attn_tensor *betas = attn_l_push_alloc(L, dt, 2, a_shape);
  attn_tensor saved = attn_l_push_saved(L, &lay, dt, 0);
  ATTN_L_TRY(L, attn_caption_forward(&a, out, alphas, betas, &saved));
  return 4;
}

/* caption_backward(feats, ..., b_hh|nil (as caption_forward), saved, dout|nil, dalphas|nil,
 * dbetas|nil) -> dfeats, dkeys, dw_v, demb, dh0, dc0, dW_q, dw_beta, db_beta|nil, dw_ih, dw_hh,
 * db_ih|nil, db_hh|nil */
static int l_caption_backward(lua_State *L) {
  const char *fn = "show_attend_tell backward";
  attn_caption_args a;
  attn_caption_dims d;
  read_caption(L, &a);
  attn_tensor *dout = opt_tensor(L, 15), *dalphas = opt_tensor(L, 16), *dbetas = opt_tensor(L, 17);
  lua_settop(L, 17);
  ATTN_L_TRY(L, attn_caption_check(fn, &a, &d));
  attn_saved_layout lay;
  ATTN_L_TRY(L, attn_caption_saved_layout(&d, &lay));
  attn_tensor saved = attn_l_check_saved(L, 14, &lay, a.emb->dtype, fn);
  const attn_tensor *x[13] = {a.feats, a.keys, a.w_v, a.emb, a.h0, a.c0, a.w_q, a.w_beta, a.b_beta,
                              a.w_ih, a.w_hh, a.b_ih, a.b_hh};
  attn_tensor *gx[13];
  for (int i = 0; i < 13; i++) {
    if (x[i]) {
      gx[i] = attn_l_push_like(L, x[i]);
    } else {
      gx[i] = NULL;
      lua_pushnil(L);
    }
  }
  attn_caption_grads g = {gx[0], gx[1], gx[2], gx[3], gx[4], gx[5], gx[6], gx[7], gx[8], gx[9], gx[10], gx[11], gx[12]};
  ATTN_L_TRY(L, attn_caption_backward(&a, &saved, dout, dalphas, dbetas, &g));
  return 13;
}

static const luaL_Reg rnn_functions[] = {
    {"caption_backward", l_caption_backward},
    {"caption_forward", l_caption_forward},
    {"decoder_forward", l_decoder_forward},
    {"decoder_backward", l_decoder_backward},
    {"gru_forward", l_gru_forward},
    {"gru_backward", l_gru_backward},
    {"lstm_forward", l_lstm_forward},
    {"lstm_backward", l_lstm_backward},
    {NULL, NULL},
};

void attn_l_open_rnn(lua_State *L) { attn_l_setfuncs(L, rnn_functions); }
