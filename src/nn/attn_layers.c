/* The forwards of d2l's attention layers as one call each: additive attention with its two
 * projections, and multi-head attention with its four projections and the head moves. At the
 * book's sizes a layer call is a dozen small operations, and calling them one by one from Lua
 * cost more than their arithmetic; here they run back to back on the same core functions
 * (attn_matmul, the head moves, attn_sdpa_forward, the additive scores), so the numbers are
 * those of the composition and every kernel improvement reaches both. The intermediates the
 * backward needs go to one caller-provided buffer, in the layout of attn_additive_saved_layout
 * and attn_mha_saved_layout (core/attn_saved.h). */
#include "attention/attn_attention.h"
#include "core/attn_ops.h"

/* Borrowed views (struct copies sharing the operand's storage reference, never freed). */
static attn_tensor view2(const attn_tensor *t, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  const int64_t shape[2] = {rows, cols}, stride[2] = {row_stride, col_stride};
  return attn_view_as_strided(t, 2, shape, stride);
}

static attn_tensor view3(const attn_tensor *t, int64_t a, int64_t b, int64_t c) {
  attn_tensor v = *t; /* t is contiguous */
  v.ndim = 3;
  v.shape[0] = a, v.shape[1] = b, v.shape[2] = c;
  attn_contiguous_strides(3, v.shape, v.stride);
  return v;
}

/* x (B, N, in) @ w^T (+ b) -> y (B*N, h) contiguous. x is read as rows in place when its first
 * two dims merge into one, through a contiguous copy otherwise. */
static attn_status project(const attn_tensor *x, const attn_tensor *w, const attn_tensor *b, attn_tensor *y) {
  int64_t B = x->shape[0], N = x->shape[1], in = x->shape[2];
  attn_tensor copy = {0}, rows;
  if (B <= 1 || N <= 1 || x->stride[0] == N * x->stride[1]) {
    rows = view2(x, B * N, in, N > 1 ? x->stride[1] : x->stride[0], x->stride[2]);
  } else {
    attn_status st = attn_tensor_clone(&copy, x, x->dtype);
    if (st != ATTN_OK) return st;
    rows = view2(&copy, B * N, in, in, 1);
  }
  attn_tensor wt = view2(w, w->shape[1], w->shape[0], w->stride[1], w->stride[0]);
  attn_status st = b ? attn_addmm(b, &rows, &wt, y) : attn_matmul(&rows, &wt, y); /* the bias rows start the product */
  attn_tensor_free(&copy);
  return st;
}

/* x must be (B, N, in) with in = w's columns, w (h, in), b (h) or NULL, all of dtype dt. */
static attn_status check_projection(const char *op, const char *xname, const attn_tensor *x, const char *wname,
                                    const attn_tensor *w, const char *bname, const attn_tensor *b, int64_t B,
                                    int64_t h, attn_dtype dt) {
  if (x->ndim != 3 || (B >= 0 && x->shape[0] != B) || w->ndim != 2 || x->shape[2] != w->shape[1] ||
      (h >= 0 && w->shape[0] != h))
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s does not fit %s %s (expected (B, N, in) and (h, in)%s)", op, xname,
                      attn_tensor_shape_str(x), wname, attn_tensor_shape_str(w),
                      B >= 0 ? ", the batch and h of the queries" : "");
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
    return attn_error(ATTN_ERR_SHAPE, "%s: bias %s %s does not fit %s %s (expected (h))", op, bname,
                      attn_tensor_shape_str(b), wname, attn_tensor_shape_str(w));
  if (x->dtype != dt || w->dtype != dt || (b && b->dtype != dt))
    return attn_error(ATTN_ERR_DTYPE, "%s: %s, %s%s%s must be %s as the queries", op, xname, wname, b ? " and " : "",
                      b ? bname : "", attn_dtype_name(dt));
  return attn_check_float(op, x);
}

/* out must be a contiguous (a, b, c) tensor of dtype dt. */
static attn_status check_out(const char *op, const attn_tensor *t, attn_dtype dt, int64_t a, int64_t b, int64_t c) {
  const int64_t want[3] = {a, b, c};
  if (t->dtype != dt || t->ndim != 3 || t->shape[0] != a || t->shape[1] != b || t->shape[2] != c ||
      !attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_SHAPE, "%s: out %s must be a contiguous %s tensor of shape %s", op,
                      attn_tensor_shape_str(t), attn_dtype_name(dt), attn_shape_str(3, want));
  return ATTN_OK;
}

/* ------------------------------------------------------------ additive attention */

attn_status attn_additive_saved_layout(int64_t B, int64_t Nq, int64_t Nk, int64_t h, attn_saved_layout *l) {
  attn_saved_begin(l, "projected_additive_attention");
  const int64_t qh[3] = {B, Nq, h}, kh[3] = {B, Nk, h}, scores[3] = {B, Nq, Nk};
  attn_status st;
  if ((st = attn_saved_add(l, "qh", 3, qh)) != ATTN_OK || (st = attn_saved_add(l, "kh", 3, kh)) != ATTN_OK)
    return st;
  return attn_saved_add(l, "scores", 3, scores);
}

attn_status attn_attention_additive_layer_forward(const attn_tensor *queries, const attn_tensor *keys,
                                                  const attn_tensor *values, const attn_tensor *w_q,
                                                  const attn_tensor *w_k, const attn_tensor *w_v,
                                                  const attn_attention_opts *opts, attn_tensor *out,
                                                  attn_tensor *weights, attn_tensor *saved) {
  const char *op = "projected_additive_attention";
  attn_dtype dt = queries->dtype;
  attn_status st = check_projection(op, "queries", queries, "W_q", w_q, NULL, NULL, -1, -1, dt);
  if (st != ATTN_OK) return st;
  int64_t B = queries->shape[0], Nq = queries->shape[1], h = w_q->shape[0];
  st = check_projection(op, "keys", keys, "W_k", w_k, NULL, NULL, B, h, dt);
  if (st != ATTN_OK) return st;
  int64_t Nk = keys->shape[1];
  /* w_v as nn.Linear(h, 1) holds it, (1, h), or as a vector (h) */
  if (!((w_v->ndim == 1 && w_v->shape[0] == h) || (w_v->ndim == 2 && w_v->shape[0] == 1 && w_v->shape[1] == h)))
    return attn_error(ATTN_ERR_SHAPE, "%s: w_v %s must be (1, %lld) or (%lld)", op, attn_tensor_shape_str(w_v),
                      (long long)h, (long long)h);
  attn_saved_layout lay;
  if ((st = attn_additive_saved_layout(B, Nq, Nk, h, &lay)) != ATTN_OK ||
      (st = attn_saved_check(op, &lay, saved, dt)) != ATTN_OK)
    return st;
  attn_tensor qh = attn_saved_view(saved, &lay, ATTN_ADDITIVE_SAVED_QH);
  attn_tensor kh = attn_saved_view(saved, &lay, ATTN_ADDITIVE_SAVED_KH);
  attn_tensor scores = attn_saved_view(saved, &lay, ATTN_ADDITIVE_SAVED_SCORES);
  attn_tensor q2 = view2(&qh, B * Nq, h, h, 1), k2 = view2(&kh, B * Nk, h, h, 1);
  attn_tensor wv = *w_v;
  wv.ndim = 1;
  wv.shape[0] = h;
  wv.stride[0] = w_v->stride[w_v->ndim - 1];
  if ((st = project(queries, w_q, NULL, &q2)) != ATTN_OK || (st = project(keys, w_k, NULL, &k2)) != ATTN_OK)
    return st;
  if ((st = attn_attention_additive_scores_forward(&qh, &kh, &wv, &scores)) != ATTN_OK) return st;
  return attn_attention_scores_forward(op, &scores, values, opts, out, weights);
}

/* ------------------------------------------------------------ multi-head attention */

/* (B*H, N, dh) for one projection: x @ w^T + b, split into heads. */
static attn_status project_heads(const attn_tensor *x, const attn_tensor *w, const attn_tensor *b, int64_t heads,
                                 attn_tensor *xh) {
  int64_t B = x->shape[0], N = x->shape[1], h = w->shape[0];
  attn_tensor y;
  int64_t shape[2] = {B * N, h};
  attn_status st = attn_tensor_init(&y, x->dtype, 2, shape);
  if (st != ATTN_OK) return st;
  st = project(x, w, b, &y);
  if (st == ATTN_OK) {
    attn_tensor y3 = view3(&y, B, N, h);
    st = attn_attention_split_heads(&y3, heads, xh);
  }
  attn_tensor_free(&y);
  return st;
}

attn_status attn_mha_saved_layout(int64_t B, int64_t Nq, int64_t Nk, int64_t h, int64_t heads,
                                  attn_saved_layout *l) {
  attn_saved_begin(l, "multi_head_attention");
  int64_t BH, BNq;
  if (heads < 1 || h < 0 || h % heads != 0)
    return attn_error(ATTN_ERR_ARG, "%s: num_hiddens %lld is not divisible by num_heads %lld", l->op, (long long)h,
                      (long long)heads);
  if (B < 0 || Nq < 0 || Nk < 0 || __builtin_mul_overflow(B, heads, &BH) || __builtin_mul_overflow(B, Nq, &BNq))
    return attn_error(ATTN_ERR_SHAPE,
                      "%s: %lld samples of %lld queries and %lld keys in %lld heads do not fit a saved buffer", l->op, (long long)B, (long long)Nq, (long long)Nk, (long long)heads);
  int64_t dh = h / heads;
  const int64_t q[3] = {BH, Nq, dh}, k[3] = {BH, Nk, dh}, merged[2] = {BNq, h};
  attn_status st;
  if ((st = attn_saved_add(l, "qh", 3, q)) != ATTN_OK || (st = attn_saved_add(l, "kh", 3, k)) != ATTN_OK ||
      (st = attn_saved_add(l, "vh", 3, k)) != ATTN_OK || (st = attn_saved_add(l, "ctx", 3, q)) != ATTN_OK)
    return st;
  return attn_saved_add(l, "merged", 2, merged);
}

attn_status attn_attention_mha_forward(const attn_tensor *queries, const attn_tensor *keys,
                                       const attn_tensor *values, const attn_mha_params *p,
                                       const attn_attention_opts *opts, attn_tensor *out, attn_tensor *weights,
                                       attn_tensor *lse, attn_tensor *saved, int *flash) {
  const char *op = "multi_head_attention";
  attn_dtype dt = queries->dtype;
  attn_status st = check_projection(op, "queries", queries, "W_q", p->w_q, "b_q", p->b_q, -1, -1, dt);
  if (st != ATTN_OK) return st;
  int64_t B = queries->shape[0], Nq = queries->shape[1], h = p->w_q->shape[0], H = p->heads;
  if ((st = check_projection(op, "keys", keys, "W_k", p->w_k, "b_k", p->b_k, B, h, dt)) != ATTN_OK ||
      (st = check_projection(op, "values", values, "W_v", p->w_v, "b_v", p->b_v, B, h, dt)) != ATTN_OK)
    return st;
  const attn_tensor *wo = p->w_o, *bo = p->b_o;
  if (wo->ndim != 2 || wo->shape[0] != h || wo->shape[1] != h || wo->dtype != dt ||
      (bo && (bo->ndim != 1 || bo->shape[0] != h || bo->dtype != dt)))
    return attn_error(ATTN_ERR_SHAPE, "%s: W_o %s%s%s must be (%lld, %lld)%s, %s as the queries", op,
                      attn_tensor_shape_str(wo), bo ? " with b_o " : "", bo ? attn_tensor_shape_str(bo) : "",
                      (long long)h, (long long)h, bo ? " and (h)" : "", attn_dtype_name(dt));
  int64_t Nk = keys->shape[1];
  if (values->shape[1] != Nk)
    return attn_error(ATTN_ERR_SHAPE, "%s: keys %s and values %s differ in length", op, attn_tensor_shape_str(keys),
                      attn_tensor_shape_str(values));
  if (H < 1 || h % H != 0)
    return attn_error(ATTN_ERR_ARG, "%s: num_hiddens %lld is not divisible by num_heads %lld", op, (long long)h,
                      (long long)H);
  attn_saved_layout lay;
  if ((st = attn_mha_saved_layout(B, Nq, Nk, h, H, &lay)) != ATTN_OK ||
      (st = attn_saved_check(op, &lay, saved, dt)) != ATTN_OK || (st = check_out(op, out, dt, B, Nq, h)) != ATTN_OK)
    return st;
  attn_tensor qh = attn_saved_view(saved, &lay, ATTN_MHA_SAVED_QH);
  attn_tensor kh = attn_saved_view(saved, &lay, ATTN_MHA_SAVED_KH);
  attn_tensor vh = attn_saved_view(saved, &lay, ATTN_MHA_SAVED_VH);
  attn_tensor ctx = attn_saved_view(saved, &lay, ATTN_MHA_SAVED_CTX);
  attn_tensor merged = attn_saved_view(saved, &lay, ATTN_MHA_SAVED_MERGED);
  if ((st = project_heads(queries, p->w_q, p->b_q, H, &qh)) != ATTN_OK ||
      (st = project_heads(keys, p->w_k, p->b_k, H, &kh)) != ATTN_OK ||
      (st = project_heads(values, p->w_v, p->b_v, H, &vh)) != ATTN_OK)
    return st;
  /* the caller's lengths are per sample: each sample's heads share them */
  attn_attention_opts o = *opts;
  o.heads = H; /* rows b*H + h: a 4-D bias or mask and ALiBi's slopes are per head */
  attn_tensor lens = {0};
  const attn_tensor *vl = opts->valid_lens;
  if (vl) {
    if (vl->ndim < 1 || vl->ndim > 2 || vl->shape[0] != B)
      return attn_error(ATTN_ERR_SHAPE, "%s: valid_lens %s does not fit queries %s (expected [%lld] or [%lldx%lld])",
                        op, attn_tensor_shape_str(vl), attn_tensor_shape_str(queries), (long long)B, (long long)B,
                        (long long)Nq);
    int64_t shape[2] = {B * H, vl->ndim == 2 ? vl->shape[1] : 0};
    if ((st = attn_tensor_init(&lens, vl->dtype, vl->ndim, shape)) != ATTN_OK) return st;
    st = attn_attention_repeat_rows(vl, H, &lens);
    o.valid_lens = &lens;
  }
  if (st == ATTN_OK) st = attn_sdpa_forward(&qh, &kh, &vh, &o, &ctx, weights, lse, flash);
  attn_tensor_free(&lens);
  if (st != ATTN_OK) return st;
  attn_tensor m3 = view3(&merged, B, Nq, h), out2 = view2(out, B * Nq, h, h, 1);
  attn_tensor wot = view2(wo, h, h, wo->stride[1], wo->stride[0]);
  if ((st = attn_attention_merge_heads(&ctx, H, &m3)) != ATTN_OK || (st = attn_matmul(&merged, &wot, &out2)))
    return st;
  return bo ? attn_binary(ATTN_ADD, &out2, bo, &out2) : ATTN_OK;
}
