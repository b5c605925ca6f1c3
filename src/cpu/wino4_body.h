/* The Winograd F(4x4, 3x3) transforms (cpu/wino_cpu.h) as plain loops, one tile at a time:
 * included by wino_body.h, so every ISA file gets them (float64 everywhere, float32 where the set
 * has no transforms of its own). A tile is a 4x4 block of outputs over a 6x6 input patch; tiles
 * come in groups of 4x4 (th and tw of the geometry count groups), and a group's 16 tiles take 16
 * adjacent columns of each of the 36 planes, tile (4 R + t, 4 G + j) at column 16 G + 4 j + t of
 * its group row R (so that a vector of 16 lanes holds one group). Tiles past the outputs are real
 * columns: they read zeros or the plane's next entries, and their products are dropped.
 *
 * The transforms, on six values (B^T) or four (A):
 *   B^T d: 4 d0 - 5 d2 + d4, (d3 + d4) - 4 (d1 + d2), (d4 - d3) + 4 (d1 - d2),
 *          (d4 - d2) + 2 (d3 - d1), (d4 - d2) - 2 (d3 - d1), 4 d1 - 5 d3 + d5
 *   A^T m: m0 + (m1 + m2) + (m3 + m4), (m1 - m2) + 2 (m3 - m4), (m1 + m2) + 4 (m3 + m4),
 *          (m1 - m2) + 8 (m3 - m4) + m5
 *   A e:   e0, (e0 + e2) + (e1 + e3), (e0 + e2) - (e1 + e3), (e0 + 4 e2) + 2 (e1 + 4 e3),
 *          (e0 + 4 e2) - 2 (e1 + 4 e3), e3
 *   B v:   4 v0, 4 (v2 - v1 + v5) + 2 (v4 - v3), -5 v0 - 4 (v1 + v2) - (v3 + v4),
 *          (v1 - v2) + 2 (v3 - v4) - 5 v5, v0 + (v1 + v2) + (v3 + v4), v5 */

#define WINO4_DEFINE(S, T)                                                                                  \
  /* out[k * so] = B^T in (in[k * si], six values) */                                                       \
  static inline void WINO_FN(bt6_##S)(const T *in, int64_t si, T *out, int64_t so) {                        \
    T d0 = in[0], d1 = in[si], d2 = in[2 * si], d3 = in[3 * si], d4 = in[4 * si], d5 = in[5 * si];          \
    out[0] = 4 * d0 - 5 * d2 + d4, out[so] = (d3 + d4) - 4 * (d1 + d2), out[2 * so] = (d4 - d3) + 4 * (d1 - d2); \
    out[3 * so] = (d4 - d2) + 2 * (d3 - d1), out[4 * so] = (d4 - d2) - 2 * (d3 - d1);                       \
    out[5 * so] = 4 * d1 - 5 * d3 + d5;                                                                     \
  }                                                                                                         \
  static inline void WINO_FN(at6_##S)(const T *in, int64_t si, T *out, int64_t so) {                        \
    T m0 = in[0], m1 = in[si], m2 = in[2 * si], m3 = in[3 * si], m4 = in[4 * si], m5 = in[5 * si];          \
    out[0] = m0 + (m1 + m2) + (m3 + m4), out[so] = (m1 - m2) + 2 * (m3 - m4);                               \
    out[2 * so] = (m1 + m2) + 4 * (m3 + m4), out[3 * so] = (m1 - m2) + 8 * (m3 - m4) + m5;                  \
  }                                                                                                         \
  static inline void WINO_FN(a4_##S)(const T *in, int64_t si, T *out, int64_t so) {                         \
    T e0 = in[0], e1 = in[si], e2 = in[2 * si], e3 = in[3 * si];                                            \
    out[0] = e0, out[so] = (e0 + e2) + (e1 + e3), out[2 * so] = (e0 + e2) - (e1 + e3);                      \
    out[3 * so] = (e0 + 4 * e2) + 2 * (e1 + 4 * e3), out[4 * so] = (e0 + 4 * e2) - 2 * (e1 + 4 * e3);       \
    out[5 * so] = e3;                                                                                       \
  }                                                                                                         \
  static inline void WINO_FN(b6_##S)(const T *in, int64_t si, T *out, int64_t so) {                         \
    T v0 = in[0], v1 = in[si], v2 = in[2 * si], v3 = in[3 * si], v4 = in[4 * si], v5 = in[5 * si];          \
    out[0] = 4 * v0, out[so] = 4 * (v2 - v1 + v5) + 2 * (v4 - v3), out[2 * so] = -5 * v0 - 4 * (v1 + v2) - (v3 + v4); \
    out[3 * so] = (v1 - v2) + 2 * (v3 - v4) - 5 * v5, out[4 * so] = v0 + (v1 + v2) + (v3 + v4);             \
    out[5 * so] = v5;                                                                                       \
  }                                                                                                         \
  static void WINO_FN(input4_##S)(const attn_wino_geom *g, const T *x, int64_t ti0, int64_t rows, T *V,      \
                                  int64_t ps, T *scratch) {                                                 \
    (void)scratch;                                                                                          \
    for (int64_t R = 0; R < rows; R++)                                                                      \
      for (int64_t col = 0; col < 16 * g->tw; col++) {                                                      \
        int64_t G = col / 16, j = col / 4 % 4, t = col % 4;                                                 \
        int64_t r0 = 4 * (4 * (ti0 + R) + t) - g->ph, c0 = 4 * (4 * G + j) - g->pw;                         \
        T d[36], u[36];                                                                                     \
        for (int a = 0; a < 6; a++)                                                                         \
          for (int b = 0; b < 6; b++) {                                                                     \
            int64_t r = r0 + a, c = c0 + b;                                                                 \
            d[6 * a + b] = r >= 0 && r < g->H && c >= 0 && c < g->W ? x[r * g->W + c] : 0;                  \
          }                                                                                                 \
        for (int b = 0; b < 6; b++) WINO_FN(bt6_##S)(d + b, 6, u + b, 6);                                  \
        for (int i = 0; i < 6; i++) WINO_FN(bt6_##S)(u + 6 * i, 1, V + 6 * i * ps + R * 16 * g->tw + col, ps); \
      }                                                                                                     \
  }                                                                                                         \
  static void WINO_FN(output4_##S)(const attn_wino_geom *g, const T *M, int64_t ps, int64_t ti0, int64_t rows, \
                                   T bias, T *y, T *scratch) {                                              \
    (void)scratch;                                                                                          \
    for (int64_t R = 0; R < rows; R++)                                                                      \
      for (int64_t col = 0; col < 16 * g->tw; col++) {                                                      \
        int64_t G = col / 16, j = col / 4 % 4, t = col % 4;                                                 \
        int64_t r0 = 4 * (4 * (ti0 + R) + t), c0 = 4 * (4 * G + j);                                        \
        T w[24], o[16];                                                                                     \
        for (int k = 0; k < 6; k++) WINO_FN(at6_##S)(M + k * ps + R * 16 * g->tw + col, 6 * ps, w + k, 6);   \
        for (int i = 0; i < 4; i++) WINO_FN(at6_##S)(w + 6 * i, 1, o + 4 * i, 1);                          \
        for (int a = 0; a < 4; a++)                                                                         \
          for (int b = 0; b < 4; b++)                                                                       \
            if (r0 + a < g->Ho && c0 + b < g->Wo) y[(r0 + a) * g->Wo + c0 + b] = o[4 * a + b] + bias;       \
      }                                                                                                     \
  }                                                                                                         \
  static void WINO_FN(grad4_##S)(const attn_wino_geom *g, const T *dy, int64_t ti0, int64_t rows, T *Z,      \
                                 int64_t ps, T *scratch, double *sum) {                                     \
    (void)scratch;                                                                                          \
    if (sum) WINO_FN(sum_rows_##S)(dy, g->Ho, g->Wo, 16 * ti0, 16 * (ti0 + rows), sum);                      \
    for (int64_t R = 0; R < rows; R++)                                                                      \
      for (int64_t col = 0; col < 16 * g->tw; col++) {                                                      \
        int64_t G = col / 16, j = col / 4 % 4, t = col % 4;                                                 \
        int64_t r0 = 4 * (4 * (ti0 + R) + t), c0 = 4 * (4 * G + j);                                        \
        T e[16], u[24];                                                                                     \
        for (int a = 0; a < 4; a++)                                                                         \
          for (int b = 0; b < 4; b++)                                                                       \
            e[4 * a + b] = r0 + a < g->Ho && c0 + b < g->Wo ? dy[(r0 + a) * g->Wo + c0 + b] : 0;            \
        for (int b = 0; b < 4; b++) WINO_FN(a4_##S)(e + b, 4, u + b, 4);                                   \
        for (int i = 0; i < 6; i++) WINO_FN(a4_##S)(u + 4 * i, 1, Z + 6 * i * ps + R * 16 * g->tw + col, ps); \
      }                                                                                                     \
  }                                                                                                         \
  /* The band writes its padded rows [16 ti0, 16 (ti0 + rows) + 2) but for the seams it adds into: */      \
  /* here by clearing the rows it writes first and adding every tile's patch. */                            \
  static void WINO_FN(adjoint4_##S)(const attn_wino_geom *g, const T *M, int64_t ps, int64_t ti0, int64_t rows, \
                                    T *dx, T *scratch, int seams) {                                         \
    (void)scratch;                                                                                          \
    int64_t p0 = 16 * ti0 + (seams & ATTN_WINO_ADD_TOP ? 2 : 0);                                            \
    int64_t p1 = 16 * (ti0 + rows) + (seams & ATTN_WINO_ADD_BOTTOM ? 0 : 2);                                \
    for (int64_t p = p0; p < p1; p++)                                                                       \
      if (p - g->ph >= 0 && p - g->ph < g->H)                                                               \
        for (int64_t c = 0; c < g->W; c++) dx[(p - g->ph) * g->W + c] = 0;                                  \
    for (int64_t R = 0; R < rows; R++)                                                                      \
      for (int64_t col = 0; col < 16 * g->tw; col++) {                                                      \
        int64_t G = col / 16, j = col / 4 % 4, t = col % 4;                                                 \
        int64_t r0 = 4 * (4 * (ti0 + R) + t) - g->ph, c0 = 4 * (4 * G + j) - g->pw;                         \
        T w[36], p[36];                                                                                     \
        for (int k = 0; k < 6; k++) WINO_FN(b6_##S)(M + k * ps + R * 16 * g->tw + col, 6 * ps, w + k, 6);    \
        for (int a = 0; a < 6; a++) WINO_FN(b6_##S)(w + 6 * a, 1, p + 6 * a, 1);                           \
        for (int a = 0; a < 6; a++)                                                                         \
          for (int b = 0; b < 6; b++) {                                                                     \
            int64_t r = r0 + a, c = c0 + b;                                                                 \
            if (r >= 0 && r < g->H && c >= 0 && c < g->W) dx[r * g->W + c] += p[6 * a + b];                 \
          }                                                                                                 \
      }                                                                                                     \
  }
