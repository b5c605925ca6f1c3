/* The fused Show, Attend and Tell decoder: see attn_caption.h for the model. The per-step pieces
 * are the engine's own kernels (attn_gemm, the additive scores, attention over given scores, the
 * LSTM's gate math), called in the order and on the shapes of the step-by-step composition
 * (nn.Linear's products with the bias rows first, the LSTM cell's x W_ih^T then h W_hh^T), so
 * the forward numbers are those of the composition. The backward's additive scores are its own
 * small kernel (tanh_bwd_job) on the tanh values the forward kept. */
#include "nn/attn_caption.h"

#include <math.h>
#include <string.h>

#include "attention/attn_attention.h"
#include "core/attn_gemm.h"
#include "core/attn_ops.h"
#include "core/attn_parallel.h"
#include "core/attn_vmath.h"
#include "nn/attn_lstm.h"
#include "nn/attn_steps_internal.h"

/* ---------------------------------------------------------------- layout of `saved` */

attn_status attn_caption_saved_layout(const attn_caption_dims *d, attn_saved_layout *l) {
  attn_saved_begin(l, "show_attend_tell");
  int64_t T1, H4;
  if (__builtin_add_overflow(d->T, 1, &T1) || __builtin_mul_overflow(d->H, 4, &H4))
    return attn_error(ATTN_ERR_SHAPE, "%s: %lld steps and %lld hidden units do not fit a saved buffer", l->op,
                      (long long)d->T, (long long)d->H);
  const int64_t T = d->T, B = d->B;
  const int64_t hs[3] = {T1, B, d->H}, gates[3] = {T, B, H4}, tc[3] = {T, B, d->H}, qh[3] = {T, B, d->A};
  const int64_t scores[3] = {T, B, d->L}, ctx[3] = {T, B, d->D}, beta[2] = {T, B}, th[4] = {T, B, d->L, d->A};
  attn_status st;
  if ((st = attn_saved_add(l, "hs", 3, hs)) != ATTN_OK || (st = attn_saved_add(l, "cs", 3, hs)) != ATTN_OK ||
      (st = attn_saved_add(l, "gates", 3, gates)) != ATTN_OK || (st = attn_saved_add(l, "tc", 3, tc)) != ATTN_OK ||
      (st = attn_saved_add(l, "qh", 3, qh)) != ATTN_OK || (st = attn_saved_add(l, "scores", 3, scores)) != ATTN_OK ||
      (st = attn_saved_add(l, "weights", 3, scores)) != ATTN_OK || (st = attn_saved_add(l, "ctx", 3, ctx)) != ATTN_OK ||
      (st = attn_saved_add(l, "beta", 2, beta)) != ATTN_OK)
    return st;
  return attn_saved_add(l, "tanh", 4, th);
}

/* The parts' offsets in `saved`. */
typedef struct {
  int64_t hs, cs, gates, tc, qh, scores, weights, ctx, beta, tanh;
} layout;

static layout layout_of(const attn_saved_layout *s) {
  layout l = {s->part[ATTN_CAPTION_SAVED_HS].offset,     s->part[ATTN_CAPTION_SAVED_CS].offset,
              s->part[ATTN_CAPTION_SAVED_GATES].offset,  s->part[ATTN_CAPTION_SAVED_TC].offset,
              s->part[ATTN_CAPTION_SAVED_QH].offset,     s->part[ATTN_CAPTION_SAVED_SCORES].offset,
              s->part[ATTN_CAPTION_SAVED_WEIGHTS].offset, s->part[ATTN_CAPTION_SAVED_CTX].offset,
              s->part[ATTN_CAPTION_SAVED_BETA].offset,    s->part[ATTN_CAPTION_SAVED_TANH].offset};
  return l;
}

/* ---------------------------------------------------------------- checks */

/* t must be present, contiguous, of dtype dt and of shape (s[0], .., s[nd-1]). */
static attn_status check_operand(const char *op, const char *what, const attn_tensor *t, attn_dtype dt, int nd,
                                 int64_t s0, int64_t s1, int64_t s2) {
  const int64_t want[3] = {s0, s1, s2};
  if (!t) return attn_error(ATTN_ERR_ARG, "%s: %s is missing", op, what);
  int ok = t->ndim == nd;
  for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == want[i];
  if (!ok)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s is %s, expected %s", op, what, attn_tensor_shape_str(t),
                      attn_shape_str(nd, want));
  if (t->dtype != dt)
    return attn_error(ATTN_ERR_DTYPE, "%s: %s is %s, the embeddings are %s", op, what, attn_dtype_name(t->dtype),
                      attn_dtype_name(dt));
  if (!attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_ARG, "%s: %s %s must be contiguous", op, what, attn_tensor_shape_str(t));
  return ATTN_OK;
}

/* t must be nd-D with every size at least 1. */
static attn_status check_sizes(const char *op, const char *what, const char *form, const attn_tensor *t, int nd) {
  int ok = t && t->ndim == nd;
  for (int i = 0; ok && i < nd; i++) ok = t->shape[i] >= 1;
  if (!ok)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be %s with every size at least 1", op, what,
                      t ? attn_tensor_shape_str(t) : "(missing)", form);
  return ATTN_OK;
}

attn_status attn_caption_check(const char *op, const attn_caption_args *a, attn_caption_dims *d) {
  attn_status st;
  if ((st = check_sizes(op, "embeddings", "(T, B, embed)", a->emb, 3)) != ATTN_OK ||
      (st = check_sizes(op, "feats", "(B, L, D)", a->feats, 3)) != ATTN_OK ||
      (st = check_sizes(op, "keys", "(B, L, A)", a->keys, 3)) != ATTN_OK ||
      (st = check_sizes(op, "h0", "(B, H)", a->h0, 2)) != ATTN_OK)
    return st;
  if ((st = attn_check_float(op, a->emb)) != ATTN_OK) return st;
  attn_dtype dt = a->emb->dtype;
  d->T = a->emb->shape[0], d->B = a->emb->shape[1], d->E = a->emb->shape[2];
  d->L = a->feats->shape[1], d->D = a->feats->shape[2], d->A = a->keys->shape[2], d->H = a->h0->shape[1];
  /* every product's size and leading dim below 2^31 (attn_gemm's bound), so no count below overflows */
  const double lim = 2147483648.0;
  if (1.0 * d->T * d->B >= lim || 1.0 * d->B * d->L >= lim || 1.0 * d->A >= lim || 1.0 * d->E + d->D + d->H >= lim ||
      4.0 * d->H >= lim)
    return attn_error(ATTN_ERR_SHAPE, "%s: embeddings %s, feats %s and state %s are too large for one call", op,
                      attn_tensor_shape_str(a->emb), attn_tensor_shape_str(a->feats), attn_tensor_shape_str(a->h0));
  int64_t T = d->T, B = d->B, L = d->L, D = d->D, A = d->A, E = d->E, H = d->H;
  (void)T;
  if ((st = check_operand(op, "embeddings", a->emb, dt, 3, d->T, B, E)) != ATTN_OK ||
      (st = check_operand(op, "feats", a->feats, dt, 3, B, L, D)) != ATTN_OK ||
      (st = check_operand(op, "keys", a->keys, dt, 3, B, L, A)) != ATTN_OK ||
      (st = check_operand(op, "h0", a->h0, dt, 2, B, H, 0)) != ATTN_OK ||
      (st = check_operand(op, "c0", a->c0, dt, 2, B, H, 0)) != ATTN_OK ||
      (st = check_operand(op, "W_q", a->w_q, dt, 2, A, H, 0)) != ATTN_OK ||
      (st = check_operand(op, "w_beta", a->w_beta, dt, 2, 1, H, 0)) != ATTN_OK ||
      (a->b_beta && (st = check_operand(op, "b_beta", a->b_beta, dt, 1, 1, 0, 0)) != ATTN_OK) ||
      (st = check_operand(op, "weight_ih", a->w_ih, dt, 2, 4 * H, E + D, 0)) != ATTN_OK ||
      (st = check_operand(op, "weight_hh", a->w_hh, dt, 2, 4 * H, H, 0)) != ATTN_OK ||
      (a->b_ih && (st = check_operand(op, "bias_ih", a->b_ih, dt, 1, 4 * H, 0, 0)) != ATTN_OK) ||
      (a->b_hh && (st = check_operand(op, "bias_hh", a->b_hh, dt, 1, 4 * H, 0, 0)) != ATTN_OK))
    return st;
  if (a->w_v && a->w_v->ndim == 2) return check_operand(op, "w_v", a->w_v, dt, 2, 1, A, 0);
  return check_operand(op, "w_v", a->w_v, dt, 1, A, 0, 0);
}

/* ---------------------------------------------------------------- forward */

/* y (n) = sigmoid(y), as the tensor op computes it (attn_vmath's row for float32). */
static void sigmoid_rows(attn_dtype dt, void *y, int64_t n) {
  if (dt == ATTN_F32) {
    attn_vmath_sigmoid_f32(y, y, n);
    return;
  }
  double *v = y;
  for (int64_t i = 0; i < n; i++) v[i] = v[i] >= 0 ? 1 / (1 + exp(-v[i])) : exp(v[i]) / (1 + exp(v[i]));
}

/* z (B, ldz) columns 0..D-1 = ctx (B, D) scaled by beta (B) per row. */
static void gate_rows(attn_dtype dt, int64_t B, int64_t D, const void *ctx, const void *beta, void *z, int64_t ldz) {
  for (int64_t b = 0; b < B; b++) {
    if (dt == ATTN_F32) {
      const float *c = (const float *)ctx + b * D, s = ((const float *)beta)[b];
      float *o = (float *)z + b * ldz;
      for (int64_t j = 0; j < D; j++) o[j] = c[j] * s;
    } else {
      const double *c = (const double *)ctx + b * D, s = ((const double *)beta)[b];
      double *o = (double *)z + b * ldz;
      for (int64_t j = 0; j < D; j++) o[j] = c[j] * s;
    }
  }
}

/* The w_v operand as an (A) view. */
static attn_tensor wv_view(const attn_tensor *w_v, int64_t A) {
  const int64_t shape = A, stride = 1;
  return attn_view_as_strided(w_v, 1, &shape, &stride);
}

attn_status attn_caption_forward(const attn_caption_args *a, attn_tensor *out, attn_tensor *alphas,
                                 attn_tensor *betas, attn_tensor *saved) {
  const char *op = "show_attend_tell";
  attn_caption_dims d;
  attn_status st = attn_caption_check(op, a, &d);
  if (st != ATTN_OK) return st;
  attn_dtype dt = a->emb->dtype;
  int64_t T = d.T, B = d.B, L = d.L, D = d.D, A = d.A, E = d.E, H = d.H, IN = E + D, BH = B * H;
  attn_saved_layout sl;
  if ((st = check_operand(op, "output", out, dt, 3, B, T, H + D)) != ATTN_OK ||
      (st = check_operand(op, "alphas", alphas, dt, 3, B, T, L)) != ATTN_OK ||
      (st = check_operand(op, "betas", betas, dt, 2, B, T, 0)) != ATTN_OK ||
      (st = attn_caption_saved_layout(&d, &sl)) != ATTN_OK || (st = attn_saved_check(op, &sl, saved, dt)) != ATTN_OK)
    return st;
  size_t es = attn_dtype_size(dt);
  layout lay = layout_of(&sl);
  /* workspace: the LSTM input x = cat(emb, z) (B, E + D), its pre-activations (B, 4H), the
   * summed biases (4H) */
  int64_t w_x = 0, w_pre = w_x + B * IN, w_bias = w_pre + B * 4 * H, wn = w_bias + 4 * H;
  attn_tensor ws = {0};
  if ((st = attn_tensor_init(&ws, dt, 1, &wn)) != ATTN_OK) return st;
  /* both biases summed once, as the LSTM kernel does */
  const void *bias = a->b_ih ? attn_tensor_data(a->b_ih) : a->b_hh ? attn_tensor_data(a->b_hh) : NULL;
  if (a->b_ih && a->b_hh) {
    memcpy(at(&ws, w_bias), attn_tensor_data(a->b_ih), (size_t)(4 * H) * es);
    add_into(dt, at(&ws, w_bias), attn_tensor_data(a->b_hh), 4 * H);
    bias = at(&ws, w_bias);
  }
  attn_tensor wv = wv_view(a->w_v, A);
  char *x = at(&ws, w_x), *pre = at(&ws, w_pre);
  memcpy(at(saved, lay.hs), attn_tensor_data(a->h0), (size_t)BH * es);
  memcpy(at(saved, lay.cs), attn_tensor_data(a->c0), (size_t)BH * es);
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.training = 0;
  for (int64_t t = 0; t < T && st == ATTN_OK; t++) {
    int64_t tb = t * B;
    char *hp = at(saved, lay.hs + tb * H), *cp = at(saved, lay.cs + tb * H), *beta = at(saved, lay.beta + tb);
    /* the query and the scores from the previous state */
    gemm(dt, 0, 1, B, A, H, hp, H, attn_tensor_data(a->w_q), H, 0, at(saved, lay.qh + tb * A), A);
    attn_tensor qv = view3(saved, lay.qh + tb * A, B, 1, A), sv = view3(saved, lay.scores + tb * L, B, 1, L);
    attn_tensor wtv = view3(saved, lay.weights + tb * L, B, 1, L), cv = view3(saved, lay.ctx + tb * D, B, 1, D);
    const int64_t th_shape[4] = {B, 1, L, A}, th_stride[4] = {L * A, L * A, A, 1};
    attn_tensor thv = attn_view_as_strided(saved, 4, th_shape, th_stride);
    thv.offset = saved->offset + lay.tanh + tb * L * A;
    if ((st = attn_attention_additive_scores_forward_tanh(&qv, a->keys, &wv, &sv, &thv)) != ATTN_OK ||
        (st = attn_attention_scores_forward(op, &sv, a->feats, &o, &cv, &wtv)) != ATTN_OK)
      break;
    /* the gate: sigmoid(h w_beta^T + b_beta), the bias rows first (nn.Linear's addmm) */
    attn_fill_rows(beta, B, 1, es, a->b_beta ? attn_tensor_data(a->b_beta) : NULL);
    gemm(dt, 0, 1, B, 1, H, hp, H, attn_tensor_data(a->w_beta), H, 1, beta, 1);
    sigmoid_rows(dt, beta, B);
    /* the LSTM step on x = cat(emb[t], beta ctx) */
    for (int64_t b = 0; b < B; b++)
      memcpy(x + (size_t)(b * IN) * es, at(a->emb, (tb + b) * E), (size_t)E * es);
    gate_rows(dt, B, D, at(saved, lay.ctx + tb * D), beta, x + (size_t)E * es, IN);
    attn_fill_rows(pre, B, 4 * H, es, bias);
    gemm(dt, 0, 1, B, 4 * H, IN, x, IN, attn_tensor_data(a->w_ih), IN, 1, pre, 4 * H);
    gemm(dt, 0, 1, B, 4 * H, H, hp, H, attn_tensor_data(a->w_hh), H, 1, pre, 4 * H);
    attn_lstm_gates_forward(dt, B, H, pre, cp, at(saved, lay.gates + tb * 4 * H), cp + (size_t)BH * es,
                            at(saved, lay.tc + tb * H), hp + (size_t)BH * es);
    /* the batch-major outputs: cat(h, z), alpha, beta */
    for (int64_t b = 0; b < B; b++) {
      char *row = at(out, (b * T + t) * (H + D));
      memcpy(row, hp + (size_t)(BH + b * H) * es, (size_t)H * es);
      memcpy(row + (size_t)H * es, x + (size_t)(b * IN + E) * es, (size_t)D * es);
      memcpy(at(alphas, (b * T + t) * L), at(saved, lay.weights + (tb + b) * L), (size_t)L * es);
      memcpy(at(betas, b * T + t), beta + (size_t)b * es, es);
    }
  }
  attn_tensor_free(&ws);
  return st;
}

/* ---------------------------------------------------------------- backward */

/* Checks a gradient output of the operand's shape (NULL is fine). */
static attn_status check_grad(const char *op, const char *what, const attn_tensor *g, const attn_tensor *x) {
  if (!g || !x) return ATTN_OK;
  return check_operand(op, what, g, x->dtype, x->ndim, x->shape[0], x->ndim > 1 ? x->shape[1] : 0,
                       x->ndim > 2 ? x->shape[2] : 0);
}

/* The gate's backward over one step's rows: dbeta_b = dz_b . ctx_b + dbetas[b, t]; dctx = beta dz
 * (B, D); dpre (B) = dbeta beta (1 - beta), the gate's pre-activation gradient. dbetas (B, T) may
 * be NULL. */
#define GATE_BWD(T_)                                                                                      \
  static void gate_bwd_##T_(int64_t B, int64_t D, int64_t T, int64_t t, const T_ *dz, const T_ *ctx,      \
                            const T_ *beta, const T_ *dbetas, T_ *dctx, T_ *dpre) {                      \
    for (int64_t b = 0; b < B; b++) {                                                                     \
      const T_ *g = dz + b * D, *c = ctx + b * D;                                                        \
      T_ s = dbetas ? dbetas[b * T + t] : 0, be = beta[b];                                               \
      T_ *o = dctx + b * D;                                                                               \
      for (int64_t j = 0; j < D; j++) {                                                                   \
        s += g[j] * c[j];                                                                                 \
        o[j] = g[j] * be;                                                                                 \
      }                                                                                                   \
      dpre[b] = s * (be * (1 - be));                                                                      \
    }                                                                                                     \
  }
GATE_BWD(float)
GATE_BWD(double)

/* dh (B, H) += dpre (B) w (H) (the gate's share of the previous state's gradient). */
static void add_outer(attn_dtype dt, int64_t B, int64_t H, const void *dpre, const void *w, void *dh) {
  for (int64_t b = 0; b < B; b++) {
    if (dt == ATTN_F32) {
      float s = ((const float *)dpre)[b], *o = (float *)dh + b * H;
      const float *v = w;
      for (int64_t j = 0; j < H; j++) o[j] += s * v[j];
    } else {
      double s = ((const double *)dpre)[b], *o = (double *)dh + b * H;
      const double *v = w;
      for (int64_t j = 0; j < H; j++) o[j] += s * v[j];
    }
  }
}

/* C (M, N) = A^T X over TB = T B rows, A (TB, M) and X (TB, N) with leading dims lda, ldx: a
 * weight's gradient summed over the steps. In chunks of whole steps as large as the small product
 * kernel takes (attn_gemm_is_small), which reads the transposed A in place, at these sizes about
 * twice as fast as one OpenBLAS product over all rows; one product when not even a step fits
 * (and in float64, which is always OpenBLAS's). */
static void weight_grad(attn_dtype dt, int64_t T, int64_t B, int64_t M, int64_t N, const char *A, int64_t lda,
                        const char *X, int64_t ldx, void *C) {
  int64_t steps = T;
  while (dt == ATTN_F32 && steps > 1 && !attn_gemm_is_small(0, M, N, steps * B)) steps--;
  if (dt != ATTN_F32 || !attn_gemm_is_small(0, M, N, steps * B)) steps = T;
  size_t es = attn_dtype_size(dt);
  for (int64_t t = 0; t < T; t += steps) {
    int64_t rows = (T - t < steps ? T - t : steps) * B;
    gemm(dt, 1, 0, M, N, rows, A + (size_t)(t * B * lda) * es, lda, X + (size_t)(t * B * ldx) * es, ldx, t ? 1 : 0,
         C, N);
  }
}

/* The additive scores' backward of one step from the forward's tanh values th (B, L, A) and the
 * scores' gradient ds (B, L): with p = ds[b,j] (1 - th[b,j,c]^2), dq[b,c] = w[c] sum_j p (written),
 * dk[b,j,c] += p and dwb[b,c] += ds[b,j] th[b,j,c] (summed over the steps; the keys' gradient is
 * w times its sum, w_v's the sum of dwb's rows, both after the loop). No tanh is evaluated, and
 * no pair is skipped, so a NaN in the scores' inputs reaches the gradients (there is no mask here).
 * Rows b are independent: the same bits on any thread count. */
typedef struct {
  attn_dtype dt;
  int64_t L, A;
  const void *th, *ds, *w;
  void *dq, *dk, *dwb;
} tanh_bwd_job;

#define TANH_BWD(T_)                                                                                           \
  static void tanh_bwd_##T_(const tanh_bwd_job *J, int64_t b0, int64_t b1) {                                 \
    const int64_t L = J->L, A = J->A;                                                                         \
    const T_ *w = J->w;                                                                                       \
    for (int64_t b = b0; b < b1; b++) {                                                                       \
      T_ *restrict q = (T_ *)J->dq + b * A, *restrict wb = (T_ *)J->dwb + b * A;                              \
      for (int64_t c = 0; c < A; c++) q[c] = 0;                                                               \
      for (int64_t j = 0; j < L; j++) {                                                                       \
        const T_ g = ((const T_ *)J->ds)[b * L + j], *restrict t = (const T_ *)J->th + (b * L + j) * A;       \
        T_ *restrict k = (T_ *)J->dk + (b * L + j) * A;                                                       \
        for (int64_t c = 0; c < A; c++) {                                                                     \
          T_ p = g * (1 - t[c] * t[c]);                                                                       \
          q[c] += p;                                                                                          \
          k[c] += p;                                                                                          \
          wb[c] += g * t[c];                                                                                  \
        }                                                                                                     \
      }                                                                                                       \
      for (int64_t c = 0; c < A; c++) q[c] *= w[c];                                                           \
    }                                                                                                         \
  }
TANH_BWD(float)
TANH_BWD(double)

/* After the loop: dkeys (B, L, A) = dks times w per column, dw_v (A) = the sum of dwb's rows in
 * order, in double (either may be NULL). */
#define WV_GRADS(T_)                                                                                          \
  static void wv_grads_##T_(int64_t B, int64_t L, int64_t A, const T_ *w, const T_ *dks, const T_ *dwb,      \
                            T_ *dkeys, T_ *dwv) {                                                            \
    if (dkeys)                                                                                               \
      for (int64_t r = 0; r < B * L; r++)                                                                    \
        for (int64_t c = 0; c < A; c++) dkeys[r * A + c] = dks[r * A + c] * w[c];                            \
    if (dwv)                                                                                                 \
      for (int64_t c = 0; c < A; c++) {                                                                      \
        double s = 0;                                                                                        \
        for (int64_t b = 0; b < B; b++) s += dwb[b * A + c];                                                 \
        dwv[c] = (T_)s;                                                                                      \
      }                                                                                                      \
  }
WV_GRADS(float)
WV_GRADS(double)

static void wv_grads(attn_dtype dt, int64_t B, int64_t L, int64_t A, const void *w, const void *dks,
                     const void *dwb, void *dkeys, void *dwv) {
  if (dt == ATTN_F32)
    wv_grads_float(B, L, A, w, dks, dwb, dkeys, dwv);
  else
    wv_grads_double(B, L, A, w, dks, dwb, dkeys, dwv);
}

static void tanh_bwd_task(void *ctx, int64_t begin, int64_t end) {
  const tanh_bwd_job *J = ctx;
  if (J->dt == ATTN_F32)
    tanh_bwd_float(J, begin, end);
  else
    tanh_bwd_double(J, begin, end);
}

attn_status attn_caption_backward(const attn_caption_args *a, const attn_tensor *saved, const attn_tensor *dout,
                                  const attn_tensor *dalphas, const attn_tensor *dbetas, const attn_caption_grads *g) {
  const char *op = "show_attend_tell backward";
  attn_caption_dims d;
  attn_status st = attn_caption_check(op, a, &d);
  if (st != ATTN_OK) return st;
  attn_dtype dt = a->emb->dtype;
  int64_t T = d.T, B = d.B, L = d.L, D = d.D, A = d.A, E = d.E, H = d.H, IN = E + D, BH = B * H, TB = T * B;
  attn_saved_layout sl;
  if ((st = attn_caption_saved_layout(&d, &sl)) != ATTN_OK || (st = attn_saved_check(op, &sl, saved, dt)) != ATTN_OK ||
      (dout && (st = check_operand(op, "output gradient", dout, dt, 3, B, T, H + D)) != ATTN_OK) ||
      (dalphas && (st = check_operand(op, "alphas gradient", dalphas, dt, 3, B, T, L)) != ATTN_OK) ||
      (dbetas && (st = check_operand(op, "betas gradient", dbetas, dt, 2, B, T, 0)) != ATTN_OK) ||
      (st = check_grad(op, "feats gradient", g->feats, a->feats)) != ATTN_OK ||
      (st = check_grad(op, "keys gradient", g->keys, a->keys)) != ATTN_OK ||
      (st = check_grad(op, "w_v gradient", g->w_v, a->w_v)) != ATTN_OK ||
      (st = check_grad(op, "embeddings gradient", g->emb, a->emb)) != ATTN_OK ||
      (st = check_grad(op, "h0 gradient", g->h0, a->h0)) != ATTN_OK ||
      (st = check_grad(op, "c0 gradient", g->c0, a->c0)) != ATTN_OK ||
      (st = check_grad(op, "W_q gradient", g->w_q, a->w_q)) != ATTN_OK ||
      (st = check_grad(op, "w_beta gradient", g->w_beta, a->w_beta)) != ATTN_OK ||
      (st = check_grad(op, "b_beta gradient", g->b_beta, a->b_beta)) != ATTN_OK ||
      (st = check_grad(op, "weight_ih gradient", g->w_ih, a->w_ih)) != ATTN_OK ||
      (st = check_grad(op, "weight_hh gradient", g->w_hh, a->w_hh)) != ATTN_OK ||
      (st = check_grad(op, "bias_ih gradient", g->b_ih, a->b_ih)) != ATTN_OK ||
      (st = check_grad(op, "bias_hh gradient", g->b_hh, a->b_hh)) != ATTN_OK)
    return st;

  size_t es = attn_dtype_size(dt);
  layout lay = layout_of(&sl);
  /* workspace: the state and cell gradients dh, dc (B, H), a step's output gradient gy (B, H),
   * dz (B, D), dctx (B, D), dweights (B, L), dscores (B, L) and dfeats (B, L, D); every step's
   * gate pre-activation gradients dG (T, B, 4H), dqh (T, B, A), dpre (T, B) (the gate's), the
   * LSTM inputs X (T, B, E + D), and over the steps the keys' gradient before its w_v factor
   * (B, L, A) and w_v's per row (B, A) (tanh_bwd_job) */
  int64_t w_dh = 0, w_dc = w_dh + BH, w_gy = w_dc + BH, w_dz = w_gy + BH, w_dctx = w_dz + B * D;
  int64_t w_dw = w_dctx + B * D, w_ds = w_dw + B * L, w_df = w_ds + B * L;
  int64_t w_dG = w_df + B * L * D, w_dqh = w_dG + TB * 4 * H, w_dpre = w_dqh + TB * A;
  int64_t w_X = w_dpre + TB, w_dks = w_X + TB * IN, w_dwb = w_dks + B * L * A, wn = w_dwb + B * A;
  attn_tensor ws = {0};
  if ((st = attn_tensor_init(&ws, dt, 1, &wn)) != ATTN_OK) return st;
  attn_tensor df_t = view3(&ws, w_df, B, L, D);
  memset(at(&ws, w_dh), 0, (size_t)(2 * BH) * es);
  if (!dout) memset(at(&ws, w_gy), 0, (size_t)BH * es);
  if (g->feats) memset(attn_tensor_data(g->feats), 0, (size_t)attn_tensor_numel(g->feats) * es);
  memset(at(&ws, w_dks), 0, (size_t)(B * L * A + B * A) * es); /* dks and dwb, accumulated */
  tanh_bwd_job tj = {.dt = dt, .L = L, .A = A, .w = attn_tensor_data(a->w_v), .ds = at(&ws, w_ds),
                     .dk = at(&ws, w_dks), .dwb = at(&ws, w_dwb)};
  const int64_t tanh_grain = (int64_t)(2e5 / (4.0 * L * A)) + 1; /* rows of about 2e5 flops a chunk */
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.training = 0;
  char *dh = at(&ws, w_dh), *dc = at(&ws, w_dc), *gy = at(&ws, w_gy), *dz = at(&ws, w_dz);
  const char *w_ih = attn_tensor_data(a->w_ih), *w_beta = attn_tensor_data(a->w_beta);

  for (int64_t t = T - 1; t >= 0 && st == ATTN_OK; t--) {
    int64_t tb = t * B;
    const char *beta = at(saved, lay.beta + tb), *ctx = at(saved, lay.ctx + tb * D);
    char *dG = at(&ws, w_dG + tb * 4 * H), *dpre = at(&ws, w_dpre + tb);
    /* this step's output gradient: cat(h, z)'s halves */
    if (dout)
      for (int64_t b = 0; b < B; b++) {
        const char *row = at(dout, (b * T + t) * (H + D));
        memcpy(gy + (size_t)(b * H) * es, row, (size_t)H * es);
        memcpy(dz + (size_t)(b * D) * es, row + (size_t)H * es, (size_t)D * es);
      }
    else
      memset(dz, 0, (size_t)(B * D) * es);
    /* the LSTM step: dG, the previous cell's gradient in dc, then dh = dG W_hh and dz += the
     * context's columns of dG W_ih (the embeddings' are one product after the loop) */
    attn_lstm_gates_backward(dt, B, H, dh, dc, gy, at(saved, lay.cs + tb * H), at(saved, lay.gates + tb * 4 * H),
                             at(saved, lay.tc + tb * H), dG);
    gemm(dt, 0, 0, B, H, 4 * H, dG, 4 * H, attn_tensor_data(a->w_hh), H, 0, dh, H);
    gemm(dt, 0, 0, B, D, 4 * H, dG, 4 * H, w_ih + (size_t)E * es, IN, 1, dz, D);
    /* the gate z = beta ctx */
    if (dt == ATTN_F32)
      gate_bwd_float(B, D, T, t, (const float *)dz, (const float *)ctx, (const float *)beta,
                     dbetas ? (const float *)attn_tensor_data(dbetas) : NULL, (float *)at(&ws, w_dctx), (float *)dpre);
    else
      gate_bwd_double(B, D, T, t, (const double *)dz, (const double *)ctx, (const double *)beta,
                      dbetas ? (const double *)attn_tensor_data(dbetas) : NULL, (double *)at(&ws, w_dctx),
                      (double *)dpre);
    add_outer(dt, B, H, dpre, w_beta, dh);
    /* the attention: the weights' own gradient joins the context's */
    attn_tensor dwv = view3(&ws, w_dw, B, 1, L);
    if (dalphas)
      for (int64_t b = 0; b < B; b++)
        memcpy(at(&ws, w_dw + b * L), at(dalphas, (b * T + t) * L), (size_t)L * es);
    attn_tensor sv = view3(saved, lay.scores + tb * L, B, 1, L);
    attn_tensor wtv = view3(saved, lay.weights + tb * L, B, 1, L), dcv = view3(&ws, w_dctx, B, 1, D);
    attn_tensor dsv = view3(&ws, w_ds, B, 1, L);
    if ((st = attn_attention_scores_backward(op, &sv, a->feats, &o, &wtv, &dcv, dalphas ? &dwv : NULL, &dsv,
                                             g->feats ? &df_t : NULL)) != ATTN_OK)
      break;
    tj.th = at(saved, lay.tanh + tb * L * A);
    tj.dq = at(&ws, w_dqh + tb * A);
    attn_parallel_for(B, tanh_grain, tanh_bwd_task, &tj);
    if (g->feats) add_into(dt, attn_tensor_data(g->feats), at(&ws, w_df), B * L * D);
    /* the query was the previous state */
    gemm(dt, 0, 0, B, H, A, at(&ws, w_dqh + tb * A), A, attn_tensor_data(a->w_q), H, 1, dh, H);
  }
  if (st == ATTN_OK) {
    if (g->h0) memcpy(attn_tensor_data(g->h0), dh, (size_t)BH * es);
    if (g->c0) memcpy(attn_tensor_data(g->c0), dc, (size_t)BH * es);
    if (g->keys || g->w_v) wv_grads(dt, B, L, A, attn_tensor_data(a->w_v), at(&ws, w_dks), at(&ws, w_dwb),
                                    g->keys ? attn_tensor_data(g->keys) : NULL,
                                    g->w_v ? attn_tensor_data(g->w_v) : NULL);
    const char *hs = at(saved, lay.hs); /* the previous states h_0 .. h_{T-1} (T B x H) */
    const char *dGs = at(&ws, w_dG), *dpres = at(&ws, w_dpre);
    if (g->w_q) gemm(dt, 1, 0, A, H, TB, at(&ws, w_dqh), A, hs, H, 0, attn_tensor_data(g->w_q), H);
    if (g->w_beta) gemm(dt, 1, 0, 1, H, TB, dpres, 1, hs, H, 0, attn_tensor_data(g->w_beta), H);
    if (g->b_beta) attn_colsum_rows(dt, dpres, TB, 1, attn_tensor_data(g->b_beta));
    if (g->w_hh) weight_grad(dt, T, B, 4 * H, H, dGs, 4 * H, hs, H, attn_tensor_data(g->w_hh));
    if (g->b_ih) attn_colsum_rows(dt, dGs, TB, 4 * H, attn_tensor_data(g->b_ih));
    if (g->b_hh) attn_colsum_rows(dt, dGs, TB, 4 * H, attn_tensor_data(g->b_hh));
    if (g->w_ih) { /* the inputs cat(emb, beta ctx) of every step again */
      char *X = at(&ws, w_X);
      for (int64_t r = 0; r < TB; r++) memcpy(X + (size_t)(r * IN) * es, at(a->emb, r * E), (size_t)E * es);
      for (int64_t t = 0; t < T; t++)
        gate_rows(dt, B, D, at(saved, lay.ctx + t * B * D), at(saved, lay.beta + t * B),
                  X + (size_t)(t * B * IN + E) * es, IN);
      weight_grad(dt, T, B, 4 * H, IN, dGs, 4 * H, X, IN, attn_tensor_data(g->w_ih));
    }
    if (g->emb) gemm(dt, 0, 0, TB, E, 4 * H, dGs, 4 * H, w_ih, IN, 0, attn_tensor_data(g->emb), E);
  }
  attn_tensor_free(&ws);
  return st;
}
