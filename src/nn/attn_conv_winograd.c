/* Winograd F(2x2, 3x3) convolution: see attn_conv_internal.h for the model. */
#include <stdatomic.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "core/attn_gemm.h"
#include "core/attn_parallel.h"
#include "nn/attn_conv_internal.h"

/* A block's transformed inputs and products take about this many bytes: they stay in the
 * core's L2 cache between the transforms and the GEMMs. */
#define BLOCK_BYTES (384 * 1024)
/* Tiles per block: at least this many (the GEMMs' columns), at most MAX_TILES. */
#define MIN_TILES 16
#define MAX_TILES 512
/* The weight gradient is summed over at most this many chunks of blocks (fixed by the shape). */
#define DW_CHUNKS 8
/* Work below about this many multiply-adds stays on the calling thread. */
#define GRAIN_FLOPS 200000

typedef struct {
  attn_dtype dt;
  size_t es;
  const char *x, *b, *dy;
  char *U, *y, *partial;
  int64_t N, C, H, W, O, ph, pw, Ho, Wo;
  int64_t th, tw, tiles, tb, blocks; /* tiles per column and row of an image, in all, per block */
  int64_t chunk, chunks;             /* weight gradient: blocks per chunk, chunks */
  atomic_int failed;
} wino_job;

int attn_conv2d_winograd_applies(int64_t kh, int64_t kw, const int64_t stride[2], const int64_t padding[2],
                                 const int64_t dilation[2], int64_t groups) {
  return kh == 3 && kw == 3 && stride[0] == 1 && stride[1] == 1 && dilation[0] == 1 && dilation[1] == 1 &&
         groups == 1 && padding[0] <= 2 && padding[1] <= 2;
}

/* The job's tiling: output (Ho, Wo) from input (H, W) and padding, blocks of tb tiles with tb
 * from the channel counts alone. */
static void tiling(wino_job *J) {
  J->es = attn_dtype_size(J->dt);
  J->Ho = J->H + 2 * J->ph - 2, J->Wo = J->W + 2 * J->pw - 2;
  J->th = (J->Ho + 1) / 2, J->tw = (J->Wo + 1) / 2, J->tiles = J->N * J->th * J->tw;
  int64_t per_tile = 16 * (J->C + J->O) * (int64_t)J->es, tb = BLOCK_BYTES / per_tile;
  tb = tb < MIN_TILES ? MIN_TILES : tb > MAX_TILES ? MAX_TILES : tb / MIN_TILES * MIN_TILES;
  J->tb = tb;
  J->blocks = (J->tiles + tb - 1) / tb;
  atomic_init(&J->failed, 0);
}

/* Tile k of the block at t0: image *n, top-left input position (*r, *c) (may be negative). */
static void tile_at(const wino_job *J, int64_t t, int64_t *n, int64_t *r, int64_t *c) {
  int64_t per = J->th * J->tw, rem = t % per;
  *n = t / per;
  *r = 2 * (rem / J->tw) - J->ph;
  *c = 2 * (rem % J->tw) - J->pw;
}

#define DEFINE_WINO(S, T)                                                                                     \
  /* V (16, C, tb): B^T d B of the nt tiles from t0, each channel */                                        \
  static void input_tiles_##S(const wino_job *J, int64_t t0, int64_t nt, T *V) {                              \
    const T *x = (const T *)J->x;                                                                           \
    int64_t H = J->H, W = J->W, tb = J->tb, cs = J->C * tb;                                                 \
    for (int64_t k = 0; k < nt; k++) {                                                                      \
      int64_t n, r0, c0;                                                                                    \
      tile_at(J, t0 + k, &n, &r0, &c0);                                                                     \
      int inside = r0 >= 0 && c0 >= 0 && r0 + 4 <= H && c0 + 4 <= W;                                       \
      for (int64_t c = 0; c < J->C; c++) {                                                                  \
        const T *xc = x + (n * J->C + c) * H * W;                                                           \
        T d[4][4];                                                                                          \
        if (inside)                                                                                         \
          for (int i = 0; i < 4; i++)                                                                       \
            for (int j = 0; j < 4; j++) d[i][j] = xc[(r0 + i) * W + c0 + j];                                \
        else                                                                                                \
          for (int i = 0; i < 4; i++)                                                                       \
            for (int j = 0; j < 4; j++) {                                                                   \
              int64_t r = r0 + i, q = c0 + j;                                                               \
              d[i][j] = r >= 0 && r < H && q >= 0 && q < W ? xc[r * W + q] : 0;                             \
            }                                                                                               \
        T e[4][4];                                                                                          \
        for (int j = 0; j < 4; j++) {                                                                       \
          e[0][j] = d[0][j] - d[2][j], e[1][j] = d[1][j] + d[2][j];                                         \
          e[2][j] = d[2][j] - d[1][j], e[3][j] = d[1][j] - d[3][j];                                         \
        }                                                                                                   \
        T *v = V + c * tb + k;                                                                              \
        for (int i = 0; i < 4; i++) {                                                                       \
          v[(4 * i + 0) * cs] = e[i][0] - e[i][2], v[(4 * i + 1) * cs] = e[i][1] + e[i][2];                 \
          v[(4 * i + 2) * cs] = e[i][2] - e[i][1], v[(4 * i + 3) * cs] = e[i][1] - e[i][3];                 \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
  }                                                                                                         \
  /* y's 2x2 tiles A^T m A (+ bias) from the products M (16, O, tb), clipped to (Ho, Wo) */                 \
  static void output_tiles_##S(const wino_job *J, int64_t t0, int64_t nt, const T *M) {                       \
    T *y = (T *)J->y;                                                                                       \
    const T *b = (const T *)J->b;                                                                           \
    int64_t Ho = J->Ho, Wo = J->Wo, tb = J->tb, os = J->O * tb;                                             \
    for (int64_t k = 0; k < nt; k++) {                                                                      \
      int64_t n, r0, c0;                                                                                    \
      tile_at(J, t0 + k, &n, &r0, &c0);                                                                     \
      r0 += J->ph, c0 += J->pw; /* the output tile's corner */                                              \
      int rows = r0 + 1 < Ho ? 2 : 1, cols = c0 + 1 < Wo ? 2 : 1;                                          \
      for (int64_t o = 0; o < J->O; o++) {                                                                  \
        const T *m = M + o * tb + k;                                                                        \
        T s[2][4];                                                                                          \
        for (int j = 0; j < 4; j++) {                                                                       \
          T m0 = m[j * os], m1 = m[(4 + j) * os], m2 = m[(8 + j) * os], m3 = m[(12 + j) * os];              \
          s[0][j] = m0 + m1 + m2, s[1][j] = m1 - m2 - m3;                                                   \
        }                                                                                                   \
        T bias = b ? b[o] : 0, out[2][2];                                                                   \
        for (int i = 0; i < 2; i++) {                                                                       \
          out[i][0] = s[i][0] + s[i][1] + s[i][2] + bias;                                                   \
          out[i][1] = s[i][1] - s[i][2] - s[i][3] + bias;                                                   \
        }                                                                                                   \
        T *yo = y + (n * J->O + o) * Ho * Wo + r0 * Wo + c0;                                                \
        for (int i = 0; i < rows; i++)                                                                      \
          for (int j = 0; j < cols; j++) yo[i * Wo + j] = out[i][j];                                        \
      }                                                                                                     \
    }                                                                                                       \
  }                                                                                                         \
  /* Z (16, O, tb): A e A^T of dy's 2x2 tiles e (zero outside (Ho, Wo)) */                                  \
  static void grad_tiles_##S(const wino_job *J, int64_t t0, int64_t nt, T *Z) {                               \
    const T *dy = (const T *)J->dy;                                                                         \
    int64_t Ho = J->Ho, Wo = J->Wo, tb = J->tb, os = J->O * tb;                                             \
    for (int64_t k = 0; k < nt; k++) {                                                                      \
      int64_t n, r0, c0;                                                                                    \
      tile_at(J, t0 + k, &n, &r0, &c0);                                                                     \
      r0 += J->ph, c0 += J->pw;                                                                             \
      int rows = r0 + 1 < Ho ? 2 : 1, cols = c0 + 1 < Wo ? 2 : 1;                                           \
      for (int64_t o = 0; o < J->O; o++) {                                                                  \
        const T *g = dy + (n * J->O + o) * Ho * Wo + r0 * Wo + c0;                                          \
        T e[2][2] = {{0, 0}, {0, 0}};                                                                       \
        for (int i = 0; i < rows; i++)                                                                      \
          for (int j = 0; j < cols; j++) e[i][j] = g[i * Wo + j];                                           \
        T u[4][2];                                                                                          \
        for (int j = 0; j < 2; j++)                                                                         \
          u[0][j] = e[0][j], u[1][j] = e[0][j] + e[1][j], u[2][j] = e[0][j] - e[1][j], u[3][j] = -e[1][j];  \
        T *z = Z + o * tb + k;                                                                              \
        for (int i = 0; i < 4; i++) {                                                                       \
          z[(4 * i + 0) * os] = u[i][0], z[(4 * i + 1) * os] = u[i][0] + u[i][1];                           \
          z[(4 * i + 2) * os] = u[i][0] - u[i][1], z[(4 * i + 3) * os] = -u[i][1];                          \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
  }

DEFINE_WINO(f32, float)
DEFINE_WINO(f64, double)

static void input_tiles(const wino_job *J, int64_t t0, int64_t nt, char *V) {
  if (J->dt == ATTN_F32)
    input_tiles_f32(J, t0, nt, (float *)V);
  else
    input_tiles_f64(J, t0, nt, (double *)V);
}

static double load(attn_dtype dt, const void *base, int64_t i) {
  return dt == ATTN_F32 ? (double)((const float *)base)[i] : ((const double *)base)[i];
}
static void store(attn_dtype dt, void *base, int64_t i, double v) {
  if (dt == ATTN_F32)
    ((float *)base)[i] = (float)v;
  else
    ((double *)base)[i] = v;
}

/* U (16, O, C) = G g G^T for every pair of channels (in double, then rounded once). */
static void weight_transform(const wino_job *J, const void *w, int flip) {
  for (int64_t o = 0; o < J->O; o++)
    for (int64_t c = 0; c < J->C; c++) {
      double g[3][3], e[4][3];
      for (int p = 0; p < 3; p++)
        for (int q = 0; q < 3; q++)
          g[p][q] = flip ? load(J->dt, w, ((c * J->O + o) * 3 + 2 - p) * 3 + 2 - q)
                         : load(J->dt, w, ((o * J->C + c) * 3 + p) * 3 + q);
      for (int q = 0; q < 3; q++) {
        e[0][q] = g[0][q], e[1][q] = 0.5 * (g[0][q] + g[1][q] + g[2][q]);
        e[2][q] = 0.5 * (g[0][q] - g[1][q] + g[2][q]), e[3][q] = g[2][q];
      }
      for (int i = 0; i < 4; i++) {
        double u[4] = {e[i][0], 0.5 * (e[i][0] + e[i][1] + e[i][2]), 0.5 * (e[i][0] - e[i][1] + e[i][2]), e[i][2]};
        for (int j = 0; j < 4; j++) store(J->dt, J->U, ((4 * i + j) * J->O + o) * J->C + c, u[j]);
      }
    }
}

/* A block's workspace of rows (16 rows, tb columns) x count, or NULL after marking the job failed. */
static char *workspace(wino_job *J, int64_t rows, size_t *cap) {
  char *ws = attn_alloc((size_t)(16 * rows * J->tb) * J->es, cap);
  if (!ws) atomic_store(&J->failed, 1);
  return ws;
}

/* Blocks [b0, b1): input transforms, 16 products over channels, output transforms. */
static void forward_blocks(void *ctx, int64_t b0, int64_t b1) {
  wino_job *J = ctx;
  size_t es = J->es, cap[2] = {0, 0};
  char *V = workspace(J, J->C, &cap[0]), *M = workspace(J, J->O, &cap[1]);
  for (int64_t bl = b0; V && M && bl < b1; bl++) {
    int64_t t0 = bl * J->tb, nt = J->tiles - t0 < J->tb ? J->tiles - t0 : J->tb;
    input_tiles(J, t0, nt, V);
    for (int xi = 0; xi < 16; xi++)
      attn_gemm(J->dt, 0, 0, J->O, nt, J->C, 1.0, J->U + (size_t)(xi * J->O * J->C) * es, J->C,
                V + (size_t)(xi * J->C * J->tb) * es, J->tb, 0.0, M + (size_t)(xi * J->O * J->tb) * es, J->tb);
    if (J->dt == ATTN_F32)
      output_tiles_f32(J, t0, nt, (const float *)M);
    else
      output_tiles_f64(J, t0, nt, (const double *)M);
  }
  if (V) attn_free(V, cap[0]);
  if (M) attn_free(M, cap[1]);
}

static int64_t grain(const wino_job *J) {
  int64_t work = 16 * J->tb * J->O * J->C;
  return work >= GRAIN_FLOPS ? 1 : GRAIN_FLOPS / (work > 0 ? work : 1) + 1;
}

int attn_conv2d_winograd(attn_dtype dt, const void *x, int64_t N, int64_t C, int64_t H, int64_t W, const void *w,
                         int flip, const void *b, int64_t O, int64_t ph, int64_t pw, void *y) {
  wino_job J;
  memset(&J, 0, sizeof J);
  J.dt = dt, J.x = x, J.b = b, J.y = y, J.N = N, J.C = C, J.H = H, J.W = W, J.O = O, J.ph = ph, J.pw = pw;
  tiling(&J);
  if (J.tiles == 0) return 0;
  size_t cap;
  J.U = attn_alloc((size_t)(16 * O * C) * J.es, &cap);
  if (!J.U) return -1;
  weight_transform(&J, w, flip);
  attn_parallel_for(J.blocks, grain(&J), forward_blocks, &J);
  attn_free(J.U, cap);
  return atomic_load(&J.failed) ? -1 : 0;
}

/* Chunks [k0, k1) of the weight gradient: per chunk, sum over its blocks' tiles of the 16
 * products Z V^T (O, C), in block order, into the chunk's partial (16, O, C). */
static void dweight_chunks(void *ctx, int64_t k0, int64_t k1) {
  wino_job *J = ctx;
  size_t es = J->es, cap[2] = {0, 0};
  char *V = workspace(J, J->C, &cap[0]), *Z = workspace(J, J->O, &cap[1]);
  for (int64_t k = k0; V && Z && k < k1; k++) {
    int64_t bend = (k + 1) * J->chunk < J->blocks ? (k + 1) * J->chunk : J->blocks;
    for (int64_t bl = k * J->chunk; bl < bend; bl++) {
      int64_t t0 = bl * J->tb, nt = J->tiles - t0 < J->tb ? J->tiles - t0 : J->tb;
      input_tiles(J, t0, nt, V);
      if (J->dt == ATTN_F32)
        grad_tiles_f32(J, t0, nt, (float *)Z);
      else
        grad_tiles_f64(J, t0, nt, (double *)Z);
      for (int xi = 0; xi < 16; xi++)
        attn_gemm(J->dt, 0, 1, J->O, J->C, nt, 1.0, Z + (size_t)(xi * J->O * J->tb) * es, J->tb,
                  V + (size_t)(xi * J->C * J->tb) * es, J->tb, bl == k * J->chunk ? 0.0 : 1.0,
                  J->partial + (size_t)((k * 16 + xi) * J->O * J->C) * es, J->C);
    }
  }
  if (V) attn_free(V, cap[0]);
  if (Z) attn_free(Z, cap[1]);
}

typedef struct {
  const wino_job *J;
  void *dw;
} reduce_job;

/* dw[o, c] for pairs [e0, e1): the chunks' partials added in chunk order, then G^T D G (in double). */
static void reduce_dweight(void *ctx, int64_t e0, int64_t e1) {
  const reduce_job *R = ctx;
  const wino_job *J = R->J;
  int64_t oc = J->O * J->C;
  for (int64_t e = e0; e < e1; e++) {
    double d[4][4], f[3][4];
    for (int xi = 0; xi < 16; xi++) {
      double s = 0;
      for (int64_t k = 0; k < J->chunks; k++) s += load(J->dt, J->partial, (k * 16 + xi) * oc + e);
      d[xi / 4][xi % 4] = s;
    }
    for (int j = 0; j < 4; j++) {
      f[0][j] = d[0][j] + 0.5 * (d[1][j] + d[2][j]);
      f[1][j] = 0.5 * (d[1][j] - d[2][j]);
      f[2][j] = 0.5 * (d[1][j] + d[2][j]) + d[3][j];
    }
    for (int i = 0; i < 3; i++) {
      double g[3] = {f[i][0] + 0.5 * (f[i][1] + f[i][2]), 0.5 * (f[i][1] - f[i][2]), 0.5 * (f[i][1] + f[i][2]) + f[i][3]};
      for (int j = 0; j < 3; j++) store(J->dt, R->dw, e * 9 + i * 3 + j, g[j]);
    }
  }
}

int attn_conv2d_winograd_dweight(attn_dtype dt, const void *x, int64_t N, int64_t C, int64_t H, int64_t W,
                                 const void *dy, int64_t O, int64_t ph, int64_t pw, void *dw) {
  wino_job J;
  memset(&J, 0, sizeof J);
  J.dt = dt, J.x = x, J.dy = dy, J.N = N, J.C = C, J.H = H, J.W = W, J.O = O, J.ph = ph, J.pw = pw;
  tiling(&J);
  int64_t chunks = J.blocks < DW_CHUNKS ? J.blocks : DW_CHUNKS;
  J.chunk = chunks > 0 ? (J.blocks + chunks - 1) / chunks : 1;
  J.chunks = (J.blocks + J.chunk - 1) / J.chunk; /* no tiles: no chunks, dw is zero */
  size_t cap;
  J.partial = attn_alloc((size_t)((J.chunks > 0 ? J.chunks : 1) * 16 * O * C) * J.es, &cap);
  if (!J.partial) return -1;
  attn_parallel_for(J.chunks, 1, dweight_chunks, &J);
  reduce_job R = {&J, dw};
  if (!atomic_load(&J.failed)) attn_parallel_for(O * C, 512, reduce_dweight, &R);
  attn_free(J.partial, cap);
  return atomic_load(&J.failed) ? -1 : 0;
}
