/* The flash attention kernels (float32), written once: each src/cpu/flash_<isa>.c
 * defines FLASH_SUFFIX and the register block (FLASH_VL floats per vector,
 * FLASH_QV vectors by FLASH_NR broadcasts) and includes this file, compiled
 * with that ISA's flags (see the Makefile); src/cpu/cpu_dispatch.c picks
 * one set at run time.
 *
 * Layout: a tile keeps 64 queries (forward, dq) or 64 keys (dk, dv) in vector
 * lanes, one row per key (or query). Every product is then the one
 * micro-kernel below, C[n][lanes] += sum_k A[k][lanes] * B[n, k], with A a
 * packed tile and B read straight from the caller's rows by broadcasts, so
 * K and V are never re-packed, the row maximum of the online softmax is a
 * lane-wise max, and the score tile (64 x 64 floats) never leaves L1/L2.
 * Scores are kept in base-2 units (q is scaled by scale * log2 e once when
 * packed), so the softmax uses exp2. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/attn_attention_internal.h"

#include "cpu/cpu_inline.h"
#include "cpu/exp_poly.h"

#define FLASH_CAT2(a, b) a##b
#define FLASH_CAT(a, b) FLASH_CAT2(a, b)
#define FLASH_FN(name) FLASH_CAT(name, FLASH_SUFFIX)

#define TW ATTN_FLASH_TILE
/* Keys per forward tile: two lane widths, so the P V product runs longer between its reloads of
 * the output tile (the tile is then 32 KiB, still within L1 on current cores). */
#define KT (2 * TW)

typedef float flash_vf __attribute__((vector_size(FLASH_VL * 4)));

static inline flash_vf vload(const float *p) {
  flash_vf v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void vstore(float *p, flash_vf v) { memcpy(p, &v, sizeof v); }

typedef int32_t flash_vi __attribute__((vector_size(FLASH_VL * 4)));
typedef uint32_t flash_vu __attribute__((vector_size(FLASH_VL * 4)));

/* a > b ? a : b lane-wise (b where either is NaN, as the scalar select) */
static inline flash_vf vmax(flash_vf a, flash_vf b) {
  flash_vi gt = a > b;
  return (flash_vf)((gt & (flash_vi)a) | (~gt & (flash_vi)b));
}

/* Rows [n0, n0 + NB) of the product below, lane vectors [QLO, QHI) of lanes [l0, l0 + VL * QV):
 * NB x QV accumulators stay in registers over the whole k loop (NB, QLO and QHI are constants
 * after inlining); in mode 0 the vectors outside [QLO, QHI) are stored as 0. Bounds on the k loop
 * per lane vector (the terms outside are known to be 0), at most one of: kend (non-decreasing:
 * vector q takes k < kend[q] only) or kbeg (non-decreasing: vector q takes k >= kbeg[q] only). */
ATTN_CPU_INLINE void mk_block(const int NB, const int QLO, const int QHI, int64_t K,
                              int64_t n0, int64_t l0, const float *A, const float *B,
                              int64_t bn, int64_t bk, float *C, float *cs, int mode,
                              const int64_t *kend, const int64_t *kbeg) {
  flash_vf acc[FLASH_NR][FLASH_QV];
  for (int r = 0; r < NB; r++)
    for (int q = QLO; q < QHI; q++) acc[r][q] = (flash_vf){0};
  int64_t k = kbeg ? (kbeg[QLO] < K ? kbeg[QLO] : K) : 0;
  const float *ap = A + l0 + k * TW, *bp = B + n0 * bn + k * bk;
#pragma GCC unroll 4
  for (int s = QLO; s < QHI; s++) {
    /* one pass without bounds; with kend vectors [s, QHI) up to kend[s]; with kbeg vectors
     * [QLO, s] up to kbeg[s + 1] */
    const int lo = kend ? s : QLO, hi = kbeg ? s + 1 : QHI;
    int64_t ke = kend ? kend[s] : kbeg && s + 1 < QHI ? kbeg[s + 1] : K;
    ke = ke < K ? ke : K;
    for (; k < ke; k++, ap += TW, bp += bk) {
      flash_vf a[FLASH_QV];
      for (int q = lo; q < hi; q++) a[q] = vload(ap + q * FLASH_VL);
      for (int r = 0; r < NB; r++) {
        float bv = bp[r * bn];
        /* a[q] is loaded above for every q in [lo, hi) (cppcheck loses that across the two loops) */
        // cppcheck-suppress uninitvar
        for (int q = lo; q < hi; q++) acc[r][q] += a[q] * bv;
      }
    }
    if (!kend && !kbeg) break;
  }
  if (mode == 3)
    for (int q = QLO; q < QHI; q++) {
      flash_vf mx = vload(cs + l0 + q * FLASH_VL);
      for (int r = 0; r < NB; r++) mx = vmax(acc[r][q], mx);
      vstore(cs + l0 + q * FLASH_VL, mx);
    }
  for (int r = 0; r < NB; r++)
    for (int q = mode == 0 ? 0 : QLO; q < (mode == 0 ? FLASH_QV : QHI); q++) {
      float *cp = C + (n0 + r) * TW + l0 + q * FLASH_VL;
      flash_vf c = q >= QLO && q < QHI ? acc[r][q] : (flash_vf){0};
      if (mode == 1) c += vload(cp);
      if (mode == 2) c += vload(cp) * vload(cs + l0 + q * FLASH_VL);
      vstore(cp, c);
    }
}

/* C[n][0:TW] = init + sum_{k < K} A[k][0:TW] * B[n*bn + k*bk] for n < N, where init is 0
 * (mode 0), C (mode 1) or C * cs lane-wise (mode 2: the online-softmax rescale); mode 3 is mode 0
 * that also takes the new rows into the lane-wise running max cs, while they are in registers
 * (a pass of its own over the tile was bound by the latency of its max chain). kend and kbeg as
 * in mk_block, one entry per lane vector of the tile (NULL: none; constants after inlining, so
 * the plain product keeps its one k loop). */
ATTN_CPU_INLINE void mk_impl(int64_t K, int64_t N, const float *A, const float *B,
                             int64_t bn, int64_t bk, float *C, float *cs, int mode,
                             const int64_t *kend, const int64_t *kbeg) {
  for (int64_t l0 = 0; l0 < TW; l0 += FLASH_VL * FLASH_QV) {
    const int64_t *ke = kend ? kend + l0 / FLASH_VL : NULL, *kb = kbeg ? kbeg + l0 / FLASH_VL : NULL;
    int64_t n0 = 0;
    for (; n0 + FLASH_NR <= N; n0 += FLASH_NR)
      mk_block(FLASH_NR, 0, FLASH_QV, K, n0, l0, A, B, bn, bk, C, cs, mode, ke, kb);
#if FLASH_NR > 4
    for (; n0 + 4 <= N; n0 += 4) mk_block(4, 0, FLASH_QV, K, n0, l0, A, B, bn, bk, C, cs, mode, ke, kb);
#endif
#if FLASH_NR > 2
    for (; n0 + 2 <= N; n0 += 2) mk_block(2, 0, FLASH_QV, K, n0, l0, A, B, bn, bk, C, cs, mode, ke, kb);
#endif
    for (; n0 < N; n0++) mk_block(1, 0, FLASH_QV, K, n0, l0, A, B, bn, bk, C, cs, mode, ke, kb);
  }
}

static void mk(int64_t K, int64_t N, const float *A, const float *B, int64_t bn, int64_t bk, float *C, float *cs,
               int mode) {
  mk_impl(K, N, A, B, bn, bk, C, cs, mode, NULL, NULL);
}

/* The scores of a clean tile (mode 3): C as mk's mode 0, and mx[lane] = the max of it and of the
 * lane's new scores. */
static void mk_scores_max(int64_t K, int64_t N, const float *A, const float *B, int64_t bn, float *C, float *mx) {
  mk_impl(K, N, A, B, bn, 1, C, mx, 3, NULL, NULL);
}

/* The products of a masked tile whose k loop runs over the tile's rows (the weights times V or
 * dO, dS times K or Q): mode 2 or 1, lane vector v taking k < kend[v] only or k >= kbeg[v] only
 * (one of the two given). */
static void mk_bounded(int64_t K, int64_t N, const float *A, const float *B, int64_t bk, float *C, float *cs,
                       int mode, const int64_t *kend, const int64_t *kbeg) {
  if (mode == 2) mk_impl(K, N, A, B, 1, bk, C, cs, 2, kend, NULL);
  if (mode == 1 && kend) mk_impl(K, N, A, B, 1, bk, C, NULL, 1, kend, NULL);
  if (mode == 1 && kbeg) mk_impl(K, N, A, B, 1, bk, C, NULL, 1, NULL, kbeg);
}

#define FLASH_NV (TW / FLASH_VL) /* lane vectors per tile */
#define FLASH_MAXNB (KT / FLASH_NR + 1) /* blocks of FLASH_NR rows in a tile */

/* mk_block of mode 0 on lane vectors [qlo, qhi) only (qlo >= qhi: the block is stored as 0). */
ATTN_CPU_INLINE void mk_block_range(int qlo, int qhi, int64_t K, int64_t n0,
                                    int64_t l0, const float *A, const float *B,
                                    int64_t bn, float *C) {
#define FLASH_MKR(lo, hi)                                                                      \
  case (lo) * 8 + (hi):                                                                        \
    mk_block(FLASH_NR, lo, hi, K, n0, l0, A, B, bn, 1, C, NULL, 0, NULL, NULL);                \
    return;
  switch (qlo < qhi ? qlo * 8 + qhi : 0) {
    FLASH_MKR(0, 1)
    FLASH_MKR(0, 2)
    FLASH_MKR(1, 2)
#if FLASH_QV > 2
    FLASH_MKR(0, 3)
    FLASH_MKR(1, 3)
    FLASH_MKR(2, 3)
    FLASH_MKR(0, 4)
    FLASH_MKR(1, 4)
    FLASH_MKR(2, 4)
    FLASH_MKR(3, 4)
#endif
    default: mk_block(FLASH_NR, 0, FLASH_QV, 0, n0, l0, A, B, bn, 1, C, NULL, 0, NULL, NULL); /* zeros */
  }
#undef FLASH_MKR
}

/* The scores (or dP) of a masked tile (mode 0): the block of FLASH_NR rows from FLASH_NR * i on
 * computes only the lane vectors [vlo[i], vhi[i]) (tile-wide vector indices) and stores the
 * others as 0; rows past the last whole block are computed whole. The vectors left out are ones
 * no lane of which sees a key (or query) of the block, so mask_tile sets them to -inf, as it
 * does every entry out of range, and under a causal mask the diagonal tile costs about 5/8. */
static void mk_masked(int64_t K, int64_t N, const float *A, const float *B, int64_t bn, float *C, const int *vlo,
                      const int *vhi) {
  for (int64_t l0 = 0; l0 < TW; l0 += FLASH_VL * FLASH_QV) {
    const int v0 = (int)(l0 / FLASH_VL);
    int64_t n0 = 0;
    for (; n0 + FLASH_NR <= N; n0 += FLASH_NR) {
      int i = (int)(n0 / FLASH_NR), lo = vlo[i] - v0, hi = vhi[i] - v0;
      mk_block_range(lo < 0 ? 0 : lo, hi > FLASH_QV ? FLASH_QV : hi, K, n0, l0, A, B, bn, C);
    }
    for (; n0 < N; n0++) mk_block(1, 0, FLASH_QV, K, n0, l0, A, B, bn, 1, C, NULL, 0, NULL, NULL);
  }
}

/* 2^x, vectorisable: exact 0 below -126 and for -inf, NaN stays NaN, relative error about 1e-7. */
static inline float exp2_f(float x) {
  uint32_t xb, kb, yb;
  memcpy(&xb, &x, 4);
  float kf = x + 12583039.0f; /* round(x) + 127 in the low mantissa bits */
  memcpy(&kb, &kf, 4);
  float r = (x - (kf - 12583039.0f)) * 0.693147180559945f;
  float y = attn_cpu_exp_poly_scale(r, kb);
  memcpy(&yb, &y, 4);
  yb &= (uint32_t)0 - (uint32_t)(xb <= 0xC2FC0000u || xb > 0xFF800000u); /* -126 > x >= -inf: 0 */
  memcpy(&y, &yb, 4);
  return y;
}

/* 2^x on a whole vector for x <= 0, -inf or NaN (the softmax weights, forward and backward: vectors so
 * the running max and row sums stay in registers; the auto-vectorised loops kept them in
 * memory). x below -127 is raised to it, whose scale bits are those of +0: the result is exact 0
 * there and for -inf, with no mask of its own, and a NaN fails the test and stays NaN. 2^f on
 * f = x - round(x) in [-0.5, 0.5] is a degree-5 interpolant at the Chebyshev nodes: relative
 * error below 2.5e-7 in float, one FMA fewer than exp_poly's degree-7 e^r and no multiply by
 * ln 2. */
static inline flash_vf exp2_v(flash_vf x) {
  flash_vi low = x < -127.0f;
  x = (flash_vf)((low & (flash_vi)((flash_vf){0} - 127.0f)) | (~low & (flash_vi)x));
  flash_vf kf = x + 12583039.0f;
  flash_vf f = x - (kf - 12583039.0f);
  flash_vf p = f * 1.339086336e-3f + 9.676031918e-3f;
  p = p * f + 5.550357114e-2f;
  p = p * f + 2.402210749e-1f;
  p = p * f + 6.931471880e-1f;
  p = p * f + 1.000000075f;
  return p * (flash_vf)((flash_vu)kf << 23);
}

/* log2 of a vector of positive normal floats: the exponent, and 2 atanh(t) / ln 2 to the t^7
 * term for the mantissa m in [sqrt(1/2), sqrt(2)), t = (m - 1) / (m + 1) (|t| < 0.172, so the
 * first term left out is below 5e-8). For the forward's log-sum-exp, 64 rows at a time. */
static inline flash_vf log2_v(flash_vf x) {
  flash_vi xb = (flash_vi)x;
  flash_vi e = (xb >> 23) - 127;
  flash_vf m = (flash_vf)((xb & 0x007FFFFF) | 0x3F800000);
  flash_vi big = m > 1.41421356f;
  m = (flash_vf)((big & (flash_vi)(m * 0.5f)) | (~big & (flash_vi)m));
  e -= big; /* big is -1 where m was halved */
  flash_vf t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
  flash_vf p = t2 * 0.4121985831f + 0.5770780164f;
  p = p * t2 + 0.9617966939f;
  p = p * t2 + 2.885390082f;
  return __builtin_convertvector(e, flash_vf) + p * t;
}

/* ---- masks ---------------------------------------------------------------- */

/* Per query row (offset o from q0, o < nq): visible keys [a, b) and the first filled key e
 * (d2l's valid_lens: keys in [e, b) score fill). Rows past the real ones see nothing. */
static void query_ranges(const attn_attention_job *J, int64_t b, int64_t q0, int64_t nq, int64_t *qa, int64_t *qb,
                         int64_t *qe) {
  for (int64_t o = 0; o < TW; o++) {
    if (o >= nq) {
      qa[o] = qb[o] = qe[o] = 0;
      continue;
    }
    attn_attention_rowmask m;
    attn_attention_row_mask(J, b, q0 + o, &m);
    qa[o] = m.a;
    qb[o] = m.b;
    qe[o] = m.e;
  }
}

/* query_ranges for a block of r queries from i0, and [*jlo, *jhi): the keys some row sees. */
static void block_ranges(const attn_attention_job *J, int64_t b, int64_t i0, int64_t r, int64_t *qa, int64_t *qb,
                         int64_t *qe, int64_t *jlo, int64_t *jhi) {
  query_ranges(J, b, i0, r, qa, qb, qe);
  *jlo = J->Nk;
  *jhi = 0;
  for (int64_t o = 0; o < r; o++)
    if (qa[o] < qb[o]) {
      if (qa[o] < *jlo) *jlo = qa[o];
      if (qb[o] > *jhi) *jhi = qb[o];
    }
}

enum { TILE_SKIP, TILE_CLEAN, TILE_MASKED };

/* Class of the tile keys [k0, k1) x query rows i0 + [0, nq): skipped when the pattern keeps no
 * entry of it (attn_attention_tile_visible, O(1): window and sparse work stays banded), when no
 * row sees a key, or when every key a row sees is a filled one whose weight underflows to 0
 * (negligible[o]: the row's max, or log-sum-exp, lies more than 150 above the fill); clean when
 * every row sees every key unfilled, there is no keep-mask and the pattern keeps the whole tile. */
static int classify(const attn_attention_job *J, int64_t i0, int64_t nq, int64_t k0, int64_t k1, const int64_t *qa,
                    const int64_t *qb, const int64_t *qe, const float *level, float fill2) {
  if (nq < 1 || !attn_attention_tile_visible(J, i0, i0 + nq, k0, k1)) return TILE_SKIP;
  int visible = 0, clean = J->mask == NULL && attn_attention_tile_full(J, i0, i0 + nq, k0, k1), needed = 0;
  for (int64_t o = 0; o < nq; o++) {
    int64_t lo = qa[o] > k0 ? qa[o] : k0, hi = qb[o] < k1 ? qb[o] : k1;
    if (!(qa[o] <= k0 && k1 <= qe[o])) clean = 0;
    if (lo >= hi) continue;
    visible = 1;
    if (lo < qe[o] || !(level[o] > fill2 + 150.0f)) needed = 1;
  }
  if (!visible || !needed) return TILE_SKIP;
  return clean ? TILE_CLEAN : TILE_MASKED;
}

/* Whether the keep-mask and the pattern's rule keep entry (b, i, j) inside i's key range. */
static inline int keeps_at(const attn_attention_job *J, int64_t b, int64_t i, int64_t j) {
  if (!attn_attention_rule_keeps(J, i, j)) return 0;
  if (!J->mask) return 1;
  size_t off = (size_t)(attn_attention_head_off(b, J->H, 1, J->msb, J->msh) + i * J->msr + j * J->msc);
  return J->mdt == ATTN_F32 ? ((const float *)J->mask)[off] != 0 : ((const double *)J->mask)[off] != 0;
}

/* Masks tile T (rows x TW): lanes_q says whether lanes are queries (else rows are). Removed
 * entries become -inf, filled ones fill2. Query offsets index qa/qb/qe from q0; keys from k0.
 * The range tests are branch-free selects (they vectorise); the keep-mask is read afterwards. */
static void mask_tile(const attn_attention_job *J, int64_t b, float *T, int64_t rows, int lanes_q, int64_t q0,
                      int64_t k0, const int64_t *qa, const int64_t *qb, const int64_t *qe, float fill2) {
  const int sparse = J->mask || J->rule; /* entries removed inside the ranges */
  int64_t alo = 0, bhi = INT64_MAX; /* lanes_q: rows (keys) in [alo, bhi) that every lane sees unfilled */
  if (lanes_q)
    for (int64_t l = 0; l < TW; l++) {
      alo = qa[l] > alo ? qa[l] : alo;
      bhi = qb[l] < bhi ? qb[l] : bhi;
      bhi = qe[l] < bhi ? qe[l] : bhi;
    }
  for (int64_t n = 0; n < rows; n++) {
    float *x = T + n * TW;
    if (!sparse && (lanes_q ? k0 + n >= alo && k0 + n < bhi
                             : qa[n] <= k0 && k0 + TW <= qb[n] && k0 + TW <= qe[n]))
      continue; /* nothing to mask in this row (the clean part of a tile the diagonal cuts) */
    if (lanes_q) {
      const int64_t j = k0 + n;
      for (int64_t l = 0; l < TW; l++) {
        float v = j >= qe[l] ? fill2 : x[l];
        x[l] = (j < qa[l]) | (j >= qb[l]) ? -INFINITY : v;
      }
    } else {
      const int64_t a = qa[n], bb = qb[n], e = qe[n];
      for (int64_t l = 0; l < TW; l++) {
        const int64_t j = k0 + l;
        float v = j >= e ? fill2 : x[l];
        x[l] = (j < a) | (j >= bb) ? -INFINITY : v;
      }
    }
    if (sparse)
      for (int64_t l = 0; l < TW; l++) {
        int64_t o = lanes_q ? l : n, j = k0 + (lanes_q ? n : l);
        if (j >= qa[o] && j < qb[o] && !keeps_at(J, b, q0 + o, j)) x[l] = -INFINITY;
      }
  }
}

/* Adds the additive part of the scores (attn_attention_has_bias: the bias and ALiBi), in base-2
 * units, to tile T (rows x TW) of row b before mask_tile: lanes_q as there (lanes are queries
 * q0 + o and rows keys k0 + n, or lanes keys and rows queries); only the first nlanes lanes are
 * real (the others are masked or never used), and every row is. The bias is read through its
 * strides (a broadcast dim has stride 0), ALiBi's -slope |i - j| is computed here. */
static void bias_tile(const attn_attention_job *J, int64_t b, float *T, int64_t rows, int lanes_q, int64_t q0,
                      int64_t k0, int64_t nlanes) {
  const float l2e = 1.4426950408889634f;
  double slope;
  const float *bq = (const float *)attn_attention_bias_row(J, b, q0, &slope); /* query q0's row */
  const float s2 = (float)(-slope * 1.4426950408889634);
  const int64_t sr = J->bsr, sc = J->bsc;
  for (int64_t n = 0; n < rows; n++) {
    float *x = T + n * TW;
    /* lanes_q: entry o is (q0 + o, k0 + n), |i - j| = |c + o|; else (q0 + n, k0 + o), |c - o| */
    const float c = (float)(lanes_q ? q0 - (k0 + n) : q0 + n - k0);
    if (bq) {
      const float *p = lanes_q ? bq + (k0 + n) * sc : bq + n * sr + k0 * sc;
      const int64_t st = lanes_q ? sr : sc;
      for (int64_t o = 0; o < nlanes; o++) x[o] += l2e * p[o * st];
    }
    if (J->slopes) {
      if (lanes_q)
        for (int64_t o = 0; o < nlanes; o++) x[o] += s2 * fabsf(c + (float)o);
      else
        for (int64_t o = 0; o < nlanes; o++) x[o] += s2 * fabsf(c - (float)o);
    }
  }
}

/* The lane vectors each block of FLASH_NR rows of a masked tile computes (mk_masked), as the range
 * from the first to the last vector one of whose lanes sees one of the block's rows: lanes are
 * queries with visible keys [qa, qb) and rows keys j0 + n (forward, dq), nrows rows. */
static void vis_query_lanes(const int64_t *qa, const int64_t *qb, int64_t j0, int64_t nrows, int *vlo, int *vhi) {
  int64_t lo[FLASH_NV], hi[FLASH_NV];
  for (int v = 0; v < FLASH_NV; v++) {
    lo[v] = INT64_MAX;
    hi[v] = INT64_MIN;
    for (int l = v * FLASH_VL; l < (v + 1) * FLASH_VL; l++)
      if (qa[l] < qb[l]) {
        lo[v] = qa[l] < lo[v] ? qa[l] : lo[v];
        hi[v] = qb[l] > hi[v] ? qb[l] : hi[v];
      }
  }
  for (int i = 0; i * FLASH_NR < nrows; i++) {
    int64_t bl = j0 + i * FLASH_NR, bh = bl + FLASH_NR;
    vlo[i] = FLASH_NV;
    vhi[i] = 0;
    for (int v = 0; v < FLASH_NV; v++)
      if (lo[v] < bh && hi[v] > bl) {
        vlo[i] = v < vlo[i] ? v : vlo[i];
        vhi[i] = v + 1;
      }
  }
}

/* The same for lanes that are keys k0 + l and rows that are queries seeing keys [qa[n], qb[n])
 * (dk, dv), and kbeg[v]: the first row from which on vector v has a lane some row sees
 * (non-decreasing, as mk_bounded wants: the least over v and the vectors after it). */
static void vis_key_lanes(const int64_t *qa, const int64_t *qb, int64_t k0, int64_t nrows, int *vlo, int *vhi,
                          int64_t *kbeg) {
  for (int v = 0; v < FLASH_NV; v++) {
    kbeg[v] = nrows;
    for (int64_t n = 0; n < nrows; n++)
      if (qa[n] < qb[n] && qa[n] < k0 + (v + 1) * FLASH_VL && qb[n] > k0 + v * FLASH_VL) {
        kbeg[v] = n;
        break;
      }
  }
  for (int v = FLASH_NV - 2; v >= 0; v--) kbeg[v] = kbeg[v + 1] < kbeg[v] ? kbeg[v + 1] : kbeg[v];
  for (int i = 0; i * FLASH_NR < nrows; i++) {
    int64_t bl = INT64_MAX, bh = INT64_MIN;
    for (int64_t n = i * FLASH_NR; n < (i + 1) * FLASH_NR && n < nrows; n++)
      if (qa[n] < qb[n]) {
        bl = qa[n] < bl ? qa[n] : bl;
        bh = qb[n] > bh ? qb[n] : bh;
      }
    vlo[i] = FLASH_NV;
    vhi[i] = 0;
    for (int v = 0; v < FLASH_NV; v++)
      if (k0 + v * FLASH_VL < bh && k0 + (v + 1) * FLASH_VL > bl) {
        vlo[i] = v < vlo[i] ? v : vlo[i];
        vhi[i] = v + 1;
      }
  }
}

/* kend[v] for the products over the rows (keys j0 + n) of a masked tile whose lanes are queries:
 * the keys past the end of every range in vector v have weight 0 there (non-decreasing: a later
 * bound only adds zero terms). */
static void lane_kend(const int64_t *qb, int64_t j0, int64_t nb, int64_t *kend) {
  int64_t run = 0;
  for (int v = 0; v < FLASH_NV; v++) {
    int64_t h = 0;
    for (int l = 0; l < FLASH_VL; l++) h = qb[v * FLASH_VL + l] > h ? qb[v * FLASH_VL + l] : h;
    int64_t e = h - j0 < 0 ? 0 : h - j0 > nb ? nb : h - j0;
    kend[v] = run = e > run ? e : run;
  }
}

/* Scores of query block (b, i0) (r queries, packed scaled in Qt) against keys [j0, j0 + nb) into
 * S (one row per key, queries in lanes), masked; the tile's class is returned (TILE_SKIP: S is
 * not written). level: each row's running max or log-sum-exp, for classify. mx (NULL: none)
 * takes in the scores of a clean tile as a lane-wise running max. */
static inline int query_tile(const attn_flash_job *F, int64_t b, int64_t i0, int64_t r, int64_t j0, int64_t nb,
                             const int64_t *qa, const int64_t *qb, const int64_t *qe, const float *level,
                             const float *Qt, float *S, float *mx) {
  const attn_attention_job *J = F->J;
  int cls = classify(J, i0, r, j0, j0 + nb, qa, qb, qe, level, F->fill2);
  if (cls == TILE_SKIP) return cls;
  if (cls == TILE_MASKED) {
    int vlo[FLASH_MAXNB], vhi[FLASH_MAXNB];
    vis_query_lanes(qa, qb, j0, nb, vlo, vhi);
    mk_masked(J->d, nb, Qt, attn_flash_head(&F->k, b) + j0 * F->k.sr, F->k.sr, S, vlo, vhi);
    if (attn_attention_has_bias(J)) bias_tile(J, b, S, nb, 1, i0, j0, r);
    mask_tile(J, b, S, nb, 1, i0, j0, qa, qb, qe, F->fill2);
  } else if (attn_attention_has_bias(J)) { /* (the running max then comes from the biased tile) */
    mk(J->d, nb, Qt, attn_flash_head(&F->k, b) + j0 * F->k.sr, F->k.sr, 1, S, NULL, 0);
    bias_tile(J, b, S, nb, 1, i0, j0, r);
  } else if (mx) {
    mk_scores_max(J->d, nb, Qt, attn_flash_head(&F->k, b) + j0 * F->k.sr, F->k.sr, S, mx);
  } else {
    mk(J->d, nb, Qt, attn_flash_head(&F->k, b) + j0 * F->k.sr, F->k.sr, 1, S, NULL, 0);
  }
  return cls;
}

/* ---- transposes ------------------------------------------------------------ */

/* x[i][p] -> x[p][i] for a block of FLASH_VL vectors: at each stage h (FLASH_VL / 2 down to 1)
 * rows i and i + h swap their off-diagonal h x h sub-blocks, one two-source shuffle per row.
 * Queries sit in lanes inside the tiles but in rows outside, so every packed operand and every
 * output row crosses one; element by element that was ~4% of a causal forward. */
#if FLASH_VL == 16
#define FLASH_LANES(M, h)                                                                                     \
  M(h, 0), M(h, 1), M(h, 2), M(h, 3), M(h, 4), M(h, 5), M(h, 6), M(h, 7), M(h, 8), M(h, 9), M(h, 10), M(h, 11), \
      M(h, 12), M(h, 13), M(h, 14), M(h, 15)
#elif FLASH_VL == 8
#define FLASH_LANES(M, h) M(h, 0), M(h, 1), M(h, 2), M(h, 3), M(h, 4), M(h, 5), M(h, 6), M(h, 7)
#elif FLASH_VL == 4
#define FLASH_LANES(M, h) M(h, 0), M(h, 1), M(h, 2), M(h, 3)
#endif
#define FLASH_TLO(h, p) (((p) & (h)) ? FLASH_VL + (p) - (h) : (p))
#define FLASH_THI(h, p) (((p) & (h)) ? FLASH_VL + (p) : (p) + (h))
#define FLASH_TSTAGE(h)                                                    \
  for (int i = 0; i < FLASH_VL; i++)                                       \
    if (!(i & (h))) {                                                      \
      flash_vf a = x[i], b = x[i + (h)];                                   \
      x[i] = __builtin_shufflevector(a, b, FLASH_LANES(FLASH_TLO, h));     \
      x[i + (h)] = __builtin_shufflevector(a, b, FLASH_LANES(FLASH_THI, h)); \
    }

static inline void vtranspose(flash_vf *x) {
#if defined(__clang__) || __GNUC__ >= 12 /* __builtin_shufflevector */
#if FLASH_VL >= 16
  FLASH_TSTAGE(8)
#endif
#if FLASH_VL >= 8
  FLASH_TSTAGE(4)
#endif
  FLASH_TSTAGE(2)
  FLASH_TSTAGE(1)
#else
  float t[FLASH_VL][FLASH_VL];
  memcpy(t, x, sizeof t);
  for (int i = 0; i < FLASH_VL; i++)
    for (int p = 0; p < FLASH_VL; p++) x[i][p] = t[p][i];
#endif
}

/* ---- forward ---------------------------------------------------------------- */

/* dst[c][o] = scale * src[o][c] (rows o < 64, zero past `rows`): whole FLASH_VL x FLASH_VL blocks
 * through vtranspose, the columns past the last whole block one at a time. */
static void pack_t(float *dst, const float *src, int64_t sr, int64_t rows, int64_t width, float scale) {
  const int64_t wv = width - width % FLASH_VL; /* rows in turn: each is read from start to end */
  for (int64_t o0 = 0; o0 < TW; o0 += FLASH_VL)
    for (int64_t c0 = 0; c0 < wv; c0 += FLASH_VL) {
      flash_vf x[FLASH_VL];
      for (int i = 0; i < FLASH_VL; i++)
        x[i] = o0 + i < rows ? vload(src + (o0 + i) * sr + c0) * scale : (flash_vf){0};
      vtranspose(x);
      for (int i = 0; i < FLASH_VL; i++) vstore(dst + (c0 + i) * TW + o0, x[i]);
    }
  for (int64_t c = wv; c < width; c++) {
    float *dp = dst + c * TW;
    for (int64_t o = 0; o < rows; o++) dp[o] = src[o * sr + c] * scale;
    for (int64_t o = rows; o < TW; o++) dp[o] = 0.0f;
  }
}

/* 1 when no element of x[0:n) is inf or NaN (exponent bits all ones; an integer test, so the
 * loop vectorises). */
static inline int finite_f32(const float *x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t c = 0; c < n; c++) {
    uint32_t u;
    memcpy(&u, &x[c], 4);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  return !bad;
}

/* The online softmax of a score tile S (nb rows of TW lanes, base 2): the running max m and sum
 * l of every lane take the tile in, S becomes its weights relative to the new max, and al the
 * factor the output so far is to be rescaled by. A lane whose max is still -inf uses 0 in its
 * place, so its weights stay 0 and the factor is 0. tmax (NULL: none) is the new max when the
 * score product already formed it. */
static void online_softmax(float *S, int64_t nb, float *m, float *l, float *al, const float *tmax) {
  flash_vf mx[FLASH_NV], mu[FLASH_NV], sum[FLASH_NV];
  for (int v = 0; v < FLASH_NV; v++) mx[v] = vload((tmax ? tmax : m) + v * FLASH_VL);
  if (!tmax)
    for (int64_t n = 0; n < nb; n++)
      for (int v = 0; v < FLASH_NV; v++) mx[v] = vmax(vload(S + n * TW + v * FLASH_VL), mx[v]);
  for (int v = 0; v < FLASH_NV; v++) {
    flash_vi none = mx[v] == -INFINITY;
    mu[v] = (flash_vf)(~none & (flash_vi)mx[v]);
    vstore(al + v * FLASH_VL, exp2_v(vload(m + v * FLASH_VL) - mu[v]));
    vstore(m + v * FLASH_VL, mx[v]);
    sum[v] = (flash_vf){0};
  }
  for (int64_t n = 0; n < nb; n++)
    for (int v = 0; v < FLASH_NV; v++) {
      flash_vf p = exp2_v(vload(S + n * TW + v * FLASH_VL) - mu[v]);
      vstore(S + n * TW + v * FLASH_VL, p);
      sum[v] += p;
    }
  for (int v = 0; v < FLASH_NV; v++)
    vstore(l + v * FLASH_VL, vload(l + v * FLASH_VL) * vload(al + v * FLASH_VL) + sum[v]);
}

/* out[o][c] = Ot[c][o] * inv[o] for rows o < r of width dv (contiguous rows): whole blocks through
 * vtranspose, the rest one at a time. */
static void write_rows(float *out, const float *Ot, int64_t r, int64_t dv, const float *inv) {
  int64_t o0 = 0;
  for (; o0 + FLASH_VL <= r; o0 += FLASH_VL) {
    int64_t c0 = 0;
    for (; c0 + FLASH_VL <= dv; c0 += FLASH_VL) {
      flash_vf x[FLASH_VL];
      for (int i = 0; i < FLASH_VL; i++) x[i] = vload(Ot + (c0 + i) * TW + o0);
      vtranspose(x);
      for (int i = 0; i < FLASH_VL; i++) vstore(out + (o0 + i) * dv + c0, x[i] * inv[o0 + i]);
    }
    for (int64_t o = o0; o < o0 + FLASH_VL; o++)
      for (int64_t c = c0; c < dv; c++) out[o * dv + c] = Ot[c * TW + o] * inv[o];
  }
  for (int64_t o = o0; o < r; o++)
    for (int64_t c = 0; c < dv; c++) out[o * dv + c] = Ot[c * TW + o] * inv[o];
}

/* Output, log-sum-exp and (when wanted) weights of queries [i0, i0 + 64) of head b. Returns 0,
 * leaving the results unfinished, when a row has keys but no finite softmax or its output is
 * not finite: the driver then runs the call on the reference path (see attn_flash_item_fn). */
int FLASH_FN(attn_flash_forward_)(const attn_flash_job *F, int64_t b, int64_t i0, float *ws) {
  const attn_attention_job *J = F->J;
  const int64_t Nq = J->Nq, Nk = J->Nk, d = J->d, dv = J->dv;
  const int64_t r = Nq - i0 < TW ? Nq - i0 : TW;
  float *Qt = ws, *Ot = Qt + d * TW, *S = Ot + dv * TW, *m = S + KT * TW, *l = m + TW, *al = l + TW, *mu = al + TW;
  float *sum = mu + TW;
  int64_t *qa = (int64_t *)(sum + TW), *qb = qa + TW, *qe = qb + TW;
  int64_t jlo, jhi;
  block_ranges(J, b, i0, r, qa, qb, qe, &jlo, &jhi);
  pack_t(Qt, attn_flash_head(&F->q, b) + i0 * F->q.sr, F->q.sr, r, d, F->qscale);
  memset(Ot, 0, sizeof(float) * (size_t)(dv * TW));
  for (int64_t o = 0; o < TW; o++) {
    m[o] = -INFINITY;
    l[o] = 0;
  }
  const float *V = attn_flash_head(&F->v, b);
  int64_t tiles = 0;
  for (int64_t j0 = jlo; j0 < jhi; j0 += KT) {
    int64_t nb = jhi - j0 < KT ? jhi - j0 : KT;
    memcpy(mu, m, sizeof(float) * TW);
    int cls = query_tile(F, b, i0, r, j0, nb, qa, qb, qe, m, Qt, S, mu);
    if (cls == TILE_SKIP) continue;
    tiles++;
    online_softmax(S, nb, m, l, al, cls == TILE_CLEAN && !attn_attention_has_bias(J) ? mu : NULL);
    if (J->dropout)
      for (int64_t n = 0; n < nb; n++)
        for (int64_t o = 0; o < r; o++) S[n * TW + o] *= (float)attn_attention_keep(J, b, i0 + o, j0 + n);
    if (cls == TILE_MASKED) { /* keys past a lane vector's range have weight 0 there: stop early */
      int64_t kend[FLASH_NV];
      lane_kend(qb, j0, nb, kend);
      mk_bounded(nb, dv, S, V + j0 * F->v.sr, F->v.sr, Ot, al, 2, kend, NULL);
    } else {
      mk(nb, dv, S, V + j0 * F->v.sr, 1, F->v.sr, Ot, al, 2);
    }
  }
  /* A sum that is not positive means no key (zeros, log-sum-exp +inf) or, when the row has keys,
   * no finite softmax (its scores are all -inf, or hold +inf or NaN): that row, like an output
   * that is not finite (an inf or NaN in V; tested on the tile, where the lanes are contiguous,
   * before it is scaled by 1 / sum <= 1), is left to the reference path. */
  if (F->tiles) atomic_fetch_add_explicit(F->tiles, tiles, memory_order_relaxed);
  for (int64_t c = 0; c < dv; c++)
    if (!finite_f32(Ot + c * TW, r)) return 0;
  for (int v = 0; v < FLASH_NV; v++) vstore(al + v * FLASH_VL, log2_v(vload(l + v * FLASH_VL))); /* used where l > 0 */
  for (int64_t o = 0; o < r; o++) {
    if (!(l[o] > 0)) {
      attn_attention_rowmask rm;
      attn_attention_row_mask(J, b, i0 + o, &rm);
      if (attn_sdpa_row_has_key(J, &rm)) return 0;
    }
    sum[o] = l[o] > 0 ? 1.0f / l[o] : 0.0f;
    if (F->lse) F->lse[b * Nq + i0 + o] = l[o] > 0 ? ((double)m[o] + (double)al[o]) * 0.6931471805599453 : INFINITY;
  }
  write_rows(F->out + b * Nq * dv + i0 * dv, Ot, r, dv, sum);
  if (!F->weights) return 1;
  /* weights: the scores once more, normalised with the final max and sum */
  for (int64_t o = 0; o < r; o++) memset(F->weights + (b * Nq + i0 + o) * Nk, 0, sizeof(float) * (size_t)Nk);
  for (int64_t o = 0; o < TW; o++) {
    mu[o] = m[o] == -INFINITY ? 0.0f : m[o];
    sum[o] = l[o] > 0 ? 1.0f / l[o] : 0.0f;
  }
  for (int64_t j0 = jlo; j0 < jhi; j0 += KT) {
    int64_t nb = jhi - j0 < KT ? jhi - j0 : KT;
    int cls = query_tile(F, b, i0, r, j0, nb, qa, qb, qe, m, Qt, S, NULL);
    if (cls == TILE_SKIP) continue;
    for (int64_t n = 0; n < nb; n++)
      for (int64_t o = 0; o < TW; o++) S[n * TW + o] = exp2_f(S[n * TW + o] - mu[o]) * sum[o];
    for (int64_t o = 0; o < r; o++) {
      float *wrow = F->weights + (b * Nq + i0 + o) * Nk + j0;
      for (int64_t n = 0; n < nb; n++) wrow[n] = S[n * TW + o];
    }
  }
  return 1;
}

/* ---- backward ----------------------------------------------------------------- */

/* dq of queries [i0, i0 + 64) of head b: loops over key tiles, rebuilding P from the saved
 * log-sum-exp. dS = P (dP - D) with D = dout . out; filled and removed keys give 0. Returns 0
 * when a dq row is not finite (the driver then runs the reference backward). */
int FLASH_FN(attn_flash_backward_q_)(const attn_flash_job *F, int64_t b, int64_t i0, float *ws) {
  const attn_attention_job *J = F->J;
  const int64_t Nq = J->Nq, d = J->d, dv = J->dv;
  const int64_t r = Nq - i0 < TW ? Nq - i0 : TW;
  float *Qt = ws, *dOt = Qt + d * TW, *dQt = dOt + dv * TW, *S = dQt + d * TW, *dP = S + TW * TW;
  float *lse2 = dP + TW * TW, *D = lse2 + TW;
  int64_t *qa = (int64_t *)(D + TW), *qb = qa + TW, *qe = qb + TW;
  int64_t jlo, jhi;
  block_ranges(J, b, i0, r, qa, qb, qe, &jlo, &jhi);
  pack_t(Qt, attn_flash_head(&F->q, b) + i0 * F->q.sr, F->q.sr, r, d, F->qscale);
  pack_t(dOt, attn_flash_head(&F->dout, b) + i0 * F->dout.sr, F->dout.sr, r, dv, 1.0f);
  memset(dQt, 0, sizeof(float) * (size_t)(d * TW));
  for (int64_t o = 0; o < TW; o++) {
    lse2[o] = o < r ? F->lse2[b * Nq + i0 + o] : INFINITY;
    D[o] = o < r ? F->D[b * Nq + i0 + o] : 0.0f;
  }
  const float *K = attn_flash_head(&F->k, b), *V = attn_flash_head(&F->v, b);
  for (int64_t j0 = jlo; j0 < jhi; j0 += TW) {
    int64_t nb = jhi - j0 < TW ? jhi - j0 : TW;
    int cls = query_tile(F, b, i0, r, j0, nb, qa, qb, qe, lse2, Qt, S, NULL);
    if (cls == TILE_SKIP) continue;
    if (cls == TILE_MASKED) { /* the lane vectors the scores left out are 0 in dP too */
      int vlo[FLASH_MAXNB], vhi[FLASH_MAXNB];
      vis_query_lanes(qa, qb, j0, nb, vlo, vhi);
      mk_masked(dv, nb, dOt, V + j0 * F->v.sr, F->v.sr, dP, vlo, vhi);
    } else {
      mk(dv, nb, dOt, V + j0 * F->v.sr, F->v.sr, 1, dP, NULL, 0);
    }
    if (J->dropout)
      for (int64_t n = 0; n < nb; n++)
        for (int64_t o = 0; o < r; o++) dP[n * TW + o] *= (float)attn_attention_keep(J, b, i0 + o, j0 + n);
    for (int64_t n = 0; n < nb; n++) /* dS = P (dP - D), P = exp2(S - lse2) <= 1 */
      for (int v = 0; v < FLASH_NV; v++) {
        float *g = dP + n * TW + v * FLASH_VL;
        flash_vf p = exp2_v(vload(S + n * TW + v * FLASH_VL) - vload(lse2 + v * FLASH_VL));
        vstore(g, p * (vload(g) - vload(D + v * FLASH_VL)));
      }
    if (cls == TILE_MASKED)
      for (int64_t n = 0; n < nb; n++)
        for (int64_t o = 0; o < TW; o++)
          if (j0 + n >= qe[o]) dP[n * TW + o] = 0.0f;
    if (cls == TILE_MASKED) {
      int64_t kend[FLASH_NV];
      lane_kend(qb, j0, nb, kend);
      mk_bounded(nb, d, dP, K + j0 * F->k.sr, F->k.sr, dQt, NULL, 1, kend, NULL);
    } else {
      mk(nb, d, dP, K + j0 * F->k.sr, 1, F->k.sr, dQt, NULL, 1);
    }
  }
  float sc = (float)J->scale;
  int ok = 1;
  for (int64_t o = 0; o < r; o++) {
    float *row = F->dq + (b * Nq + i0 + o) * d;
    for (int64_t c = 0; c < d; c++) row[c] = dQt[c * TW + o] * sc;
    ok &= finite_f32(row, d);
  }
  return ok;
}

/* dk and dv of keys [j0, j0 + 64) of head b: lanes are keys, rows are queries, looping over
 * query tiles. Returns 0 when a dk or dv row is not finite. */
int FLASH_FN(attn_flash_backward_k_)(const attn_flash_job *F, int64_t b, int64_t j0, float *ws) {
  const attn_attention_job *J = F->J;
  const int64_t Nq = J->Nq, Nk = J->Nk, d = J->d, dv = J->dv;
  const int64_t nk = Nk - j0 < TW ? Nk - j0 : TW, j1 = j0 + nk;
  float *Kt = ws, *Vt = Kt + d * TW, *dKt = Vt + dv * TW, *dVt = dKt + d * TW, *S = dVt + dv * TW,
        *dP = S + TW * TW;
  float *lse2 = dP + TW * TW;
  int64_t *qa = (int64_t *)(lse2 + TW), *qb = qa + TW, *qe = qb + TW;
  pack_t(Kt, attn_flash_head(&F->k, b) + j0 * F->k.sr, F->k.sr, nk, d, F->qscale);
  pack_t(Vt, attn_flash_head(&F->v, b) + j0 * F->v.sr, F->v.sr, nk, dv, 1.0f);
  memset(dKt, 0, sizeof(float) * (size_t)(d * TW));
  memset(dVt, 0, sizeof(float) * (size_t)(dv * TW));
  const float *Q = attn_flash_head(&F->q, b), *dO = attn_flash_head(&F->dout, b);
  /* causal: queries before j0 see none of these keys */
  int64_t istart = J->causal && J->window < 0 ? (j0 / TW) * TW : 0;
  for (int64_t i0 = istart; i0 < Nq; i0 += TW) {
    int64_t nr = Nq - i0 < TW ? Nq - i0 : TW;
    if (!attn_attention_tile_visible(J, i0, i0 + nr, j0, j1)) continue; /* before the ranges: O(1) */
    query_ranges(J, b, i0, nr, qa, qb, qe);
    for (int64_t o = 0; o < TW; o++) lse2[o] = o < nr ? F->lse2[b * Nq + i0 + o] : INFINITY;
    int cls = classify(J, i0, nr, j0, j1, qa, qb, qe, lse2, F->fill2);
    if (cls == TILE_SKIP) continue;
    /* masked (the causal diagonal): each block of query rows computes the lane vectors of keys
     * some of its rows see, and the products over the rows start each vector at its first row */
    int vlo[FLASH_MAXNB], vhi[FLASH_MAXNB];
    int64_t kbeg[FLASH_NV];
    if (cls == TILE_MASKED) {
      vis_key_lanes(qa, qb, j0, nr, vlo, vhi, kbeg);
      mk_masked(d, nr, Kt, Q + i0 * F->q.sr, F->q.sr, S, vlo, vhi);
      if (attn_attention_has_bias(J)) bias_tile(J, b, S, nr, 0, i0, j0, nk);
      mask_tile(J, b, S, nr, 0, i0, j0, qa, qb, qe, F->fill2);
      mk_masked(dv, nr, Vt, dO + i0 * F->dout.sr, F->dout.sr, dP, vlo, vhi);
    } else {
      mk(d, nr, Kt, Q + i0 * F->q.sr, F->q.sr, 1, S, NULL, 0);
      if (attn_attention_has_bias(J)) bias_tile(J, b, S, nr, 0, i0, j0, nk);
      mk(dv, nr, Vt, dO + i0 * F->dout.sr, F->dout.sr, 1, dP, NULL, 0);
    }
    for (int64_t n = 0; n < nr; n++) {
      const float L2 = lse2[n], Dn = F->D[b * Nq + i0 + n];
      float *s = S + n * TW, *g = dP + n * TW;
      if (J->dropout) {
        for (int64_t o = 0; o < nk; o++) {
          float p = exp2_f(s[o] - L2), kf = (float)attn_attention_keep(J, b, i0 + n, j0 + o);
          g[o] = p * (g[o] * kf - Dn);
          s[o] = p * kf;
        }
        for (int64_t o = nk; o < TW; o++) s[o] = g[o] = 0;
      } else {
        for (int v = 0; v < FLASH_NV; v++) {
          flash_vf p = exp2_v(vload(s + v * FLASH_VL) - L2);
          vstore(g + v * FLASH_VL, p * (vload(g + v * FLASH_VL) - Dn));
          vstore(s + v * FLASH_VL, p);
        }
      }
      if (cls == TILE_MASKED) /* filled keys: no score gradient; their weight comes from fillp (exact) */
        for (int64_t o = 0; o < TW; o++) {
          int64_t j = j0 + o;
          if (j < qe[n]) continue;
          g[o] = 0.0f;
          if (j < qb[n] && keeps_at(J, b, i0 + n, j))
            s[o] = F->fillp[b * Nq + i0 + n] * (J->dropout ? (float)attn_attention_keep(J, b, i0 + n, j) : 1.0f);
        }
    }
    if (cls == TILE_MASKED) {
      mk_bounded(nr, dv, S, dO + i0 * F->dout.sr, F->dout.sr, dVt, NULL, 1, NULL, kbeg);
      mk_bounded(nr, d, dP, Q + i0 * F->q.sr, F->q.sr, dKt, NULL, 1, NULL, kbeg);
    } else {
      mk(nr, dv, S, dO + i0 * F->dout.sr, 1, F->dout.sr, dVt, NULL, 1);
      mk(nr, d, dP, Q + i0 * F->q.sr, 1, F->q.sr, dKt, NULL, 1);
    }
  }
  float sc = (float)J->scale;
  int ok = 1;
  for (int64_t o = 0; o < nk; o++) {
    if (F->dk) {
      float *row = F->dk + (b * Nk + j0 + o) * d;
      for (int64_t c = 0; c < d; c++) row[c] = dKt[c * TW + o] * sc;
      ok &= finite_f32(row, d);
    }
    if (F->dv) {
      float *row = F->dv + (b * Nk + j0 + o) * dv;
      for (int64_t c = 0; c < dv; c++) row[c] = dVt[c * TW + o];
      ok &= finite_f32(row, dv);
    }
  }
  return ok;
}

/* The FMA peak probe: 16 independent multiply-add chains (enough to cover the latency of two
 * FMA pipes), iters rounds; returns a lane sum so the work is not optimised away. */
static double fma_loop(int64_t iters) {
  flash_vf acc[16], a = (flash_vf){0} + 0.999999f, c = (flash_vf){0} + 1e-7f;
  for (int r = 0; r < 16; r++) acc[r] = (flash_vf){0} + (float)r;
  for (int64_t it = 0; it < iters; it++)
    for (int r = 0; r < 16; r++) acc[r] = acc[r] * a + c;
  double s = 0;
  for (int r = 0; r < 16; r++)
    for (int l = 0; l < FLASH_VL; l++) s += acc[r][l];
  return s;
}

const attn_flash_kernels FLASH_FN(attn_flash_kernels_) = {
    .name = FLASH_NAME,
    .forward = FLASH_FN(attn_flash_forward_),
    .backward_q = FLASH_FN(attn_flash_backward_q_),
    .backward_k = FLASH_FN(attn_flash_backward_k_),
    .fma_loop = fma_loop,
    .fma_flops = 16 * 2 * FLASH_VL,
};
