/* Linear attention, forward and backward (attn_linear.h): shape checks here, the sweeps in
 * attn_linear_body.h once per element type. */
#include "attention/attn_linear.h"

#include <math.h>
#include <stdatomic.h>

#include "core/attn_alloc.h"
#include "core/attn_parallel.h"

typedef struct {
  const void *q, *k, *v, *out, *g; /* element 0 of each operand */
  int64_t qs[3], ks[3], vs[3], os[3], gs[3];
  void *out_w, *dq, *dk, *dv_out;
  int64_t Nq, Nk, d, dv;
  attn_linear_opts o;
  size_t ws_entries;
  atomic_int failed;
} lin_ctx;

#define T float
#define SUF f32
#include "attention/attn_linear_body.h"
#undef T
#undef SUF
#define T double
#define SUF f64
#include "attention/attn_linear_body.h"
#undef T
#undef SUF

static void strides(const attn_tensor *t, int64_t *s) {
  for (int i = 0; i < 3; i++) s[i] = t->stride[i];
}

static attn_status check_out(const char *op, const char *name, const attn_tensor *t, attn_dtype dt, int64_t s0,
                             int64_t s1, int64_t s2) {
  if (t->dtype != dt || t->ndim != 3 || t->shape[0] != s0 || t->shape[1] != s1 || t->shape[2] != s2 ||
      !attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be a contiguous [%lldx%lldx%lld] %s tensor", op, name,
                      attn_tensor_shape_str(t), (long long)s0, (long long)s1, (long long)s2, attn_dtype_name(dt));
  return ATTN_OK;
}

/* The operands' shapes and options; fills the sizes and element pointers of x. */
static attn_status check_inputs(const char *op, const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                const attn_linear_opts *o, lin_ctx *x) {
  attn_status st;
  if ((st = attn_check_float(op, q)) != ATTN_OK) return st;
  if (k->dtype != q->dtype || v->dtype != q->dtype)
    return attn_error(ATTN_ERR_DTYPE, "%s: queries %s (%s), keys %s (%s) and values %s (%s) must share a dtype", op,
                      attn_tensor_shape_str(q), attn_dtype_name(q->dtype), attn_tensor_shape_str(k),
                      attn_dtype_name(k->dtype), attn_tensor_shape_str(v), attn_dtype_name(v->dtype));
  if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3 || k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] ||
      k->shape[2] != q->shape[2] || v->shape[1] != k->shape[1])
    return attn_error(ATTN_ERR_SHAPE,
                      "%s: queries %s, keys %s and values %s must be (B, Nq, d), (B, Nk, d) and (B, Nk, dv)", op,
                      attn_tensor_shape_str(q), attn_tensor_shape_str(k), attn_tensor_shape_str(v));
  if (o->causal && q->shape[1] != k->shape[1])
    return attn_error(ATTN_ERR_SHAPE, "%s: causal needs as many queries as keys, got queries %s and keys %s", op,
                      attn_tensor_shape_str(q), attn_tensor_shape_str(k));
  if (!(o->eps >= 0) || !isfinite(o->eps))
    return attn_error(ATTN_ERR_ARG, "%s: eps must be finite and >= 0, got %g", op, o->eps);
  if (o->feature != ATTN_LINEAR_ELU1 && o->feature != ATTN_LINEAR_IDENTITY)
    return attn_error(ATTN_ERR_ARG, "%s: unknown feature map %d", op, o->feature);
  x->q = attn_tensor_data(q), x->k = attn_tensor_data(k), x->v = attn_tensor_data(v);
  strides(q, x->qs), strides(k, x->ks), strides(v, x->vs);
  x->Nq = q->shape[1], x->Nk = k->shape[1], x->d = q->shape[2], x->dv = v->shape[2];
  x->o = *o;
  atomic_init(&x->failed, 0);
  /* the workspace sizes below stay far from overflow for any d, dv the state can hold at all */
  if (x->d > (1 << 20) || x->dv > (1 << 20) || x->d * x->dv > ((int64_t)1 << 32))
    return attn_error(ATTN_ERR_MEMORY, "%s: a (%lld x %lld) state per item is too large (queries %s, values %s)",
                      op, (long long)x->d, (long long)x->dv, attn_tensor_shape_str(q), attn_tensor_shape_str(v));
  return ATTN_OK;
}

static attn_status finish(const char *op, lin_ctx *x) {
  if (atomic_load(&x->failed))
    return attn_error(ATTN_ERR_MEMORY, "%s: no memory for a workspace of %zu entries", op, x->ws_entries);
  return ATTN_OK;
}

attn_status attn_linear_attention_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                          const attn_linear_opts *o, attn_tensor *out) {
  const char *op = "linear_attention";
  lin_ctx x;
  attn_status st = check_inputs(op, q, k, v, o, &x);
  if (st != ATTN_OK) return st;
  int64_t B = q->shape[0];
  if ((st = check_out(op, "output", out, q->dtype, B, x.Nq, x.dv)) != ATTN_OK) return st;
  if (attn_tensor_numel(out) == 0) return ATTN_OK;
  x.out_w = attn_tensor_data(out);
  x.ws_entries = (size_t)(x.d * x.dv + 3 * x.d + x.dv);
  attn_parallel_for(B, 1, q->dtype == ATTN_F32 ? forward_task_f32 : forward_task_f64, &x);
  return finish(op, &x);
}

attn_status attn_linear_attention_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                           const attn_tensor *out, const attn_tensor *g, const attn_linear_opts *o,
                                           attn_tensor *dq, attn_tensor *dk, attn_tensor *dv) {
  const char *op = "linear_attention backward";
  lin_ctx x;
  attn_status st = check_inputs(op, q, k, v, o, &x);
  if (st != ATTN_OK) return st;
  int64_t B = q->shape[0];
  for (int i = 0; i < 2; i++) {
    const attn_tensor *t = i ? g : out;
    if (t->dtype != q->dtype || t->ndim != 3 || t->shape[0] != B || t->shape[1] != x.Nq || t->shape[2] != x.dv)
      return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be [%lldx%lldx%lld] %s for queries %s and values %s", op,
                        i ? "gradient" : "output", attn_tensor_shape_str(t), (long long)B, (long long)x.Nq,
                        (long long)x.dv, attn_dtype_name(q->dtype), attn_tensor_shape_str(q),
                        attn_tensor_shape_str(v));
  }
  if ((st = check_out(op, "dq", dq, q->dtype, B, x.Nq, x.d)) != ATTN_OK) return st;
  if ((st = check_out(op, "dk", dk, q->dtype, B, x.Nk, x.d)) != ATTN_OK) return st;
  if ((st = check_out(op, "dv", dv, q->dtype, B, x.Nk, x.dv)) != ATTN_OK) return st;
  if (B == 0) return ATTN_OK;
  x.out = attn_tensor_data(out), x.g = attn_tensor_data(g);
  strides(out, x.os), strides(g, x.gs);
  x.dq = attn_tensor_data(dq), x.dk = attn_tensor_data(dk), x.dv_out = attn_tensor_data(dv);
  x.ws_entries = (size_t)(3 * x.d * x.dv + 7 * x.d + 4 * x.dv + (o->causal ? x.Nq : 0));
  attn_parallel_for(B, 1, q->dtype == ATTN_F32 ? backward_task_f32 : backward_task_f64, &x);
  return finish(op, &x);
}
