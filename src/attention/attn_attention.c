/* Attention kernels: the setup every call shares (src/attention/attn_attention_internal.h). It validates
 * the operands, options, keep-mask and lengths, and builds one attn_attention_job (BLAS-readable
 * operand views, per-row lengths, the expanded keep-mask, the dropout stream) for the drivers:
 * the blocked reference path (src/attention/attn_sdpa_reference.c, row kernels in src/attention/attn_sdpa_rows.c)
 * and the flash kernels (src/attention/attn_sdpa_flash.c). Dot-product attention's entry points are in
 * src/attention/attn_sdpa.c; this file also holds attention over given scores (additive attention, d2l's
 * masked_softmax). */
#include "attention/attn_attention_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/attn_alloc.h"

#define BLK ATTN_SDPA_BLOCK

void attn_attention_opts_init(attn_attention_opts *o) {
  memset(o, 0, sizeof *o);
  o->window = -1;
  o->scale = NAN;
  o->training = 1;
}

/* ------------------------------------------------------------ keep-mask, operands */

/* A keep-mask or bias t (what names it in errors) broadcast over J's rows as a view in *view,
 * its strides in st[4] (row b's sample and head strides, row, column; attn_attention_row_mask's
 * mapping). 4-D calls, and 3-D ones with heads given a 4-D t, broadcast to (B, H, Nq, Nk);
 * other calls to (B, Nq, Nk) (NumPy: the dims past those must be 1). */
static attn_status prepare_bcast(const char *op, const char *what, const attn_tensor *t, const attn_attention_job *J,
                                 attn_attention_ctx *ctx, attn_tensor *view, int64_t st[4]) {
  const int four = J->nd4 || (J->H > 1 && t->ndim >= 4), nd = four ? 4 : 3;
  int64_t target[4] = {J->B / J->H, J->H, J->Nq, J->Nk};
  if (!four) {
    target[1] = J->B;
    target[0] = 1;
  }
  const int64_t *tg = target + 4 - nd;
  int ok = 1;
  for (int d = 0; ok && d < t->ndim; d++) {
    int64_t s = t->shape[t->ndim - 1 - d];
    ok = s == 1 || (d < nd && s == tg[nd - 1 - d]);
  }
  if (!ok)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s does not broadcast to %s = %s (%s)", op, what,
                      attn_tensor_shape_str(t), four ? "(B, H, Nq, Nk)" : "(B, Nq, Nk)", attn_shape_str(nd, tg),
                      attn_attention_ctx_str(ctx));
  *view = *t;
  while (view->ndim > nd) attn_view_select(view, 0, 0);
  while (view->ndim < nd) attn_view_unsqueeze(view, 0);
  attn_status s = attn_view_expand(view, nd, tg);
  if (s != ATTN_OK) return s;
  if (four) {
    for (int d = 0; d < 4; d++) st[d] = view->stride[d];
  } else { /* row b = (b / H) * H + b % H */
    st[0] = J->H * view->stride[0];
    st[1] = view->stride[0];
    st[2] = view->stride[1];
    st[3] = view->stride[2];
  }
  return ATTN_OK;
}

/* The keep-mask's values must be 0 or 1: each stored element is visited once (broadcast dims
 * have stride 0). */
static attn_status check_keep_mask(const char *op, const attn_tensor *mask, const attn_tensor *view) {
  int64_t n[4] = {1, 1, 1, 1}, s[4] = {0, 0, 0, 0};
  for (int d = 0; d < view->ndim; d++) {
    n[4 - view->ndim + d] = view->stride[d] == 0 ? (view->shape[d] > 0 ? 1 : 0) : view->shape[d];
    s[4 - view->ndim + d] = view->stride[d];
  }
  for (int64_t a = 0; a < n[0]; a++)
    for (int64_t b = 0; b < n[1]; b++)
      for (int64_t i = 0; i < n[2]; i++)
        for (int64_t j = 0; j < n[3]; j++) {
          int64_t off = view->offset + a * s[0] + b * s[1] + i * s[2] + j * s[3];
          double v = view->dtype == ATTN_F32 ? (double)((const float *)view->storage->data)[off]
                                             : ((const double *)view->storage->data)[off];
          if (v != 0 && v != 1)
            return attn_error(ATTN_ERR_ARG, "%s: mask %s is a keep-mask: entries must be 0 or 1, found %g", op,
                              attn_tensor_shape_str(mask), v);
        }
  return ATTN_OK;
}

/* ------------------------------------------------------------ operands, gemm */

static int blas_layout(const attn_tensor *t, int *trans, int64_t *ld) {
  const int r = t->ndim - 2; /* the matrix dims: the last two */
  int64_t rows = t->shape[r], cols = t->shape[r + 1], sr = t->stride[r], sc = t->stride[r + 1];
  int64_t mc = cols > 1 ? cols : 1, mr = rows > 1 ? rows : 1;
  if ((sc == 1 || cols <= 1) && (rows <= 1 || sr >= mc)) {
    *trans = 0;
    *ld = rows <= 1 ? mc : sr;
  } else if ((sr == 1 || rows <= 1) && (cols <= 1 || sc >= mr)) {
    *trans = 1;
    *ld = cols <= 1 ? mr : sc;
  } else {
    return 0;
  }
  return *ld <= INT_MAX;
}

/* m describes t; when blas is set and BLAS cannot read t, t is copied into *tmp. */
static attn_status mat3_prepare(const attn_tensor *t, int blas, attn_tensor *tmp, attn_attention_mat *m) {
  int trans = 0;
  int64_t ld = 1;
  if (blas && !blas_layout(t, &trans, &ld)) {
    attn_status st = attn_tensor_clone(tmp, t, t->dtype);
    if (st != ATTN_OK) return st;
    t = tmp;
    blas_layout(t, &trans, &ld);
  }
  const int r = t->ndim - 2;
  m->p = attn_tensor_data(t);
  m->sb = t->stride[0];
  m->sr = t->stride[r];
  m->sc = t->stride[r + 1];
  m->nh = r == 2 ? t->shape[1] : 1; /* a 4-D operand's heads (the caller sets grp) */
  m->sh = r == 2 ? t->stride[1] : 0;
  m->grp = 1;
  m->trans = trans;
  m->ld = (int)ld;
  return ATTN_OK;
}

/* ------------------------------------------------------------ validation */

int attn_attention_same_shape(const attn_tensor *t, int ndim, const int64_t *shape) {
  if (t->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++)
    if (t->shape[d] != shape[d]) return 0;
  return 1;
}

const char *attn_attention_ctx_str(attn_attention_ctx *x) {
  if (!x->done) {
    if (!x->scores)
      snprintf(x->buf, sizeof x->buf, "queries %s, keys %s, values %s", attn_tensor_shape_str(x->a),
               attn_tensor_shape_str(x->b), attn_tensor_shape_str(x->c));
    else if (x->b)
      snprintf(x->buf, sizeof x->buf, "scores %s, values %s", attn_tensor_shape_str(x->a), attn_tensor_shape_str(x->b));
    else
      snprintf(x->buf, sizeof x->buf, "%s %s", x->named_x ? "X" : "scores", attn_tensor_shape_str(x->a));
    x->done = 1;
  }
  return x->buf;
}

attn_status attn_attention_check_input(const char *op, const char *name, const attn_tensor *t, attn_dtype dt,
                               const int64_t *shape, attn_attention_ctx *ctx) {
  if (!attn_attention_same_shape(t, 3, shape))
    return attn_error(ATTN_ERR_SHAPE, "%s: %s has shape %s, expected %s (%s)", op, name, attn_tensor_shape_str(t),
                      attn_shape_str(3, shape), attn_attention_ctx_str(ctx));
  if (t->dtype != dt)
    return attn_error(ATTN_ERR_DTYPE, "%s: %s %s is %s, expected %s like the other operands", op, name,
                      attn_tensor_shape_str(t), attn_dtype_name(t->dtype), attn_dtype_name(dt));
  return ATTN_OK;
}

attn_status attn_attention_check_output(const char *op, const char *name, const attn_tensor *t, attn_dtype dt,
                                const int64_t *shape) {
  if (!attn_attention_same_shape(t, 3, shape) || t->dtype != dt || !attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s %s must be a contiguous %s tensor of shape %s", op, name,
                      attn_tensor_shape_str(t), attn_dtype_name(dt), attn_shape_str(3, shape));
  return ATTN_OK;
}

void attn_attention_mem_free(attn_attention_mem *m) {
  for (int i = 0; i < m->ntmp; i++) attn_tensor_free(&m->tmp[i]);
  if (m->lens) attn_free(m->lens, m->lens_cap);
  if (m->slopes) attn_free(m->slopes, m->slopes_cap);
  if (m->gcount) attn_free(m->gcount, m->gcount_cap);
  memset(m, 0, sizeof *m);
}

attn_status attn_attention_prepare(attn_attention_job *J, attn_attention_mem *mem, const char *op, attn_attention_ctx *ctx,
                           const attn_attention_opts *o) {
  attn_status st;
  if (J->B > INT_MAX || J->Nq > INT_MAX || J->Nk > INT_MAX || J->d > INT_MAX || J->dv > INT_MAX)
    return attn_error(ATTN_ERR_SHAPE, "%s: sizes exceed BLAS's 32-bit range (%s)", op, attn_attention_ctx_str(ctx));
  J->es = attn_dtype_size(J->dt);
  J->nblk = (J->Nq + BLK - 1) / BLK;
  J->causal = o->causal != 0;
  J->window = o->window;
  if (J->window > J->Nq + J->Nk) J->window = J->Nq + J->Nk;
  st = attn_attention_prepare_pattern(J, mem, op, o);
  if (st != ATTN_OK) return st;
  if (!(o->dropout >= 0 && o->dropout <= 1))
    return attn_error(ATTN_ERR_ARG, "%s: dropout must be a probability in [0, 1], got %g", op, o->dropout);
  if (o->scale == o->scale && !isfinite(o->scale))
    return attn_error(ATTN_ERR_ARG, "%s: scale %g is not finite", op, o->scale);
  if (o->kernel < ATTN_KERNEL_AUTO || o->kernel > ATTN_KERNEL_TINY)
    return attn_error(ATTN_ERR_ARG, "%s: kernel %d is not one of the ATTN_KERNEL_* values", op, o->kernel);
  J->dropout = o->dropout > 0 && o->training;
  /* tiny heads: the blocked driver's products as plain loops; calls this small are mostly the
   * per-call setup of sgemm (attn_sdpa_reference.c) */
  J->tiny = o->kernel == ATTN_KERNEL_TINY ||
            (o->kernel == ATTN_KERNEL_AUTO && J->Nq * J->Nk < 64 * 64 && J->d <= ATTN_SDPA_TINY_WIDTH &&
             J->dv <= ATTN_SDPA_TINY_WIDTH);
  if (J->dropout) {
    J->drop = attn_dropout_rule_make(o->dropout, o->seed);
  }
  if (J->H < 1) J->H = 1;
  if (J->grp < 1) J->grp = 1;
  if (J->lh < 1) J->lh = 1;
  if (o->valid_lens) {
    size_t n = (size_t)(J->B / J->lh * J->Nq);
    mem->lens = attn_alloc((n ? n : 1) * sizeof(int64_t), &mem->lens_cap);
    if (!mem->lens) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for valid_lens (%s)", op, attn_attention_ctx_str(ctx));
    st = attn_attention_lengths(op, "valid_lens", "", o->valid_lens, J->B / J->lh, J->Nq, J->Nk, 1, mem->lens);
    if (st != ATTN_OK) /* again, for the message with the shapes */
      st = attn_attention_lengths(op, "valid_lens", attn_attention_ctx_str(ctx), o->valid_lens, J->B / J->lh, J->Nq,
                                  J->Nk, 1, mem->lens);
    if (st != ATTN_OK) return st;
    J->lens = mem->lens;
  }
  if (o->mask) {
    attn_tensor mv;
    int64_t ms[4];
    if (!attn_dtype_is_float(o->mask->dtype)) return attn_check_float(op, o->mask);
    if ((st = prepare_bcast(op, "mask", o->mask, J, ctx, &mv, ms)) != ATTN_OK ||
        (st = check_keep_mask(op, o->mask, &mv)) != ATTN_OK)
      return st;
    J->mask = (const char *)attn_tensor_data(&mv);
    J->mdt = mv.dtype;
    J->msb = ms[0];
    J->msh = ms[1];
    J->msr = ms[2];
    J->msc = ms[3];
  }
  if ((o->bias || o->alibi) && !J->dot)
    return attn_error(ATTN_ERR_ARG, "%s: bias and alibi apply to dot-product attention only (%s)", op,
                      attn_attention_ctx_str(ctx));
  if (o->bias) {
    attn_tensor bv;
    int64_t bs[4];
    if (o->bias->dtype != J->dt)
      return attn_error(ATTN_ERR_DTYPE, "%s: bias %s is %s, expected %s like the queries", op,
                        attn_tensor_shape_str(o->bias), attn_dtype_name(o->bias->dtype), attn_dtype_name(J->dt));
    if ((st = prepare_bcast(op, "bias", o->bias, J, ctx, &bv, bs)) != ATTN_OK) return st;
    J->bias = (const char *)attn_tensor_data(&bv);
    J->bsb = bs[0];
    J->bsh = bs[1];
    J->bsr = bs[2];
    J->bsc = bs[3];
  }
  if (o->alibi) {
    const attn_tensor *a = o->alibi;
    if (!attn_dtype_is_float(a->dtype)) return attn_check_float(op, a);
    if (a->ndim != 1 || a->shape[0] != J->H)
      return attn_error(ATTN_ERR_SHAPE, "%s: alibi slopes %s must hold one slope per head, H = %lld (%s)", op,
                        attn_tensor_shape_str(a), (long long)J->H, attn_attention_ctx_str(ctx));
    mem->slopes = attn_alloc((size_t)J->H * sizeof(double), &mem->slopes_cap);
    if (!mem->slopes) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the alibi slopes", op);
    for (int64_t h = 0; h < J->H; h++) {
      int64_t off = a->offset + h * a->stride[0];
      double v = a->dtype == ATTN_F32 ? (double)((const float *)a->storage->data)[off]
                                      : ((const double *)a->storage->data)[off];
      if (!isfinite(v))
        return attn_error(ATTN_ERR_ARG, "%s: alibi slope %lld is %g, not finite", op, (long long)h + 1, v);
      mem->slopes[h] = v;
    }
    J->slopes = mem->slopes;
  }
  return ATTN_OK;
}

attn_status attn_attention_operand(attn_attention_mem *mem, const attn_tensor *t, int blas, attn_attention_mat *m) {
  return mat3_prepare(t, blas, &mem->tmp[mem->ntmp++], m);
}


/* Backward's optional inputs: stored weights (B, Nq, Nk), the gradient of the
 * output (B, Nq, dv) and of the weights (B, Nq, Nk), checked and attached to J. */
attn_status attn_attention_attach_backward_inputs(const char *op, attn_attention_job *J, attn_attention_mem *mem, attn_attention_ctx *ctx,
                                          const attn_tensor *weights, const attn_tensor *dout,
                                          const attn_tensor *dweights) {
  int64_t os[3] = {J->B, J->Nq, J->dv}, ws[3] = {J->B, J->Nq, J->Nk};
  attn_status st;
  if (weights) {
    if ((st = attn_attention_check_input(op, "weights", weights, J->dt, ws, ctx)) != ATTN_OK) return st;
    if ((st = attn_attention_operand(mem, weights, 0, &J->wst)) != ATTN_OK) return st;
    J->has_wst = 1;
  }
  if (dout) {
    if ((st = attn_attention_check_input(op, "grad of out", dout, J->dt, os, ctx)) != ATTN_OK) return st;
    if ((st = attn_attention_operand(mem, dout, 1, &J->dout)) != ATTN_OK) return st;
    J->has_dout = 1;
  }
  if (dweights) {
    if ((st = attn_attention_check_input(op, "grad of weights", dweights, J->dt, ws, ctx)) != ATTN_OK) return st;
    if ((st = attn_attention_operand(mem, dweights, 0, &J->dw)) != ATTN_OK) return st;
    J->has_dw = 1;
  }
  return ATTN_OK;
}


static attn_status scores_setup(const char *op, const attn_tensor *s, const attn_tensor *v,
                                const attn_attention_opts *o, attn_attention_job *J, attn_attention_mem *mem, attn_attention_ctx *ctx) {
  memset(J, 0, sizeof *J);
  memset(mem, 0, sizeof *mem);
  memset(ctx, 0, sizeof *ctx);
  ctx->scores = 1;
  ctx->a = s;
  ctx->b = v;
  ctx->named_x = strncmp(op, "masked_softmax", 14) == 0;
  if (s->ndim != 3)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s must be %s, got %s", op, ctx->named_x ? "X" : "scores",
                      ctx->named_x ? "(B, Q, K)" : "(B, Nq, Nk)", attn_tensor_shape_str(s));
  if (v && (v->ndim != 3 || v->shape[0] != s->shape[0] || v->shape[1] != s->shape[2]))
    return attn_error(ATTN_ERR_SHAPE, "%s: values must be (B, Nk, dv) = [%lldx%lldxdv] (%s)", op,
                      (long long)s->shape[0], (long long)s->shape[2], attn_attention_ctx_str(ctx));
  if (v && v->dtype != s->dtype)
    return attn_error(ATTN_ERR_DTYPE, "%s: dtypes differ: scores %s, values %s", op, attn_dtype_name(s->dtype),
                      attn_dtype_name(v->dtype));
  if (attn_check_float(op, s) != ATTN_OK) return ATTN_ERR_DTYPE;
  J->dt = s->dtype;
  J->B = s->shape[0];
  J->Nq = s->shape[1];
  J->Nk = s->shape[2];
  J->d = 0;
  J->dv = v ? v->shape[2] : 0;
  if (o->heads < 0 || (o->heads > 0 && J->B % o->heads != 0))
    return attn_error(ATTN_ERR_ARG, "%s: heads %lld must divide the rows (%s)", op, (long long)o->heads,
                      attn_attention_ctx_str(ctx));
  J->H = o->heads > 0 ? o->heads : 1;
  attn_status st = attn_attention_prepare(J, mem, op, ctx, o);
  if (st != ATTN_OK) return st;
  J->scale = o->scale == o->scale ? o->scale : 1.0;
  if ((st = attn_attention_operand(mem, s, 0, &J->sc)) != ATTN_OK) return st;
  if (v) {
    if ((st = attn_attention_operand(mem, v, 1, &J->v)) != ATTN_OK) return st;
    J->has_v = 1;
  }
  return ATTN_OK;
}

attn_status attn_attention_scores_forward(const char *op, const attn_tensor *scores, const attn_tensor *v,
                                          const attn_attention_opts *o, attn_tensor *out, attn_tensor *weights) {
  attn_attention_job J;
  attn_attention_mem mem;
  attn_attention_ctx ctx;
  attn_status st = scores_setup(op, scores, v, o, &J, &mem, &ctx);
  if (st == ATTN_OK && out && !v) st = attn_error(ATTN_ERR_ARG, "%s: an output needs values", op);
  if (st == ATTN_OK) {
    int64_t os[3] = {J.B, J.Nq, J.dv}, ws[3] = {J.B, J.Nq, J.Nk};
    if ((!out || (st = attn_attention_check_output(op, "out", out, J.dt, os)) == ATTN_OK) &&
        (!weights || (st = attn_attention_check_output(op, "weights", weights, J.dt, ws)) == ATTN_OK)) {
      J.out = out ? attn_tensor_data(out) : NULL;
      J.weights = weights ? attn_tensor_data(weights) : NULL;
      st = attn_attention_run_forward(&J, op);
    }
  }
  attn_attention_mem_free(&mem);
  return st;
}

attn_status attn_attention_scores_backward(const char *op, const attn_tensor *scores, const attn_tensor *v,
                                           const attn_attention_opts *o, const attn_tensor *weights,
                                           const attn_tensor *dout, const attn_tensor *dweights, attn_tensor *dscores,
                                           attn_tensor *dv) {
  attn_attention_job J;
  attn_attention_mem mem;
  attn_attention_ctx ctx;
  attn_status st = scores_setup(op, scores, v, o, &J, &mem, &ctx);
  if (st != ATTN_OK) goto done;
  int64_t vs[3] = {J.B, J.Nk, J.dv}, ws[3] = {J.B, J.Nq, J.Nk};
  if (dout && !v) {
    st = attn_error(ATTN_ERR_ARG, "%s: a gradient of the output needs values", op);
    goto done;
  }
  if ((st = attn_attention_attach_backward_inputs(op, &J, &mem, &ctx, weights, dout, dweights)) != ATTN_OK) goto done;
  if ((dscores && (st = attn_attention_check_output(op, "dscores", dscores, J.dt, ws)) != ATTN_OK) ||
      (dv && v && (st = attn_attention_check_output(op, "dv", dv, J.dt, vs)) != ATTN_OK))
    goto done;
  J.gs = dscores ? attn_tensor_data(dscores) : NULL;
  J.gv = dv && v ? attn_tensor_data(dv) : NULL;
  st = attn_attention_run_backward(&J, op);
done:
  attn_attention_mem_free(&mem);
  return st;
}
