/* The fused LSTM: see attn_lstm.h for the model. Buffers come from the caching allocator, so a
 * training loop (or a decoder calling one step at a time) reuses warm pages. */
#include "nn/attn_lstm.h"

#include <math.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "core/attn_dropout.h"
#include "core/attn_gemm.h"
#include "core/attn_ops.h"
#include "core/attn_vmath.h"
#include "nn/attn_rnn_internal.h"
#include "nn/attn_steps_internal.h"

attn_status attn_lstm_saved_layout(int64_t T, int64_t B, int64_t H, int layers, attn_saved_layout *l) {
  static const attn_rnn_saved_part parts[] = {{"hs", 1, 1}, {"cs", 1, 1}, {"gates", 0, 4}, {"tc", 0, 1}};
  return attn_rnn_saved_layout("lstm", T, B, H, layers, parts, 4, l);
}

/* ---------------------------------------------------------------- one step's gate math */

/* Rows of B x 4H pre-activations (both projections and biases, gate order i, f, g, o) and the
 * previous cells cp (B, H) -> the activated gates (B, 4H), the new cells cn, tanh(cn) in tc and
 * the new states hn (B, H). */
static double sigmoid_f64(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

/* c' = f c + i g over one row (the activated gates G, 4H wide). */
#define LSTM_CELL_ROW(H, G, cp, cn)                                                                   \
  for (int64_t j = 0; j < (H); j++) (cn)[j] = (G)[(H) + j] * (cp)[j] + (G)[j] * (G)[2 * (H) + j]
/* h' = o tanh(c'). */
#define LSTM_OUT_ROW(H, G, tc, hn)                                                                    \
  for (int64_t j = 0; j < (H); j++) (hn)[j] = (G)[3 * (H) + j] * (tc)[j]

static void gates_fwd_f64(int64_t B, int64_t H, const double *pre, const double *cp, double *gates, double *cn,
                          double *tc, double *hn) {
  for (int64_t b = 0; b < B; b++) {
    const double *a = pre + b * 4 * H, *c = cp + b * H;
    double *G = gates + b * 4 * H, *n = cn + b * H, *t = tc + b * H, *h = hn + b * H;
    for (int64_t j = 0; j < 2 * H; j++) G[j] = sigmoid_f64(a[j]);
    for (int64_t j = 2 * H; j < 3 * H; j++) G[j] = tanh(a[j]);
    for (int64_t j = 3 * H; j < 4 * H; j++) G[j] = sigmoid_f64(a[j]);
    LSTM_CELL_ROW(H, G, c, n);
    for (int64_t j = 0; j < H; j++) t[j] = tanh(n[j]);
    LSTM_OUT_ROW(H, G, t, h);
  }
}

/* float32: the sigmoid and tanh rows of the active instruction-set path (attn_vmath.h). */
static void gates_fwd_f32(int64_t B, int64_t H, const float *pre, const float *cp, float *gates, float *cn, float *tc,
                          float *hn) {
  for (int64_t b = 0; b < B; b++) {
    const float *a = pre + b * 4 * H, *c = cp + b * H;
    float *G = gates + b * 4 * H, *n = cn + b * H, *t = tc + b * H, *h = hn + b * H;
    attn_vmath_sigmoid_f32(a, G, 2 * H);
    attn_vmath_tanh_f32(a + 2 * H, G + 2 * H, H);
    attn_vmath_sigmoid_f32(a + 3 * H, G + 3 * H, H);
    LSTM_CELL_ROW(H, G, c, n);
    attn_vmath_tanh_f32(n, t, H);
    LSTM_OUT_ROW(H, G, t, h);
  }
}

/* The gradient of one step: dh (B, H) holds the new state's gradient from the step after, dy
 * (B, H) (this step's output gradient) is added to it; dc (B, H) the new cell's gradient. cp,
 * gates and tc as forward saved them. Writes dG (B, 4H), the gradient of the pre-activations
 * (of both projections: they are summed), and replaces dc by the previous cell's gradient dc f
 * (the caller sets dh to dG W_hh). Only products and sums: one source for both dtypes. */
#define LSTM_GATES_BWD(T)                                                                                    \
  static void gates_bwd_##T(int64_t B, int64_t H, const T *restrict dh, T *restrict dc, const T *restrict dy, \
                            const T *restrict cp, const T *restrict gates, const T *restrict tc,            \
                            T *restrict dG) {                                                               \
    for (int64_t b = 0; b < B; b++) {                                                                       \
      const T *G = gates + b * 4 * H, *t = tc + b * H, *p = cp + b * H;                                     \
      const T *h = dh + b * H, *y = dy + b * H;                                                             \
      T *c = dc + b * H, *d = dG + b * 4 * H;                                                               \
      for (int64_t j = 0; j < H; j++) {                                                                     \
        T gh = h[j] + y[j], i = G[j], f = G[H + j], g = G[2 * H + j], o = G[3 * H + j];                     \
        T dct = c[j] + gh * o * (1 - t[j] * t[j]);                                                          \
        d[j] = dct * g * (i * (1 - i));                                                                     \
        d[H + j] = dct * p[j] * (f * (1 - f));                                                              \
        d[2 * H + j] = dct * i * (1 - g * g);                                                               \
        d[3 * H + j] = gh * t[j] * (o * (1 - o));                                                           \
        c[j] = dct * f;                                                                                     \
      }                                                                                                     \
    }                                                                                                       \
  }
LSTM_GATES_BWD(float)
LSTM_GATES_BWD(double)

void attn_lstm_gates_forward(attn_dtype dt, int64_t B, int64_t H, const void *pre, const void *cp, void *gates,
                             void *cn, void *tc, void *hn) {
  if (dt == ATTN_F32)
    gates_fwd_f32(B, H, pre, cp, gates, cn, tc, hn);
  else
    gates_fwd_f64(B, H, pre, cp, gates, cn, tc, hn);
}

void attn_lstm_gates_backward(attn_dtype dt, int64_t B, int64_t H, const void *dh, void *dc, const void *dy,
                              const void *cp, const void *gates, const void *tc, void *dG) {
  if (dt == ATTN_F32)
    gates_bwd_float(B, H, dh, dc, dy, cp, gates, tc, dG);
  else
    gates_bwd_double(B, H, dh, dc, dy, cp, gates, tc, dG);
}

/* Pointers into layer k's planes of `saved`. */
typedef struct {
  char *hs, *cs, *gates, *tc;
} saved_layer;

static saved_layer layer_block(const attn_tensor *saved, const attn_saved_layout *l, int k) {
  saved_layer s = {attn_rnn_layer_part(saved, l, ATTN_LSTM_SAVED_HS, k),
                   attn_rnn_layer_part(saved, l, ATTN_LSTM_SAVED_CS, k),
                   attn_rnn_layer_part(saved, l, ATTN_LSTM_SAVED_GATES, k),
                   attn_rnn_layer_part(saved, l, ATTN_LSTM_SAVED_TC, k)};
  return s;
}

/* ---------------------------------------------------------------- forward */

attn_status attn_lstm_forward(const attn_tensor *x, const attn_tensor *h0, const attn_tensor *c0, int layers,
                              const attn_tensor *const *w_ih, const attn_tensor *const *w_hh,
                              const attn_tensor *const *b_ih, const attn_tensor *const *b_hh, double dropout_p,
                              uint64_t seed, attn_tensor *out, attn_tensor *hn, attn_tensor *cn,
                              attn_tensor *saved) {
  const char *op = "lstm";
  int64_t T, B, NI, H;
  attn_status st = attn_rnn_check_input(op, x, layers, w_ih, w_hh, 4, dropout_p, &T, &B, &NI, &H);
  attn_dtype dt = x->dtype;
  if (st == ATTN_OK && h0) st = attn_rnn_check_operand(op, "h0", 0, h0, dt, 3, layers, B, H);
  if (st == ATTN_OK && c0) st = attn_rnn_check_operand(op, "c0", 0, c0, dt, 3, layers, B, H);
  if (st == ATTN_OK) st = attn_rnn_check_biases(op, layers, dt, 4, H, b_ih, b_hh);
  if (st == ATTN_OK) st = attn_rnn_check_operand(op, "output", layers - 1, out, dt, 3, T, B, H);
  if (st == ATTN_OK) st = attn_rnn_check_operand(op, "final state", 0, hn, dt, 3, layers, B, H);
  if (st == ATTN_OK) st = attn_rnn_check_operand(op, "final cell", 0, cn, dt, 3, layers, B, H);
  attn_saved_layout lay;
  if (st == ATTN_OK && (st = attn_lstm_saved_layout(T, B, H, layers, &lay)) == ATTN_OK)
    st = attn_saved_check(op, &lay, saved, dt);
  if (st != ATTN_OK) return st;

  size_t es = attn_dtype_size(dt);
  int64_t TB = T * B;
  int drop = dropout_p > 0 && layers > 1;
  size_t n_state = (size_t)(B * H) * es, cap[3];
  size_t bytes[3] = {(size_t)(TB * 4 * H) * es, (size_t)(4 * H) * es, drop ? (size_t)(TB * H) * es : 0};
  char *bufs[3];
  if ((st = attn_rnn_alloc_all(op, x, 3, bytes, bufs, cap)) != ATTN_OK) return st;
  char *pre = bufs[0], *bias = bufs[1], *dropped = bufs[2];

  const char *input = attn_tensor_data(x);
  int64_t in_k = NI;
  for (int k = 0; k < layers; k++) {
    saved_layer s = layer_block(saved, &lay, k);
    /* both biases summed once: every step's rows start from b_ih + b_hh */
    const void *bi = b_ih[k] ? attn_tensor_data(b_ih[k]) : NULL, *bh = b_hh[k] ? attn_tensor_data(b_hh[k]) : NULL;
    const void *b0 = bi ? bi : bh;
    if (bi && bh) {
      memcpy(bias, bi, (size_t)(4 * H) * es);
      if (dt == ATTN_F32)
        for (int64_t j = 0; j < 4 * H; j++) ((float *)bias)[j] += ((const float *)bh)[j];
      else
        for (int64_t j = 0; j < 4 * H; j++) ((double *)bias)[j] += ((const double *)bh)[j];
      b0 = bias;
    }
    attn_fill_rows(pre, TB, 4 * H, es, b0);
    /* all steps' input projections in one product */
    gemm(dt, 0, 1, TB, 4 * H, in_k, input, in_k, attn_tensor_data(w_ih[k]), in_k, 1, pre, 4 * H);
    attn_rnn_copy_state(s.hs, h0, k, n_state);
    attn_rnn_copy_state(s.cs, c0, k, n_state);
    const void *whh = attn_tensor_data(w_hh[k]);
    for (int64_t t = 0; t < T; t++) {
      size_t off = (size_t)t * n_state;
      char *pt = pre + 4 * off;
      if (t > 0 || h0) gemm(dt, 0, 1, B, 4 * H, H, s.hs + off, H, whh, H, 1, pt, 4 * H); /* zero h0: no product */
      attn_lstm_gates_forward(dt, B, H, pt, s.cs + off, s.gates + 4 * off, s.cs + off + n_state, s.tc + off,
                    s.hs + off + n_state);
    }
    memcpy((char *)attn_tensor_data(hn) + (size_t)k * n_state, s.hs + (size_t)T * n_state, n_state);
    memcpy((char *)attn_tensor_data(cn) + (size_t)k * n_state, s.cs + (size_t)T * n_state, n_state);
    input = attn_rnn_pass_up(dt, k, layers, s.hs + n_state, TB, H, out, dropped, seed, dropout_p);
    in_k = H;
  }
  attn_rnn_free_all(bufs, cap, 3);
  return ATTN_OK;
}

/* ---------------------------------------------------------------- backward */

attn_status attn_lstm_backward(const attn_tensor *x, int layers, const attn_tensor *const *w_ih,
                               const attn_tensor *const *w_hh, double dropout_p, uint64_t seed,
                               const attn_tensor *saved, const attn_tensor *dout, const attn_tensor *dhn,
                               const attn_tensor *dcn, attn_tensor *dx, attn_tensor *dh0, attn_tensor *dc0,
                               attn_tensor *const *dw_ih, attn_tensor *const *dw_hh, attn_tensor *const *db_ih,
                               attn_tensor *const *db_hh) {
  const char *op = "lstm backward";
  int64_t T, B, NI, H;
  attn_status st = attn_rnn_check_input(op, x, layers, w_ih, w_hh, 4, dropout_p, &T, &B, &NI, &H);
  attn_dtype dt = x->dtype;
  attn_saved_layout lay;
  if (st == ATTN_OK && (st = attn_lstm_saved_layout(T, B, H, layers, &lay)) == ATTN_OK)
    st = attn_saved_check(op, &lay, saved, dt);
  if (st == ATTN_OK && dout) st = attn_rnn_check_operand(op, "output gradient", layers - 1, dout, dt, 3, T, B, H);
  if (st == ATTN_OK && dhn) st = attn_rnn_check_operand(op, "final state gradient", 0, dhn, dt, 3, layers, B, H);
  if (st == ATTN_OK && dcn) st = attn_rnn_check_operand(op, "final cell gradient", 0, dcn, dt, 3, layers, B, H);
  if (st == ATTN_OK) st = attn_rnn_check_operand(op, "input gradient", 0, dx, dt, 3, T, B, NI);
  if (st == ATTN_OK && dh0) st = attn_rnn_check_operand(op, "h0 gradient", 0, dh0, dt, 3, layers, B, H);
  if (st == ATTN_OK && dc0) st = attn_rnn_check_operand(op, "c0 gradient", 0, dc0, dt, 3, layers, B, H);
  if (st == ATTN_OK) st = attn_rnn_check_grads(op, layers, dt, 4, H, NI, dw_ih, dw_hh, db_ih, db_hh);
  if (st != ATTN_OK) return st;

  size_t es = attn_dtype_size(dt);
  int64_t TB = T * B;
  int drop = dropout_p > 0 && layers > 1;
  size_t n_dy = (size_t)(TB * H) * es, n_state = (size_t)(B * H) * es, cap[5];
  size_t bytes[5] = {n_dy, 4 * n_dy, n_state, n_state, drop ? n_dy : 0};
  char *bufs[5];
  if ((st = attn_rnn_alloc_all(op, x, 5, bytes, bufs, cap)) != ATTN_OK) return st;
  char *dy = bufs[0], *dG = bufs[1], *dh = bufs[2], *dc = bufs[3], *layer_in = bufs[4];

  /* the output gradient of layer k: dout for the top one (read in place), then what the layer
   * above leaves in dy */
  if (!dout) memset(dy, 0, n_dy);
  for (int k = layers - 1; k >= 0; k--) {
    saved_layer s = layer_block(saved, &lay, k);
    const char *gy = dout && k == layers - 1 ? (const char *)attn_tensor_data(dout) : dy;
    attn_rnn_copy_state(dh, dhn, k, n_state);
    attn_rnn_copy_state(dc, dcn, k, n_state);
    const void *whh = attn_tensor_data(w_hh[k]);
    for (int64_t t = T - 1; t >= 0; t--) {
      size_t off = (size_t)t * n_state;
      char *dGt = dG + 4 * off;
      /* the step's pre-activation gradient; dc becomes the previous cell's; dh = dG W_hh */
      attn_lstm_gates_backward(dt, B, H, dh, dc, gy + off, s.cs + off, s.gates + 4 * off, s.tc + off, dGt);
      if (t > 0 || dh0) gemm(dt, 0, 0, B, H, 4 * H, dGt, 4 * H, whh, H, 0, dh, H);
    }
    if (dh0) memcpy((char *)attn_tensor_data(dh0) + (size_t)k * n_state, dh, n_state);
    if (dc0) memcpy((char *)attn_tensor_data(dc0) + (size_t)k * n_state, dc, n_state);
    /* weight and bias gradients over all steps at once: both projections see the same dG */
    if (dw_hh[k]) gemm(dt, 1, 0, 4 * H, H, TB, dG, 4 * H, s.hs, H, 0, attn_tensor_data(dw_hh[k]), H);
    if (db_ih[k]) attn_colsum_rows(dt, dG, TB, 4 * H, attn_tensor_data(db_ih[k]));
    if (db_hh[k]) {
      if (db_ih[k])
        memcpy(attn_tensor_data(db_hh[k]), attn_tensor_data(db_ih[k]), (size_t)(4 * H) * es);
      else
        attn_colsum_rows(dt, dG, TB, 4 * H, attn_tensor_data(db_hh[k]));
    }
    int64_t in_k = k ? H : NI;
    const char *input = attn_rnn_layer_input(dt, k, x, saved, &lay, ATTN_LSTM_SAVED_HS, n_state, TB, H, layer_in,
                                             seed, dropout_p);
    if (dw_ih[k]) gemm(dt, 1, 0, 4 * H, in_k, TB, dG, 4 * H, input, in_k, 0, attn_tensor_data(dw_ih[k]), in_k);
    /* the input's gradient: dx for the first layer, else the layer below's output gradient */
    void *din = k ? (void *)dy : attn_tensor_data(dx);
    gemm(dt, 0, 0, TB, in_k, 4 * H, dG, 4 * H, attn_tensor_data(w_ih[k]), in_k, 0, din, in_k);
    if (k > 0 && drop) attn_dropout_flat(dt, dy, dy, TB * H, seed + (uint64_t)(k - 1), dropout_p);
  }
  attn_rnn_free_all(bufs, cap, 5);
  return ATTN_OK;
}
