#include "core/attn_rng.h"

#include <float.h>

#include <math.h>
#include <stdint.h>

#include "core/attn_alloc.h"

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void attn_rng_seed(attn_rng *rng, uint64_t seed) {
  for (int i = 0; i < 4; i++) { /* splitmix64 */
    seed += 0x9e3779b97f4a7c15ULL;
    uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    rng->s[i] = z ^ (z >> 31);
  }
}

/* Inline copies of next and uniform01 for the fill loops: the exported
 * functions are called through the PLT from inside the library, which cost
 * more than the generator itself. */
static inline uint64_t next(attn_rng *rng) {
  uint64_t *s = rng->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

static inline double uniform01(attn_rng *rng) { return (double)(next(rng) >> 11) * 0x1.0p-53; }

uint64_t attn_rng_next(attn_rng *rng) { return next(rng); }

double attn_rng_uniform01(attn_rng *rng) { return uniform01(rng); }

/* Visits every element of t in row-major order. */
typedef double (*draw_fn)(attn_rng *rng, double a, double b, int *spare_valid, double *spare);

static void fill_strided(attn_rng *rng, attn_tensor *t, draw_fn draw, double a, double b) {
  int64_t index[ATTN_MAX_DIMS] = {0};
  int64_t n = attn_tensor_numel(t);
  int spare_valid = 0;
  double spare = 0;
  for (int64_t i = 0; i < n; i++) {
    attn_tensor_set(t, index, draw(rng, a, b, &spare_valid, &spare));
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (++index[d] < t->shape[d]) break;
      index[d] = 0;
    }
  }
}

/* The draw of each kind, inlined into the contiguous loops below. */
enum draw_kind { DRAW_UNIFORM, DRAW_NORMAL, DRAW_BERNOULLI };

static inline double draw_uniform(attn_rng *rng, double low, double high, int *sv, double *sp);
static inline double draw_normal(attn_rng *rng, double mean, double std, int *spare_valid, double *spare);
static inline double draw_bernoulli(attn_rng *rng, double p, double unused, int *sv, double *sp);

#define FILL_LOOP(T, CONVERT, DRAW)                                                                                \
  do {                                                                                                             \
    T *o = data;                                                                                                   \
    for (int64_t i = 0; i < n; i++) o[i] = CONVERT(DRAW(rng, a, b, &spare_valid, &spare));                        \
  } while (0)
#define AS_F32(v) ((float)(v))
#define AS_F64(v) (v)
#define FILL_DTYPES(DRAW)                                                                                          \
  do {                                                                                                             \
    if (t->dtype == ATTN_F32)                                                                                      \
      FILL_LOOP(float, AS_F32, DRAW);                                                                              \
    else if (t->dtype == ATTN_F64)                                                                                 \
      FILL_LOOP(double, AS_F64, DRAW);                                                                             \
    else                                                                                                           \
      FILL_LOOP(int64_t, attn_double_to_i64, DRAW);                                                                \
  } while (0)

/* Visits every element of t in row-major order. A contiguous t gets the same
 * draws in the same order and the same conversions as attn_tensor_set, in
 * loops with the draw inlined: the per-element index walk and the indirect
 * call cost several times the draw itself. */
static void fill_each(attn_rng *rng_out, attn_tensor *t, enum draw_kind kind, double a, double b) {
  attn_rng *rng = rng_out;
  static const draw_fn draws[] = {draw_uniform, draw_normal, draw_bernoulli};
  if (!attn_tensor_is_contiguous(t)) {
    fill_strided(rng, t, draws[kind], a, b);
    return;
  }
  void *data = attn_tensor_data(t);
  int64_t n = attn_tensor_numel(t);
  int spare_valid = 0;
  double spare = 0;
  attn_rng local = *rng; /* in registers for the loop, not behind a pointer the stores may alias */
  rng = &local;
  if (kind == DRAW_UNIFORM)
    FILL_DTYPES(draw_uniform);
  else if (kind == DRAW_NORMAL)
    FILL_DTYPES(draw_normal);
  else
    FILL_DTYPES(draw_bernoulli);
  *rng_out = local;
}

static inline double draw_uniform(attn_rng *rng, double low, double high, int *sv, double *sp) {
  (void)sv;
  (void)sp;
  double u = uniform01(rng);
  return low * (1.0 - u) + high * u; /* a convex combination: finite for any finite bounds (high - low may not be) */
}

/* Box-Muller, using both values of each pair. */
static inline double draw_normal(attn_rng *rng, double mean, double std, int *spare_valid, double *spare) {
  if (*spare_valid) {
    *spare_valid = 0;
    return mean + std * *spare;
  }
  double u1 = 1.0 - uniform01(rng); /* (0, 1]: log stays finite */
  double u2 = uniform01(rng);
  double r = sqrt(-2.0 * log(u1)), theta = 6.283185307179586476925 * u2;
  *spare = r * sin(theta);
  *spare_valid = 1;
  return mean + std * r * cos(theta);
}

/* 1 when the uniform draw u = k 2^-53 is below p, computed as k < threshold
 * = ceil(p 2^53) (the same outcome for every integer k) without a branch: the
 * outcome is random, so a branch would be mispredicted half the time. */
static inline double draw_bernoulli(attn_rng *rng, double p, double threshold, int *sv, double *sp) {
  (void)p;
  (void)sv;
  (void)sp;
  uint64_t k = next(rng) >> 11;
  return (double)((k - (uint64_t)threshold) >> 63);
}

/* Every fill writes each element once, so a target whose indices share
 * elements (an expanded view) is refused, as for every write. */
static attn_status check_target(const char *op, const attn_tensor *t) {
  if (attn_tensor_overlaps_itself(t))
    return attn_error(ATTN_ERR_ARG, "%s: %s is an expanded view (several indices share one element); "
                      "write to a contiguous copy", op, attn_tensor_shape_str(t));
  return ATTN_OK;
}

attn_status attn_rng_uniform(attn_rng *rng, attn_tensor *t, double low, double high) {
  attn_status st = check_target("rand", t);
  if (st == ATTN_OK) st = attn_check_float("rand", t);
  if (st != ATTN_OK) return st;
  if (!(low <= high) || !isfinite(low) || !isfinite(high))
    return attn_error(ATTN_ERR_ARG, "rand: bounds [%g, %g) are not an interval", low, high);
  if (t->dtype == ATTN_F32 && (fabs(low) > FLT_MAX || fabs(high) > FLT_MAX))
    return attn_error(ATTN_ERR_ARG, "rand: bounds [%g, %g) exceed the float32 range", low, high);
  fill_each(rng, t, DRAW_UNIFORM, low, high);
  return ATTN_OK;
}

attn_status attn_rng_normal(attn_rng *rng, attn_tensor *t, double mean, double std) {
  attn_status st = check_target("randn", t);
  if (st == ATTN_OK) st = attn_check_float("randn", t);
  if (st != ATTN_OK) return st;
  if (!(std >= 0) || !isfinite(mean) || !isfinite(std))
    return attn_error(ATTN_ERR_ARG, "randn: need finite mean and std >= 0, got %g and %g", mean, std);
  fill_each(rng, t, DRAW_NORMAL, mean, std);
  return ATTN_OK;
}

attn_status attn_rng_bernoulli(attn_rng *rng, attn_tensor *t, double p) {
  if (check_target("bernoulli", t) != ATTN_OK) return ATTN_ERR_ARG;
  if (!(p >= 0 && p <= 1)) return attn_error(ATTN_ERR_ARG, "bernoulli: p = %g is not in [0, 1]", p);
  fill_each(rng, t, DRAW_BERNOULLI, p, ceil(p * 0x1.0p53));
  return ATTN_OK;
}

uint64_t attn_rng_below(attn_rng *rng, uint64_t n) {
  if (n == 0) return attn_rng_next(rng); /* the full 2^64 range */
  /* Reject the top partial block of 2^64 so every value is equally likely. */
  uint64_t limit = UINT64_MAX - UINT64_MAX % n, r;
  do r = attn_rng_next(rng);
  while (r >= limit);
  return r % n;
}

attn_status attn_rng_randint(attn_rng *rng, attn_tensor *t, int64_t low, int64_t high) {
  if (check_target("randint", t) != ATTN_OK) return ATTN_ERR_ARG;
  if (low >= high)
    return attn_error(ATTN_ERR_ARG, "randint: empty range: low %lld must be below high %lld", (long long)low,
                      (long long)high);
  uint64_t span = (uint64_t)high - (uint64_t)low; /* fits: high - low < 2^64 */
  int64_t index[ATTN_MAX_DIMS] = {0};
  int64_t n = attn_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) {
    attn_tensor_set_i64(t, index, (int64_t)((uint64_t)low + attn_rng_below(rng, span)));
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (++index[d] < t->shape[d]) break;
      index[d] = 0;
    }
  }
  return ATTN_OK;
}

attn_status attn_rng_multinomial(attn_rng *rng, const attn_tensor *probs, int64_t n, int replacement,
                                 attn_tensor *out) {
  const char *op = "multinomial";
  attn_status st = attn_check_float(op, probs);
  if (st != ATTN_OK) return st;
  if (probs->ndim != 2 || out->ndim != 2 || out->dtype != ATTN_I64 || out->shape[0] != probs->shape[0] ||
      out->shape[1] != n || !attn_tensor_is_contiguous(out))
    return attn_error(ATTN_ERR_SHAPE, "%s: probabilities %s must be (rows, categories) and the output %s a "
                      "contiguous int64 (rows, %lld)", op, attn_tensor_shape_str(probs), attn_tensor_shape_str(out),
                      (long long)n);
  int64_t R = probs->shape[0], C = probs->shape[1];
  if (n < 0 || (n > 0 && C == 0))
    return attn_error(ATTN_ERR_ARG, "%s: cannot draw %lld samples from %lld categories", op, (long long)n,
                      (long long)C);
  if ((uint64_t)C > SIZE_MAX / sizeof(double))
    return attn_error(ATTN_ERR_MEMORY, "%s: %lld categories are more than can be held", op, (long long)C);
  size_t cap;
  double *w = attn_alloc(sizeof(double) * (size_t)(C > 0 ? C : 1), &cap);
  if (!w) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for %lld categories", op, (long long)C);
  int64_t *o = attn_tensor_data(out);
  /* validate every row before drawing anything, so a failure consumes no randomness */
  for (int pass = 0; pass < 2 && st == ATTN_OK; pass++)
    for (int64_t r = 0; r < R && st == ATTN_OK; r++) {
      int64_t nonzero = 0;
      double total = 0;
      for (int64_t c = 0; c < C; c++) {
        int64_t pos[2] = {r, c};
        w[c] = attn_tensor_get(probs, pos);
        if (!(w[c] >= 0) || !isfinite(w[c])) {
          st = attn_error(ATTN_ERR_ARG, "%s: probability %g at row %lld, category %lld is not a finite number >= 0",
                          op, w[c], (long long)r + 1, (long long)c + 1);
          break;
        }
        nonzero += w[c] > 0;
        total += w[c];
      }
      if (st != ATTN_OK) break;
      if (n > 0 && (total <= 0 || (!replacement && n > nonzero))) {
        st = attn_error(ATTN_ERR_ARG, "%s: row %lld has %lld categories with nonzero probability; cannot draw "
                        "%lld samples%s", op, (long long)r + 1, (long long)nonzero, (long long)n,
                        replacement ? "" : " without replacement");
        break;
      }
      for (int64_t s = 0; pass == 1 && s < n; s++) {
        /* the first category whose running sum passes u (skipping zeros, so a
         * zero-probability category is never drawn) */
        double u = attn_rng_uniform01(rng) * total, run = 0;
        int64_t pick = -1;
        for (int64_t c = 0; c < C; c++) {
          if (w[c] <= 0) continue;
          pick = c;
          run += w[c];
          if (u < run) break;
        }
        o[r * n + s] = pick;
        if (!replacement) {
          total -= w[pick];
          w[pick] = 0;
          if (total <= 0) /* rounding: recompute from the weights left */
            for (int64_t c = 0; c < C; c++) total += w[c];
        }
      }
    }
  attn_free(w, cap);
  return st;
}
