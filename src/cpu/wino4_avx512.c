/* The AVX-512 set's float32 Winograd F(4x4, 3x3) transforms (cpu/wino_cpu.h; the plain loops of
 * wino4_body.h are the reference they are tested against). One vector holds one group of 4x4
 * tiles, tile (t, j) of the group in lane 4 j + t: a group's 16 input columns of a padded row are
 * one vector, and a 4x4 transpose inside each 128-bit lane (transpose4) turns four tile rows'
 * vectors of columns 4 j + b into four vectors, one per b, of lanes 4 j + t. So every transform
 * is vertical arithmetic on whole vectors between masked row loads and stores; columns 4 and 5
 * of a patch are columns 2 and 3 of the same rows read two entries further on. The arithmetic is
 * wino4_body.h's, with multiply-adds fused. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>

#include "cpu/wino_avx512.h"
#include "cpu/wino_cpu.h"

#define INLINE static inline __attribute__((always_inline))

/* out[b] lane 4 j + t = in[t] lane 4 j + b, in each 128-bit lane j (an involution). */
INLINE void transpose4(const __m512 in[4], __m512 out[4]) {
  const __m512d t0 = _mm512_castps_pd(_mm512_unpacklo_ps(in[0], in[1]));
  const __m512d t1 = _mm512_castps_pd(_mm512_unpackhi_ps(in[0], in[1]));
  const __m512d t2 = _mm512_castps_pd(_mm512_unpacklo_ps(in[2], in[3]));
  const __m512d t3 = _mm512_castps_pd(_mm512_unpackhi_ps(in[2], in[3]));
  out[0] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2)), out[1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
  out[2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3)), out[3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
}

INLINE __m512 k(float v) { return _mm512_set1_ps(v); }

/* u = B^T d (six values) */
INLINE void bt6(const __m512 d[6], __m512 u[6]) {
  const __m512 s12 = _mm512_add_ps(d[1], d[2]), d12 = _mm512_sub_ps(d[1], d[2]), d31 = _mm512_sub_ps(d[3], d[1]);
  const __m512 d42 = _mm512_sub_ps(d[4], d[2]);
  u[0] = _mm512_fmadd_ps(k(4), d[0], _mm512_fnmadd_ps(k(5), d[2], d[4]));
  u[1] = _mm512_fnmadd_ps(k(4), s12, _mm512_add_ps(d[3], d[4]));
  u[2] = _mm512_fmadd_ps(k(4), d12, _mm512_sub_ps(d[4], d[3]));
  u[3] = _mm512_fmadd_ps(k(2), d31, d42), u[4] = _mm512_fnmadd_ps(k(2), d31, d42);
  u[5] = _mm512_fmadd_ps(k(4), d[1], _mm512_fnmadd_ps(k(5), d[3], d[5]));
}

/* o = A^T m (six values to four) */
INLINE void at6(const __m512 m[6], __m512 o[4]) {
  const __m512 s12 = _mm512_add_ps(m[1], m[2]), d12 = _mm512_sub_ps(m[1], m[2]);
  const __m512 s34 = _mm512_add_ps(m[3], m[4]), d34 = _mm512_sub_ps(m[3], m[4]);
  o[0] = _mm512_add_ps(_mm512_add_ps(m[0], s12), s34), o[1] = _mm512_fmadd_ps(k(2), d34, d12);
  o[2] = _mm512_fmadd_ps(k(4), s34, s12), o[3] = _mm512_add_ps(_mm512_fmadd_ps(k(8), d34, d12), m[5]);
}

/* z = A e (four values to six) */
INLINE void a4(const __m512 e[4], __m512 z[6]) {
  const __m512 s02 = _mm512_add_ps(e[0], e[2]), s13 = _mm512_add_ps(e[1], e[3]);
  const __m512 p = _mm512_fmadd_ps(k(4), e[2], e[0]), q = _mm512_fmadd_ps(k(4), e[3], e[1]);
  z[0] = e[0], z[1] = _mm512_add_ps(s02, s13), z[2] = _mm512_sub_ps(s02, s13);
  z[3] = _mm512_fmadd_ps(k(2), q, p), z[4] = _mm512_fnmadd_ps(k(2), q, p), z[5] = e[3];
}

/* p = B v (six values) */
INLINE void b6(const __m512 v[6], __m512 p[6]) {
  const __m512 s12 = _mm512_add_ps(v[1], v[2]), s34 = _mm512_add_ps(v[3], v[4]);
  p[0] = _mm512_mul_ps(k(4), v[0]);
  p[1] = _mm512_fmadd_ps(k(4), _mm512_add_ps(_mm512_sub_ps(v[2], v[1]), v[5]), _mm512_mul_ps(k(2), _mm512_sub_ps(v[4], v[3])));
  p[2] = neg(_mm512_fmadd_ps(k(5), v[0], _mm512_fmadd_ps(k(4), s12, s34)));
  p[3] = _mm512_fnmadd_ps(k(5), v[5], _mm512_fmadd_ps(k(2), _mm512_sub_ps(v[3], v[4]), _mm512_sub_ps(v[1], v[2])));
  p[4] = _mm512_add_ps(_mm512_add_ps(v[0], s12), s34), p[5] = v[5];
}

/* Column kk of a group's 6x6 transformed values: planes 6 i + kk (ps apart), i = 0..5. */
INLINE void load_column(const float *in, int64_t ps, int kk, __m512 v[6]) {
  #pragma GCC unroll 6
  for (int i = 0; i < 6; i++) v[i] = _mm512_loadu_ps(in + (6 * i + kk) * ps);
}

void attn_wino4_input_f32_avx512(const attn_wino_geom *g, const float *x, int64_t ti0, int64_t rows, float *V,
                                 int64_t ps, float *scratch) {
  const int64_t Tr = 16 * g->tw;
  /* rows above and below the plane read a row of zeros (scratch's first W entries): every load of
   * a group then takes the same two column masks, not a mask per row (a third of the
   * instructions went to combining them) */
  for (int64_t i = 0; i < g->W; i += 16) _mm512_mask_storeu_ps(scratch + i, lanes_below(g->W - i), _mm512_setzero_ps());
  for (int64_t R = 0; R < rows; R++) {
    const float *row[18];
    for (int a = 0; a < 18; a++) {
      const int64_t r = 16 * (ti0 + R) + a - g->ph;
      row[a] = r >= 0 && r < g->H ? x + r * g->W : scratch;
    }
    for (int64_t G = 0; G < g->tw; G++) {
      const int64_t q = 16 * G - g->pw;
      const __mmask16 m0 = in_row16(g->W, q), m2 = in_row16(g->W, q + 2);
      __m512 u[4][6], u2[4][6]; /* B^T along the rows of tile row t, from columns q on and q + 2 on */
      for (int t = 0; t < 4; t++) {
        __m512 d[6], d2[6];
        #pragma GCC unroll 6
        for (int a = 0; a < 6; a++) d[a] = load16(row[4 * t + a], q, m0), d2[a] = load16(row[4 * t + a], q + 2, m2);
        bt6(d, u[t]), bt6(d2, u2[t]);
      }
      float *out = V + R * Tr + 16 * G;
      #pragma GCC unroll 6
      for (int i = 0; i < 6; i++) {
        const __m512 a[4] = {u[0][i], u[1][i], u[2][i], u[3][i]}, a2[4] = {u2[0][i], u2[1][i], u2[2][i], u2[3][i]};
        __m512 c[6], c2[4], v[6];
        transpose4(a, c), transpose4(a2, c2);
        c[4] = c2[2], c[5] = c2[3]; /* patch columns 4 and 5: columns 2 and 3 from two entries on */
        bt6(c, v);
        #pragma GCC unroll 6
        for (int j = 0; j < 6; j++) _mm512_storeu_ps(out + (6 * i + j) * ps, v[j]);
      }
    }
  }
}

void attn_wino4_output_f32_avx512(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows,
                                  float bias, float *y, float *scratch) {
  (void)scratch;
  const int64_t Tr = 16 * g->tw, Wo = g->Wo;
  const __m512 b = _mm512_set1_ps(bias);
  for (int64_t R = 0; R < rows; R++)
    for (int64_t G = 0; G < g->tw; G++) {
      const float *in = M + R * Tr + 16 * G;
      __m512 w[4][6]; /* A^T along i, for each column k */
      #pragma GCC unroll 6
      for (int kk = 0; kk < 6; kk++) {
        __m512 m[6], o[4];
        load_column(in, ps, kk, m);
        at6(m, o);
        for (int r = 0; r < 4; r++) w[r][kk] = o[r];
      }
      const __mmask16 cols = lanes_below(Wo - 16 * G);
      #pragma GCC unroll 4
      for (int r = 0; r < 4; r++) {
        __m512 o[4], rowv[4];
        at6(w[r], o);
        for (int q = 0; q < 4; q++) o[q] = _mm512_add_ps(o[q], b);
        transpose4(o, rowv); /* rowv[t] lane 4 j + q: output row 4 t + r of the group */
        for (int t = 0; t < 4; t++) {
          const int64_t yr = 16 * (ti0 + R) + 4 * t + r;
          if (yr < g->Ho) _mm512_mask_storeu_ps(y + yr * Wo + 16 * G, cols, rowv[t]);
        }
      }
    }
}

void attn_wino4_grad_f32_avx512(const attn_wino_geom *g, const float *dy, int64_t ti0, int64_t rows, float *Z,
                                int64_t ps, float *scratch, double *sum) {
  (void)scratch;
  const int64_t Tr = 16 * g->tw, Wo = g->Wo;
  wino_dsum db = {_mm512_setzero_pd(), _mm512_setzero_pd()}; /* four rows' entries per add */
  for (int64_t R = 0; R < rows; R++)
    for (int64_t G = 0; G < g->tw; G++) {
      const __mmask16 cols = in_row16(Wo, 16 * G);
      __m512 e[4][4]; /* e[r][q]: entry (r, q) of the group's tiles */
      #pragma GCC unroll 4
      for (int r = 0; r < 4; r++) {
        __m512 in[4];
        for (int t = 0; t < 4; t++) {
          const int64_t yr = 16 * (ti0 + R) + 4 * t + r;
          in[t] = yr < g->Ho ? _mm512_maskz_loadu_ps(cols, dy + yr * Wo + 16 * G) : _mm512_setzero_ps();
        }
        if (sum) dsum_add(&db, _mm512_add_ps(_mm512_add_ps(in[0], in[1]), _mm512_add_ps(in[2], in[3])));
        transpose4(in, e[r]);
      }
      __m512 z[6][4]; /* A along the rows, for each column q */
      #pragma GCC unroll 4
      for (int q = 0; q < 4; q++) {
        const __m512 c[4] = {e[0][q], e[1][q], e[2][q], e[3][q]};
        __m512 zz[6];
        a4(c, zz);
        for (int i = 0; i < 6; i++) z[i][q] = zz[i];
      }
      float *out = Z + R * Tr + 16 * G;
      #pragma GCC unroll 6
      for (int i = 0; i < 6; i++) {
        __m512 zz[6];
        a4(z[i], zz);
        for (int j = 0; j < 6; j++) _mm512_storeu_ps(out + (6 * i + j) * ps, zz[j]);
      }
    }
  dsum_done(&db, sum);
}

/* Lanes 4 j + t from lane 4 (j - 1) + t: the tile to the left; for j = 0, lanes 12 + t of prev. */
INLINE __m512 from_left(__m512 v, __m512 prev) {
  const __m512i idx = _mm512_setr_epi32(28, 29, 30, 31, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
  return _mm512_permutex2var_ps(v, idx, prev);
}

/* The group row's padded rows 16 R + 4 t + a: a patch's rows 4 and 5 are the next tile row's rows
 * 0 and 1, a group's columns 16 and 17 the next group's 0 and 1 (carried in registers: one more
 * group past the last takes the final two, when they lie inside dx). Rows 0 and 1 add to what the
 * group row above left (the band's first and last two as seams says). */
void attn_wino4_adjoint_f32_avx512(const attn_wino_geom *g, const float *M, int64_t ps, int64_t ti0, int64_t rows,
                                   float *dx, float *scratch, int seams) {
  (void)scratch;
  const int64_t Tr = 16 * g->tw, H = g->H, W = g->W, pw = g->pw;
  for (int64_t R = 0; R < rows; R++) {
    const int top = R > 0 || (seams & ATTN_WINO_ADD_TOP);
    const int bottom = R + 1 == rows && (seams & ATTN_WINO_ADD_BOTTOM);
    const int64_t y0 = 16 * (ti0 + R) - g->ph;
    __m512 carry[6][2];
    for (int a = 0; a < 6; a++) carry[a][0] = carry[a][1] = _mm512_setzero_ps();
    /* the group past the last only when the final two columns fall inside dx */
    const int64_t groups = 16 * g->tw - pw < W ? g->tw + 1 : g->tw;
    for (int64_t G = 0; G < groups; G++) {
      __m512 p[6][6]; /* B v B^T: p[a][b] */
      if (G < g->tw) {
        const float *in = M + R * Tr + 16 * G;
        __m512 w[6][6];
        #pragma GCC unroll 6
        for (int kk = 0; kk < 6; kk++) {
          __m512 v[6], o[6];
          load_column(in, ps, kk, v);
          b6(v, o);
          for (int a = 0; a < 6; a++) w[a][kk] = o[a];
        }
        #pragma GCC unroll 6
        for (int a = 0; a < 6; a++) b6(w[a], p[a]);
      } else {
        for (int a = 0; a < 6; a++)
          for (int bb = 0; bb < 6; bb++) p[a][bb] = _mm512_setzero_ps();
      }
      __m512 rw[6][4]; /* rw[a][t] lane 4 j + b: padded row 4 t + a, column 16 G + 4 j + b */
      #pragma GCC unroll 6
      for (int a = 0; a < 6; a++) {
        const __m512 e[4] = {_mm512_add_ps(p[a][0], from_left(p[a][4], carry[a][0])),
                             _mm512_add_ps(p[a][1], from_left(p[a][5], carry[a][1])), p[a][2], p[a][3]};
        carry[a][0] = p[a][4], carry[a][1] = p[a][5];
        transpose4(e, rw[a]);
      }
      const int64_t q = 16 * G;
      put_row(dx, H, W, y0, q, pw, top, rw[0][0]);
      put_row(dx, H, W, y0 + 1, q, pw, top, rw[1][0]);
      for (int t = 0; t < 4; t++) {
        if (t > 0) {
          put_row(dx, H, W, y0 + 4 * t, q, pw, 0, _mm512_add_ps(rw[4][t - 1], rw[0][t]));
          put_row(dx, H, W, y0 + 4 * t + 1, q, pw, 0, _mm512_add_ps(rw[5][t - 1], rw[1][t]));
        }
        put_row(dx, H, W, y0 + 4 * t + 2, q, pw, 0, rw[2][t]);
        put_row(dx, H, W, y0 + 4 * t + 3, q, pw, 0, rw[3][t]);
      }
      put_row(dx, H, W, y0 + 16, q, pw, bottom, rw[4][3]);
      put_row(dx, H, W, y0 + 17, q, pw, bottom, rw[5][3]);
    }
  }
}
#endif
