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

/* mask expanded to (B, Nq, Nk) as a view in *view; checks that values are 0 or 1. */
static attn_status prepare_mask(const char *op, const attn_tensor *mask, int64_t B, int64_t Nq, int64_t Nk,
                                attn_tensor *view) {
  int64_t target[3] = {B, Nq, Nk};
  if (!attn_dtype_is_float(mask->dtype)) return attn_check_float(op, mask);
  int ok = 1; /* NumPy broadcasting: dims past the third (from the right) must be 1 */
  for (int d = 0; ok && d < mask->ndim; d++) {
    int64_t s = mask->shape[mask->ndim - 1 - d];
    ok = s == 1 || (d < 3 && s == target[2 - d]);
  }
  if (!ok)
    return attn_error(ATTN_ERR_SHAPE, "%s: mask %s does not broadcast to (B, Nq, Nk) = %s", op,
                      attn_tensor_shape_str(mask), attn_shape_str(3, target));
  *view = *mask;
  while (view->ndim > 3) attn_view_select(view, 0, 0);
  while (view->ndim < 3) attn_view_unsqueeze(view, 0);
  attn_status st = attn_view_expand(view, 3, target);
  if (st != ATTN_OK) return st;
  /* visit each stored element once (broadcast dims have stride 0) */
  int64_t n[3];
  for (int d = 0; d < 3; d++) n[d] = view->stride[d] == 0 ? (target[d] > 0 ? 1 : 0) : target[d];
  for (int64_t b = 0; b < n[0]; b++)
    for (int64_t i = 0; i < n[1]; i++)
      for (int64_t j = 0; j < n[2]; j++) {
        int64_t off = view->offset + b * view->stride[0] + i * view->stride[1] + j * view->stride[2];
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
  int64_t rows = t->shape[1], cols = t->shape[2], sr = t->stride[1], sc = t->stride[2];
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
  m->p = attn_tensor_data(t);
  m->sb = t->stride[0];
  m->sr = t->stride[1];
  m->sc = t->stride[2];
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
  if (o->valid_lens) {
    size_t n = (size_t)(J->B * J->Nq);
    mem->lens = attn_alloc((n ? n : 1) * sizeof(int64_t), &mem->lens_cap);
    if (!mem->lens) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for valid_lens (%s)", op, attn_attention_ctx_str(ctx));
    st = attn_attention_lengths(op, "valid_lens", "", o->valid_lens, J->B, J->Nq, J->Nk, 1, mem->lens);
    if (st != ATTN_OK) /* again, for the message with the shapes */
      st = attn_attention_lengths(op, "valid_lens", attn_attention_ctx_str(ctx), o->valid_lens, J->B, J->Nq, J->Nk, 1, mem->lens);
    if (st != ATTN_OK) return st;
    J->lens = mem->lens;
  }
  if (o->mask) {
    attn_tensor mv;
    st = prepare_mask(op, o->mask, J->B, J->Nq, J->Nk, &mv);
    if (st != ATTN_OK) return st;
    J->mask = (const char *)attn_tensor_data(&mv);
    J->mdt = mv.dtype;
    J->msb = mv.stride[0];
    J->msr = mv.stride[1];
    J->msc = mv.stride[2];
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
