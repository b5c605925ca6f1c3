/* The fused GRU: see attn_rnn.h for the model. Buffers come from the caching
 * allocator, so a training loop reuses warm pages step after step. */
#include "attn_rnn.h"

#include <math.h>
#include <string.h>

#include "attn_alloc.h"
#include "attn_dropout.h"
#include "attn_gemm.h"
#include "attn_vmath.h"

/* C = op(A) op(B) + beta C, row-major: the engine's small-product kernel or BLAS (attn_gemm.h). */
static void gemm(attn_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                 const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
  attn_gemm(dt, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

static void sigmoid_row_f64(const double *x, double *y, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = x[j] >= 0 ? 1 / (1 + exp(-x[j])) : exp(x[j]) / (1 + exp(x[j]));
}
static void tanh_row_f64(const double *x, double *y, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = tanh(x[j]);
}

/* Per-dtype step kernels (the dtype is the only difference, hence the macro).
 *
 * gates_fwd: gi (B, 3H) input projections of this step, gh (B, 3H) recurrent
 * ones, hp (B, H) the previous state; writes the new state hn (B, H) and the
 * saved planes rz (B, 2H), n (B, H), ghn (B, H).
 *
 * gates_bwd: from dh (B, H), the gradient of the new state, writes dgi and
 * dgh (B, 3H), the gradients of the two projections, and replaces dh by
 * dh * z (the direct part of the previous state's gradient; the caller adds
 * dgh W_hh). Its buffers do not overlap (restrict), so the loop vectorises. */
#define DEFINE_STEP(S, T, SIGMOID, TANH)                                                              \
  static void gates_fwd_##S(int64_t B, int64_t H, const T *gi, const T *gh, const T *hp, T *hn, T *rz, T *n, \
                            T *ghn) {                                                                 \
    for (int64_t b = 0; b < B; b++)                                                                   \
      for (int64_t j = 0; j < 2 * H; j++) rz[b * 2 * H + j] = gi[b * 3 * H + j] + gh[b * 3 * H + j];  \
    SIGMOID(rz, rz, B * 2 * H);                                                                       \
    for (int64_t b = 0; b < B; b++)                                                                   \
      for (int64_t j = 0; j < H; j++) {                                                               \
        T g = gh[b * 3 * H + 2 * H + j];                                                              \
        ghn[b * H + j] = g;                                                                           \
        n[b * H + j] = gi[b * 3 * H + 2 * H + j] + rz[b * 2 * H + j] * g;                             \
      }                                                                                               \
    TANH(n, n, B * H);                                                                                \
    for (int64_t b = 0; b < B; b++)                                                                   \
      for (int64_t j = 0; j < H; j++) {                                                               \
        T z = rz[b * 2 * H + H + j], v = n[b * H + j];                                                \
        hn[b * H + j] = v + z * (hp[b * H + j] - v);                                                  \
      }                                                                                               \
  }                                                                                                   \
  static void gates_bwd_##S(int64_t B, int64_t H, T *restrict dh, const T *restrict hp,              \
                            const T *restrict rz, const T *restrict n, const T *restrict ghn,         \
                            T *restrict dgi, T *restrict dgh) {                                       \
    for (int64_t b = 0; b < B; b++)                                                                   \
      for (int64_t j = 0; j < H; j++) {                                                               \
        T g = dh[b * H + j], r = rz[b * 2 * H + j], z = rz[b * 2 * H + H + j], v = n[b * H + j];      \
        T dn = g - g * z, dz = g * (hp[b * H + j] - v);                                               \
        T dan = dn * (1 - v * v), daz = dz * (z * (1 - z));                                           \
        T dar = (dan * ghn[b * H + j]) * (r * (1 - r));                                               \
        T *i = dgi + b * 3 * H, *h = dgh + b * 3 * H;                                                 \
        i[j] = h[j] = dar;                                                                            \
        i[H + j] = h[H + j] = daz;                                                                    \
        i[2 * H + j] = dan;                                                                           \
        h[2 * H + j] = dan * r;                                                                       \
        dh[b * H + j] = g * z;                                                                        \
      }                                                                                               \
  }                                                                                                   \
  /* out[c] = sum over rows of m (rows, cols), accumulated in double, each column in row order: 8  \
   * columns at a time down all the rows, their sums held in registers (a row at a time through    \
   * acc made every step a load and a store of acc), the rest through acc. */                        \
  static void colsum_##S(const T *m, int64_t rows, int64_t cols, double *acc, T *out) {               \
    int64_t c0 = 0;                                                                                   \
    for (; c0 + 8 <= cols; c0 += 8) {                                                                 \
      double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;                          \
      for (int64_t r = 0; r < rows; r++) {                                                            \
        const T *x = m + r * cols + c0;                                                               \
        a0 += x[0], a1 += x[1], a2 += x[2], a3 += x[3], a4 += x[4], a5 += x[5], a6 += x[6], a7 += x[7]; \
      }                                                                                               \
      out[c0] = (T)a0, out[c0 + 1] = (T)a1, out[c0 + 2] = (T)a2, out[c0 + 3] = (T)a3;                 \
      out[c0 + 4] = (T)a4, out[c0 + 5] = (T)a5, out[c0 + 6] = (T)a6, out[c0 + 7] = (T)a7;             \
    }                                                                                                 \
    memset(acc, 0, (size_t)cols * sizeof(double));                                                    \
    for (int64_t r = 0; r < rows; r++)                                                                \
      for (int64_t c = c0; c < cols; c++) acc[c] += m[r * cols + c];                                  \
    for (int64_t c = c0; c < cols; c++) out[c] = (T)acc[c];                                           \
  }                                                                                                   \
  /* Every row of m (rows, cols) set to v (cols), or zeros when v is NULL. */                         \
  static void fill_rows_##S(T *m, int64_t rows, int64_t cols, const T *v) {                           \
    for (int64_t r = 0; r < rows; r++)                                                                \
      if (v)                                                                                          \
        memcpy(m + r * cols, v, (size_t)cols * sizeof(T));                                            \
      else                                                                                            \
        memset(m + r * cols, 0, (size_t)cols * sizeof(T));                                            \
  }

DEFINE_STEP(f32, float, attn_vmath_sigmoid_f32, attn_vmath_tanh_f32)
DEFINE_STEP(f64, double, sigmoid_row_f64, tanh_row_f64)

int64_t attn_gru_saved_numel(int64_t T, int64_t B, int64_t H, int layers) {
  return (int64_t)layers * ((T + 1) * B * H + 4 * T * B * H);
}

/* Pointers into one layer's block of `saved`. */
typedef struct {
  char *hs, *rz, *n, *ghn;
} saved_layer;

static saved_layer layer_block(const attn_tensor *saved, int k, int64_t T, int64_t B, int64_t H) {
  size_t es = attn_dtype_size(saved->dtype);
  char *base = (char *)attn_tensor_data(saved) + (size_t)(attn_gru_saved_numel(T, B, H, k)) * es;
  saved_layer s;
  s.hs = base;
  s.rz = s.hs + (size_t)((T + 1) * B * H) * es;
  s.n = s.rz + (size_t)(2 * T * B * H) * es;
  s.ghn = s.n + (size_t)(T * B * H) * es;
  return s;
}

/* The engine's dropout (attn_dropout.h) on a contiguous buffer, stream seed. */
static void dropout(attn_dtype dt, const void *x, void *y, int64_t n, uint64_t seed, double p) {
  attn_dropout_rule r = attn_dropout_rule_make(p, seed);
  if (dt == ATTN_F32)
    attn_dropout_f32(&r, x, y, n, 0);
  else
    attn_dropout_f64(&r, x, y, n, 0);
}

/* ---------------------------------------------------------------- checks */

static int has_shape(const attn_tensor *t, int nd, int64_t a, int64_t b, int64_t c) {
  int64_t want[3] = {a, b, c};
  if (!t || t->ndim != nd) return 0;
  for (int d = 0; d < nd; d++)
    if (t->shape[d] != want[d]) return 0;
  return 1;
}

static attn_status check_operand(const char *op, const char *what, int k, const attn_tensor *t, attn_dtype dt,
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

/* Validates the operands both directions share; sets T, B, NI (the input size) and H. */
static attn_status check_common(const char *op, const attn_tensor *x, const attn_tensor *h0, int layers,
                                const attn_tensor *const *w_ih, const attn_tensor *const *w_hh, double dropout_p,
                                int64_t *T, int64_t *B, int64_t *NI, int64_t *H) {
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
    st = check_operand(op, "weight_ih", k, w_ih[k], x->dtype, 2, 3 * *H, k == 0 ? *NI : *H, 0);
    if (st == ATTN_OK) st = check_operand(op, "weight_hh", k, w_hh[k], x->dtype, 2, 3 * *H, *H, 0);
  }
  if (st == ATTN_OK && h0) st = check_operand(op, "h0", 0, h0, x->dtype, 3, layers, *B, *H);
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
  for (int k = 0; k < layers && st == ATTN_OK; k++) {
    if (b_ih[k]) st = check_operand(op, "bias_ih", k, b_ih[k], x->dtype, 1, 3 * H, 0, 0);
    if (st == ATTN_OK && b_hh[k]) st = check_operand(op, "bias_hh", k, b_hh[k], x->dtype, 1, 3 * H, 0, 0);
  }
  if (st == ATTN_OK) st = check_operand(op, "output", layers - 1, out, x->dtype, 3, T, B, H);
  if (st == ATTN_OK) st = check_operand(op, "final state", 0, hn, x->dtype, 3, layers, B, H);
  if (st == ATTN_OK)
    st = check_operand(op, "saved", 0, saved, x->dtype, 1, attn_gru_saved_numel(T, B, H, layers), 0, 0);
  if (st != ATTN_OK) return st;

  attn_dtype dt = x->dtype;
  size_t es = attn_dtype_size(dt);
  int64_t TB = T * B;
  size_t cap_gi, cap_gh, cap_drop = 0;
  char *gi = attn_alloc((size_t)(TB * 3 * H) * es, &cap_gi);
  char *gh = attn_alloc((size_t)(B * 3 * H) * es, &cap_gh);
  int drop = dropout_p > 0 && layers > 1;
  char *dropped = drop ? attn_alloc((size_t)(TB * H) * es, &cap_drop) : NULL;
  if (!gi || !gh || (drop && !dropped)) {
    if (gi) attn_free(gi, cap_gi);
    if (gh) attn_free(gh, cap_gh);
    if (dropped) attn_free(dropped, cap_drop);
    return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the %s workspace", op, attn_tensor_shape_str(x));
  }

  const char *input = attn_tensor_data(x);
  int64_t in_k = NI;
  for (int k = 0; k < layers; k++) {
    saved_layer s = layer_block(saved, k, T, B, H);
    const void *bi = b_ih[k] ? attn_tensor_data(b_ih[k]) : NULL;
    const void *bh = b_hh[k] ? attn_tensor_data(b_hh[k]) : NULL;
    /* all steps' input projections in one GEMM, on top of the bias rows */
    if (dt == ATTN_F32)
      fill_rows_f32((float *)gi, TB, 3 * H, bi);
    else
      fill_rows_f64((double *)gi, TB, 3 * H, bi);
    gemm(dt, 0, 1, TB, 3 * H, in_k, input, in_k, attn_tensor_data(w_ih[k]), in_k, 1, gi, 3 * H);
    if (h0)
      memcpy(s.hs, (const char *)attn_tensor_data(h0) + (size_t)(k * B * H) * es, (size_t)(B * H) * es);
    else
      memset(s.hs, 0, (size_t)(B * H) * es);
    for (int64_t t = 0; t < T; t++) {
      size_t bh_off = (size_t)(t * B * H) * es;
      if (dt == ATTN_F32)
        fill_rows_f32((float *)gh, B, 3 * H, bh);
      else
        fill_rows_f64((double *)gh, B, 3 * H, bh);
      gemm(dt, 0, 1, B, 3 * H, H, s.hs + bh_off, H, attn_tensor_data(w_hh[k]), H, 1, gh, 3 * H);
      char *git = gi + (size_t)(t * B * 3 * H) * es;
      if (dt == ATTN_F32)
        gates_fwd_f32(B, H, (const float *)git, (const float *)gh, (const float *)(s.hs + bh_off),
                      (float *)(s.hs + bh_off + (size_t)(B * H) * es), (float *)(s.rz + 2 * bh_off),
                      (float *)(s.n + bh_off), (float *)(s.ghn + bh_off));
      else
        gates_fwd_f64(B, H, (const double *)git, (const double *)gh, (const double *)(s.hs + bh_off),
                      (double *)(s.hs + bh_off + (size_t)(B * H) * es), (double *)(s.rz + 2 * bh_off),
                      (double *)(s.n + bh_off), (double *)(s.ghn + bh_off));
    }
    memcpy((char *)attn_tensor_data(hn) + (size_t)(k * B * H) * es, s.hs + (size_t)(T * B * H) * es,
           (size_t)(B * H) * es);
    const char *states = s.hs + (size_t)(B * H) * es; /* h_1 .. h_T */
    if (k == layers - 1) {
      memcpy(attn_tensor_data(out), states, (size_t)(TB * H) * es);
    } else if (drop) {
      dropout(dt, states, dropped, TB * H, seed + (uint64_t)k, dropout_p);
      input = dropped;
    } else {
      input = states;
    }
    in_k = H;
  }
  attn_free(gi, cap_gi);
  attn_free(gh, cap_gh);
  if (dropped) attn_free(dropped, cap_drop);
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
  if (st == ATTN_OK)
    st = check_operand(op, "saved", 0, saved, x->dtype, 1, attn_gru_saved_numel(T, B, H, layers), 0, 0);
  if (st == ATTN_OK && dout) st = check_operand(op, "output gradient", layers - 1, dout, x->dtype, 3, T, B, H);
  if (st == ATTN_OK && dhn) st = check_operand(op, "final state gradient", 0, dhn, x->dtype, 3, layers, B, H);
  if (st == ATTN_OK) st = check_operand(op, "input gradient", 0, dx, x->dtype, 3, T, B, NI);
  if (st == ATTN_OK && dh0) st = check_operand(op, "h0 gradient", 0, dh0, x->dtype, 3, layers, B, H);
  for (int k = 0; k < layers && st == ATTN_OK; k++) {
    if (dw_ih[k]) st = check_operand(op, "weight_ih gradient", k, dw_ih[k], x->dtype, 2, 3 * H, k ? H : NI, 0);
    if (st == ATTN_OK && dw_hh[k])
      st = check_operand(op, "weight_hh gradient", k, dw_hh[k], x->dtype, 2, 3 * H, H, 0);
    if (st == ATTN_OK && db_ih[k]) st = check_operand(op, "bias_ih gradient", k, db_ih[k], x->dtype, 1, 3 * H, 0, 0);
    if (st == ATTN_OK && db_hh[k]) st = check_operand(op, "bias_hh gradient", k, db_hh[k], x->dtype, 1, 3 * H, 0, 0);
  }
  if (st != ATTN_OK) return st;

  attn_dtype dt = x->dtype;
  size_t es = attn_dtype_size(dt);
  int64_t TB = T * B;
  int drop = dropout_p > 0 && layers > 1;
  size_t n_dy = (size_t)(TB * H) * es, n_dg = (size_t)(TB * 3 * H) * es, n_dh = (size_t)(B * H) * es;
  size_t n_acc = (size_t)(3 * H) * sizeof(double);
  size_t cap[6] = {0};
  char *dy = attn_alloc(n_dy, &cap[0]), *dgi = attn_alloc(n_dg, &cap[1]), *dgh = attn_alloc(n_dg, &cap[2]);
  char *dh = attn_alloc(n_dh, &cap[3]), *acc = attn_alloc(n_acc, &cap[4]);
  char *layer_in = drop ? attn_alloc(n_dy, &cap[5]) : NULL;
  if (!dy || !dgi || !dgh || !dh || !acc || (drop && !layer_in)) {
    char *bufs[6] = {dy, dgi, dgh, dh, acc, layer_in};
    for (int i = 0; i < 6; i++)
      if (bufs[i]) attn_free(bufs[i], cap[i]);
    return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the %s workspace", op, attn_tensor_shape_str(x));
  }

  if (dout)
    memcpy(dy, attn_tensor_data(dout), n_dy);
  else
    memset(dy, 0, n_dy);
  for (int k = layers - 1; k >= 0; k--) {
    saved_layer s = layer_block(saved, k, T, B, H);
    if (dhn)
      memcpy(dh, (const char *)attn_tensor_data(dhn) + (size_t)k * n_dh, n_dh);
    else
      memset(dh, 0, n_dh);
    const void *whh = attn_tensor_data(w_hh[k]);
    for (int64_t t = T - 1; t >= 0; t--) {
      size_t off = (size_t)(t * B * H) * es;
      char *dgit = dgi + 3 * off, *dght = dgh + 3 * off;
      /* dh += dy[t]; then the step's gate gradients; dh becomes dh * z + dgh W_hh */
      if (dt == ATTN_F32) {
        float *g = (float *)dh;
        const float *d = (const float *)(dy + off);
        for (int64_t i = 0; i < B * H; i++) g[i] += d[i];
        gates_bwd_f32(B, H, g, (const float *)(s.hs + off), (const float *)(s.rz + 2 * off),
                      (const float *)(s.n + off), (const float *)(s.ghn + off), (float *)dgit, (float *)dght);
      } else {
        double *g = (double *)dh;
        const double *d = (const double *)(dy + off);
        for (int64_t i = 0; i < B * H; i++) g[i] += d[i];
        gates_bwd_f64(B, H, g, (const double *)(s.hs + off), (const double *)(s.rz + 2 * off),
                      (const double *)(s.n + off), (const double *)(s.ghn + off), (double *)dgit, (double *)dght);
      }
      gemm(dt, 0, 0, B, H, 3 * H, dght, 3 * H, whh, H, 1, dh, H);
    }
    if (dh0) memcpy((char *)attn_tensor_data(dh0) + (size_t)k * n_dh, dh, n_dh);
    /* weight gradients over all steps at once */
    if (dw_hh[k]) gemm(dt, 1, 0, 3 * H, H, TB, dgh, 3 * H, s.hs, H, 0, attn_tensor_data(dw_hh[k]), H);
    for (int which = 0; which < 2; which++) {
      attn_tensor *db = which ? db_hh[k] : db_ih[k];
      const char *g = which ? dgh : dgi;
      if (!db) continue;
      if (dt == ATTN_F32)
        colsum_f32((const float *)g, TB, 3 * H, (double *)acc, attn_tensor_data(db));
      else
        colsum_f64((const double *)g, TB, 3 * H, (double *)acc, attn_tensor_data(db));
    }
    int64_t in_k = k ? H : NI;
    const char *input = attn_tensor_data(x);
    if (k > 0) {
      saved_layer below = layer_block(saved, k - 1, T, B, H);
      input = below.hs + n_dh; /* the layer below's h_1 .. h_T */
      if (drop) {
        dropout(dt, input, layer_in, TB * H, seed + (uint64_t)(k - 1), dropout_p);
        input = layer_in;
      }
    }
    if (dw_ih[k]) gemm(dt, 1, 0, 3 * H, in_k, TB, dgi, 3 * H, input, in_k, 0, attn_tensor_data(dw_ih[k]), in_k);
    /* the input's gradient: dx for the first layer, else the layer below's output gradient */
    void *din = k ? (void *)dy : attn_tensor_data(dx);
    gemm(dt, 0, 0, TB, in_k, 3 * H, dgi, 3 * H, attn_tensor_data(w_ih[k]), in_k, 0, din, in_k);
    if (k > 0 && drop) dropout(dt, dy, dy, TB * H, seed + (uint64_t)(k - 1), dropout_p);
  }
  char *bufs[6] = {dy, dgi, dgh, dh, acc, layer_in};
  for (int i = 0; i < 6; i++)
    if (bufs[i]) attn_free(bufs[i], cap[i]);
  return ATTN_OK;
}
