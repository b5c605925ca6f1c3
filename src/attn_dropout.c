/* Inverted dropout with a counter-based mask (see attn_dropout.h). */
#include "attn_dropout.h"

#include <string.h>

#include "attn_parallel.h"

attn_dropout_rule attn_dropout_rule_make(double p, uint64_t seed) {
  attn_dropout_rule r = {seed, (uint64_t)1 << 53, 0.0};
  if (p < 1) {
    r.threshold = (uint64_t)(p * 9007199254740992.0); /* p * 2^53, exact for p = k / 2^53 */
    r.scale = 1.0 / (1.0 - p);
  }
  return r;
}

/* The kept value is computed for every entry and cleared by a mask from the
 * draw, not chosen by a branch: the outcome is random, so a branch was
 * mispredicted on about min(p, 1 - p) of the entries. A dropped NaN or inf
 * still gives 0. The rule is read into locals once (y may alias it). */
#define DROPOUT_LOOP(T, U)                                                                          \
  do {                                                                                              \
    const attn_dropout_rule rule = *r;                                                              \
    for (int64_t i = 0; i < n; i++) {                                                               \
      T kept = (T)(x[i] * rule.scale);                                                              \
      U bits, keep = (U)0 - (U)!attn_dropout_drops(&rule, base + (uint64_t)i);                     \
      memcpy(&bits, &kept, sizeof bits);                                                            \
      bits &= keep;                                                                                 \
      memcpy(y + i, &bits, sizeof bits);                                                            \
    }                                                                                               \
  } while (0)

void attn_dropout_f32(const attn_dropout_rule *r, const float *x, float *y, int64_t n, uint64_t base) {
  DROPOUT_LOOP(float, uint32_t);
}

void attn_dropout_f64(const attn_dropout_rule *r, const double *x, double *y, int64_t n, uint64_t base) {
  DROPOUT_LOOP(double, uint64_t);
}

typedef struct {
  attn_dropout_rule rule;
  attn_tensor *out;
} dropout_job;

static void run_chunk(void *ctx, int64_t begin, int64_t end) {
  const dropout_job *j = ctx;
  if (j->out->dtype == ATTN_F32) {
    float *y = (float *)attn_tensor_data(j->out) + begin;
    attn_dropout_f32(&j->rule, y, y, end - begin, (uint64_t)begin);
  } else {
    double *y = (double *)attn_tensor_data(j->out) + begin;
    attn_dropout_f64(&j->rule, y, y, end - begin, (uint64_t)begin);
  }
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
  /* row-major order first (nothing to do when out is x), then the mask in place */
  if ((out->storage != x->storage || out->offset != x->offset) && (st = attn_copy(out, x)) != ATTN_OK) return st;
  dropout_job j = {attn_dropout_rule_make(p, seed), out};
  attn_parallel_for(attn_tensor_numel(out), 1 << 16, run_chunk, &j);
  return ATTN_OK;
}
