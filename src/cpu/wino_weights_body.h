/* The Winograd kernel transform and the weight gradient's reduction (cpu/wino_cpu.h), for both tile
 * sizes, written once: included by wino_body.h (last), so each ISA file compiles them with its own
 * flags (the loops over 16 pairs of channels become 8-double vectors on AVX-512, pairs of doubles
 * on the generic path, where they took 6% of the convolution). The arithmetic is in double,
 * rounded once, and not contracted into fused multiply-adds, so every set gives the same bits. */

/* The kernel transform G (m + 2 rows of 3) of F(2x2, 3x3) and F(4x4, 3x3). */
static const double WINO_FN(wino_g2)[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
static const double WINO_FN(wino_g4)[6][3] = {{1.0 / 4, 0, 0},
                                              {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                              {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                              {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                              {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                              {0, 0, 1}};

/* Pairs of channels per step, innermost in every loop. */
#define WINO_LANES 16

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* to the end of the file (wino_body.h includes this last) */
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

/* u[a i + j] (a x a) = G g G^T per lane; a is a constant where it is inlined, so the loops unroll. */
static inline void WINO_FN(g_g_gt)(int a, const double (*G)[3], const double g[9][WINO_LANES],
                                   double u[36][WINO_LANES]) {
  double e[6][3][WINO_LANES];
  for (int i = 0; i < a; i++)
    for (int q = 0; q < 3; q++)
      for (int l = 0; l < WINO_LANES; l++)
        e[i][q][l] = G[i][0] * g[q][l] + G[i][1] * g[3 + q][l] + G[i][2] * g[6 + q][l];
  for (int i = 0; i < a; i++)
    for (int j = 0; j < a; j++)
      for (int l = 0; l < WINO_LANES; l++)
        u[a * i + j][l] = G[j][0] * e[i][0][l] + G[j][1] * e[i][1][l] + G[j][2] * e[i][2][l];
}

/* g[3 p + q] = G^T D G per lane, for D (a x a) */
static inline void WINO_FN(gt_d_g)(int a, const double (*G)[3], const double D[36][WINO_LANES],
                                   double g[9][WINO_LANES]) {
  double f[3][6][WINO_LANES];
  for (int p = 0; p < 3; p++)
    for (int q = 0; q < a; q++)
      for (int l = 0; l < WINO_LANES; l++) {
        double v = 0;
        for (int i = 0; i < a; i++) v += G[i][p] * D[a * i + q][l];
        f[p][q][l] = v;
      }
  for (int p = 0; p < 3; p++)
    for (int q = 0; q < 3; q++)
      for (int l = 0; l < WINO_LANES; l++) {
        double v = 0;
        for (int i = 0; i < a; i++) v += f[p][i][l] * G[i][q];
        g[3 * p + q][l] = v;
      }
}

#define WINO_WEIGHTS_DEFINE(S, T)                                                                           \
  static void WINO_FN(weights_##S)(int m, const T *w, int64_t O, int64_t C, T *U) {                               \
    const int64_t oc = O * C, np = (m + 2) * (m + 2);                                                       \
    for (int64_t e0 = 0; e0 < oc; e0 += WINO_LANES) {                                                       \
      const int n = oc - e0 < WINO_LANES ? (int)(oc - e0) : WINO_LANES;                                     \
      double g[9][WINO_LANES], u[36][WINO_LANES];                                                           \
      memset(g, 0, sizeof g);                                                                               \
      for (int p = 0; p < 9; p++)                                                                           \
        for (int l = 0; l < n; l++) g[p][l] = (double)w[(e0 + l) * 9 + p];                                  \
      if (m == 2)                                                                                           \
        WINO_FN(g_g_gt)(4, WINO_FN(wino_g2), g, u);                                                         \
      else                                                                                                  \
        WINO_FN(g_g_gt)(6, WINO_FN(wino_g4), g, u);                                                         \
      for (int64_t xi = 0; xi < np; xi++)                                                                   \
        for (int l = 0; l < n; l++) U[xi * oc + e0 + l] = (T)u[xi][l];                                      \
    }                                                                                                       \
  }                                                                                                         \
                                                                                                            \
  static void WINO_FN(reduce_##S)(int m, const T *partial, int64_t chunks, int64_t O, int64_t C, int64_t e0,        \
                           int64_t e1, T *dw) {                                                             \
    const int64_t oc = O * C, np = (m + 2) * (m + 2);                                                       \
    for (int64_t eb = e0; eb < e1; eb += WINO_LANES) {                                                      \
      const int n = e1 - eb < WINO_LANES ? (int)(e1 - eb) : WINO_LANES;                                     \
      double d[36][WINO_LANES], g[9][WINO_LANES]; /* [position][pair] */                                    \
      memset(d, 0, sizeof d);                                                                               \
      for (int64_t xi = 0; xi < np; xi++)                                                                   \
        for (int64_t k = 0; k < chunks; k++) {                                                              \
          const T *at = partial + (k * np + xi) * oc + eb;                                                  \
          for (int l = 0; l < n; l++) d[xi][l] += (double)at[l];                                            \
        }                                                                                                   \
      if (m == 2)                                                                                           \
        WINO_FN(gt_d_g)(4, WINO_FN(wino_g2), d, g);                                                         \
      else                                                                                                  \
        WINO_FN(gt_d_g)(6, WINO_FN(wino_g4), d, g);                                                         \
      for (int l = 0; l < n; l++)                                                                           \
        for (int p = 0; p < 9; p++) dw[(eb + l) * 9 + p] = (T)g[p][l];                                      \
    }                                                                                                       \
  }

WINO_WEIGHTS_DEFINE(f32, float)
WINO_WEIGHTS_DEFINE(f64, double)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
