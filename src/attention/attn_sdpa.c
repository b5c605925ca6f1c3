/* Scaled dot-product attention: the entry points. A call is set up as every attention call is
 * (src/attention/attn_attention.c), then runs the flash kernels (float32, at least one 64 x 64 tile:
 * src/attention/attn_sdpa_flash.c) or the blocked reference path (src/attention/attn_sdpa_reference.c), which also
 * reruns a flash call whose results came out not finite. */
#include "attention/attn_attention_internal.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "core/attn_alloc.h"

/* ------------------------------------------------------------ flash path */

/* Float32 calls of at least one tile take the flash kernels, whatever the operands hold: they
 * need no scan for inf or NaN first (a serial pass over q, k and v cost ~7% of a one-thread call
 * at N = 128), because a block whose results come out not finite sends the whole call to the
 * reference path (attn_flash_item_fn says why that keeps the rules). */
static int flash_applies(const attn_attention_job *J, const attn_attention_opts *o) {
  return attn_sdpa_flash_size(J->Nq, J->Nk, o->kernel) && J->dt == ATTN_F32 && J->d > 0 && J->dv > 0 && J->B > 0 &&
         J->Nq > 0 && J->Nk > 0;
}

/* t (3-D or 4-D) as a float32 operand with unit column stride (a contiguous copy when it has
 * none); 4-D operands keep their heads (attn_flash_mat), grouped by grp. */
static attn_status flash_operand(attn_attention_mem *mem, const attn_tensor *t, int64_t grp, attn_flash_mat *m) {
  const int r = t->ndim - 2;
  if (t->shape[r + 1] > 1 && t->stride[r + 1] != 1) {
    attn_tensor *tmp = &mem->tmp[mem->ntmp++];
    attn_status st = attn_tensor_clone(tmp, t, t->dtype);
    if (st != ATTN_OK) return st;
    t = tmp;
  }
  m->p = attn_tensor_data(t);
  m->sb = t->stride[0];
  m->sr = t->stride[r];
  m->sh = r == 2 ? t->stride[1] : 0;
  m->nh = r == 2 ? t->shape[1] * grp : 1;
  m->grp = grp;
  return ATTN_OK;
}

static attn_status flash_setup(attn_flash_job *F, const attn_flash_kernels **ks, attn_attention_job *J,
                               attn_attention_mem *mem, const char *op, const attn_tensor *q, const attn_tensor *k,
                               const attn_tensor *v, const attn_attention_opts *o) {
  attn_status st = attn_attention_flash_kernels(o->kernel, op, ks);
  if (st != ATTN_OK) return st;
  memset(F, 0, sizeof *F);
  F->J = J;
  F->qscale = (float)(J->scale * 1.4426950408889634);
  F->fill2 = (float)(ATTN_MASKED_SOFTMAX_FILL * 1.4426950408889634);
  if ((st = flash_operand(mem, q, 1, &F->q)) != ATTN_OK || (st = flash_operand(mem, k, J->grp, &F->k)) != ATTN_OK)
    return st;
  return flash_operand(mem, v, J->grp, &F->v);
}

/* ------------------------------------------------------------ public entry points */

/* The shape of operand n (0 q, 1 k, 2 v) of a call, as errors name it. */
static const char *const sdpa_names[3] = {"queries", "keys", "values"};

static attn_status sdpa_setup(const char *op, const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_attention_opts *o, attn_attention_job *J, attn_attention_mem *mem, attn_attention_ctx *ctx) {
  memset(J, 0, sizeof *J);
  memset(mem, 0, sizeof *mem);
  const attn_tensor *operands[3] = {q, k, v};
  static const char *const dims3[3] = {"(B, Nq, d)", "(B, Nk, d)", "(B, Nk, dv)"},
                           *const dims4[3] = {"(B, H, Nq, d)", "(B, Hkv, Nk, d)", "(B, Hkv, Nk, dv)"};
  const int nd = q->ndim == 4 ? 4 : 3, r = nd - 3; /* r: the heads dim's count */
  for (int n = 0; n < 3; n++)
    if (operands[n]->ndim != nd)
      return attn_error(ATTN_ERR_SHAPE, "%s: %s must be %s, got %s", op, sdpa_names[n], nd == 4 ? dims4[n] : dims3[n],
                        attn_tensor_shape_str(operands[n]));
  memset(ctx, 0, sizeof *ctx);
  ctx->a = q;
  ctx->b = k;
  ctx->c = v;
  if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0])
    return attn_error(ATTN_ERR_SHAPE, "%s: batch sizes differ (%s)", op, attn_attention_ctx_str(ctx));
  int64_t H = 1, Hkv = 1;
  if (nd == 4) {
    H = q->shape[1];
    Hkv = k->shape[1];
    if (v->shape[1] != Hkv)
      return attn_error(ATTN_ERR_SHAPE, "%s: keys and values must have the same heads Hkv, got %lld and %lld (%s)", op,
                        (long long)Hkv, (long long)v->shape[1], attn_attention_ctx_str(ctx));
    if (Hkv < 1 || H % Hkv != 0)
      return attn_error(ATTN_ERR_SHAPE, "%s: key/value heads Hkv = %lld must divide query heads H = %lld (%s)", op,
                        (long long)Hkv, (long long)H, attn_attention_ctx_str(ctx));
  }
  if (k->shape[2 + r] != q->shape[2 + r])
    return attn_error(ATTN_ERR_SHAPE, "%s: keys must have the queries' width %lld (%s)", op,
                      (long long)q->shape[2 + r], attn_attention_ctx_str(ctx));
  if (v->shape[1 + r] != k->shape[1 + r])
    return attn_error(ATTN_ERR_SHAPE, "%s: values must have one row per key, %lld (%s)", op,
                      (long long)k->shape[1 + r], attn_attention_ctx_str(ctx));
  if (k->dtype != q->dtype || v->dtype != q->dtype)
    return attn_error(ATTN_ERR_DTYPE, "%s: dtypes differ: queries %s, keys %s, values %s", op,
                      attn_dtype_name(q->dtype), attn_dtype_name(k->dtype), attn_dtype_name(v->dtype));
  if (attn_check_float(op, q) != ATTN_OK) return ATTN_ERR_DTYPE;
  J->dt = q->dtype;
  J->nd4 = nd == 4;
  J->B = q->shape[0] * H;
  J->Nq = q->shape[1 + r];
  J->Nk = k->shape[1 + r];
  J->d = q->shape[2 + r];
  J->dv = v->shape[2 + r];
  if (nd == 4) {
    J->H = H;
    J->grp = H / Hkv;
    J->lh = H;
  } else {
    if (o->heads < 0 || (o->heads > 0 && J->B % o->heads != 0))
      return attn_error(ATTN_ERR_ARG, "%s: heads %lld must divide the rows (%s)", op, (long long)o->heads,
                        attn_attention_ctx_str(ctx));
    J->H = o->heads > 0 ? o->heads : 1;
  }
  J->dot = 1;
  J->has_v = 1;
  attn_status st = attn_attention_prepare(J, mem, op, ctx, o);
  if (st != ATTN_OK) return st;
  J->scale = o->scale == o->scale ? o->scale : (J->d > 0 ? 1.0 / sqrt((double)J->d) : 1.0);
  if ((st = attn_attention_operand(mem, q, 1, &J->q)) != ATTN_OK || (st = attn_attention_operand(mem, k, 1, &J->k)) != ATTN_OK ||
      (st = attn_attention_operand(mem, v, 1, &J->v)) != ATTN_OK)
    return st;
  if (nd == 4) { /* key/value head of row b: (b % H) / grp */
    J->k.nh = J->v.nh = H;
    J->k.grp = J->v.grp = J->grp;
  }
  return ATTN_OK;
}

/* An output t of a call: contiguous, J->dt, of shape (B, N, width) for 3-D calls or
 * (B, heads, N, width) for 4-D ones (heads: H, or Hkv for dk and dv). */
static attn_status check_out(const char *op, const char *name, const attn_tensor *t, const attn_attention_job *J,
                             int64_t heads, int64_t n, int64_t width) {
  if (!J->nd4) {
    int64_t shape[3] = {J->B, n, width};
    return attn_attention_check_output(op, name, t, J->dt, shape);
  }
  int64_t shape[4] = {J->B / J->H, heads, n, width};
  if (!attn_attention_same_shape(t, 4, shape) || t->dtype != J->dt || !attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s %s must be a contiguous %s tensor of shape %s", op, name,
                      attn_tensor_shape_str(t), attn_dtype_name(J->dt), attn_shape_str(4, shape));
  return ATTN_OK;
}

/* An input of the backward given in the shape of an output (check_out's shapes, any strides),
 * as a 3-D view over the call's rows in *view (a contiguous copy in mem when the rows do not
 * share one stride). */
static attn_status row_input(const char *op, const char *name, const attn_tensor *t, const attn_attention_job *J,
                             attn_attention_mem *mem, attn_attention_ctx *ctx, int64_t n, int64_t width,
                             attn_tensor *view) {
  if (!J->nd4) {
    int64_t shape[3] = {J->B, n, width};
    *view = *t;
    return attn_attention_check_input(op, name, t, J->dt, shape, ctx);
  }
  int64_t shape[4] = {J->B / J->H, J->H, n, width};
  if (!attn_attention_same_shape(t, 4, shape) || t->dtype != J->dt)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be a %s tensor of shape %s", op, name, attn_tensor_shape_str(t),
                      attn_dtype_name(J->dt), attn_shape_str(4, shape));
  if (t->stride[0] != J->H * t->stride[1] && J->B / J->H > 1) {
    attn_tensor *tmp = &mem->tmp[mem->ntmp++];
    attn_status st = attn_tensor_clone(tmp, t, t->dtype);
    if (st != ATTN_OK) return st;
    t = tmp;
  }
  *view = *t;
  view->ndim = 3;
  view->shape[0] = J->B;
  view->stride[0] = t->stride[1];
  view->shape[1] = n;
  view->stride[1] = t->stride[2];
  view->shape[2] = width;
  view->stride[2] = t->stride[3];
  return ATTN_OK;
}

/* Grouped-query dk or dv: dst (B*Hkv rows of n x width) = the sum over each group's grp query
 * heads of src (B*H rows), in head order (the same bits on any thread count). */
static void group_sum(const attn_attention_job *J, char *dst, const char *src, int64_t n, int64_t width) {
  const size_t row = (size_t)(n * width) * J->es;
  for (int64_t g = 0; g < J->B / J->grp; g++) {
    char *o = dst + (size_t)g * row;
    memcpy(o, src + (size_t)(g * J->grp) * row, row);
    for (int64_t e = 1; e < J->grp; e++) attn_sdpa_add_row(J, o, src + (size_t)(g * J->grp + e) * row, 1, n * width);
  }
}

static attn_status check_lse(const char *op, const attn_tensor *lse, int64_t B, int64_t Nq) {
  int64_t shape[2] = {B, Nq};
  if (!attn_attention_same_shape(lse, 2, shape) || lse->dtype != ATTN_F64 || !attn_tensor_is_contiguous(lse))
    return attn_error(ATTN_ERR_SHAPE, "%s: lse %s must be a contiguous float64 tensor of shape %s", op,
                      attn_tensor_shape_str(lse), attn_shape_str(2, shape));
  return ATTN_OK;
}

attn_status attn_sdpa_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_attention_opts *o, attn_tensor *out, attn_tensor *weights,
                              attn_tensor *lse, int *flash) {
  const char *op = "dot_product_attention";
  if (flash) *flash = 0;
  attn_attention_job J;
  attn_attention_mem mem;
  attn_attention_ctx ctx;
  attn_status st = sdpa_setup(op, q, k, v, o, &J, &mem, &ctx);
  if (st == ATTN_OK) {
    if ((st = check_out(op, "out", out, &J, J.H, J.Nq, J.dv)) == ATTN_OK &&
        (!weights || (st = check_out(op, "weights", weights, &J, J.H, J.Nq, J.Nk)) == ATTN_OK) &&
        (!lse || (st = check_lse(op, lse, J.B, J.Nq)) == ATTN_OK)) {
      J.out = attn_tensor_data(out);
      J.weights = weights ? attn_tensor_data(weights) : NULL;
      int done = 0;
      if (flash_applies(&J, o)) {
        attn_flash_job F;
        const attn_flash_kernels *ks;
        if ((st = flash_setup(&F, &ks, &J, &mem, op, q, k, v, o)) == ATTN_OK) {
          F.out = (float *)J.out;
          F.weights = (float *)J.weights;
          F.lse = lse ? attn_tensor_data(lse) : NULL;
          st = attn_attention_run_flash_forward(&F, ks, op, &done);
        }
      }
      if (st == ATTN_OK && !done) {
        st = attn_attention_run_forward(&J, op);
        double *l = lse ? attn_tensor_data(lse) : NULL;
        for (int64_t i = 0; l && i < J.B * J.Nq; i++) l[i] = NAN;
      }
      if (flash) *flash = st == ATTN_OK && done;
    }
  }
  attn_attention_mem_free(&mem);
  return st;
}

/* Grouped-query backward: the kernels write dk and dv per query head into one temporary
 * (B*H, Nk, d + dv) block, summed over each group afterwards (group_sum). */
typedef struct {
  attn_tensor *dk, *dv;
  char *buf;
  size_t cap;
} gqa_grads;

static attn_status gqa_begin(attn_attention_job *J, gqa_grads *g, const char *op) {
  if (J->grp == 1 || (!J->gk && !J->gv)) return ATTN_OK;
  size_t rows = (size_t)(J->B * J->Nk), bytes = rows * (size_t)(J->d + J->dv) * J->es;
  g->buf = attn_alloc(bytes ? bytes : 1, &g->cap);
  if (!g->buf) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the grouped key/value gradients", op);
  if (J->gk) J->gk = g->buf;
  if (J->gv) J->gv = g->buf + rows * (size_t)J->d * J->es;
  return ATTN_OK;
}

static void gqa_end(attn_attention_job *J, gqa_grads *g, attn_status st) {
  if (!g->buf) return;
  if (st == ATTN_OK) {
    if (g->dk) group_sum(J, attn_tensor_data(g->dk), J->gk, J->Nk, J->d);
    if (g->dv) group_sum(J, attn_tensor_data(g->dv), J->gv, J->Nk, J->dv);
  }
  attn_free(g->buf, g->cap);
}

attn_status attn_sdpa_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_attention_opts *o, const attn_tensor *weights, const attn_tensor *out,
                               const attn_tensor *lse, const attn_tensor *dout, const attn_tensor *dweights,
                               attn_tensor *dq, attn_tensor *dk, attn_tensor *dv) {
  const char *op = "dot_product_attention backward";
  attn_attention_job J;
  attn_attention_mem mem;
  attn_attention_ctx ctx;
  gqa_grads G = {.dk = dk, .dv = dv};
  attn_tensor wv, ov, gv, gwv; /* the row views of weights, out, dout, dweights */
  attn_status st = sdpa_setup(op, q, k, v, o, &J, &mem, &ctx);
  if (st != ATTN_OK) goto done;
  const int64_t Hkv = J.H / J.grp;
  if ((weights && (st = row_input(op, "weights", weights, &J, &mem, &ctx, J.Nq, J.Nk, &wv)) != ATTN_OK) ||
      (out && (st = row_input(op, "out", out, &J, &mem, &ctx, J.Nq, J.dv, &ov)) != ATTN_OK) ||
      (dout && (st = row_input(op, "grad of out", dout, &J, &mem, &ctx, J.Nq, J.dv, &gv)) != ATTN_OK) ||
      (dweights && (st = row_input(op, "grad of weights", dweights, &J, &mem, &ctx, J.Nq, J.Nk, &gwv)) != ATTN_OK))
    goto done;
  if ((st = attn_attention_attach_backward_inputs(op, &J, &mem, &ctx, weights ? &wv : NULL, dout ? &gv : NULL,
                                                  dweights ? &gwv : NULL)) != ATTN_OK)
    goto done;
  if ((dq && (st = check_out(op, "dq", dq, &J, J.H, J.Nq, J.d)) != ATTN_OK) ||
      (dk && (st = check_out(op, "dk", dk, &J, Hkv, J.Nk, J.d)) != ATTN_OK) ||
      (dv && (st = check_out(op, "dv", dv, &J, Hkv, J.Nk, J.dv)) != ATTN_OK))
    goto done;
  J.gq = dq ? attn_tensor_data(dq) : NULL;
  J.gk = dk ? attn_tensor_data(dk) : NULL;
  J.gv = dv ? attn_tensor_data(dv) : NULL;
  if ((st = gqa_begin(&J, &G, op)) != ATTN_OK) goto done;
  if (out && lse && dout && !dweights) {
    if ((st = check_lse(op, lse, J.B, J.Nq)) != ATTN_OK) goto done;
    if (flash_applies(&J, o)) { /* an lse entry that is NaN (the reference forward ran) sends it back */
      attn_flash_job F;
      attn_flash_mat om;
      const attn_flash_kernels *ks;
      int flash_done = 0;
      if ((st = flash_setup(&F, &ks, &J, &mem, op, q, k, v, o)) != ATTN_OK ||
          (st = flash_operand(&mem, &gv, 1, &F.dout)) != ATTN_OK || (st = flash_operand(&mem, &ov, 1, &om)) != ATTN_OK)
        goto done;
      F.dq = (float *)J.gq;
      F.dk = (float *)J.gk;
      F.dv = (float *)J.gv;
      st = attn_attention_run_flash_backward(&F, ks, om, attn_tensor_data(lse), J.Nq, op, &flash_done);
      if (st != ATTN_OK || flash_done) goto done;
    }
  }
  st = attn_attention_run_backward(&J, op);
done:
  gqa_end(&J, &G, st);
  attn_attention_mem_free(&mem);
  return st;
}
