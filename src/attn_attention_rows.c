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
  /* Softmax of row x in place. Scores (already scaled) are valid on [a, e); [e, b) get the d2l fill; keys          \
   * outside [a, b) and those the keep-mask removes get weight 0. *nz0, *nz1: range of nonzero weights. */          \
  static void softmax_row_##S(void *xv, int64_t nk, int64_t a, int64_t b, int64_t e, const void *mrow, int64_t msc, \
                              attn_dtype mdt, int64_t *nz0, int64_t *nz1) {                                         \
    T *x = xv;                                                                                                      \
    *nz0 = *nz1 = 0;                                                                                                \
    if (a > 0) memset(x, 0, sizeof(T) * (size_t)a);                                                                 \
    if (b < nk) memset(x + b, 0, sizeof(T) * (size_t)(nk - b));                                                     \
    if (a >= b) return;                                                                                             \
    for (int64_t j = e; j < b; j++) x[j] = (T)FILL;                                                                 \
    if (mrow) {                                                                                                     \
      if (mdt == ATTN_F32) {                                                                                        \
        const float *mk = (const float *)mrow;                                                                      \
        for (int64_t j = a; j < b; j++)                                                                             \
          if (mk[j * msc] == 0) x[j] = -(T)INFINITY;                                                                \
      } else {                                                                                                      \
        const double *mk = (const double *)mrow;                                                                    \
        for (int64_t j = a; j < b; j++)                                                                             \
          if (mk[j * msc] == 0) x[j] = -(T)INFINITY;                                                                \
      }                                                                                                             \
    }                                                                                                               \
    T m = row_max_##S(x + a, b - a); /* ignores NaN; a NaN entry makes the sum NaN below */                         \
    if (m == -(T)INFINITY) {         /* no key left (or only NaN): zero weights */                                  \
      T fill = 0;                                                                                                   \
      for (int64_t j = a; j < b; j++)                                                                               \
        if (x[j] != x[j]) fill = x[j];                                                                              \
      for (int64_t j = a; j < b; j++) x[j] = fill;                                                                  \
      if (fill == 0) return;                                                                                        \
      *nz0 = a;                                                                                                     \
      *nz1 = b;                                                                                                     \
      return;                                                                                                       \
    }                                                                                                               \
    double sum = exp_row_##S(x + a, b - a, m);                                                                      \
    row_scale_##S(x + a, b - a, (T)(1.0 / sum));                                                                    \
    int64_t lo = a, hi = b;                                                                                         \
    while (hi > lo && x[hi - 1] == 0) hi--;                                                                         \
    while (lo < hi && x[lo] == 0) lo++;                                                                             \
    *nz0 = lo;                                                                                                      \
    *nz1 = hi;                                                                                                      \
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
  /* [*a, *e): the smallest range holding every nonzero entry of x[0:n] (empty: a = e). */                          \
  static void nonzero_range_##S(const void *xv, int64_t n, int64_t *a, int64_t *e) {                                \
    const T *x = xv;                                                                                                \
    int64_t lo = 0, hi = n;                                                                                         \
    while (hi > lo && x[hi - 1] == 0) hi--;                                                                         \
    while (lo < hi && x[lo] == 0) lo++;                                                                             \
    *a = lo;                                                                                                        \
    *e = hi;                                                                                                        \
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
  /* Softmax backward on [n0, n1): dp holds dL/dweights, p the weights; dp becomes dL/dscores (times scale),        \
   * exactly 0 where the weight is 0 (removed keys; their dp is never read) and at filled positions j >= len. */    \
  static void softmax_back_row_##S(const void *pv, void *dpv, int64_t n0, int64_t n1, int64_t len, double scale) {  \
    const T *p = pv;                                                                                                \
    T *dp = dpv;                                                                                                    \
    double dot = 0;                                                                                                 \
    int64_t j = n0;                                                                                                 \
    while (j + 8 <= n1) {                                                                                           \
      T s8[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                                           \
      int64_t stop = j + 256 < n1 ? j + 256 : n1;                                                                   \
      for (; j + 8 <= stop; j += 8)                                                                                 \
        for (int k = 0; k < 8; k++) s8[k] += select_nonzero_##S(p[j + k], p[j + k] * dp[j + k]);                    \
      for (int k = 0; k < 8; k++) dot += (double)s8[k];                                                             \
    }                                                                                                               \
    for (; j < n1; j++) dot += (double)select_nonzero_##S(p[j], p[j] * dp[j]);                                      \
    T D = (T)dot, sc = (T)scale;                                                                                    \
    int64_t e = len < n1 ? (len > n0 ? len : n0) : n1;                                                              \
    for (j = n0; j + 8 <= e; j += 8)                                                                                \
      for (int k = 0; k < 8; k++) dp[j + k] = select_nonzero_##S(p[j + k], sc * (p[j + k] * (dp[j + k] - D)));      \
    for (; j < e; j++) dp[j] = select_nonzero_##S(p[j], sc * (p[j] * (dp[j] - D)));                                 \
    for (j = e; j < n1; j++) dp[j] = 0;                                                                             \
  }                                                                                                                 \
                                                                                                                    \
  /* out[c] = sum over j in [n0, n1) with w[j] != 0 of w[j] * X[b, j, c], c < width (never reads rows with          \
   * a zero weight). */                                                                                             \
  static void combine_row_##S(const void *wv, int64_t n0, int64_t n1, const attn_attention_mat *X, int64_t b,       \
                              void *outv, int64_t width) {                                                          \
    const T *w = wv;                                                                                                \
    T *out = outv;                                                                                                  \
    for (int64_t c = 0; c < width; c++) out[c] = 0;                                                                 \
    for (int64_t j = n0; j < n1; j++) {                                                                             \
      if (w[j] == 0) continue;                                                                                      \
      const T *x = (const T *)attn_attention_at(X, sizeof(T), b, j, 0);                                             \
      for (int64_t c = 0; c < width; c++) out[c] += w[j] * x[c * X->sc];                                            \
    }                                                                                                               \
  }                                                                                                                 \
                                                                                                                    \
  /* acc[j, c] += sum over rows r of w[r][j] * X[b, i0 + r, c] for w[r][j] != 0; w rows have ld nk. */              \
  static void outer_acc_##S(const void *wv, int64_t nk, int64_t rows, int64_t n0, int64_t n1,                       \
                            const attn_attention_mat *X, int64_t b, int64_t i0, void *accv, int64_t width) {        \
    const T *w = wv;                                                                                                \
    T *acc = accv;                                                                                                  \
    for (int64_t r = 0; r < rows; r++) {                                                                            \
      const T *x = (const T *)attn_attention_at(X, sizeof(T), b, i0 + r, 0);                                        \
      for (int64_t j = n0; j < n1; j++) {                                                                           \
        T wj = w[r * nk + j];                                                                                       \
        if (wj == 0) continue;                                                                                      \
        for (int64_t c = 0; c < width; c++) acc[j * width + c] += wj * x[c * X->sc];                                \
      }                                                                                                             \
    }                                                                                                               \
  }                                                                                                                 \
                                                                                                                    \
  /* 1 when every X[b, i0 + r, c] (r < rows, c < width) is finite. */                                               \
  static int block_finite_##S(const attn_attention_mat *X, int64_t b, int64_t i0, int64_t rows, int64_t width) {    \
    for (int64_t r = 0; r < rows; r++) {                                                                            \
      const T *x = (const T *)attn_attention_at(X, sizeof(T), b, i0 + r, 0);                                        \
      T acc = 0;                                                                                                    \
      for (int64_t c = 0; c < width; c++) acc += x[c * X->sc] * 0;                                                  \
      if (acc != 0) return 0; /* NaN: 0 * inf and NaN * 0 are NaN */                                                \
    }                                                                                                               \
    return 1;                                                                                                       \
  }                                                                                                                 \
                                                                                                                    \
  static int row_finite_##S(const void *xv, int64_t n) {                                                            \
    const T *x = xv;                                                                                                \
    T acc = 0;                                                                                                      \
    for (int64_t c = 0; c < n; c++) acc += x[c] * 0;                                                                \
    return acc == 0;                                                                                                \
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

#define ROW_OPS(S)                                                                                        \
  {                                                                                                       \
    softmax_row_##S, load_row_##S, add_row_##S, nonzero_range_##S, dropout_row_##S, softmax_back_row_##S, \
        combine_row_##S, outer_acc_##S, block_finite_##S, row_finite_##S, add_vec_##S                     \
  }
const attn_attention_row_ops attn_attention_ops_f32 = ROW_OPS(f), attn_attention_ops_f64 = ROW_OPS(d);
