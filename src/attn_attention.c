/* Attention kernels: the public entry points. They validate the operands,
 * masks and lengths, set up one attn_attention_job (BLAS-readable operand views,
 * per-row lengths, the expanded keep-mask, the dropout stream) and hand it to
 * the block drivers of src/attn_attention_blocks.c, whose row kernels live in
 * src/attn_attention_rows.c. */
#include "attn_attention_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attn_alloc.h"

#define BLK ATTN_SDPA_BLOCK

void attn_attention_opts_init(attn_attention_opts *o) {
  memset(o, 0, sizeof *o);
  o->window = -1;
  o->scale = NAN;
}

/* ------------------------------------------------------------ lengths, masks */

attn_status attn_attention_lengths(const char *op, const char *arg, const char *ctx, const attn_tensor *lens, int64_t B,
                                   int64_t Nq, int64_t max_len, int allow_2d, int64_t *out) {
  int one = lens->ndim == 1 && lens->shape[0] == B;
  int two = allow_2d && lens->ndim == 2 && lens->shape[0] == B && lens->shape[1] == Nq;
  if (!one && !two) {
    if (allow_2d)
      return attn_error(ATTN_ERR_SHAPE, "%s: %s has shape %s, which does not fit %s (expected [%lld] or [%lldx%lld])",
                        op, arg, attn_tensor_shape_str(lens), ctx, (long long)B, (long long)B, (long long)Nq);
    return attn_error(ATTN_ERR_SHAPE, "%s: %s has shape %s, which does not fit %s (expected [%lld])", op, arg,
                      attn_tensor_shape_str(lens), ctx, (long long)B);
  }
  int64_t rows = one ? 1 : Nq;
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < rows; i++) {
      int64_t idx[2] = {b, i}, len;
      long long pos = (long long)(b * rows + i) + 1;
      if (lens->dtype == ATTN_I64) {
        len = attn_tensor_get_i64(lens, idx);
      } else {
        double v = attn_tensor_get(lens, idx);
        if (!(v == floor(v)) || !isfinite(v))
          return attn_error(ATTN_ERR_ARG, "%s: %s holds %g at entry %lld (1-based), not an integer (%s %s, %s)", op,
                            arg, v, pos, arg, attn_tensor_shape_str(lens), ctx);
        len = v > (double)max_len ? max_len : (v < 0 ? -1 : (int64_t)v);
      }
      if (len < 0)
        return attn_error(ATTN_ERR_ARG, "%s: %s holds %g at entry %lld (1-based), a negative length (%s %s, %s)", op,
                          arg, attn_tensor_get(lens, idx), pos, arg, attn_tensor_shape_str(lens), ctx);
      if (len > max_len) len = max_len; /* longer than the keys: every key is valid (PyTorch) */
      if (one)
        for (int64_t q = 0; q < Nq; q++) out[b * Nq + q] = len;
      else
        out[b * Nq + i] = len;
    }
  return ATTN_OK;
}

/* mask expanded to (B, Nq, Nk) as a view in *view; checks that values are 0 or 1. */
static attn_status prepare_mask(const char *op, const attn_tensor *mask, int64_t B, int64_t Nq, int64_t Nk,
                                attn_tensor *view) {
  int64_t target[3] = {B, Nq, Nk};
  if (!attn_dtype_is_float(mask->dtype)) return attn_check_float(op, mask);
  int ok = mask->ndim <= 3;
  for (int d = 0; ok && d < mask->ndim; d++) {
    int64_t s = mask->shape[mask->ndim - 1 - d];
    ok = s == 1 || s == target[2 - d];
  }
  if (!ok)
    return attn_error(ATTN_ERR_SHAPE, "%s: mask %s does not broadcast to (B, Nq, Nk) = %s", op,
                      attn_tensor_shape_str(mask), attn_shape_str(3, target));
  *view = *mask;
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

static int same_shape(const attn_tensor *t, int ndim, const int64_t *shape) {
  if (t->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++)
    if (t->shape[d] != shape[d]) return 0;
  return 1;
}

/* The operand shapes error messages name, formatted on first use: most calls never fail, and
 * formatting three shapes costs as much as a book-sized kernel. */
typedef struct {
  char buf[256];
  const attn_tensor *a, *b, *c; /* queries, keys, values; or scores and values (b), c NULL */
  int scores, named_x;          /* scores form; masked_softmax names its input X as the book does */
  int done;
} call_ctx;

static const char *ctx_str(call_ctx *x) {
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

static attn_status check_input(const char *op, const char *name, const attn_tensor *t, attn_dtype dt,
                               const int64_t *shape, call_ctx *ctx) {
  if (!same_shape(t, 3, shape))
    return attn_error(ATTN_ERR_SHAPE, "%s: %s has shape %s, expected %s (%s)", op, name, attn_tensor_shape_str(t),
                      attn_shape_str(3, shape), ctx_str(ctx));
  if (t->dtype != dt)
    return attn_error(ATTN_ERR_DTYPE, "%s: %s %s is %s, expected %s like the other operands", op, name,
                      attn_tensor_shape_str(t), attn_dtype_name(t->dtype), attn_dtype_name(dt));
  return ATTN_OK;
}

static attn_status check_output(const char *op, const char *name, const attn_tensor *t, attn_dtype dt,
                                const int64_t *shape) {
  if (!same_shape(t, 3, shape) || t->dtype != dt || !attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s %s must be a contiguous %s tensor of shape %s", op, name,
                      attn_tensor_shape_str(t), attn_dtype_name(dt), attn_shape_str(3, shape));
  return ATTN_OK;
}

/* Temporaries of one call, released by job_free. */
typedef struct {
  attn_tensor tmp[16];
  int ntmp;
  int64_t *lens;
  size_t lens_cap;
} job_mem;

static void job_free(job_mem *m) {
  for (int i = 0; i < m->ntmp; i++) attn_tensor_free(&m->tmp[i]);
  if (m->lens) attn_free(m->lens, m->lens_cap);
  memset(m, 0, sizeof *m);
}

static attn_status prepare(attn_attention_job *J, job_mem *mem, const char *op, call_ctx *ctx,
                           const attn_attention_opts *o) {
  attn_status st;
  if (J->B > INT_MAX || J->Nq > INT_MAX || J->Nk > INT_MAX || J->d > INT_MAX || J->dv > INT_MAX)
    return attn_error(ATTN_ERR_SHAPE, "%s: sizes exceed BLAS's 32-bit range (%s)", op, ctx_str(ctx));
  J->ops = J->dt == ATTN_F32 ? &attn_attention_ops_f32 : &attn_attention_ops_f64;
  J->es = attn_dtype_size(J->dt);
  J->nblk = (J->Nq + BLK - 1) / BLK;
  J->causal = o->causal != 0;
  J->window = o->window;
  if (J->window > J->Nq + J->Nk) J->window = J->Nq + J->Nk;
  if (!(o->dropout >= 0 && o->dropout <= 1))
    return attn_error(ATTN_ERR_ARG, "%s: dropout probability %g is outside [0, 1]", op, o->dropout);
  if (o->scale == o->scale && !isfinite(o->scale))
    return attn_error(ATTN_ERR_ARG, "%s: scale %g is not finite", op, o->scale);
  J->dropout = o->dropout > 0;
  if (J->dropout) {
    J->drop.seed = o->seed;
    J->drop.threshold = o->dropout >= 1 ? ((uint64_t)1 << 53) : (uint64_t)(o->dropout * 9007199254740992.0);
    J->drop.factor = o->dropout >= 1 ? 0.0 : 1.0 / (1.0 - o->dropout);
  }
  if (o->valid_lens) {
    size_t n = (size_t)(J->B * J->Nq);
    mem->lens = attn_alloc((n ? n : 1) * sizeof(int64_t), &mem->lens_cap);
    if (!mem->lens) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for valid_lens (%s)", op, ctx_str(ctx));
    st = attn_attention_lengths(op, "valid_lens", "", o->valid_lens, J->B, J->Nq, J->Nk, 1, mem->lens);
    if (st != ATTN_OK) /* again, for the message with the shapes */
      st = attn_attention_lengths(op, "valid_lens", ctx_str(ctx), o->valid_lens, J->B, J->Nq, J->Nk, 1, mem->lens);
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

static attn_status operand(job_mem *mem, const attn_tensor *t, int blas, attn_attention_mat *m) {
  return mat3_prepare(t, blas, &mem->tmp[mem->ntmp++], m);
}

/* ------------------------------------------------------------ flash path */

/* 1 when every element of the 3-D float32 tensor t is finite (exponent bits not all ones; an
 * integer test, so the loop vectorises). */
static int all_finite_f32(const attn_tensor *t) {
  const float *p = attn_tensor_data(t);
  const int64_t n = t->shape[2], sc = t->stride[2];
  uint32_t bad = 0;
  for (int64_t b = 0; b < t->shape[0]; b++)
    for (int64_t r = 0; r < t->shape[1]; r++) {
      const float *x = p + b * t->stride[0] + r * t->stride[1];
      if (sc == 1)
        for (int64_t c = 0; c < n; c++) {
          uint32_t u;
          memcpy(&u, &x[c], 4);
          bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
      else
        for (int64_t c = 0; c < n; c++) {
          uint32_t u;
          memcpy(&u, &x[c * sc], 4);
          bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
      if (bad) return 0;
    }
  return 1;
}

/* Non-finite operands keep the reference path's guarantee that a NaN or inf in a removed entry
 * cannot reach the result; float64 always takes the reference path. */
static int flash_applies(const attn_attention_job *J, const attn_attention_opts *o, const attn_tensor *q,
                         const attn_tensor *k, const attn_tensor *v) {
  return attn_sdpa_flash_size(J->Nq, J->Nk, o->kernel) && J->dt == ATTN_F32 && J->d > 0 && J->dv > 0 &&
         J->B > 0 && J->Nq > 0 && J->Nk > 0 && all_finite_f32(q) && all_finite_f32(k) && all_finite_f32(v);
}

/* t as a float32 operand with unit column stride (a contiguous copy when it has none). */
static attn_status flash_operand(job_mem *mem, const attn_tensor *t, attn_flash_mat *m) {
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
                               job_mem *mem, const char *op, const attn_tensor *q, const attn_tensor *k,
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
                              const attn_attention_opts *o, attn_attention_job *J, job_mem *mem, call_ctx *ctx) {
  memset(J, 0, sizeof *J);
  memset(mem, 0, sizeof *mem);
  if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3)
    return attn_error(ATTN_ERR_SHAPE, "%s: queries, keys and values must be 3-D (B, N, d), got %s, %s and %s", op,
                      attn_tensor_shape_str(q), attn_tensor_shape_str(k), attn_tensor_shape_str(v));
  memset(ctx, 0, sizeof *ctx);
  ctx->a = q;
  ctx->b = k;
  ctx->c = v;
  if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0])
    return attn_error(ATTN_ERR_SHAPE, "%s: batch sizes differ (%s)", op, ctx_str(ctx));
  if (k->shape[2] != q->shape[2])
    return attn_error(ATTN_ERR_SHAPE, "%s: keys must have the queries' width %lld (%s)", op, (long long)q->shape[2],
                      ctx_str(ctx));
  if (v->shape[1] != k->shape[1])
    return attn_error(ATTN_ERR_SHAPE, "%s: values must have one row per key, %lld (%s)", op, (long long)k->shape[1],
                      ctx_str(ctx));
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
  attn_status st = prepare(J, mem, op, ctx, o);
  if (st != ATTN_OK) return st;
  J->scale = o->scale == o->scale ? o->scale : (J->d > 0 ? 1.0 / sqrt((double)J->d) : 1.0);
  if ((st = operand(mem, q, 1, &J->q)) != ATTN_OK || (st = operand(mem, k, 1, &J->k)) != ATTN_OK ||
      (st = operand(mem, v, 1, &J->v)) != ATTN_OK)
    return st;
  return ATTN_OK;
}

static attn_status check_lse(const char *op, const attn_tensor *lse, int64_t B, int64_t Nq) {
  int64_t shape[2] = {B, Nq};
  if (!same_shape(lse, 2, shape) || lse->dtype != ATTN_F64 || !attn_tensor_is_contiguous(lse))
    return attn_error(ATTN_ERR_SHAPE, "%s: lse %s must be a contiguous float64 tensor of shape %s", op,
                      attn_tensor_shape_str(lse), attn_shape_str(2, shape));
  return ATTN_OK;
}

attn_status attn_sdpa_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_attention_opts *o, attn_tensor *out, attn_tensor *weights,
                              attn_tensor *lse) {
  const char *op = "dot_product_attention";
  attn_attention_job J;
  job_mem mem;
  call_ctx ctx;
  attn_status st = sdpa_setup(op, q, k, v, o, &J, &mem, &ctx);
  if (st == ATTN_OK) {
    int64_t os[3] = {J.B, J.Nq, J.dv}, ws[3] = {J.B, J.Nq, J.Nk};
    if ((st = check_output(op, "out", out, J.dt, os)) == ATTN_OK &&
        (!weights || (st = check_output(op, "weights", weights, J.dt, ws)) == ATTN_OK) &&
        (!lse || (st = check_lse(op, lse, J.B, J.Nq)) == ATTN_OK)) {
      J.out = attn_tensor_data(out);
      J.weights = weights ? attn_tensor_data(weights) : NULL;
      if (flash_applies(&J, o, q, k, v)) {
        attn_flash_job F;
        const attn_flash_kernels *ks;
        if ((st = flash_setup(&F, &ks, &J, &mem, op, q, k, v, o)) == ATTN_OK) {
          F.out = (float *)J.out;
          F.weights = (float *)J.weights;
          F.lse = lse ? attn_tensor_data(lse) : NULL;
          st = attn_attention_run_flash_forward(&F, ks, op);
        }
      } else {
        st = attn_attention_run_forward(&J, op);
        double *l = lse ? attn_tensor_data(lse) : NULL;
        for (int64_t i = 0; l && i < J.B * J.Nq; i++) l[i] = NAN;
      }
    }
  }
  job_free(&mem);
  return st;
}

/* Backward's optional inputs: stored weights (B, Nq, Nk), the gradient of the
 * output (B, Nq, dv) and of the weights (B, Nq, Nk), checked and attached to J. */
static attn_status attach_backward_inputs(const char *op, attn_attention_job *J, job_mem *mem, call_ctx *ctx,
                                          const attn_tensor *weights, const attn_tensor *dout,
                                          const attn_tensor *dweights) {
  int64_t os[3] = {J->B, J->Nq, J->dv}, ws[3] = {J->B, J->Nq, J->Nk};
  attn_status st;
  if (weights) {
    if ((st = check_input(op, "weights", weights, J->dt, ws, ctx)) != ATTN_OK) return st;
    if ((st = operand(mem, weights, 0, &J->wst)) != ATTN_OK) return st;
    J->has_wst = 1;
  }
  if (dout) {
    if ((st = check_input(op, "grad of out", dout, J->dt, os, ctx)) != ATTN_OK) return st;
    if ((st = operand(mem, dout, 1, &J->dout)) != ATTN_OK) return st;
    J->has_dout = 1;
  }
  if (dweights) {
    if ((st = check_input(op, "grad of weights", dweights, J->dt, ws, ctx)) != ATTN_OK) return st;
    if ((st = operand(mem, dweights, 0, &J->dw)) != ATTN_OK) return st;
    J->has_dw = 1;
  }
  return ATTN_OK;
}

attn_status attn_sdpa_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_attention_opts *o, const attn_tensor *weights, const attn_tensor *out,
                               const attn_tensor *lse, const attn_tensor *dout, const attn_tensor *dweights,
                               attn_tensor *dq, attn_tensor *dk, attn_tensor *dv) {
  const char *op = "dot_product_attention backward";
  attn_attention_job J;
  job_mem mem;
  call_ctx ctx;
  attn_status st = sdpa_setup(op, q, k, v, o, &J, &mem, &ctx);
  if (st != ATTN_OK) goto done;
  int64_t qs[3] = {J.B, J.Nq, J.d}, ks[3] = {J.B, J.Nk, J.d}, vs[3] = {J.B, J.Nk, J.dv}, os[3] = {J.B, J.Nq, J.dv};
  if ((st = attach_backward_inputs(op, &J, &mem, &ctx, weights, dout, dweights)) != ATTN_OK) goto done;
  if ((dq && (st = check_output(op, "dq", dq, J.dt, qs)) != ATTN_OK) ||
      (dk && (st = check_output(op, "dk", dk, J.dt, ks)) != ATTN_OK) ||
      (dv && (st = check_output(op, "dv", dv, J.dt, vs)) != ATTN_OK))
    goto done;
  J.gq = dq ? attn_tensor_data(dq) : NULL;
  J.gk = dk ? attn_tensor_data(dk) : NULL;
  J.gv = dv ? attn_tensor_data(dv) : NULL;
  if (out && lse && dout && !dweights) {
    if ((st = check_input(op, "out", out, J.dt, os, &ctx)) != ATTN_OK || (st = check_lse(op, lse, J.B, J.Nq)) != ATTN_OK)
      goto done;
    const double *l = attn_tensor_data(lse);
    int lse_set = 1; /* NaN: the reference path ran, or a row had no finite softmax (its gradient is NaN) */
    for (int64_t i = 0; i < J.B * J.Nq && lse_set; i++) lse_set = !isnan(l[i]);
    if (flash_applies(&J, o, q, k, v) && lse_set && all_finite_f32(dout) && all_finite_f32(out)) {
      attn_flash_job F;
      attn_flash_mat om;
      const attn_flash_kernels *ks;
      if ((st = flash_setup(&F, &ks, &J, &mem, op, q, k, v, o)) != ATTN_OK ||
          (st = flash_operand(&mem, dout, &F.dout)) != ATTN_OK || (st = flash_operand(&mem, out, &om)) != ATTN_OK)
        goto done;
      F.dq = (float *)J.gq;
      F.dk = (float *)J.gk;
      F.dv = (float *)J.gv;
      st = attn_attention_run_flash_backward(&F, ks, om, l, J.Nq, op);
      goto done;
    }
  }
  st = attn_attention_run_backward(&J, op);
done:
  job_free(&mem);
  return st;
}

static attn_status scores_setup(const char *op, const attn_tensor *s, const attn_tensor *v,
                                const attn_attention_opts *o, attn_attention_job *J, job_mem *mem, call_ctx *ctx) {
  memset(J, 0, sizeof *J);
  memset(mem, 0, sizeof *mem);
  if (s->ndim != 3)
    return attn_error(ATTN_ERR_SHAPE, "%s: scores must be 3-D (B, Nq, Nk), got %s", op, attn_tensor_shape_str(s));
  memset(ctx, 0, sizeof *ctx);
  ctx->scores = 1;
  ctx->a = s;
  ctx->b = v;
  ctx->named_x = strncmp(op, "masked_softmax", 14) == 0;
  if (v && (v->ndim != 3 || v->shape[0] != s->shape[0] || v->shape[1] != s->shape[2]))
    return attn_error(ATTN_ERR_SHAPE, "%s: values must be (B, Nk, dv) = [%lldx%lldxdv] (%s)", op,
                      (long long)s->shape[0], (long long)s->shape[2], ctx_str(ctx));
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
  attn_status st = prepare(J, mem, op, ctx, o);
  if (st != ATTN_OK) return st;
  J->scale = o->scale == o->scale ? o->scale : 1.0;
  if ((st = operand(mem, s, 0, &J->sc)) != ATTN_OK) return st;
  if (v) {
    if ((st = operand(mem, v, 1, &J->v)) != ATTN_OK) return st;
    J->has_v = 1;
  }
  return ATTN_OK;
}

attn_status attn_attention_scores_forward(const char *op, const attn_tensor *scores, const attn_tensor *v,
                                          const attn_attention_opts *o, attn_tensor *out, attn_tensor *weights) {
  attn_attention_job J;
  job_mem mem;
  call_ctx ctx;
  attn_status st = scores_setup(op, scores, v, o, &J, &mem, &ctx);
  if (st == ATTN_OK && out && !v) st = attn_error(ATTN_ERR_ARG, "%s: an output needs values", op);
  if (st == ATTN_OK) {
    int64_t os[3] = {J.B, J.Nq, J.dv}, ws[3] = {J.B, J.Nq, J.Nk};
    if ((!out || (st = check_output(op, "out", out, J.dt, os)) == ATTN_OK) &&
        (!weights || (st = check_output(op, "weights", weights, J.dt, ws)) == ATTN_OK)) {
      J.out = out ? attn_tensor_data(out) : NULL;
      J.weights = weights ? attn_tensor_data(weights) : NULL;
      st = attn_attention_run_forward(&J, op);
    }
  }
  job_free(&mem);
  return st;
}

attn_status attn_attention_scores_backward(const char *op, const attn_tensor *scores, const attn_tensor *v,
                                           const attn_attention_opts *o, const attn_tensor *weights,
                                           const attn_tensor *dout, const attn_tensor *dweights, attn_tensor *dscores,
                                           attn_tensor *dv) {
  attn_attention_job J;
  job_mem mem;
  call_ctx ctx;
  attn_status st = scores_setup(op, scores, v, o, &J, &mem, &ctx);
  if (st != ATTN_OK) goto done;
  int64_t vs[3] = {J.B, J.Nk, J.dv}, ws[3] = {J.B, J.Nq, J.Nk};
  if (dout && !v) {
    st = attn_error(ATTN_ERR_ARG, "%s: a gradient of the output needs values", op);
    goto done;
  }
  if ((st = attach_backward_inputs(op, &J, &mem, &ctx, weights, dout, dweights)) != ATTN_OK) goto done;
  if ((dscores && (st = check_output(op, "dscores", dscores, J.dt, ws)) != ATTN_OK) ||
      (dv && v && (st = check_output(op, "dv", dv, J.dt, vs)) != ATTN_OK))
    goto done;
  J.gs = dscores ? attn_tensor_data(dscores) : NULL;
  J.gv = dv && v ? attn_tensor_data(dv) : NULL;
  st = attn_attention_run_backward(&J, op);
done:
  job_free(&mem);
  return st;
}

attn_status attn_attention_masked_softmax_forward(const attn_tensor *x, const attn_tensor *valid_lens,
                                                  attn_tensor *out) {
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.valid_lens = valid_lens;
  return attn_attention_scores_forward("masked_softmax", x, NULL, &o, NULL, out);
}

attn_status attn_attention_masked_softmax_backward(const attn_tensor *y, const attn_tensor *dy,
                                                   const attn_tensor *valid_lens, attn_tensor *dx) {
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.valid_lens = valid_lens;
  /* the stored output stands in for the scores: it is only read as weights */
  return attn_attention_scores_backward("masked_softmax backward", y, NULL, &o, y, NULL, dy, dx, NULL);
}
