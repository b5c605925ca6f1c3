/* The forwards of d2l's attention layers as one call each: additive attention with its two
 * projections, and multi-head attention with its four projections and the head moves. At the
 * book's sizes a layer call is a dozen small operations, and calling them one by one from Lua
 * cost more than their arithmetic; here they run back to back on the same core functions
 * (attn_matmul, the head moves, attn_sdpa_forward, the additive scores), so the numbers are
 * those of the composition and every kernel improvement reaches both. The intermediates the
 * backward needs are written to caller-provided tensors. */
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

static attn_status check_saved(const char *op, const char *name, const attn_tensor *t, attn_dtype dt, int64_t a,
                               int64_t b, int64_t c) {
  int ndim = c < 0 ? 2 : 3;
  if (t->dtype != dt || t->ndim != ndim || t->shape[0] != a || t->shape[1] != b || (ndim == 3 && t->shape[2] != c) ||
      !attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be a contiguous %s tensor of %lld x %lld%s", op, name,
                      attn_tensor_shape_str(t), attn_dtype_name(dt), (long long)a, (long long)b,
                      ndim == 3 ? " x (head width)" : "");
  return ATTN_OK;
}

/* ------------------------------------------------------------ additive attention */

attn_status attn_attention_additive_layer_forward(const attn_tensor *queries, const attn_tensor *keys,
                                                  const attn_tensor *values, const attn_tensor *w_q,
                                                  const attn_tensor *w_k, const attn_tensor *w_v,
                                                  const attn_attention_opts *opts, attn_tensor *out,
                                                  attn_tensor *weights, attn_tensor *qh, attn_tensor *kh,
                                                  attn_tensor *scores) {
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
  if ((st = check_saved(op, "qh", qh, dt, B, Nq, h)) != ATTN_OK || (st = check_saved(op, "kh", kh, dt, B, Nk, h)))
    return st;
  attn_tensor q2 = view2(qh, B * Nq, h, h, 1), k2 = view2(kh, B * Nk, h, h, 1);
  attn_tensor wv = *w_v;
  wv.ndim = 1;
  wv.shape[0] = h;
  wv.stride[0] = w_v->stride[w_v->ndim - 1];
  if ((st = project(queries, w_q, NULL, &q2)) != ATTN_OK || (st = project(keys, w_k, NULL, &k2)) != ATTN_OK)
    return st;
  if ((st = attn_attention_additive_scores_forward(qh, kh, &wv, scores)) != ATTN_OK) return st;
  return attn_attention_scores_forward(op, scores, values, opts, out, weights);
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

attn_status attn_attention_mha_forward(const attn_tensor *queries, const attn_tensor *keys,
                                       const attn_tensor *values, const attn_mha_params *p,
                                       const attn_attention_opts *opts, attn_tensor *out, attn_tensor *weights,
                                       attn_tensor *lse, const attn_mha_saved *s) {
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
  int64_t dh = h / H;
  if ((st = check_saved(op, "qh", s->qh, dt, B * H, Nq, dh)) != ATTN_OK ||
      (st = check_saved(op, "kh", s->kh, dt, B * H, Nk, dh)) != ATTN_OK ||
      (st = check_saved(op, "vh", s->vh, dt, B * H, Nk, dh)) != ATTN_OK ||
      (st = check_saved(op, "ctx", s->ctx, dt, B * H, Nq, dh)) != ATTN_OK ||
      (st = check_saved(op, "merged", s->merged, dt, B * Nq, h, -1)) != ATTN_OK ||
      (st = check_saved(op, "out", out, dt, B, Nq, h)) != ATTN_OK)
    return st;
  if ((st = project_heads(queries, p->w_q, p->b_q, H, s->qh)) != ATTN_OK ||
      (st = project_heads(keys, p->w_k, p->b_k, H, s->kh)) != ATTN_OK ||
      (st = project_heads(values, p->w_v, p->b_v, H, s->vh)) != ATTN_OK)
    return st;
  /* the caller's lengths are per sample: each sample's heads share them */
  attn_attention_opts o = *opts;
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
  if (st == ATTN_OK) st = attn_sdpa_forward(s->qh, s->kh, s->vh, &o, s->ctx, weights, lse);
  attn_tensor_free(&lens);
  if (st != ATTN_OK) return st;
  attn_tensor m3 = view3(s->merged, B, Nq, h), out2 = view2(out, B * Nq, h, h, 1);
  attn_tensor wot = view2(wo, h, h, wo->stride[1], wo->stride[0]);
  if ((st = attn_attention_merge_heads(s->ctx, H, &m3)) != ATTN_OK || (st = attn_matmul(s->merged, &wot, &out2)))
    return st;
  return bo ? attn_binary(ATTN_ADD, &out2, bo, &out2) : ATTN_OK;
}
