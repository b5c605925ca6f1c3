/* Row kernels of the attention softmax (float and double): masking by
 * selection, the d2l fill, dropout, the softmax
 * backward and the NaN-safe fallbacks of the weighted sums. */
#include <math.h>
#include <string.h>

#include "attn_attention_internal.h"
#include "attn_vmath.h"

#define FILL ATTN_MASKED_SOFTMAX_FILL

/* The exp-and-sum of a row comes from attn_vmath (shared with the generic softmax). */
static double exp_row_f(float *x, int64_t n, float m) { return attn_vmath_exp_row_f32(x, n, m); }
static double exp_row_d(double *x, int64_t n, double m) { return attn_vmath_exp_row_f64(x, n, m); }

/* ------------------------------------------------------------ row kernels */

/* Row kernels for one dtype T (suffix S). All rows hold Nk entries. Hot loops run in chunks of 8
 * with a fixed inner trip count, which GCC vectorises at -O2. */
#define DEFINE_ROW_OPS(T, S, UT)                                                                                    \
  /* Largest entry of x[0:n] (NaN entries are skipped); -inf for n = 0. */                                          \
  static T row_max_##S(const T *x, int64_t n) {                                                                     \
    T m8[8];                                                                                                        \
    for (int k = 0; k < 8; k++) m8[k] = -(T)INFINITY;                                                               \
    int64_t j = 0;                                                                                                  \
    for (; j + 8 <= n; j += 8)                                                                                      \
      for (int k = 0; k < 8; k++) m8[k] = x[j + k] > m8[k] ? x[j + k] : m8[k];                                      \
    T m = -(T)INFINITY;                                                                                             \
    for (int k = 0; k < 8; k++) m = m8[k] > m ? m8[k] : m;                                                          \
    for (; j < n; j++) m = x[j] > m ? x[j] : m;                                                                     \
    return m;                                                                                                       \
  }                                                                                                                 \
                                                                                                                    \
  static void row_scale_##S(T *x, int64_t n, T s) {                                                                 \
    int64_t j = 0;                                                                                                  \
    for (; j + 8 <= n; j += 8)                                                                                      \
      for (int k = 0; k < 8; k++) x[j + k] *= s;                                                                    \
    for (; j < n; j++) x[j] *= s;                                                                                   \
  }                                                                                                                 \
                                                                                                                    \
  /* Softmax of row x in place (scores already scaled, valid on [a, e)): [e, b) get the d2l fill, removed keys      \
   * weight 0; a row with no finite softmax goes to attn_attention_bad_row. */                                      \
  static void softmax_row_##S(const attn_attention_job *J, void *xv, const attn_attention_rowmask *m) {             \
    T *x = xv;                                                                                                      \
    const int64_t nk = J->Nk, a = m->a, b = m->b;                                                                   \
    if (a > 0) memset(x, 0, sizeof(T) * (size_t)a);                                                                 \
    if (b < nk) memset(x + b, 0, sizeof(T) * (size_t)(nk - b));                                                     \
    if (a >= b) return;                                                                                             \
    for (int64_t j = m->e; j < b; j++) x[j] = (T)FILL;                                                              \
    if (m->mrow)                                                                                                    \
      for (int64_t j = a; j < b; j++)                                                                               \
        if (!attn_attention_kept(J, m->mrow, j)) x[j] = -(T)INFINITY;                                               \
    T mx = row_max_##S(x + a, b - a); /* ignores NaN; a NaN entry makes the sum NaN below */                        \
    double sum = mx == -(T)INFINITY ? 0 : exp_row_##S(x + a, b - a, mx);                                            \
    if (!(sum > 0)) { /* all -inf (or no key), or NaN: no finite answer */                                          \
      attn_attention_bad_row(J, x, m);                                                                              \
      return;                                                                                                       \
    }                                                                                                               \
    row_scale_##S(x + a, b - a, (T)(1.0 / sum));                                                                    \
  }                                                                                                                 \
                                                                                                                    \
  /* dst[j] = scale * src[j * stride], j < n. */                                                                    \
  static void load_row_##S(void *dv_, const void *src, int64_t stride, int64_t n, double scale) {                   \
    T *dst = dv_;                                                                                                   \
    const T *s = (const T *)src;                                                                                    \
    if (scale == 1) {                                                                                               \
      if (stride == 1)                                                                                              \
        memcpy(dst, s, sizeof(T) * (size_t)n);                                                                      \
      else                                                                                                          \
        for (int64_t j = 0; j < n; j++) dst[j] = s[j * stride];                                                     \
    } else {                                                                                                        \
      T sc = (T)scale;                                                                                              \
      for (int64_t j = 0; j < n; j++) dst[j] = sc * s[j * stride];                                                  \
    }                                                                                                               \
  }                                                                                                                 \
                                                                                                                    \
  /* x[j] += src[j * stride], j < n. */                                                                             \
  static void add_row_##S(void *xv, const void *src, int64_t stride, int64_t n) {                                   \
    T *x = xv;                                                                                                      \
    const T *s = (const T *)src;                                                                                    \
    for (int64_t j = 0; j < n; j++) x[j] += s[j * stride];                                                          \
  }                                                                                                                 \
                                                                                                                    \
  /* Dropout on x[n0:n1] (entry j has stream index base + j): kept entries scaled, dropped ones 0. */               \
  static void dropout_row_##S(void *xv, int64_t n0, int64_t n1, uint64_t base, const attn_attention_dropout *ds) {  \
    T *x = xv;                                                                                                      \
    T f = (T)ds->factor;                                                                                            \
    for (int64_t j = n0; j < n1; j++) {                                                                             \
      uint64_t u = attn_attention_mix64(ds->seed + (base + (uint64_t)j + 1) * 0x9E3779B97F4A7C15ULL) >> 11;         \
      x[j] = u < ds->threshold ? (T)0 : x[j] * f;                                                                   \
    }                                                                                                               \
  }                                                                                                                 \
                                                                                                                    \
  /* v where p != 0, else 0, by bit masking (p >= 0 or NaN), so the chunked loops below vectorise. */               \
  static inline T select_nonzero_##S(T p, T v) {                                                                    \
    UT pb, vb;                                                                                                      \
    memcpy(&pb, &p, sizeof pb);                                                                                     \
    memcpy(&vb, &v, sizeof vb);                                                                                     \
    vb &= (UT)0 - (UT)(pb != 0);                                                                                    \
    memcpy(&v, &vb, sizeof v);                                                                                      \
    return v;                                                                                                       \
  }                                                                                                                 \
                                                                                                                    \
  /* sum of p[j] * dp[j] over [j0, j1), in chunks of 8 (double across chunks). */                                  \
  static double dot_row_##S(const T *p, const T *dp, int64_t j0, int64_t j1) {                                      \
    double dot = 0;                                                                                                 \
    int64_t j = j0;                                                                                                 \
    while (j + 8 <= j1) {                                                                                           \
      T s8[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                                           \
      int64_t stop = j + 256 < j1 ? j + 256 : j1;                                                                   \
      for (; j + 8 <= stop; j += 8)                                                                                 \
        for (int k = 0; k < 8; k++) s8[k] += p[j + k] * dp[j + k];                                                  \
      for (int k = 0; k < 8; k++) dot += (double)s8[k];                                                             \
    }                                                                                                               \
    for (; j < j1; j++) dot += (double)(p[j] * dp[j]);                                                              \
    return dot;                                                                                                     \
  }                                                                                                                 \
                                                                                                                    \
  /* Softmax backward on [n0, n1): dp holds dL/dweights, p the weights; dp becomes dL/dscores (times scale) on      \
   * the unmasked keys and exactly 0 on the others (a masked key's dp is read only where its weight is not 0:      \
   * a filled key, whose score does not depend on the input, still takes part in the softmax). */                  \
  static void softmax_back_row_##S(const attn_attention_job *J, const void *pv, void *dpv, int64_t n0, int64_t n1, \
                                   const attn_attention_rowmask *m, double scale) {                                 \
    const T *p = pv;                                                                                                \
    T *dp = dpv;                                                                                                    \
    int64_t u0 = m->a > n0 ? m->a : n0, u1 = m->e < n1 ? m->e : n1, f1 = m->b < n1 ? m->b : n1;                     \
    if (u1 < u0) u1 = u0;                                                                                           \
    if (f1 < u1) f1 = u1;                                                                                           \
    double dot = 0;                                                                                                 \
    if (!m->mrow) {                                                                                                 \
      dot = dot_row_##S(p, dp, u0, u1);                                                                             \
      for (int64_t j = u1; j < f1; j++) dot += (double)select_nonzero_##S(p[j], p[j] * dp[j]);                      \
    } else {                                                                                                        \
      for (int64_t j = u0; j < f1; j++)                                                                             \
        if (attn_attention_kept(J, m->mrow, j) && (j < u1 || p[j] != 0)) dot += (double)(p[j] * dp[j]);             \
    }                                                                                                               \
    T D = (T)dot, sc = (T)scale;                                                                                    \
    for (int64_t j = n0; j < u0; j++) dp[j] = 0;                                                                    \
    if (!m->mrow) {                                                                                                 \
      for (int64_t j = u0; j < u1; j++) dp[j] = sc * (p[j] * (dp[j] - D));                                          \
    } else {                                                                                                        \
      for (int64_t j = u0; j < u1; j++)                                                                             \
        dp[j] = attn_attention_kept(J, m->mrow, j) ? sc * (p[j] * (dp[j] - D)) : (T)0;                              \
    }                                                                                                               \
    for (int64_t j = u1; j < n1; j++) dp[j] = 0;                                                                    \
  }                                                                                                                 \
                                                                                                                    \
  /* dst[c] += src[c], c < n. */                                                                                    \
  static void add_vec_##S(void *dv_, const void *sv, int64_t n) {                                                   \
    T *d = dv_;                                                                                                     \
    const T *s = sv;                                                                                                \
    for (int64_t c = 0; c < n; c++) d[c] += s[c];                                                                   \
  }

DEFINE_ROW_OPS(float, f, uint32_t)
DEFINE_ROW_OPS(double, d, uint64_t)

#define ROW_OPS(S) \
  { softmax_row_##S, load_row_##S, add_row_##S, dropout_row_##S, softmax_back_row_##S, add_vec_##S }
const attn_attention_row_ops attn_attention_ops_f32 = ROW_OPS(f), attn_attention_ops_f64 = ROW_OPS(d);

/* ------------------------------------------------------------ masking, fallbacks (any dtype) */

static double load_at(attn_dtype dt, const void *p, int64_t i) {
  return dt == ATTN_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static void store_at(attn_dtype dt, void *p, int64_t i, double v) {
  if (dt == ATTN_F32)
    ((float *)p)[i] = (float)v;
  else
    ((double *)p)[i] = v;
}

int attn_attention_row_has_key(const attn_attention_job *J, const attn_attention_rowmask *m) {
  for (int64_t j = m->a; j < m->b; j++)
    if (attn_attention_kept(J, m->mrow, j)) return 1;
  return 0;
}

void attn_attention_bad_row(const attn_attention_job *J, void *x, const attn_attention_rowmask *m) {
  double v = attn_attention_row_has_key(J, m) ? NAN : 0.0;
  for (int64_t j = m->a; j < m->b; j++) store_at(J->dt, x, j, attn_attention_kept(J, m->mrow, j) ? v : 0.0);
}

void attn_attention_live_range(const attn_attention_job *J, const attn_attention_rowmask *m, const void *w,
                               int64_t *lo, int64_t *hi) {
  int64_t l = m->a, h = m->b;
  while (l < h && load_at(J->dt, w, l) == 0 && !attn_attention_unmasked(J, m, l)) l++;
  while (h > l && load_at(J->dt, w, h - 1) == 0 && !attn_attention_unmasked(J, m, h - 1)) h--;
  *lo = l;
  *hi = h;
}

void attn_attention_combine_row(const attn_attention_job *J, const attn_attention_rowmask *m, const void *w,
                                int64_t n0, int64_t n1, const attn_attention_mat *X, int64_t b, void *out,
                                int64_t width) {
  const attn_dtype dt = J->dt;
  for (int64_t c = 0; c < width; c++) store_at(dt, out, c, 0);
  for (int64_t j = n0; j < n1; j++) {
    double wj = load_at(dt, w, j);
    if (wj == 0 && !attn_attention_unmasked(J, m, j)) continue;
    const void *x = attn_attention_at(X, J->es, b, j, 0);
    for (int64_t c = 0; c < width; c++)
      store_at(dt, out, c, load_at(dt, out, c) + wj * load_at(dt, x, c * X->sc));
  }
}

void attn_attention_outer_acc(const attn_attention_job *J, const attn_attention_rowmask *ms, const void *w,
                              int64_t nk, int64_t rows, int64_t n0, int64_t n1, const attn_attention_mat *X,
                              int64_t b, int64_t i0, void *acc, int64_t width) {
  const attn_dtype dt = J->dt;
  for (int64_t r = 0; r < rows; r++) {
    const void *x = attn_attention_at(X, J->es, b, i0 + r, 0);
    for (int64_t j = n0; j < n1; j++) {
      double wj = load_at(dt, w, r * nk + j);
      if (wj == 0 && !attn_attention_unmasked(J, &ms[r], j)) continue;
      for (int64_t c = 0; c < width; c++)
        store_at(dt, acc, j * width + c, load_at(dt, acc, j * width + c) + wj * load_at(dt, x, c * X->sc));
    }
  }
}

/* 1 when x[c * stride], c < n, are finite: sum x * 0, which NaN and inf turn to NaN (vectorises). */
static int finite_run(attn_dtype dt, const void *x, int64_t n, int64_t stride) {
  if (dt == ATTN_F32) {
    const float *p = x;
    float acc = 0;
    for (int64_t c = 0; c < n; c++) acc += p[c * stride] * 0;
    return acc == 0;
  }
  const double *p = x;
  double acc = 0;
  for (int64_t c = 0; c < n; c++) acc += p[c * stride] * 0;
  return acc == 0;
}

int attn_attention_block_finite(const attn_attention_job *J, const attn_attention_mat *X, int64_t b, int64_t i0,
                                int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; r++)
    if (!finite_run(J->dt, attn_attention_at(X, J->es, b, i0 + r, 0), width, X->sc)) return 0;
  return 1;
}

int attn_attention_row_finite(const attn_attention_job *J, const void *x, int64_t n) {
  return finite_run(J->dt, x, n, 1);
}
