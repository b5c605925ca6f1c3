/* Scaled dot-product attention: the entry points. A call is set up as every attention call is
 * (src/attention/attn_attention.c), then runs the flash kernels (float32, at least one 64 x 64 tile:
 * src/attention/attn_sdpa_flash.c) or the blocked reference path (src/attention/attn_sdpa_reference.c), which also
 * reruns a flash call whose results came out not finite. */
#include "attention/attn_attention_internal.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ flash path */

/* Float32 calls of at least one tile take the flash kernels, whatever the operands hold: they
 * need no scan for inf or NaN first (a serial pass over q, k and v cost ~7% of a one-thread call
 * at N = 128), because a block whose results come out not finite sends the whole call to the
 * reference path (attn_flash_item_fn says why that keeps the rules). */
static int flash_applies(const attn_attention_job *J, const attn_attention_opts *o) {
  return attn_sdpa_flash_size(J->Nq, J->Nk, o->kernel) && J->dt == ATTN_F32 && J->d > 0 && J->dv > 0 && J->B > 0 &&
         J->Nq > 0 && J->Nk > 0;
}

/* t as a float32 operand with unit column stride (a contiguous copy when it has none). */
static attn_status flash_operand(attn_attention_mem *mem, const attn_tensor *t, attn_flash_mat *m) {
  if (t->shape[2] > 1 && t->stride[2] != 1) {
    attn_tensor *tmp = &mem->tmp[mem->ntmp++];
    attn_status st = attn_tensor_clone(tmp, t, t->dtype);
    if (st != ATTN_OK) return st;
    t = tmp;
  }
  m->p = attn_tensor_data(t);
  m->sb = t->stride[0];
  m->sr = t->stride[1];
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
  if ((st = flash_operand(mem, q, &F->q)) != ATTN_OK || (st = flash_operand(mem, k, &F->k)) != ATTN_OK)
    return st;
  return flash_operand(mem, v, &F->v);
}

/* ------------------------------------------------------------ public entry points */

static attn_status sdpa_setup(const char *op, const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_attention_opts *o, attn_attention_job *J, attn_attention_mem *mem, attn_attention_ctx *ctx) {
  memset(J, 0, sizeof *J);
  memset(mem, 0, sizeof *mem);
  const attn_tensor *operands[3] = {q, k, v};
  static const char *const names[3] = {"queries", "keys", "values"}, *const dims[3] = {"(B, Nq, d)", "(B, Nk, d)",
                                                                                      "(B, Nk, dv)"};
  for (int n = 0; n < 3; n++)
    if (operands[n]->ndim != 3)
      return attn_error(ATTN_ERR_SHAPE, "%s: %s must be %s, got %s", op, names[n], dims[n],
                        attn_tensor_shape_str(operands[n]));
  memset(ctx, 0, sizeof *ctx);
  ctx->a = q;
  ctx->b = k;
  ctx->c = v;
  if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0])
    return attn_error(ATTN_ERR_SHAPE, "%s: batch sizes differ (%s)", op, attn_attention_ctx_str(ctx));
  if (k->shape[2] != q->shape[2])
    return attn_error(ATTN_ERR_SHAPE, "%s: keys must have the queries' width %lld (%s)", op, (long long)q->shape[2],
                      attn_attention_ctx_str(ctx));
  if (v->shape[1] != k->shape[1])
    return attn_error(ATTN_ERR_SHAPE, "%s: values must have one row per key, %lld (%s)", op, (long long)k->shape[1],
                      attn_attention_ctx_str(ctx));
  if (k->dtype != q->dtype || v->dtype != q->dtype)
    return attn_error(ATTN_ERR_DTYPE, "%s: dtypes differ: queries %s, keys %s, values %s", op,
                      attn_dtype_name(q->dtype), attn_dtype_name(k->dtype), attn_dtype_name(v->dtype));
  if (attn_check_float(op, q) != ATTN_OK) return ATTN_ERR_DTYPE;
  J->dt = q->dtype;
  J->B = q->shape[0];
  J->Nq = q->shape[1];
  J->Nk = k->shape[1];
  J->d = q->shape[2];
  J->dv = v->shape[2];
  J->dot = 1;
  J->has_v = 1;
  attn_status st = attn_attention_prepare(J, mem, op, ctx, o);
  if (st != ATTN_OK) return st;
  J->scale = o->scale == o->scale ? o->scale : (J->d > 0 ? 1.0 / sqrt((double)J->d) : 1.0);
  if ((st = attn_attention_operand(mem, q, 1, &J->q)) != ATTN_OK || (st = attn_attention_operand(mem, k, 1, &J->k)) != ATTN_OK ||
      (st = attn_attention_operand(mem, v, 1, &J->v)) != ATTN_OK)
    return st;
  return ATTN_OK;
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
    int64_t os[3] = {J.B, J.Nq, J.dv}, ws[3] = {J.B, J.Nq, J.Nk};
    if ((st = attn_attention_check_output(op, "out", out, J.dt, os)) == ATTN_OK &&
        (!weights || (st = attn_attention_check_output(op, "weights", weights, J.dt, ws)) == ATTN_OK) &&
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

attn_status attn_sdpa_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_attention_opts *o, const attn_tensor *weights, const attn_tensor *out,
                               const attn_tensor *lse, const attn_tensor *dout, const attn_tensor *dweights,
                               attn_tensor *dq, attn_tensor *dk, attn_tensor *dv) {
  const char *op = "dot_product_attention backward";
  attn_attention_job J;
  attn_attention_mem mem;
  attn_attention_ctx ctx;
  attn_status st = sdpa_setup(op, q, k, v, o, &J, &mem, &ctx);
  if (st != ATTN_OK) goto done;
  int64_t qs[3] = {J.B, J.Nq, J.d}, ks[3] = {J.B, J.Nk, J.d}, vs[3] = {J.B, J.Nk, J.dv}, os[3] = {J.B, J.Nq, J.dv};
  if ((st = attn_attention_attach_backward_inputs(op, &J, &mem, &ctx, weights, dout, dweights)) != ATTN_OK) goto done;
  if ((dq && (st = attn_attention_check_output(op, "dq", dq, J.dt, qs)) != ATTN_OK) ||
      (dk && (st = attn_attention_check_output(op, "dk", dk, J.dt, ks)) != ATTN_OK) ||
      (dv && (st = attn_attention_check_output(op, "dv", dv, J.dt, vs)) != ATTN_OK))
    goto done;
  J.gq = dq ? attn_tensor_data(dq) : NULL;
  J.gk = dk ? attn_tensor_data(dk) : NULL;
  J.gv = dv ? attn_tensor_data(dv) : NULL;
  if (out && lse && dout && !dweights) {
    if ((st = attn_attention_check_input(op, "out", out, J.dt, os, &ctx)) != ATTN_OK || (st = check_lse(op, lse, J.B, J.Nq)) != ATTN_OK)
      goto done;
    if (flash_applies(&J, o)) { /* an lse entry that is NaN (the reference forward ran) sends it back */
      attn_flash_job F;
      attn_flash_mat om;
      const attn_flash_kernels *ks;
      int flash_done = 0;
      if ((st = flash_setup(&F, &ks, &J, &mem, op, q, k, v, o)) != ATTN_OK ||
          (st = flash_operand(&mem, dout, &F.dout)) != ATTN_OK || (st = flash_operand(&mem, out, &om)) != ATTN_OK)
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
  attn_attention_mem_free(&mem);
  return st;
}
