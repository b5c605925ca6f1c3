/* Inverted dropout with a counter-based mask (see attn_dropout.h). */
#include "core/attn_dropout.h"

#include <string.h>

#include "core/attn_parallel.h"
#include "core/attn_vmath.h"

attn_dropout_rule attn_dropout_rule_make(double p, uint64_t seed) {
  attn_dropout_rule r = {seed, (uint64_t)1 << 53, 0.0};
  if (p < 1) {
    r.threshold = (uint64_t)(p * 9007199254740992.0); /* p * 2^53, exact for p = k / 2^53 */
    r.scale = 1.0 / (1.0 - p);
  }
  return r;
}

/* The loops are compiled once per instruction set (src/cpu/vmath_body.h):
 * the hash's 64-bit multiplies vectorise only with AVX-512 DQ. */
void attn_dropout_f32(const attn_dropout_rule *r, const float *x, float *y, int64_t n, uint64_t base) {
  attn_vmath_dropout_f32(r, x, y, n, base);
}

void attn_dropout_f64(const attn_dropout_rule *r, const double *x, double *y, int64_t n, uint64_t base) {
  attn_vmath_dropout_f64(r, x, y, n, base);
}

typedef struct {
  attn_dropout_rule rule;
  const void *x; /* the row-major input: x's own data, or out after a copy */
  attn_tensor *out;
} dropout_job;

static void run_chunk(void *ctx, int64_t begin, int64_t end) {
  const dropout_job *j = ctx;
  if (j->out->dtype == ATTN_F32)
    attn_dropout_f32(&j->rule, (const float *)j->x + begin, (float *)attn_tensor_data(j->out) + begin, end - begin,
                     (uint64_t)begin);
  else
    attn_dropout_f64(&j->rule, (const double *)j->x + begin, (double *)attn_tensor_data(j->out) + begin,
                     end - begin, (uint64_t)begin);
}

void attn_dropout_flat(attn_dtype dt, const void *x, void *y, int64_t n, uint64_t seed, double p) {
  attn_dropout_rule r = attn_dropout_rule_make(p, seed);
  if (dt == ATTN_F32)
    attn_dropout_f32(&r, x, y, n, 0);
  else
    attn_dropout_f64(&r, x, y, n, 0);
}

attn_status attn_dropout(const char *op, const attn_tensor *x, double p, uint64_t seed, attn_tensor *out) {
  attn_status st = attn_check_float(op, x);
  if (st != ATTN_OK) return st;
  if (!(p >= 0 && p <= 1))
    return attn_error(ATTN_ERR_ARG, "%s: p must be a probability in [0, 1], got %g", op, p);
  if (out->dtype != x->dtype || out->ndim != x->ndim ||
      memcmp(out->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim) != 0 || !attn_tensor_is_contiguous(out))
    return attn_error(ATTN_ERR_SHAPE, "%s: output %s %s must be a contiguous %s tensor of shape %s", op,
                      attn_dtype_name(out->dtype), attn_tensor_shape_str(out), attn_dtype_name(x->dtype),
                      attn_tensor_shape_str(x));
  /* one pass from a contiguous x; a strided one is put in row-major order in out first */
  const void *src = out;
  if (attn_tensor_is_contiguous(x)) {
    src = attn_tensor_data(x);
  } else if ((st = attn_copy(out, x)) != ATTN_OK) {
    return st;
  }
  dropout_job j = {attn_dropout_rule_make(p, seed), NULL, out};
  j.x = src == out ? attn_tensor_data(out) : src;
  attn_parallel_for(attn_tensor_numel(out), 1 << 16, run_chunk, &j);
  return ATTN_OK;
}
