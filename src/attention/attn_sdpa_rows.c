/* Row kernels of the attention softmax, float and double: masking by selection, the d2l fill,
 * the softmax and its backward, dropout, and the NaN-safe fallbacks of the weighted sums. Each
 * kernel is one named function written once; where a loop must run in the row's own type to be
 * fast, it calls a per-dtype loop below (the only code that differs between the dtypes, and the
 * place a vectorised version of a loop would go). */
#include <math.h>
#include <string.h>

#include "attention/attn_attention_internal.h"
#include "core/attn_vmath.h"

/* ------------------------------------------------------------ per-dtype loops */

/* Loops over one row of T (suffix S). Hot loops run in chunks of 8 with a fixed inner trip
 * count, which GCC vectorises at -O2. */
#define ROW_LOOPS(T, S, UT)                                                                        \
  /* Largest entry of x[j0:j1] (NaN entries are skipped); -inf when there is none. */             \
  static T max_##S(const T *x, int64_t j0, int64_t j1) {                                           \
    T m8[8], m = -(T)INFINITY;                                                                     \
    for (int k = 0; k < 8; k++) m8[k] = -(T)INFINITY;                                              \
    int64_t j = j0;                                                                                \
    for (; j + 8 <= j1; j += 8)                                                                    \
      for (int k = 0; k < 8; k++) m8[k] = x[j + k] > m8[k] ? x[j + k] : m8[k];                     \
    for (int k = 0; k < 8; k++) m = m8[k] > m ? m8[k] : m;                                         \
    for (; j < j1; j++) m = x[j] > m ? x[j] : m;                                                   \
    return m;                                                                                      \
  }                                                                                                \
  static void scale_##S(T *x, int64_t j0, int64_t j1, T s) {                                       \
    for (int64_t j = j0; j < j1; j++) x[j] *= s;                                                   \
  }                                                                                                \
  static void fill_##S(T *x, int64_t j0, int64_t j1, T v) {                                        \
    for (int64_t j = j0; j < j1; j++) x[j] = v;                                                    \
  }                                                                                                \
  /* x[j] = v on [j0, j1) where the keep-mask row (stride msc, dtype mdt) is 0: removed keys. */   \
  static void remove_##S(T *x, int64_t j0, int64_t j1, const char *mrow, int64_t msc, attn_dtype mdt, T v) { \
    if (mdt == ATTN_F32) {                                                                         \
      const float *mk = (const float *)mrow;                                                       \
      for (int64_t j = j0; j < j1; j++) x[j] = mk[j * msc] == 0 ? v : x[j];                        \
    } else {                                                                                       \
      const double *mk = (const double *)mrow;                                                     \
      for (int64_t j = j0; j < j1; j++) x[j] = mk[j * msc] == 0 ? v : x[j];                        \
    }                                                                                              \
  }                                                                                                \
  /* dst[j] = scale * src[j * stride], j < n. */                                                   \
  static void load_##S(T *dst, const T *src, int64_t stride, int64_t n, T scale) {                 \
    for (int64_t j = 0; j < n; j++) dst[j] = scale * src[j * stride];                              \
  }                                                                                                \
  /* x[j] += src[j * stride], j < n. */                                                            \
  static void add_##S(T *x, const T *src, int64_t stride, int64_t n) {                             \
    for (int64_t j = 0; j < n; j++) x[j] += src[j * stride];                                       \
  }                                                                                                \
  /* v where p != 0, else 0, by bit masking (p >= 0 or NaN), so the loops vectorise. */            \
  static inline T select_nonzero_##S(T p, T v) {                                                   \
    UT pb, vb;                                                                                     \
    memcpy(&pb, &p, sizeof pb);                                                                    \
    memcpy(&vb, &v, sizeof vb);                                                                    \
    vb &= (UT)0 - (UT)(pb != 0);                                                                   \
    memcpy(&v, &vb, sizeof v);                                                                     \
    return v;                                                                                      \
  }                                                                                                \
  /* sum of p[j] * dp[j] over [j0, j1) (only where p[j] != 0 when nonzero is set), in chunks of 8  \
   * of T, summed in double across chunks. */                                                      \
  static double dot_##S(const T *p, const T *dp, int64_t j0, int64_t j1, int nonzero) {            \
    double dot = 0;                                                                                \
    int64_t j = j0;                                                                                \
    while (j + 8 <= j1) {                                                                          \
      T s8[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                          \
      int64_t stop = j + 256 < j1 ? j + 256 : j1;                                                  \
      for (; j + 8 <= stop; j += 8)                                                                \
        for (int k = 0; k < 8; k++)                                                                \
          s8[k] += nonzero ? select_nonzero_##S(p[j + k], p[j + k] * dp[j + k]) : p[j + k] * dp[j + k]; \
      for (int k = 0; k < 8; k++) dot += (double)s8[k];                                            \
    }                                                                                              \
    for (; j < j1; j++) dot += (double)(nonzero ? select_nonzero_##S(p[j], p[j] * dp[j]) : p[j] * dp[j]); \
    return dot;                                                                                    \
  }                                                                                                \
  /* dp[j] = sc * p[j] * (dp[j] - D) on [j0, j1): the softmax backward of unmasked keys. */        \
  static void grad_##S(const T *p, T *dp, int64_t j0, int64_t j1, T D, T sc) {                     \
    for (int64_t j = j0; j < j1; j++) dp[j] = sc * (p[j] * (dp[j] - D));                           \
  }

ROW_LOOPS(float, f32, uint32_t)
ROW_LOOPS(double, f64, uint64_t)

#define FILL ATTN_MASKED_SOFTMAX_FILL
#define IS_F32(J) ((J)->dt == ATTN_F32)

/* ------------------------------------------------------------ row kernels */

static double load_at(attn_dtype dt, const void *p, int64_t i) {
  return dt == ATTN_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static void store_at(attn_dtype dt, void *p, int64_t i, double v) {
  if (dt == ATTN_F32)
    ((float *)p)[i] = (float)v;
  else
    ((double *)p)[i] = v;
}

static double row_max(const attn_attention_job *J, const void *x, int64_t j0, int64_t j1) {
  return IS_F32(J) ? (double)max_f32(x, j0, j1) : max_f64(x, j0, j1);
}

static void row_fill(const attn_attention_job *J, void *x, int64_t j0, int64_t j1, double v) {
  if (IS_F32(J))
    fill_f32(x, j0, j1, (float)v);
  else
    fill_f64(x, j0, j1, v);
}

void attn_sdpa_bias_row(const attn_attention_job *J, int64_t b, int64_t i, void *x, int64_t j0, int64_t j1) {
  double slope;
  const char *brow = attn_attention_bias_row(J, b, i, &slope);
  const int64_t sc = J->bsc;
  if (IS_F32(J)) { /* in the scores' precision, as PyTorch adds a float mask */
    float *y = x;
    if (brow)
      for (int64_t j = j0; j < j1; j++) y[j] += ((const float *)brow)[j * sc];
    if (J->slopes)
      for (int64_t j = j0; j < j1; j++) y[j] += (float)(-slope * (double)(i > j ? i - j : j - i));
  } else {
    double *y = x;
    if (brow)
      for (int64_t j = j0; j < j1; j++) y[j] += ((const double *)brow)[j * sc];
    if (J->slopes)
      for (int64_t j = j0; j < j1; j++) y[j] += -slope * (double)(i > j ? i - j : j - i);
  }
}

/* x[j] = v on [j0, j1) where row m removes key j: its keep-mask row, then the pattern's rule. */
static void row_remove(const attn_attention_job *J, void *x, int64_t j0, int64_t j1, const attn_attention_rowmask *m,
                       double v) {
  if (m->mrow && IS_F32(J))
    remove_f32(x, j0, j1, m->mrow, J->msc, J->mdt, (float)v);
  else if (m->mrow)
    remove_f64(x, j0, j1, m->mrow, J->msc, J->mdt, v);
  if (J->rule)
    for (int64_t j = j0; j < j1; j++)
      if (!attn_attention_rule_keeps(J, m->i, j)) store_at(J->dt, x, j, v);
}

void attn_sdpa_softmax_row(const attn_attention_job *J, void *x, const attn_attention_rowmask *m) {
  const int64_t a = m->a, b = m->b;
  row_fill(J, x, 0, a, 0);
  row_fill(J, x, b, J->Nk, 0);
  if (a >= b) return;
  row_fill(J, x, m->e, b, FILL);
  if (attn_attention_row_sparse(J, m)) row_remove(J, x, a, b, m, -INFINITY);
  double mx = row_max(J, x, a, b); /* ignores NaN; a NaN entry makes the sum NaN below */
  /* the exp-and-sum comes from attn_vmath (shared with the generic softmax) */
  double sum = mx == -INFINITY ? 0
               : IS_F32(J)     ? attn_vmath_exp_row_f32((float *)x + a, b - a, (float)mx)
                               : attn_vmath_exp_row_f64((double *)x + a, b - a, mx);
  if (!(sum > 0)) { /* all -inf (or no key), or NaN: no finite answer */
    attn_sdpa_bad_row(J, x, m);
    return;
  }
  if (IS_F32(J))
    scale_f32(x, a, b, (float)(1.0 / sum));
  else
    scale_f64(x, a, b, 1.0 / sum);
}

void attn_sdpa_softmax_block(const attn_attention_job *J, void *ws, const attn_attention_rowmask *rm, int64_t r) {
  const int64_t Nk = J->Nk;
  if (!J->tiny || !IS_F32(J) || r > ATTN_SDPA_BLOCK) {
    for (int64_t rr = 0; rr < r; rr++) attn_sdpa_softmax_row(J, (char *)ws + (size_t)(rr * Nk) * J->es, &rm[rr]);
    return;
  }
  /* Tiny heads: rows of a few keys, where one exp call per row costs more than its exps. Each row
   * is masked and shifted by its max as attn_sdpa_softmax_row does, entries outside [a, b) set to
   * -inf (exp gives an exact 0), then one exp over the whole block; the sums and the rows with no
   * finite answer are handled row by row as there. */
  float *x = ws;
  char bad[ATTN_SDPA_BLOCK];
  for (int64_t rr = 0; rr < r; rr++) {
    float *row = x + rr * Nk;
    const attn_attention_rowmask *m = &rm[rr];
    bad[rr] = 0;
    fill_f32(row, 0, m->a, -INFINITY);
    fill_f32(row, m->b, Nk, -INFINITY);
    if (m->a >= m->b) continue;
    fill_f32(row, m->e, m->b, (float)FILL);
    if (attn_attention_row_sparse(J, m)) row_remove(J, row, m->a, m->b, m, -INFINITY);
    float mx = max_f32(row, m->a, m->b);
    if (mx == -INFINITY)
      bad[rr] = 1;
    else
      for (int64_t j = m->a; j < m->b; j++) row[j] -= mx;
  }
  attn_vmath_exp_row_f32(x, r * Nk, 0.0f); /* every entry is <= 0 (or NaN) */
  for (int64_t rr = 0; rr < r; rr++) {
    float *row = x + rr * Nk;
    const attn_attention_rowmask *m = &rm[rr];
    if (m->a >= m->b) continue;
    double sum = 0;
    for (int64_t j = m->a; j < m->b; j++) sum += row[j];
    if (bad[rr] || !(sum > 0))
      attn_sdpa_bad_row(J, row, m);
    else
      scale_f32(row, m->a, m->b, (float)(1.0 / sum));
  }
}

void attn_sdpa_load_row(const attn_attention_job *J, void *dst, const void *src, int64_t stride, int64_t n,
                        double scale) {
  if (scale == 1 && stride == 1)
    memcpy(dst, src, (size_t)n * J->es);
  else if (IS_F32(J))
    load_f32(dst, src, stride, n, (float)scale);
  else
    load_f64(dst, src, stride, n, scale);
}

void attn_sdpa_add_row(const attn_attention_job *J, void *x, const void *src, int64_t stride, int64_t n) {
  if (IS_F32(J))
    add_f32(x, src, stride, n);
  else
    add_f64(x, src, stride, n);
}

void attn_sdpa_dropout_row(const attn_attention_job *J, void *x, int64_t n0, int64_t n1, uint64_t base) {
  /* the engine's one dropout mask and its vectorised rows (attn_dropout.h), as nn.dropout uses */
  if (n1 <= n0) return;
  if (IS_F32(J))
    attn_dropout_f32(&J->drop, (float *)x + n0, (float *)x + n0, n1 - n0, base + (uint64_t)n0);
  else
    attn_dropout_f64(&J->drop, (double *)x + n0, (double *)x + n0, n1 - n0, base + (uint64_t)n0);
}

void attn_sdpa_softmax_back_row(const attn_attention_job *J, const void *p, void *dp, int64_t n0, int64_t n1,
                                const attn_attention_rowmask *m, double scale) {
  /* [u0, u1): the unmasked span; [u1, f1): the filled keys */
  int64_t u0 = m->a > n0 ? m->a : n0, u1 = m->e < n1 ? m->e : n1, f1 = m->b < n1 ? m->b : n1;
  if (u1 < u0) u1 = u0;
  if (f1 < u1) f1 = u1;
  /* D = sum of p * dp over the unmasked keys and the filled keys with a weight. Removed keys have
   * p = 0, so the plain sum is exact unless their dp is not finite: only then sum key by key. */
  double D = IS_F32(J) ? dot_f32(p, dp, u0, u1, 0) + dot_f32(p, dp, u1, f1, 1)
                       : dot_f64(p, dp, u0, u1, 0) + dot_f64(p, dp, u1, f1, 1);
  if (attn_attention_row_sparse(J, m) && !isfinite(D)) {
    D = 0;
    for (int64_t j = u0; j < f1; j++) {
      double pj = load_at(J->dt, p, j);
      if (attn_attention_row_keeps(J, m, j) && (j < u1 || pj != 0)) D += pj * load_at(J->dt, dp, j);
    }
  }
  row_fill(J, dp, n0, u0, 0);
  if (IS_F32(J))
    grad_f32(p, dp, u0, u1, (float)D, (float)scale);
  else
    grad_f64(p, dp, u0, u1, D, scale);
  if (attn_attention_row_sparse(J, m)) row_remove(J, dp, u0, u1, m, 0); /* removed keys: 0, whatever their dp held */
  row_fill(J, dp, u1, n1, 0);
}

/* ------------------------------------------------------------ masking, fallbacks (any dtype) */

int attn_sdpa_row_has_key(const attn_attention_job *J, const attn_attention_rowmask *m) {
  for (int64_t j = m->a; j < m->b; j++)
    if (attn_attention_row_keeps(J, m, j)) return 1;
  return 0;
}

void attn_sdpa_bad_row(const attn_attention_job *J, void *x, const attn_attention_rowmask *m) {
  double v = attn_sdpa_row_has_key(J, m) ? NAN : 0.0;
  for (int64_t j = m->a; j < m->b; j++) store_at(J->dt, x, j, attn_attention_row_keeps(J, m, j) ? v : 0.0);
}

void attn_sdpa_live_range(const attn_attention_job *J, const attn_attention_rowmask *m, const void *w,
                               int64_t *lo, int64_t *hi) {
  int64_t l = m->a, h = m->b;
  while (l < h && load_at(J->dt, w, l) == 0 && !attn_attention_unmasked(J, m, l)) l++;
  while (h > l && load_at(J->dt, w, h - 1) == 0 && !attn_attention_unmasked(J, m, h - 1)) h--;
  *lo = l;
  *hi = h;
}

void attn_sdpa_combine_row(const attn_attention_job *J, const attn_attention_rowmask *m, const void *w,
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

void attn_sdpa_outer_acc(const attn_attention_job *J, const attn_attention_rowmask *ms, const void *w,
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

int attn_sdpa_block_finite(const attn_attention_job *J, const attn_attention_mat *X, int64_t b, int64_t i0,
                                int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; r++)
    if (!finite_run(J->dt, attn_attention_at(X, J->es, b, i0 + r, 0), width, X->sc)) return 0;
  return 1;
}

int attn_sdpa_row_finite(const attn_attention_job *J, const void *x, int64_t n) {
  return finite_run(J->dt, x, n, 1);
}
