/* The fused Bahdanau decoder: see attn_decoder.h for the model. The per-step pieces are the
 * engine's own kernels (attn_gemm, the additive scores, attention over given scores, the GRU's
 * gate kernels and dropout), run back to back on views of one `saved` tensor, so the numbers
 * are those of the step-by-step composition and every kernel improvement reaches both. */
#include "nn/attn_decoder.h"

#include <stdio.h>
#include <string.h>

#include "attention/attn_attention.h"
#include "core/attn_dropout.h"
#include "core/attn_gemm.h"
#include "core/attn_ops.h"
#include "nn/attn_rnn.h"
#include "nn/attn_steps_internal.h"

/* ---------------------------------------------------------------- layout of `saved` */

attn_status attn_decoder_saved_layout(const attn_decoder_dims *d, attn_saved_layout *l) {
  attn_saved_begin(l, "attention_decoder");
  int64_t T1, H2;
  if (d->layers < 1 || __builtin_add_overflow(d->T, 1, &T1) || __builtin_mul_overflow(d->H, 2, &H2))
    return attn_error(ATTN_ERR_SHAPE, "%s: %d layers over %lld steps and %lld hidden units do not fit a saved buffer",
                      l->op, d->layers, (long long)d->T, (long long)d->H);
  const int64_t L = d->layers, T = d->T, B = d->B;
  const int64_t kh[3] = {B, d->Nk, d->ha}, qh[3] = {T, B, d->ha}, scores[3] = {T, B, d->Nk}, ctx[3] = {T, B, d->dv};
  const int64_t hs[4] = {L, T1, B, d->H}, rz[4] = {L, T, B, H2}, n[4] = {L, T, B, d->H};
  attn_status st;
  if ((st = attn_saved_add(l, "kh", 3, kh)) != ATTN_OK || (st = attn_saved_add(l, "qh", 3, qh)) != ATTN_OK ||
      (st = attn_saved_add(l, "scores", 3, scores)) != ATTN_OK ||
      (st = attn_saved_add(l, "weights", 3, scores)) != ATTN_OK || (st = attn_saved_add(l, "ctx", 3, ctx)) != ATTN_OK ||
      (st = attn_saved_add(l, "hs", 4, hs)) != ATTN_OK || (st = attn_saved_add(l, "rz", 4, rz)) != ATTN_OK ||
      (st = attn_saved_add(l, "n", 4, n)) != ATTN_OK)
    return st;
  return attn_saved_add(l, "ghn", 4, n);
}

/* The parts' offsets in `saved` (attn_decoder_saved_layout). */
typedef struct {
  int64_t kh, qh, scores, weights, ctx, hs, rz, n, ghn;
} layout;

static layout layout_of(const attn_saved_layout *s) {
  layout l = {s->part[ATTN_DECODER_SAVED_KH].offset,      s->part[ATTN_DECODER_SAVED_QH].offset,
              s->part[ATTN_DECODER_SAVED_SCORES].offset,  s->part[ATTN_DECODER_SAVED_WEIGHTS].offset,
              s->part[ATTN_DECODER_SAVED_CTX].offset,     s->part[ATTN_DECODER_SAVED_HS].offset,
              s->part[ATTN_DECODER_SAVED_RZ].offset,      s->part[ATTN_DECODER_SAVED_N].offset,
              s->part[ATTN_DECODER_SAVED_GHN].offset};
  return l;
}

/* Layer k's planes in `saved`: states hs (T+1, B, H), sigmoids rz (T, B, 2H), candidates n and
 * recurrent n projections ghn (T, B, H); offsets. */
typedef struct {
  int64_t hs, rz, n, ghn;
} layer_planes;

static layer_planes planes(const layout *l, const attn_decoder_dims *d, int k) {
  int64_t TBH = d->T * d->B * d->H;
  layer_planes p = {l->hs + k * (TBH + d->B * d->H), l->rz + k * 2 * TBH, l->n + k * TBH, l->ghn + k * TBH};
  return p;
}

/* dst (cols, rows) contiguous = the transpose of w (rows, cols), a weight taken as op(B) = w^T
 * untransposed: the small products then need no packing of it at every step. */
static attn_status transpose_into(const attn_tensor *w, attn_tensor *ws, int64_t off) {
  attn_tensor src = *w;
  attn_status st = attn_view_transpose(&src, 0, 1);
  if (st != ATTN_OK) return st;
  const int64_t shape[2] = {w->shape[1], w->shape[0]}, stride[2] = {w->shape[0], 1};
  attn_tensor dst = attn_view_as_strided(ws, 2, shape, stride);
  dst.offset = ws->offset + off;
  return attn_copy(&dst, &src);
}

/* The attention options of step t: d2l's lengths and the step's dropout stream. */
static void step_options(const attn_decoder_args *a, int64_t t, attn_attention_opts *o) {
  attn_attention_opts_init(o);
  o->valid_lens = a->valid_lens;
  o->dropout = a->attention_dropout;
  o->training = a->attention_dropout > 0;
  o->seed = a->seed + (uint64_t)t * (uint64_t)a->layers + (uint64_t)(a->layers - 1);
}

/* The GRU's dropout stream for layer k's output at step t. */
static uint64_t rnn_stream(const attn_decoder_args *a, int64_t t, int k) {
  return a->seed + (uint64_t)t * (uint64_t)a->layers + (uint64_t)k;
}

/* ---------------------------------------------------------------- checks */

/* t must be a contiguous tensor of dtype dt and shape (s0, s1[, s2]) (nd entries). k >= 0 names a layer. */
static attn_status check_operand(const char *op, const char *what, int k, const attn_tensor *t, attn_dtype dt, int nd,
                                 int64_t s0, int64_t s1, int64_t s2) {
  const int64_t want[3] = {s0, s1, s2};
  char layer[32] = "";
  if (k >= 0) snprintf(layer, sizeof layer, " of layer %d", k);
  if (!t) return attn_error(ATTN_ERR_ARG, "%s: %s%s is missing", op, what, layer);
  int ok = t->ndim == nd;
  for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == want[i];
  if (!ok)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s%s is %s, expected %s", op, what, layer, attn_tensor_shape_str(t),
                      attn_shape_str(nd, want));
  if (t->dtype != dt)
    return attn_error(ATTN_ERR_DTYPE, "%s: %s%s is %s, the embeddings are %s", op, what, layer,
                      attn_dtype_name(t->dtype), attn_dtype_name(dt));
  if (!attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_ARG, "%s: %s%s %s must be contiguous", op, what, layer, attn_tensor_shape_str(t));
  return ATTN_OK;
}

/* t must be 3-D with every size at least 1. */
static attn_status check_3d(const char *op, const char *what, const char *form, const attn_tensor *t) {
  if (!t || t->ndim != 3 || t->shape[0] < 1 || t->shape[1] < 1 || t->shape[2] < 1)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be %s with every size at least 1", op, what,
                      t ? attn_tensor_shape_str(t) : "(missing)", form);
  return ATTN_OK;
}

attn_status attn_decoder_check(const char *op, const attn_decoder_args *a, attn_decoder_dims *d) {
  attn_status st;
  if ((st = check_3d(op, "embeddings", "(T, B, embed)", a->emb)) != ATTN_OK ||
      (st = check_3d(op, "values", "(B, Nk, dv)", a->values)) != ATTN_OK ||
      (st = check_3d(op, "state", "(num_layers, B, num_hiddens)", a->h0)) != ATTN_OK)
    return st;
  if ((st = attn_check_float(op, a->emb)) != ATTN_OK) return st;
  if (!a->w_k || a->w_k->ndim != 2 || a->w_k->shape[0] < 1)
    return attn_error(ATTN_ERR_SHAPE, "%s: W_k %s must be (h, value_size) with h at least 1", op,
                      a->w_k ? attn_tensor_shape_str(a->w_k) : "(missing)");
  attn_dtype dt = a->emb->dtype;
  d->T = a->emb->shape[0], d->B = a->emb->shape[1], d->e = a->emb->shape[2];
  d->Nk = a->values->shape[1], d->ha = a->w_k->shape[0], d->dv = a->values->shape[2];
  d->H = a->h0->shape[2], d->layers = a->layers;
  if (a->layers < 1 || a->h0->shape[0] != a->layers)
    return attn_error(ATTN_ERR_SHAPE, "%s: state %s must be (num_layers, B, num_hiddens) for %d layers", op,
                      attn_tensor_shape_str(a->h0), a->layers);
  /* every product's size and leading dim below 2^31 (attn_gemm's bound), so no count below overflows */
  const int64_t lim = INT64_C(1) << 31;
  if (d->T * 1.0 * d->B >= lim || d->B * 1.0 * d->Nk >= lim || d->ha >= lim || d->dv + d->e >= lim || 3.0 * d->H >= lim)
    return attn_error(ATTN_ERR_SHAPE, "%s: embeddings %s, values %s and state %s are too large for one call", op,
                      attn_tensor_shape_str(a->emb), attn_tensor_shape_str(a->values), attn_tensor_shape_str(a->h0));
  if ((st = check_operand(op, "embeddings", -1, a->emb, dt, 3, d->T, d->B, d->e)) != ATTN_OK ||
      (st = check_operand(op, "W_k", -1, a->w_k, dt, 2, d->ha, d->dv, 0)) != ATTN_OK ||
      (st = check_operand(op, "values", -1, a->values, dt, 3, d->B, d->Nk, d->dv)) != ATTN_OK ||
      (st = check_operand(op, "state", -1, a->h0, dt, 3, a->layers, d->B, d->H)) != ATTN_OK ||
      (st = check_operand(op, "W_q", -1, a->w_q, dt, 2, d->ha, d->H, 0)) != ATTN_OK)
    return st;
  if (!a->w_v || (st = check_operand(op, "w_v", -1, a->w_v, dt, a->w_v->ndim == 2 ? 2 : 1,
                                     a->w_v->ndim == 2 ? 1 : d->ha, d->ha, 0)) != ATTN_OK)
    return a->w_v ? st : attn_error(ATTN_ERR_ARG, "%s: w_v is missing", op);
  if (a->valid_lens && (a->valid_lens->ndim != 1 || a->valid_lens->shape[0] != d->B))
    return attn_error(ATTN_ERR_SHAPE, "%s: valid_lens %s must be (B) = [%lld]", op,
                      attn_tensor_shape_str(a->valid_lens), (long long)d->B);
  for (int k = 0; k < a->layers; k++) {
    int64_t in_k = k ? d->H : d->dv + d->e;
    if ((st = check_operand(op, "weight_ih", k, a->w_ih[k], dt, 2, 3 * d->H, in_k, 0)) != ATTN_OK ||
        (st = check_operand(op, "weight_hh", k, a->w_hh[k], dt, 2, 3 * d->H, d->H, 0)) != ATTN_OK ||
        (a->b_ih[k] && (st = check_operand(op, "bias_ih", k, a->b_ih[k], dt, 1, 3 * d->H, 0, 0)) != ATTN_OK) ||
        (a->b_hh[k] && (st = check_operand(op, "bias_hh", k, a->b_hh[k], dt, 1, 3 * d->H, 0, 0)) != ATTN_OK))
      return st;
  }
  if (!(a->attention_dropout >= 0 && a->attention_dropout <= 1))
    return attn_error(ATTN_ERR_ARG, "%s: attention dropout %g must be in [0, 1]", op, a->attention_dropout);
  if (!(a->rnn_dropout >= 0 && a->rnn_dropout < 1))
    return attn_error(ATTN_ERR_ARG, "%s: GRU dropout %g must be in [0, 1)", op, a->rnn_dropout);
  attn_saved_layout lay; /* refuses a saved buffer past the size limit */
  return attn_decoder_saved_layout(d, &lay);
}

/* ---------------------------------------------------------------- forward */

attn_status attn_decoder_forward(const attn_decoder_args *a, attn_tensor *out, attn_tensor *hn, attn_tensor *weights,
                                 attn_tensor *saved) {
  const char *op = "attention_decoder";
  attn_decoder_dims d;
  attn_status st = attn_decoder_check(op, a, &d);
  if (st != ATTN_OK) return st;
  attn_dtype dt = a->emb->dtype;
  int64_t T = d.T, B = d.B, Nk = d.Nk, ha = d.ha, dv = d.dv, e = d.e, H = d.H, in0 = dv + e;
  int L = a->layers;
  attn_saved_layout sl;
  if ((st = check_operand(op, "output", -1, out, dt, 3, B, T, H)) != ATTN_OK ||
      (st = check_operand(op, "final state", -1, hn, dt, 3, L, B, H)) != ATTN_OK ||
      (st = check_operand(op, "weights", -1, weights, dt, 3, B, T, Nk)) != ATTN_OK ||
      (st = attn_decoder_saved_layout(&d, &sl)) != ATTN_OK || (st = attn_saved_check(op, &sl, saved, dt)) != ATTN_OK)
    return st;

  size_t es = attn_dtype_size(dt);
  layout lay = layout_of(&sl);
  /* workspace: every step's input projections gi (T, B, 3H) (the embeddings' part and the bias
   * for layer 0 up front, in one product), gh (B, 3H), a dropped state (B, H), and the weights
   * transposed: W_q^T (H, ha), then per layer W_ih^T (in_k, 3H) and W_hh^T (H, 3H) */
  int64_t w_gi = 0, w_gh = w_gi + T * B * 3 * H, w_drop = w_gh + B * 3 * H, w_wq = w_drop + B * H;
  int64_t w_wt = w_wq + H * ha, wt_layer0 = (in0 + H) * 3 * H, wt_layer = 2 * H * 3 * H;
  int64_t wn = w_wt + wt_layer0 + (L - 1) * wt_layer;
  attn_tensor ws = {0};
  if ((st = attn_tensor_init(&ws, dt, 1, &wn)) != ATTN_OK) return st;
  st = transpose_into(a->w_q, &ws, w_wq);
  for (int k = 0; k < L && st == ATTN_OK; k++) {
    int64_t o = w_wt + (k ? wt_layer0 + (k - 1) * wt_layer : 0), in_k = k ? H : in0;
    if ((st = transpose_into(a->w_ih[k], &ws, o)) == ATTN_OK) st = transpose_into(a->w_hh[k], &ws, o + in_k * 3 * H);
  }
  if (st != ATTN_OK) {
    attn_tensor_free(&ws);
    return st;
  }
  const int64_t wv_shape = ha, wv_stride = 1;
  attn_tensor wv = attn_view_as_strided(a->w_v, 1, &wv_shape, &wv_stride);
  /* the keys, projected once */
  gemm(dt, 0, 1, B * Nk, ha, dv, attn_tensor_data(a->values), dv, attn_tensor_data(a->w_k), dv, 0, at(saved, lay.kh),
       ha);
  attn_tensor kh = view3(saved, lay.kh, B, Nk, ha);
  char *wih0t = at(&ws, w_wt); /* (dv + e, 3H): the context's rows, then the embedding's */
  attn_fill_rows(at(&ws, w_gi), T * B, 3 * H, es, a->b_ih[0] ? attn_tensor_data(a->b_ih[0]) : NULL);
  gemm(dt, 0, 0, T * B, 3 * H, e, attn_tensor_data(a->emb), e, wih0t + (size_t)(dv * 3 * H) * es, 3 * H, 1,
       at(&ws, w_gi), 3 * H);

  for (int k = 0; k < L; k++) memcpy(at(saved, planes(&lay, &d, k).hs), at(a->h0, k * B * H), (size_t)(B * H) * es);
  layer_planes top = planes(&lay, &d, L - 1);
  for (int64_t t = 0; t < T && st == ATTN_OK; t++) {
    int64_t tb = t * B;
    /* the query is the top layer's state before the step */
    gemm(dt, 0, 0, B, ha, H, at(saved, top.hs + tb * H), H, at(&ws, w_wq), ha, 0, at(saved, lay.qh + tb * ha), ha);
    attn_tensor qv = view3(saved, lay.qh + tb * ha, B, 1, ha), sv = view3(saved, lay.scores + tb * Nk, B, 1, Nk);
    attn_tensor wtv = view3(saved, lay.weights + tb * Nk, B, 1, Nk), cv = view3(saved, lay.ctx + tb * dv, B, 1, dv);
    attn_attention_opts o;
    step_options(a, t, &o);
    if ((st = attn_attention_additive_scores_forward(&qv, &kh, &wv, &sv)) != ATTN_OK ||
        (st = attn_attention_scores_forward(op, &sv, a->values, &o, &cv, &wtv)) != ATTN_OK)
      break;
    /* layer 0's input is cat(context, embedding): the context's part joins the embedding's */
    char *gi = at(&ws, w_gi + tb * 3 * H), *gh = at(&ws, w_gh);
    gemm(dt, 0, 0, B, 3 * H, dv, at(saved, lay.ctx + tb * dv), dv, wih0t, 3 * H, 1, gi, 3 * H);
    const char *input = NULL;
    for (int k = 0; k < L; k++) {
      layer_planes p = planes(&lay, &d, k);
      char *wt = at(&ws, w_wt + (k ? wt_layer0 + (k - 1) * wt_layer : 0));
      char *h_prev = at(saved, p.hs + tb * H), *h_new = at(saved, p.hs + (tb + B) * H);
      if (k > 0) {
        /* (the step's rows of gi are free again once layer 0 has used them) */
        attn_fill_rows(gi, B, 3 * H, es, a->b_ih[k] ? attn_tensor_data(a->b_ih[k]) : NULL);
        gemm(dt, 0, 0, B, 3 * H, H, input, H, wt, 3 * H, 1, gi, 3 * H);
      }
      attn_fill_rows(gh, B, 3 * H, es, a->b_hh[k] ? attn_tensor_data(a->b_hh[k]) : NULL);
      gemm(dt, 0, 0, B, 3 * H, H, h_prev, H, wt + (size_t)((k ? H : in0) * 3 * H) * es, 3 * H, 1, gh, 3 * H);
      attn_gru_gates_forward(dt, B, H, gi, gh, h_prev, h_new, at(saved, p.rz + 2 * tb * H), at(saved, p.n + tb * H),
                             at(saved, p.ghn + tb * H));
      input = h_new;
      if (k < L - 1 && a->rnn_dropout > 0) {
        attn_dropout_flat(dt, h_new, at(&ws, w_drop), B * H, rnn_stream(a, t, k), a->rnn_dropout);
        input = at(&ws, w_drop);
      }
    }
  }
  attn_tensor_free(&ws);
  if (st != ATTN_OK) return st;
  /* batch-major outputs and weights, every layer's last state */
  char *o_base = attn_tensor_data(out), *w_base = attn_tensor_data(weights);
  const char *hs_top = at(saved, top.hs + B * H), *w_saved = at(saved, lay.weights);
  for (int64_t t = 0; t < T; t++)
    for (int64_t b = 0; b < B; b++) {
      memcpy(o_base + (size_t)((b * T + t) * H) * es, hs_top + (size_t)((t * B + b) * H) * es, (size_t)H * es);
      memcpy(w_base + (size_t)((b * T + t) * Nk) * es, w_saved + (size_t)((t * B + b) * Nk) * es, (size_t)Nk * es);
    }
  for (int k = 0; k < L; k++)
    memcpy(at(hn, k * B * H), at(saved, planes(&lay, &d, k).hs + T * B * H), (size_t)(B * H) * es);
  return ATTN_OK;
}

/* ---------------------------------------------------------------- backward */

/* Checks a gradient output of the operand's shape (NULL is fine). */
static attn_status check_grad(const char *op, const char *what, int k, const attn_tensor *g, const attn_tensor *x) {
  if (!g) return ATTN_OK;
  return check_operand(op, what, k, g, x->dtype, x->ndim, x->shape[0], x->ndim > 1 ? x->shape[1] : 0,
                       x->ndim > 2 ? x->shape[2] : 0);
}

attn_status attn_decoder_backward(const attn_decoder_args *a, const attn_tensor *saved, const attn_tensor *dout,
                                  const attn_tensor *dhn, const attn_decoder_grads *g) {
  const char *op = "attention_decoder backward";
  attn_decoder_dims d;
  attn_status st = attn_decoder_check(op, a, &d);
  if (st != ATTN_OK) return st;
  attn_dtype dt = a->emb->dtype;
  int64_t T = d.T, B = d.B, Nk = d.Nk, ha = d.ha, dv = d.dv, e = d.e, H = d.H, in0 = dv + e, TB = T * B;
  int L = a->layers;
  attn_saved_layout sl;
  if ((st = attn_decoder_saved_layout(&d, &sl)) != ATTN_OK || (st = attn_saved_check(op, &sl, saved, dt)) != ATTN_OK ||
      (dout && (st = check_operand(op, "output gradient", -1, dout, dt, 3, B, T, H)) != ATTN_OK) ||
      (dhn && (st = check_operand(op, "final state gradient", -1, dhn, dt, 3, L, B, H)) != ATTN_OK) ||
      (st = check_grad(op, "W_k gradient", -1, g->w_k, a->w_k)) != ATTN_OK ||
      (st = check_grad(op, "values gradient", -1, g->values, a->values)) != ATTN_OK ||
      (st = check_grad(op, "embeddings gradient", -1, g->emb, a->emb)) != ATTN_OK ||
      (st = check_grad(op, "state gradient", -1, g->h0, a->h0)) != ATTN_OK ||
      (st = check_grad(op, "W_q gradient", -1, g->w_q, a->w_q)) != ATTN_OK ||
      (st = check_grad(op, "w_v gradient", -1, g->w_v, a->w_v)) != ATTN_OK)
    return st;
  for (int k = 0; k < L; k++)
    if ((g->w_ih && (st = check_grad(op, "weight_ih gradient", k, g->w_ih[k], a->w_ih[k])) != ATTN_OK) ||
        (g->w_hh && (st = check_grad(op, "weight_hh gradient", k, g->w_hh[k], a->w_hh[k])) != ATTN_OK) ||
        (g->b_ih && a->b_ih[k] && (st = check_grad(op, "bias_ih gradient", k, g->b_ih[k], a->b_ih[k])) != ATTN_OK) ||
        (g->b_hh && a->b_hh[k] && (st = check_grad(op, "bias_hh gradient", k, g->b_hh[k], a->b_hh[k])) != ATTN_OK))
      return st;

  size_t es = attn_dtype_size(dt);
  layout lay = layout_of(&sl);
  /* workspace: the layers' state gradients dh (L, B, H), the top output's gradient gy (B, H), a
   * layer input's gradient dx (B, H), the context's dctx (B, dv), dscores (B, Nk), one step's
   * dkh (B, Nk, ha), dvalues (B, Nk, dv) and dw_v (ha), every step's dqh (T, B, ha), the gate
   * gradients dgi, dgh (L, T, B, 3H), a dropped layer input (T, B, H) and the keys' gradient summed
   * over the steps (B, Nk, ha) */
  int64_t w_dh = 0, w_gy = w_dh + L * B * H, w_dx = w_gy + B * H, w_dctx = w_dx + B * H;
  int64_t w_ds = w_dctx + B * dv, w_dk = w_ds + B * Nk, w_dv = w_dk + B * Nk * ha, w_dwv = w_dv + B * Nk * dv;
  int64_t w_dqh = w_dwv + ha, w_dgi = w_dqh + TB * ha, w_dgh = w_dgi + L * TB * 3 * H, w_in = w_dgh + L * TB * 3 * H;
  int64_t w_dks = w_in + TB * H, wn = w_dks + B * Nk * ha;
  attn_tensor ws = {0};
  if ((st = attn_tensor_init(&ws, dt, 1, &wn)) != ATTN_OK) return st;
  const int64_t wv_shape = ha, wv_stride = 1;
  attn_tensor wv = attn_view_as_strided(a->w_v, 1, &wv_shape, &wv_stride);
  attn_tensor kh = view3(saved, lay.kh, B, Nk, ha);
  int want_dk = g->w_k || g->values; /* the keys' gradient reaches both */
  attn_tensor dk_t = view3(&ws, w_dk, B, Nk, ha), dv_t = view3(&ws, w_dv, B, Nk, dv);
  attn_tensor dwv_t = attn_view_as_strided(&ws, 1, &wv_shape, &wv_stride);
  dwv_t.offset = ws.offset + w_dwv;

  if (dhn)
    memcpy(at(&ws, w_dh), attn_tensor_data(dhn), (size_t)(L * B * H) * es);
  else
    memset(at(&ws, w_dh), 0, (size_t)(L * B * H) * es);
  attn_tensor *sums[2] = {g->values, g->w_v}; /* accumulated over the steps */
  for (int i = 0; i < 2; i++)
    if (sums[i]) memset(attn_tensor_data(sums[i]), 0, (size_t)attn_tensor_numel(sums[i]) * es);
  if (want_dk) memset(at(&ws, w_dks), 0, (size_t)(B * Nk * ha) * es);
  if (!dout) memset(at(&ws, w_gy), 0, (size_t)(B * H) * es);

  for (int64_t t = T - 1; t >= 0 && st == ATTN_OK; t--) {
    int64_t tb = t * B;
    char *dx = at(&ws, w_dx);
    /* the GRU layers, top down: layer k's output gradient is dout's row t at the top, else the
     * input gradient of the layer above (through that step's dropout) */
    for (int k = L - 1; k >= 0; k--) {
      layer_planes p = planes(&lay, &d, k);
      char *dh = at(&ws, w_dh + k * B * H), *dgi = at(&ws, w_dgi + (k * TB + tb) * 3 * H);
      char *dgh = at(&ws, w_dgh + (k * TB + tb) * 3 * H);
      const char *dy = dx;
      if (k == L - 1) {
        if (dout)
          for (int64_t b = 0; b < B; b++)
            memcpy(at(&ws, w_gy + b * H), at(dout, (b * T + t) * H), (size_t)H * es);
        dy = at(&ws, w_gy);
      } else if (a->rnn_dropout > 0) {
        attn_dropout_flat(dt, dx, dx, B * H, rnn_stream(a, t, k), a->rnn_dropout);
      }
      attn_gru_gates_backward(dt, B, H, dh, dy, at(saved, p.hs + tb * H), at(saved, p.rz + 2 * tb * H),
                              at(saved, p.n + tb * H), at(saved, p.ghn + tb * H), dgi, dgh);
      gemm(dt, 0, 0, B, H, 3 * H, dgh, 3 * H, attn_tensor_data(a->w_hh[k]), H, 1, dh, H);
      /* the input's gradient: the layer below's output, or for layer 0 the context's columns
       * (the embeddings' part is one product after the loop) */
      if (k)
        gemm(dt, 0, 0, B, H, 3 * H, dgi, 3 * H, attn_tensor_data(a->w_ih[k]), H, 0, dx, H);
      else
        gemm(dt, 0, 0, B, dv, 3 * H, dgi, 3 * H, attn_tensor_data(a->w_ih[0]), in0, 0, at(&ws, w_dctx), dv);
    }
    attn_tensor qv = view3(saved, lay.qh + tb * ha, B, 1, ha), sv = view3(saved, lay.scores + tb * Nk, B, 1, Nk);
    attn_tensor wtv = view3(saved, lay.weights + tb * Nk, B, 1, Nk), dcv = view3(&ws, w_dctx, B, 1, dv);
    attn_tensor dsv = view3(&ws, w_ds, B, 1, Nk), dqv = view3(&ws, w_dqh + tb * ha, B, 1, ha);
    attn_attention_opts o;
    step_options(a, t, &o);
    if ((st = attn_attention_scores_backward(op, &sv, a->values, &o, &wtv, &dcv, NULL, &dsv,
                                             g->values ? &dv_t : NULL)) != ATTN_OK ||
        (st = attn_attention_additive_scores_backward(&qv, &kh, &wv, &dsv, &dqv, want_dk ? &dk_t : NULL,
                                                      g->w_v ? &dwv_t : NULL)) != ATTN_OK)
      break;
    if (g->values) add_into(dt, attn_tensor_data(g->values), at(&ws, w_dv), B * Nk * dv);
    if (want_dk) add_into(dt, at(&ws, w_dks), at(&ws, w_dk), B * Nk * ha);
    if (g->w_v) add_into(dt, attn_tensor_data(g->w_v), at(&ws, w_dwv), ha);
    /* the query was the top layer's state before the step */
    gemm(dt, 0, 0, B, H, ha, at(&ws, w_dqh + tb * ha), ha, attn_tensor_data(a->w_q), H, 1,
         at(&ws, w_dh + (L - 1) * B * H), H);
  }
  if (st == ATTN_OK) {
    if (g->h0) memcpy(attn_tensor_data(g->h0), at(&ws, w_dh), (size_t)(L * B * H) * es);
    /* through the keys' projection: dW_k = dkh^T values, dvalues += dkh W_k */
    if (g->w_k)
      gemm(dt, 1, 0, ha, dv, B * Nk, at(&ws, w_dks), ha, attn_tensor_data(a->values), dv, 0, attn_tensor_data(g->w_k),
           dv);
    if (g->values)
      gemm(dt, 0, 0, B * Nk, dv, ha, at(&ws, w_dks), ha, attn_tensor_data(a->w_k), dv, 1, attn_tensor_data(g->values),
           dv);
    layer_planes top = planes(&lay, &d, L - 1);
    if (g->w_q)
      gemm(dt, 1, 0, ha, H, TB, at(&ws, w_dqh), ha, at(saved, top.hs), H, 0, attn_tensor_data(g->w_q), H);
    /* the weight gradients over all steps at once */
    for (int k = 0; k < L; k++) {
      layer_planes p = planes(&lay, &d, k);
      const char *dgi = at(&ws, w_dgi + k * TB * 3 * H), *dgh = at(&ws, w_dgh + k * TB * 3 * H);
      if (g->w_hh && g->w_hh[k])
        gemm(dt, 1, 0, 3 * H, H, TB, dgh, 3 * H, at(saved, p.hs), H, 0, attn_tensor_data(g->w_hh[k]), H);
      if (g->b_ih && g->b_ih[k] && a->b_ih[k]) attn_colsum_rows(dt, dgi, TB, 3 * H, attn_tensor_data(g->b_ih[k]));
      if (g->b_hh && g->b_hh[k] && a->b_hh[k]) attn_colsum_rows(dt, dgh, TB, 3 * H, attn_tensor_data(g->b_hh[k]));
      if (!g->w_ih || !g->w_ih[k]) continue;
      if (k == 0) { /* layer 0's input is cat(context, embedding): two column blocks */
        char *dw = attn_tensor_data(g->w_ih[0]);
        gemm(dt, 1, 0, 3 * H, dv, TB, dgi, 3 * H, at(saved, lay.ctx), dv, 0, dw, in0);
        gemm(dt, 1, 0, 3 * H, e, TB, dgi, 3 * H, attn_tensor_data(a->emb), e, 0, dw + (size_t)dv * es, in0);
        continue;
      }
      const char *input = at(saved, planes(&lay, &d, k - 1).hs + B * H); /* the layer below's new states */
      if (a->rnn_dropout > 0) {
        for (int64_t t = 0; t < T; t++)
          attn_dropout_flat(dt, input + (size_t)(t * B * H) * es, at(&ws, w_in + t * B * H), B * H,
                           rnn_stream(a, t, k - 1), a->rnn_dropout);
        input = at(&ws, w_in);
      }
      gemm(dt, 1, 0, 3 * H, H, TB, dgi, 3 * H, input, H, 0, attn_tensor_data(g->w_ih[k]), H);
    }
    if (g->emb)
      gemm(dt, 0, 0, TB, e, 3 * H, at(&ws, w_dgi), 3 * H, (const char *)attn_tensor_data(a->w_ih[0]) + (size_t)dv * es,
           in0, 0, attn_tensor_data(g->emb), e);
  }
  attn_tensor_free(&ws);
  return st;
}
