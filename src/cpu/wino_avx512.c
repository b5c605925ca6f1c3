/* The Winograd transforms for the avx512 path, compiled with its own flags (see CPU_FLAGS_avx512
 * in the Makefile); only on x86-64. float64 takes wino_body.h's loops; float32 has its own
 * transforms here: 16 tiles per vector, read straight from the plane by masked loads (zeros
 * outside it: no padded copy) and split into even and odd columns by two-source permutes, so a
 * tile row costs one pass instead of wino_body.h's six over scratch. A row of at most 8 tiles
 * (tw + 1 <= 8: planes up to 14 wide) shares its vectors with the next tile row (lanes [0, Tr)
 * and [Tr, 2 Tr), which are also adjacent in the flat layout), so small planes fill whole
 * vectors. Each entry is the same operations in the same order as wino_body.h's: the same bits. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#include "cpu/wino_avx512.h"
#include "cpu/wino_cpu.h"

/* Permute indices that take the even (odd = 1) entries of tile columns from two rows of 16: lanes
 * [0, tr) from the first row's entries, lanes [tr, 16) from the second's (tr 16: the first row's
 * 16 then the second's, i.e. 32 consecutive entries; tr 8 the same; tr < 8 packs two short rows). */
static inline __attribute__((always_inline)) __m512i split_index(int64_t tr, int odd) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i first = _mm512_add_epi32(_mm512_add_epi32(lane, lane), _mm512_set1_epi32(odd));
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32((int32_t)(16 - 2 * tr)));
  const __mmask16 in_first = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int32_t)tr));
  return _mm512_and_si512(_mm512_mask_blend_epi32(in_first, second, first), _mm512_set1_epi32(31));
}

/* a[k][c], rows k 0..3 of the tiles' 4x4 patches, columns c: the input transform B^T d B of 16
 * tiles into v (16 planes ps apart, lanes n): along the rows (0 - 2, 1 + 2, 2 - 1, 1 - 3), then
 * along the columns the same. */
static inline __attribute__((always_inline)) void input16(float *v, int64_t ps, __mmask16 n, const __m512 a[4][4]) {
  #pragma GCC unroll 16
  for (int i = 0; i < 4; i++) {
    __m512 u[4];
    #pragma GCC unroll 16
    for (int c = 0; c < 4; c++)
      u[c] = i == 0   ? _mm512_sub_ps(a[0][c], a[2][c])
             : i == 1 ? _mm512_add_ps(a[1][c], a[2][c])
             : i == 2 ? _mm512_sub_ps(a[2][c], a[1][c])
                      : _mm512_sub_ps(a[1][c], a[3][c]);
    _mm512_mask_storeu_ps(v + (4 * i) * ps, n, _mm512_sub_ps(u[0], u[2]));
    _mm512_mask_storeu_ps(v + (4 * i + 1) * ps, n, _mm512_add_ps(u[1], u[2]));
    _mm512_mask_storeu_ps(v + (4 * i + 2) * ps, n, _mm512_sub_ps(u[2], u[1]));
    _mm512_mask_storeu_ps(v + (4 * i + 3) * ps, n, _mm512_sub_ps(u[1], u[3]));
  }
}

/* The four rows' column vectors of 16 tiles: lo[k] the padded row that gives lanes [0, tr), hi[k]
 * the one for lanes [tr, 16) (the same row when tr is 16); entries from padded column q on. */
static inline __attribute__((always_inline)) void gather16(const float *const lo[4], const __mmask16 klo[4], const float *const hi[4],
                            const __mmask16 khi[4], int64_t W, int64_t q, __m512i ev, __m512i od, int64_t off,
                            __m512 a[4][4]) {
  const __mmask16 m0 = in_row16(W, q), m1 = in_row16(W, q + off), m2 = in_row16(W, q + 2),
                  m3 = in_row16(W, q + 2 + off);
  #pragma GCC unroll 16
  for (int k = 0; k < 4; k++) {
    const __m512 x0 = load16(lo[k], q, m0 & klo[k]), x1 = load16(hi[k], q + off, m1 & khi[k]);
    const __m512 x2 = load16(lo[k], q + 2, m2 & klo[k]), x3 = load16(hi[k], q + 2 + off, m3 & khi[k]);
    a[k][0] = _mm512_permutex2var_ps(x0, ev, x1), a[k][1] = _mm512_permutex2var_ps(x0, od, x1);
    a[k][2] = _mm512_permutex2var_ps(x2, ev, x3), a[k][3] = _mm512_permutex2var_ps(x2, od, x3);
  }
}

static void input_f32_own(const attn_wino_geom *g, const float *x, int64_t ti0, int64_t rows, float *V, int64_t ps,
                          float *scratch) {
  (void)scratch;
  const int64_t Tr = g->tw + 1, pair = Tr <= 8;
  const __m512i ev = split_index(pair ? Tr : 16, 0), od = split_index(pair ? Tr : 16, 1);
  for (int64_t t = 0; t < rows; t += pair ? 2 : 1) {
    const float *lo[4], *hi[4];
    __mmask16 klo[4], khi[4];
    #pragma GCC unroll 16
    for (int k = 0; k < 4; k++) {
      lo[k] = plane_row(x, g->H, g->W, 2 * (ti0 + t) + k - g->ph, &klo[k]);
      if (pair && t + 1 < rows)
        hi[k] = plane_row(x, g->H, g->W, 2 * (ti0 + t) + 2 + k - g->ph, &khi[k]);
      else
        hi[k] = lo[k], khi[k] = pair ? 0 : klo[k];
    }
    __m512 a[4][4];
    if (pair) {
      gather16(lo, klo, hi, khi, g->W, -g->pw, ev, od, 0, a);
      input16(V + t * Tr, ps, lanes_below(t + 1 < rows ? 2 * Tr : Tr), a);
    } else {
      for (int64_t tj0 = 0; tj0 < Tr; tj0 += 16) {
        gather16(lo, klo, hi, khi, g->W, 2 * tj0 - g->pw, ev, od, 16, a);
        input16(V + t * Tr + tj0, ps, lanes_below(Tr - tj0), a);
      }
    }
  }
}

/* A^T m A + bias of 16 tiles (m: 16 planes ps apart, lanes n read): the tiles' four outputs. */
static inline __attribute__((always_inline)) void output16(const float *m, int64_t ps, __mmask16 n, __m512 b, __m512 y[4]) {
  __m512 p[16], a[4], c[4];
  #pragma GCC unroll 16
  for (int k = 0; k < 16; k++) p[k] = _mm512_maskz_loadu_ps(n, m + k * ps);
  #pragma GCC unroll 16
  for (int j = 0; j < 4; j++) { /* columns of A^T m: a = rows 0 + 1 + 2, c = rows 1 - 2 - 3 */
    a[j] = _mm512_add_ps(_mm512_add_ps(p[j], p[4 + j]), p[8 + j]);
    c[j] = _mm512_sub_ps(_mm512_sub_ps(p[4 + j], p[8 + j]), p[12 + j]);
  }
  y[0] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), a[2]), b);
  y[1] = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(a[1], a[2]), a[3]), b);
  y[2] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c[0], c[1]), c[2]), b);
  y[3] = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(c[1], c[2]), c[3]), b);
}

/* Lanes [from, from + 8) of the tiles' left (l) and right (r) outputs, interleaved: 16 columns. */
static inline __attribute__((always_inline)) __m512i zip_index(int64_t from) {
  const __m512i half = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i side = _mm512_setr_epi32(0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16);
  const __m512i at = _mm512_and_si512(_mm512_add_epi32(half, _mm512_set1_epi32((int32_t)from)), _mm512_set1_epi32(15));
  return _mm512_or_si512(at, side);
}

static void output_f32_own(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows, float bias,
                           float *y, float *scratch) {
  (void)scratch;
  const int64_t Tr = g->tw + 1, Wo = g->Wo, pair = Tr <= 8;
  const __m512 b = _mm512_set1_ps(bias);
  const __m512i z0 = zip_index(0), z1 = zip_index(pair ? Tr : 8);
  __m512 o[4];
  for (int64_t t = 0; t < rows; t += pair ? 2 : 1) {
    const int64_t r = 2 * (ti0 + t);
    float *y0 = y + r * Wo;
    if (pair) { /* tile row t in lanes [0, Tr), t + 1 in [Tr, 2 Tr): rows r, r + 1, r + 2, r + 3 */
      const int both = t + 1 < rows;
      output16(M + t * Tr, ps, lanes_below(both ? 2 * Tr : Tr), b, o);
      const __mmask16 m = lanes_below(Wo);
      _mm512_mask_storeu_ps(y0, m, _mm512_permutex2var_ps(o[0], z0, o[1]));
      if (r + 1 < g->Ho) _mm512_mask_storeu_ps(y0 + Wo, m, _mm512_permutex2var_ps(o[2], z0, o[3]));
      if (both) _mm512_mask_storeu_ps(y0 + 2 * Wo, m, _mm512_permutex2var_ps(o[0], z1, o[1]));
      if (both && r + 3 < g->Ho) _mm512_mask_storeu_ps(y0 + 3 * Wo, m, _mm512_permutex2var_ps(o[2], z1, o[3]));
      continue;
    }
    for (int64_t tj0 = 0; tj0 < g->tw; tj0 += 16) {
      output16(M + t * Tr + tj0, ps, lanes_below(g->tw - tj0), b, o); /* not the dummy or past it */
      const int64_t col = 2 * tj0;
      const __mmask16 m0 = lanes_below(Wo - col), m1 = lanes_below(Wo - col - 16);
      _mm512_mask_storeu_ps(y0 + col, m0, _mm512_permutex2var_ps(o[0], z0, o[1]));
      if (m1) /* (y0 + col + 16 may lie past the plane when no lane is stored) */
        _mm512_mask_storeu_ps(y0 + col + 16, m1, _mm512_permutex2var_ps(o[0], z1, o[1]));
      if (r + 1 < g->Ho) {
        _mm512_mask_storeu_ps(y0 + Wo + col, m0, _mm512_permutex2var_ps(o[2], z0, o[3]));
        if (m1) _mm512_mask_storeu_ps(y0 + Wo + col + 16, m1, _mm512_permutex2var_ps(o[2], z1, o[3]));
      }
    }
  }
}

/* A e A^T of 16 tiles into z (16 planes ps apart, lanes n): the tiles' top row (e0, e1) and bottom
 * row (o0, o1). Rows of A e: e, e + o, e - o, -o; each row (a, b) then gives a, a + b, a - b, -b. */
static inline __attribute__((always_inline)) void grad16(float *z, int64_t ps, __mmask16 n, __m512 e0, __m512 e1, __m512 o0, __m512 o1) {
  const __m512 ra[4] = {e0, _mm512_add_ps(e0, o0), _mm512_sub_ps(e0, o0), neg(o0)};
  const __m512 rb[4] = {e1, _mm512_add_ps(e1, o1), _mm512_sub_ps(e1, o1), neg(o1)};
  #pragma GCC unroll 16
  for (int i = 0; i < 4; i++) {
    _mm512_mask_storeu_ps(z + (4 * i) * ps, n, ra[i]);
    _mm512_mask_storeu_ps(z + (4 * i + 1) * ps, n, _mm512_add_ps(ra[i], rb[i]));
    _mm512_mask_storeu_ps(z + (4 * i + 2) * ps, n, _mm512_sub_ps(ra[i], rb[i]));
    _mm512_mask_storeu_ps(z + (4 * i + 3) * ps, n, neg(rb[i]));
  }
}

static void grad_f32_own(const attn_wino_geom *g, const float *dy, int64_t ti0, int64_t rows, float *Z, int64_t ps,
                         float *scratch, double *sum) {
  (void)scratch;
  wino_dsum db = {_mm512_setzero_pd(), _mm512_setzero_pd()}; /* the four rows' entries, per load */
  const int64_t Tr = g->tw + 1, Wo = g->Wo, pair = Tr <= 8;
  const __m512i ev = split_index(pair ? Tr : 16, 0), od = split_index(pair ? Tr : 16, 1);
  for (int64_t t = 0; t < rows; t += pair ? 2 : 1) {
    const int64_t r = 2 * (ti0 + t);
    __mmask16 k[4];
    const float *row[4]; /* dy rows r, r + 1 (lanes [0, Tr)) and r + 2, r + 3 (lanes [Tr, 16)) */
    #pragma GCC unroll 16
    for (int i = 0; i < 4; i++) row[i] = plane_row(dy, g->Ho, Wo, r + i, &k[i]);
    if (pair) {
      const int both = t + 1 < rows;
      const __mmask16 m = lanes_below(Wo), m2 = both ? m : 0;
      const __m512 t0 = load16(row[0], 0, m & k[0]), t1 = load16(row[1], 0, m & k[1]);
      const __m512 t2 = load16(row[2], 0, m2 & k[2]), t3 = load16(row[3], 0, m2 & k[3]);
      if (sum) dsum_add(&db, _mm512_add_ps(_mm512_add_ps(t0, t1), _mm512_add_ps(t2, t3)));
      grad16(Z + t * Tr, ps, lanes_below(both ? 2 * Tr : Tr), _mm512_permutex2var_ps(t0, ev, t2),
             _mm512_permutex2var_ps(t0, od, t2), _mm512_permutex2var_ps(t1, ev, t3), _mm512_permutex2var_ps(t1, od, t3));
      continue;
    }
    for (int64_t tj0 = 0; tj0 < Tr; tj0 += 16) {
      const int64_t q = 2 * tj0;
      const __mmask16 m0 = in_row16(Wo, q), m1 = in_row16(Wo, q + 16);
      const __m512 t0 = load16(row[0], q, m0 & k[0]), t1 = load16(row[0], q + 16, m1 & k[0]);
      const __m512 b0 = load16(row[1], q, m0 & k[1]), b1 = load16(row[1], q + 16, m1 & k[1]);
      if (sum) dsum_add(&db, _mm512_add_ps(_mm512_add_ps(t0, t1), _mm512_add_ps(b0, b1)));
      grad16(Z + t * Tr + tj0, ps, lanes_below(Tr - tj0), _mm512_permutex2var_ps(t0, ev, t1),
             _mm512_permutex2var_ps(t0, od, t1), _mm512_permutex2var_ps(b0, ev, b1), _mm512_permutex2var_ps(b0, od, b1));
    }
  }
  dsum_done(&db, sum);
}

/* B v B^T of 16 tiles (v: 16 planes ps apart, lanes n read): the patches' rows a, split into the
 * entries p[a][b] at columns b = 0..3. Along i with B's rows (v0, v1 - v2 + v3, v1 + v2 - v0, -v3),
 * then along k the same. */
static inline __attribute__((always_inline)) void adjoint16(const float *m, int64_t ps, __mmask16 n, __m512 p[4][4]) {
  __m512 v[16], w[4][4];
  #pragma GCC unroll 16
  for (int k = 0; k < 16; k++) v[k] = _mm512_maskz_loadu_ps(n, m + k * ps);
  #pragma GCC unroll 16
  for (int k = 0; k < 4; k++) {
    w[0][k] = v[k], w[1][k] = _mm512_add_ps(_mm512_sub_ps(v[4 + k], v[8 + k]), v[12 + k]);
    w[2][k] = _mm512_sub_ps(_mm512_add_ps(v[4 + k], v[8 + k]), v[k]), w[3][k] = neg(v[12 + k]);
  }
  #pragma GCC unroll 16
  for (int a = 0; a < 4; a++) {
    p[a][0] = w[a][0], p[a][1] = _mm512_add_ps(_mm512_sub_ps(w[a][1], w[a][2]), w[a][3]);
    p[a][2] = _mm512_sub_ps(_mm512_add_ps(w[a][1], w[a][2]), w[a][0]), p[a][3] = neg(w[a][3]);
  }
}

/* The padded rows' even (e) and odd (o) columns of 16 tiles whose left neighbours' patches end in
 * the lanes below (the lane before lane 0 from prev's last: the tile to the left of the vector). */
static inline __attribute__((always_inline)) void adjoint_cols(const __m512 p[4][4], const __m512 prev[4][4], __m512 e[4], __m512 o[4]) {
  const __m512i up = _mm512_setr_epi32(31, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14);
  #pragma GCC unroll 16
  for (int a = 0; a < 4; a++) {
    e[a] = _mm512_add_ps(p[a][0], _mm512_permutex2var_ps(p[a][2], up, prev[a][2]));
    o[a] = _mm512_add_ps(p[a][1], _mm512_permutex2var_ps(p[a][3], up, prev[a][3]));
  }
}

static void adjoint_f32_own(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows, float *dx,
                            float *scratch, int seams) {
  (void)scratch;
  const int64_t Tr = g->tw + 1, H = g->H, W = g->W, ph = g->ph, pw = g->pw, pair = Tr <= 8;
  const __m512i z0 = zip_index(0), z1 = zip_index(pair ? Tr : 8);
  __m512 p[4][4], prev[4][4], e[4], o[4];
  for (int64_t t = 0; t < rows; t += pair ? 2 : 1) {
    const int64_t y = 2 * (ti0 + t) - ph; /* dx row of the tile row's padded row 0 */
    /* the tile row above left its rows 2 and 3 in rows 0 and 1 (the band above, with the seam) */
    const int top = t > 0 || (seams & ATTN_WINO_ADD_TOP);
    const int add_last = seams & ATTN_WINO_ADD_BOTTOM; /* the band's last rows 2 and 3, likewise below */
    #pragma GCC unroll 16
    for (int a = 0; a < 4; a++) prev[a][2] = prev[a][3] = _mm512_setzero_ps(); /* no tile left of a row */
    if (pair) { /* tile row t in lanes [0, Tr), t + 1 in [Tr, 2 Tr) (the dummy lane between holds zeros) */
      const int both = t + 1 < rows;
      adjoint16(M + t * Tr, ps, lanes_below(both ? 2 * Tr : Tr), p);
      adjoint_cols(p, prev, e, o);
      __m512 r0[4], r1[4]; /* padded rows a of tile rows t (r0) and t + 1 (r1), 2 Tr columns */
      #pragma GCC unroll 16
      for (int a = 0; a < 4; a++) r0[a] = _mm512_permutex2var_ps(e[a], z0, o[a]), r1[a] = _mm512_permutex2var_ps(e[a], z1, o[a]);
      put_row(dx, H, W, y, 0, pw, top, r0[0]);
      put_row(dx, H, W, y + 1, 0, pw, top, r0[1]);
      const int last = both ? t + 2 == rows : t + 1 == rows;
      put_row(dx, H, W, y + 2, 0, pw, !both && last && add_last, both ? _mm512_add_ps(r0[2], r1[0]) : r0[2]);
      put_row(dx, H, W, y + 3, 0, pw, !both && last && add_last, both ? _mm512_add_ps(r0[3], r1[1]) : r0[3]);
      if (both)
        put_row(dx, H, W, y + 4, 0, pw, last && add_last, r1[2]), put_row(dx, H, W, y + 5, 0, pw, last && add_last, r1[3]);
      continue;
    }
    for (int64_t tj0 = 0; tj0 < Tr; tj0 += 16) {
      adjoint16(M + t * Tr + tj0, ps, lanes_below(Tr - tj0), p);
      adjoint_cols(p, prev, e, o);
      #pragma GCC unroll 16
      for (int a = 0; a < 4; a++) {
        prev[a][2] = p[a][2], prev[a][3] = p[a][3];
        const int add = a < 2 ? top : t + 1 == rows && add_last;
        put_row(dx, H, W, y + a, 2 * tj0, pw, add, _mm512_permutex2var_ps(e[a], z0, o[a]));
        put_row(dx, H, W, y + a, 2 * tj0 + 16, pw, add, _mm512_permutex2var_ps(e[a], z1, o[a]));
      }
    }
  }
}

#define WINO_OWN_F32
#define WINO_OWN_ADJOINT_F32
#define WINO_OWN4_F32
#define WINO_SUFFIX avx512
#include "cpu/wino_body.h"
#endif
