/* The fused GRU: see attn_rnn.h for the model. Buffers come from the caching
 * allocator, so a training loop reuses warm pages step after step. */
#include "nn/attn_rnn.h"
#include "nn/attn_rnn_internal.h"

#include <math.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "core/attn_dropout.h"
#include "core/attn_gemm.h"
#include "core/attn_ops.h"
#include "core/attn_vmath.h"
#include "nn/attn_steps_internal.h"

/* The float64 step kernels; float32 runs the per-ISA ones of attn_vmath (same arguments, the
 * model in attn_vmath.h), vectorised with the ISA's own sigmoid and tanh. */
static double sigmoid_f64(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

static void gates_fwd_f64(int64_t B, int64_t H, const double *gi, const double *gh, const double *hp, double *hn,
                          double *rz, double *n, double *ghn) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < H; j++) {
      const double *i = gi + b * 3 * H, *h = gh + b * 3 * H;
      double r = sigmoid_f64(i[j] + h[j]), z = sigmoid_f64(i[H + j] + h[H + j]), g = h[2 * H + j];
      double v = tanh(i[2 * H + j] + r * g);
      rz[b * 2 * H + j] = r, rz[b * 2 * H + H + j] = z, n[b * H + j] = v, ghn[b * H + j] = g;
      hn[b * H + j] = v + z * (hp[b * H + j] - v);
    }
}

static void gates_bwd_f64(int64_t B, int64_t H, double *restrict dh, const double *restrict dy,
                          const double *restrict hp, const double *restrict rz, const double *restrict n,
                          const double *restrict ghn, double *restrict dgi, double *restrict dgh) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < H; j++) {
      double g = dh[b * H + j] + dy[b * H + j], r = rz[b * 2 * H + j], z = rz[b * 2 * H + H + j], v = n[b * H + j];
      double dn = g - g * z, dz = g * (hp[b * H + j] - v);
      double dan = dn * (1 - v * v), daz = dz * (z * (1 - z));
      double dar = (dan * ghn[b * H + j]) * (r * (1 - r));
      double *i = dgi + b * 3 * H, *h = dgh + b * 3 * H;
      i[j] = h[j] = dar;
      i[H + j] = h[H + j] = daz;
      i[2 * H + j] = dan;
      h[2 * H + j] = dan * r;
      dh[b * H + j] = g * z;
    }
}

void attn_gru_gates_forward(attn_dtype dt, int64_t B, int64_t H, const void *gi, const void *gh, const void *hp,
                            void *hn, void *rz, void *n, void *ghn) {
  if (dt == ATTN_F32)
    attn_vmath_gru_fwd_f32(B, H, gi, gh, hp, hn, rz, n, ghn);
  else
    gates_fwd_f64(B, H, gi, gh, hp, hn, rz, n, ghn);
}

void attn_gru_gates_backward(attn_dtype dt, int64_t B, int64_t H, void *dh, const void *dy, const void *hp,
                             const void *rz, const void *n, const void *ghn, void *dgi, void *dgh) {
  if (dt == ATTN_F32)
    attn_vmath_gru_bwd_f32(B, H, dh, dy, hp, rz, n, ghn, dgi, dgh);
  else
    gates_bwd_f64(B, H, dh, dy, hp, rz, n, ghn, dgi, dgh);
}

attn_status attn_rnn_saved_layout(const char *name, int64_t T, int64_t B, int64_t H, int layers,
                                  const attn_rnn_saved_part *parts, int n, attn_saved_layout *l) {
  attn_saved_begin(l, name);
  int64_t T1, HW;
  int fits = T >= 0 && B >= 0 && H >= 0 && layers >= 1 && !__builtin_add_overflow(T, 1, &T1);
  for (int i = 0; i < n && fits; i++) fits = !__builtin_mul_overflow(H, parts[i].width, &HW);
  if (!fits)
    return attn_error(ATTN_ERR_SHAPE, "%s: %d layers over %lld steps of %lld samples and %lld hidden units do not "
                      "fit a saved buffer", name, layers, (long long)T, (long long)B, (long long)H);
  attn_status st = ATTN_OK;
  for (int i = 0; i < n && st == ATTN_OK; i++) {
    const int64_t shape[4] = {layers, parts[i].extra_step ? T1 : T, B, H * parts[i].width};
    st = attn_saved_add(l, parts[i].name, 4, shape);
  }
  return st;
}

attn_status attn_gru_saved_layout(int64_t T, int64_t B, int64_t H, int layers, attn_saved_layout *l) {
  static const attn_rnn_saved_part parts[] = {{"hs", 1, 1}, {"rz", 0, 2}, {"n", 0, 1}, {"ghn", 0, 1}};
  return attn_rnn_saved_layout("gru", T, B, H, layers, parts, 4, l);
}

/* Pointers into layer k's planes of `saved`. */
typedef struct {
  char *hs, *rz, *n, *ghn;
} saved_layer;

char *attn_rnn_layer_part(const attn_tensor *saved, const attn_saved_layout *l, int i, int k) {
  return attn_saved_data(saved, l, i, k * (l->part[i].numel / l->part[i].shape[0]));
}

void attn_rnn_copy_state(void *dst, const attn_tensor *t, int k, size_t bytes) {
  if (t)
    memcpy(dst, (const char *)attn_tensor_data(t) + (size_t)k * bytes, bytes);
  else
    memset(dst, 0, bytes);
}

void attn_rnn_free_all(char **bufs, const size_t *cap, int n) {
  for (int i = 0; i < n; i++)
    if (bufs[i]) attn_free(bufs[i], cap[i]);
}

attn_status attn_rnn_alloc_all(const char *op, const attn_tensor *x, int n, const size_t *bytes, char **bufs,
                               size_t *cap) {
  int ok = 1;
  for (int i = 0; i < n; i++) {
    cap[i] = 0;
    bufs[i] = bytes[i] ? attn_alloc(bytes[i], &cap[i]) : NULL;
    ok &= !bytes[i] || bufs[i];
  }
  if (ok) return ATTN_OK;
  attn_rnn_free_all(bufs, cap, n);
  return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the %s workspace", op, attn_tensor_shape_str(x));
}

const char *attn_rnn_pass_up(attn_dtype dt, int k, int layers, const char *states, int64_t TB, int64_t H,
                             attn_tensor *out, char *dropped, uint64_t seed, double dropout_p) {
  if (k == layers - 1) {
    memcpy(attn_tensor_data(out), states, (size_t)(TB * H) * attn_dtype_size(dt));
    return states;
  }
  if (!dropped) return states;
  attn_dropout_flat(dt, states, dropped, TB * H, seed + (uint64_t)k, dropout_p);
  return dropped;
}

const char *attn_rnn_layer_input(attn_dtype dt, int k, const attn_tensor *x, const attn_tensor *saved,
                                 const attn_saved_layout *l, int hs, size_t n_state, int64_t TB, int64_t H,
                                 char *layer_in, uint64_t seed, double dropout_p) {
  if (k == 0) return attn_tensor_data(x);
  const char *input = attn_rnn_layer_part(saved, l, hs, k - 1) + n_state; /* the layer below's h_1 .. h_T */
  if (!layer_in) return input;
  attn_dropout_flat(dt, input, layer_in, TB * H, seed + (uint64_t)(k - 1), dropout_p);
  return layer_in;
}

static saved_layer layer_block(const attn_tensor *saved, const attn_saved_layout *l, int k) {
  saved_layer s = {attn_rnn_layer_part(saved, l, ATTN_GRU_SAVED_HS, k),
                   attn_rnn_layer_part(saved, l, ATTN_GRU_SAVED_RZ, k),
                   attn_rnn_layer_part(saved, l, ATTN_GRU_SAVED_N, k),
                   attn_rnn_layer_part(saved, l, ATTN_GRU_SAVED_GHN, k)};
  return s;
}

/* ---------------------------------------------------------------- checks */

static int has_shape(const attn_tensor *t, int nd, int64_t a, int64_t b, int64_t c) {
  int64_t want[3] = {a, b, c};
  if (!t || t->ndim != nd) return 0;
  for (int d = 0; d < nd; d++)
    if (t->shape[d] != want[d]) return 0;
  return 1;
}

attn_status attn_rnn_check_operand(const char *op, const char *what, int k, const attn_tensor *t, attn_dtype dt,
                                   int nd, int64_t a, int64_t b, int64_t c) {
  if (!t) return attn_error(ATTN_ERR_ARG, "%s: %s of layer %d is missing", op, what, k);
  if (t->dtype != dt)
    return attn_error(ATTN_ERR_DTYPE, "%s: %s of layer %d is %s, the input is %s", op, what, k,
                      attn_dtype_name(t->dtype), attn_dtype_name(dt));
  if (!has_shape(t, nd, a, b, c)) {
    int64_t want[3] = {a, b, c};
    return attn_error(ATTN_ERR_SHAPE, "%s: %s of layer %d is %s, expected %s", op, what, k,
                      attn_tensor_shape_str(t), attn_shape_str(nd, want));
  }
  if (!attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_ARG, "%s: %s of layer %d %s must be contiguous", op, what, k,
                      attn_tensor_shape_str(t));
  return ATTN_OK;
}

attn_status attn_rnn_check_input(const char *op, const attn_tensor *x, int layers, const attn_tensor *const *w_ih,
                                 const attn_tensor *const *w_hh, int gates, double dropout_p, int64_t *T, int64_t *B,
                                 int64_t *NI, int64_t *H) {
  if (x->ndim != 3 || x->shape[0] < 1 || x->shape[1] < 1 || x->shape[2] < 1)
    return attn_error(ATTN_ERR_SHAPE, "%s: input %s must be (T, B, input_size) with every size at least 1", op,
                      attn_tensor_shape_str(x));
  if (!attn_tensor_is_contiguous(x))
    return attn_error(ATTN_ERR_ARG, "%s: input %s must be contiguous", op, attn_tensor_shape_str(x));
  if (attn_check_float(op, x) != ATTN_OK) return ATTN_ERR_DTYPE;
  if (layers < 1 || !w_hh[0] || w_hh[0]->ndim != 2 || w_hh[0]->shape[1] < 1)
    return attn_error(ATTN_ERR_ARG, "%s: needs at least one layer with a 2-D weight_hh", op);
  if (!(dropout_p >= 0 && dropout_p < 1))
    return attn_error(ATTN_ERR_ARG, "%s: dropout %g must be in [0, 1)", op, dropout_p);
  *T = x->shape[0], *B = x->shape[1], *NI = x->shape[2], *H = w_hh[0]->shape[1];
  attn_status st = ATTN_OK;
  for (int k = 0; k < layers && st == ATTN_OK; k++) {
    st = attn_rnn_check_operand(op, "weight_ih", k, w_ih[k], x->dtype, 2, gates * *H, k == 0 ? *NI : *H, 0);
    if (st == ATTN_OK) st = attn_rnn_check_operand(op, "weight_hh", k, w_hh[k], x->dtype, 2, gates * *H, *H, 0);
  }
  return st;
}

attn_status attn_rnn_check_biases(const char *op, int layers, attn_dtype dt, int gates, int64_t H,
                                  const attn_tensor *const *b_ih, const attn_tensor *const *b_hh) {
  attn_status st = ATTN_OK;
  for (int k = 0; k < layers && st == ATTN_OK; k++) {
    if (b_ih[k]) st = attn_rnn_check_operand(op, "bias_ih", k, b_ih[k], dt, 1, gates * H, 0, 0);
    if (st == ATTN_OK && b_hh[k]) st = attn_rnn_check_operand(op, "bias_hh", k, b_hh[k], dt, 1, gates * H, 0, 0);
  }
  return st;
}

attn_status attn_rnn_check_grads(const char *op, int layers, attn_dtype dt, int gates, int64_t H, int64_t NI,
                                 attn_tensor *const *dw_ih, attn_tensor *const *dw_hh, attn_tensor *const *db_ih,
                                 attn_tensor *const *db_hh) {
  attn_status st = ATTN_OK;
  int64_t GH = gates * H;
  for (int k = 0; k < layers && st == ATTN_OK; k++) {
    if (dw_ih[k]) st = attn_rnn_check_operand(op, "weight_ih gradient", k, dw_ih[k], dt, 2, GH, k ? H : NI, 0);
    if (st == ATTN_OK && dw_hh[k]) st = attn_rnn_check_operand(op, "weight_hh gradient", k, dw_hh[k], dt, 2, GH, H, 0);
    if (st == ATTN_OK && db_ih[k]) st = attn_rnn_check_operand(op, "bias_ih gradient", k, db_ih[k], dt, 1, GH, 0, 0);
    if (st == ATTN_OK && db_hh[k]) st = attn_rnn_check_operand(op, "bias_hh gradient", k, db_hh[k], dt, 1, GH, 0, 0);
  }
  return st;
}

/* Validates the operands both directions share; sets T, B, NI (the input size) and H. */
static attn_status check_common(const char *op, const attn_tensor *x, const attn_tensor *h0, int layers,
                                const attn_tensor *const *w_ih, const attn_tensor *const *w_hh, double dropout_p,
                                int64_t *T, int64_t *B, int64_t *NI, int64_t *H) {
  attn_status st = attn_rnn_check_input(op, x, layers, w_ih, w_hh, 3, dropout_p, T, B, NI, H);
  if (st == ATTN_OK && h0) st = attn_rnn_check_operand(op, "h0", 0, h0, x->dtype, 3, layers, *B, *H);
  return st;
}

/* ---------------------------------------------------------------- forward */

attn_status attn_gru_forward(const attn_tensor *x, const attn_tensor *h0, int layers, const attn_tensor *const *w_ih,
                             const attn_tensor *const *w_hh, const attn_tensor *const *b_ih,
                             const attn_tensor *const *b_hh, double dropout_p, uint64_t seed, attn_tensor *out,
                             attn_tensor *hn, attn_tensor *saved) {
  const char *op = "gru";
  int64_t T, B, NI, H;
  attn_status st = check_common(op, x, h0, layers, w_ih, w_hh, dropout_p, &T, &B, &NI, &H);
  if (st == ATTN_OK) st = attn_rnn_check_biases(op, layers, x->dtype, 3, H, b_ih, b_hh);
  if (st == ATTN_OK) st = attn_rnn_check_operand(op, "output", layers - 1, out, x->dtype, 3, T, B, H);
  if (st == ATTN_OK) st = attn_rnn_check_operand(op, "final state", 0, hn, x->dtype, 3, layers, B, H);
  attn_saved_layout lay;
  if (st == ATTN_OK && (st = attn_gru_saved_layout(T, B, H, layers, &lay)) == ATTN_OK)
    st = attn_saved_check(op, &lay, saved, x->dtype);
  if (st != ATTN_OK) return st;

  attn_dtype dt = x->dtype;
  size_t es = attn_dtype_size(dt);
  int64_t TB = T * B;
  int drop = dropout_p > 0 && layers > 1;
  size_t cap[3], bytes[3] = {(size_t)(TB * 3 * H) * es, (size_t)(B * 3 * H) * es, drop ? (size_t)(TB * H) * es : 0};
  char *bufs[3];
  if ((st = attn_rnn_alloc_all(op, x, 3, bytes, bufs, cap)) != ATTN_OK) return st;
  char *gi = bufs[0], *gh = bufs[1], *dropped = bufs[2];

  const char *input = attn_tensor_data(x);
  int64_t in_k = NI;
  for (int k = 0; k < layers; k++) {
    saved_layer s = layer_block(saved, &lay, k);
    const void *bi = b_ih[k] ? attn_tensor_data(b_ih[k]) : NULL;
    const void *bh = b_hh[k] ? attn_tensor_data(b_hh[k]) : NULL;
    /* all steps' input projections in one GEMM, on top of the bias rows */
    attn_fill_rows(gi, TB, 3 * H, es, bi);
    gemm(dt, 0, 1, TB, 3 * H, in_k, input, in_k, attn_tensor_data(w_ih[k]), in_k, 1, gi, 3 * H);
    attn_rnn_copy_state(s.hs, h0, k, (size_t)(B * H) * es);
    for (int64_t t = 0; t < T; t++) {
      size_t bh_off = (size_t)(t * B * H) * es;
      attn_fill_rows(gh, B, 3 * H, es, bh);
      gemm(dt, 0, 1, B, 3 * H, H, s.hs + bh_off, H, attn_tensor_data(w_hh[k]), H, 1, gh, 3 * H);
      char *git = gi + (size_t)(t * B * 3 * H) * es;
      attn_gru_gates_forward(dt, B, H, git, gh, s.hs + bh_off, s.hs + bh_off + (size_t)(B * H) * es,
                             s.rz + 2 * bh_off, s.n + bh_off, s.ghn + bh_off);
    }
    memcpy((char *)attn_tensor_data(hn) + (size_t)(k * B * H) * es, s.hs + (size_t)(T * B * H) * es,
           (size_t)(B * H) * es);
    input = attn_rnn_pass_up(dt, k, layers, s.hs + (size_t)(B * H) * es, TB, H, out, dropped, seed, dropout_p);
    in_k = H;
  }
  attn_rnn_free_all(bufs, cap, 3);
  return ATTN_OK;
}

/* ---------------------------------------------------------------- backward */

attn_status attn_gru_backward(const attn_tensor *x, const attn_tensor *h0, int layers,
                              const attn_tensor *const *w_ih, const attn_tensor *const *w_hh, double dropout_p,
                              uint64_t seed, const attn_tensor *saved, const attn_tensor *dout,
                              const attn_tensor *dhn, attn_tensor *dx, attn_tensor *dh0, attn_tensor *const *dw_ih,
                              attn_tensor *const *dw_hh, attn_tensor *const *db_ih, attn_tensor *const *db_hh) {
  const char *op = "gru backward";
  int64_t T, B, NI, H;
  attn_status st = check_common(op, x, h0, layers, w_ih, w_hh, dropout_p, &T, &B, &NI, &H);
  attn_saved_layout lay;
  if (st == ATTN_OK && (st = attn_gru_saved_layout(T, B, H, layers, &lay)) == ATTN_OK)
    st = attn_saved_check(op, &lay, saved, x->dtype);
  if (st == ATTN_OK && dout)
    st = attn_rnn_check_operand(op, "output gradient", layers - 1, dout, x->dtype, 3, T, B, H);
  if (st == ATTN_OK && dhn)
    st = attn_rnn_check_operand(op, "final state gradient", 0, dhn, x->dtype, 3, layers, B, H);
  if (st == ATTN_OK) st = attn_rnn_check_operand(op, "input gradient", 0, dx, x->dtype, 3, T, B, NI);
  if (st == ATTN_OK && dh0) st = attn_rnn_check_operand(op, "h0 gradient", 0, dh0, x->dtype, 3, layers, B, H);
  if (st == ATTN_OK) st = attn_rnn_check_grads(op, layers, x->dtype, 3, H, NI, dw_ih, dw_hh, db_ih, db_hh);
  if (st != ATTN_OK) return st;

  attn_dtype dt = x->dtype;
  size_t es = attn_dtype_size(dt);
  int64_t TB = T * B;
  int drop = dropout_p > 0 && layers > 1;
  size_t n_dy = (size_t)(TB * H) * es, n_dg = (size_t)(TB * 3 * H) * es, n_dh = (size_t)(B * H) * es;
  size_t cap[5], bytes[5] = {n_dy, n_dg, n_dg, n_dh, drop ? n_dy : 0};
  char *bufs[5];
  if ((st = attn_rnn_alloc_all(op, x, 5, bytes, bufs, cap)) != ATTN_OK) return st;
  char *dy = bufs[0], *dgi = bufs[1], *dgh = bufs[2], *dh = bufs[3], *layer_in = bufs[4];

  /* the output gradient of layer k: dout for the top one (read in place), then what the layer
   * above leaves in dy */
  if (!dout) memset(dy, 0, n_dy);
  for (int k = layers - 1; k >= 0; k--) {
    saved_layer s = layer_block(saved, &lay, k);
    const char *gy = dout && k == layers - 1 ? (const char *)attn_tensor_data(dout) : dy;
    attn_rnn_copy_state(dh, dhn, k, n_dh);
    const void *whh = attn_tensor_data(w_hh[k]);
    for (int64_t t = T - 1; t >= 0; t--) {
      size_t off = (size_t)(t * B * H) * es;
      char *dgit = dgi + 3 * off, *dght = dgh + 3 * off;
      /* dh += gy[t]; then the step's gate gradients; dh becomes dh * z + dgh W_hh */
      attn_gru_gates_backward(dt, B, H, dh, gy + off, s.hs + off, s.rz + 2 * off, s.n + off, s.ghn + off, dgit,
                              dght);
      gemm(dt, 0, 0, B, H, 3 * H, dght, 3 * H, whh, H, 1, dh, H);
    }
    if (dh0) memcpy((char *)attn_tensor_data(dh0) + (size_t)k * n_dh, dh, n_dh);
    /* weight gradients over all steps at once */
    if (dw_hh[k]) gemm(dt, 1, 0, 3 * H, H, TB, dgh, 3 * H, s.hs, H, 0, attn_tensor_data(dw_hh[k]), H);
    for (int which = 0; which < 2; which++) {
      attn_tensor *db = which ? db_hh[k] : db_ih[k];
      const char *g = which ? dgh : dgi;
      if (db) attn_colsum_rows(dt, g, TB, 3 * H, attn_tensor_data(db));
    }
    int64_t in_k = k ? H : NI;
    const char *input = attn_rnn_layer_input(dt, k, x, saved, &lay, ATTN_GRU_SAVED_HS, n_dh, TB, H, layer_in, seed,
                                             dropout_p);
    if (dw_ih[k]) gemm(dt, 1, 0, 3 * H, in_k, TB, dgi, 3 * H, input, in_k, 0, attn_tensor_data(dw_ih[k]), in_k);
    /* the input's gradient: dx for the first layer, else the layer below's output gradient */
    void *din = k ? (void *)dy : attn_tensor_data(dx);
    gemm(dt, 0, 0, TB, in_k, 3 * H, dgi, 3 * H, attn_tensor_data(w_ih[k]), in_k, 0, din, in_k);
    if (k > 0 && drop) attn_dropout_flat(dt, dy, dy, TB * H, seed + (uint64_t)(k - 1), dropout_p);
  }
  attn_rnn_free_all(bufs, cap, 5);
  return ATTN_OK;
}
