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

/* The tiles [t0, t0 + nt) in runs along a row of tiles: run(J, n, ti, tj0, cnt, k) for the cnt
 * tiles from (n, ti, tj0), which are tiles k .. k + cnt - 1 of the block. */
#define FOR_RUNS(J, t0, nt, n, ti, tj0, cnt, k)                                                  \
  for (int64_t k = 0, n, ti, tj0, cnt, per_ = (J)->th * (J)->tw; k < (nt); k += cnt)             \
    if ((n = ((t0) + k) / per_, ti = ((t0) + k) % per_ / (J)->tw, tj0 = ((t0) + k) % (J)->tw,      \
         cnt = (J)->tw - tj0 < (nt) - k ? (J)->tw - tj0 : (nt) - k, 1))

/* The distance between a workspace's 16 planes of rows x tb entries: rounded up to an odd
 * number of cache lines, so that the planes' streams fall in different cache sets. */
static int64_t plane_stride(const wino_job *J, int64_t rows) {
  int64_t per_line = 64 / (int64_t)J->es, lines = (rows * J->tb + per_line - 1) / per_line;
  return (lines | 1) * per_line;
}

#define DEFINE_WINO(S, T)                                                                                     \
  /* V (16 planes of (C, tb)): B^T d B of the nt tiles from t0, each channel: the patches d gathered */   \
  /* into the planes (entry (i, j) of tile k at column k of plane 4 i + j), then transformed in place */    \
  /* over the whole block at once (a loop over its tiles that vectorises: a run along one row of a */       \
  /* small image is too short for that) */                                                                  \
  static void input_tiles_##S(const wino_job *J, int64_t t0, int64_t nt, T *V, int64_t ps) {                  \
    const T *x = (const T *)J->x;                                                                           \
    int64_t H = J->H, W = J->W, tb = J->tb;                                                                 \
    FOR_RUNS(J, t0, nt, n, ti, tj0, cnt, k) {                                                               \
      int64_t q0 = 2 * tj0 - J->pw, inside = q0 >= 0 && q0 + 2 * cnt + 2 <= W;                              \
      for (int64_t c = 0; c < J->C; c++)                                                                    \
        for (int i = 0; i < 4; i++) {                                                                       \
          int64_t r = 2 * ti - J->ph + i;                                                                   \
          const T *row = r >= 0 && r < H ? x + ((n * J->C + c) * H + r) * W : NULL;                         \
          T *v = V + 4 * i * ps + c * tb + k;                                                               \
          if (row && inside)                                                                                \
            for (int64_t s = 0; s < cnt; s++)                                                               \
              for (int j = 0; j < 4; j++) v[j * ps + s] = row[q0 + 2 * s + j];                              \
          else                                                                                              \
            for (int64_t s = 0; s < cnt; s++)                                                               \
              for (int j = 0; j < 4; j++) {                                                                 \
                int64_t q = q0 + 2 * s + j;                                                                 \
                v[j * ps + s] = row && q >= 0 && q < W ? row[q] : 0;                                        \
              }                                                                                             \
        }                                                                                                   \
    }                                                                                                       \
    for (int64_t c = 0; c < J->C; c++) {                                                                    \
      T *v = V + c * tb;                                                                                    \
      for (int i = 0; i < 4; i++) { /* B^T d along columns: rows 0 - 2, 1 + 2, 2 - 1, 1 - 3 */               \
        T *restrict r0 = v + i * ps, *restrict r1 = r0 + 4 * ps, *restrict r2 = r1 + 4 * ps;                \
        T *restrict r3 = r2 + 4 * ps;                                                                       \
        for (int64_t s = 0; s < nt; s++) {                                                                  \
          T a0 = r0[s], a1 = r1[s], a2 = r2[s], a3 = r3[s];                                                 \
          r0[s] = a0 - a2, r1[s] = a1 + a2, r2[s] = a2 - a1, r3[s] = a1 - a3;                               \
        }                                                                                                   \
      }                                                                                                     \
      for (int i = 0; i < 4; i++) { /* then B along rows: the same on columns 0 .. 3 */                    \
        T *restrict r0 = v + 4 * i * ps, *restrict r1 = r0 + ps, *restrict r2 = r1 + ps;                    \
        T *restrict r3 = r2 + ps;                                                                           \
        for (int64_t s = 0; s < nt; s++) {                                                                  \
          T a0 = r0[s], a1 = r1[s], a2 = r2[s], a3 = r3[s];                                                 \
          r0[s] = a0 - a2, r1[s] = a1 + a2, r2[s] = a2 - a1, r3[s] = a1 - a3;                               \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
  }                                                                                                         \
  /* y's 2x2 tiles A^T m A (+ bias) from the products M (16 planes of (O, tb)), clipped to (Ho, Wo): */     \
  /* per channel, the four outputs of every tile of the block into buf (a loop that vectorises), then */    \
  /* stored run by run */                                                                                   \
  static void output_tiles_##S(const wino_job *J, int64_t t0, int64_t nt, const T *M, int64_t ps, T *buf) {   \
    T *y = (T *)J->y;                                                                                       \
    const T *b = (const T *)J->b;                                                                           \
    int64_t Ho = J->Ho, Wo = J->Wo, tb = J->tb;                                                             \
    T *restrict o00 = buf, *restrict o01 = buf + tb, *restrict o10 = buf + 2 * tb, *restrict o11 = buf + 3 * tb; \
    for (int64_t o = 0; o < J->O; o++) {                                                                    \
      const T *m = M + o * tb;                                                                              \
      const T *restrict m0 = m, *restrict m1 = m + ps, *restrict m2 = m + 2 * ps, *restrict m3 = m + 3 * ps; \
      const T *restrict m4 = m + 4 * ps, *restrict m5 = m + 5 * ps, *restrict m6 = m + 6 * ps;              \
      const T *restrict m7 = m + 7 * ps, *restrict m8 = m + 8 * ps, *restrict m9 = m + 9 * ps;              \
      const T *restrict m10 = m + 10 * ps, *restrict m11 = m + 11 * ps, *restrict m12 = m + 12 * ps;        \
      const T *restrict m13 = m + 13 * ps, *restrict m14 = m + 14 * ps, *restrict m15 = m + 15 * ps;        \
      T bias = b ? b[o] : 0;                                                                                \
      for (int64_t s = 0; s < nt; s++) { /* columns j of A^T m: a = rows 0 + 1 + 2, c = rows 1 - 2 - 3 */  \
        T a0 = m0[s] + m4[s] + m8[s], a1 = m1[s] + m5[s] + m9[s], a2 = m2[s] + m6[s] + m10[s];              \
        T a3 = m3[s] + m7[s] + m11[s], c0 = m4[s] - m8[s] - m12[s], c1 = m5[s] - m9[s] - m13[s];            \
        T c2 = m6[s] - m10[s] - m14[s], c3 = m7[s] - m11[s] - m15[s];                                       \
        o00[s] = a0 + a1 + a2 + bias, o01[s] = a1 - a2 - a3 + bias;                                         \
        o10[s] = c0 + c1 + c2 + bias, o11[s] = c1 - c2 - c3 + bias;                                         \
      }                                                                                                     \
      FOR_RUNS(J, t0, nt, n, ti, tj0, cnt, k) {                                                             \
        int64_t r = 2 * ti, full = 2 * (tj0 + cnt) <= Wo ? cnt : cnt - 1; /* tiles with both columns */    \
        T *y0 = y + ((n * J->O + o) * Ho + r) * Wo + 2 * tj0, *y1 = y0 + Wo;                                \
        for (int64_t s = 0; s < full; s++) y0[2 * s] = o00[k + s], y0[2 * s + 1] = o01[k + s];              \
        if (full < cnt) y0[2 * full] = o00[k + full];                                                       \
        if (r + 1 < Ho) {                                                                                   \
          for (int64_t s = 0; s < full; s++) y1[2 * s] = o10[k + s], y1[2 * s + 1] = o11[k + s];            \
          if (full < cnt) y1[2 * full] = o10[k + full];                                                     \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
  }                                                                                                         \
  /* Z (16 planes of (O, tb)): A e A^T of dy's 2x2 tiles e (zero outside (Ho, Wo)); per run and */          \
  /* channel the two rows of dy (zero-padded) into buf, then all the run's tiles at once */                 \
  static void grad_tiles_##S(const wino_job *J, int64_t t0, int64_t nt, T *Z, int64_t ps, T *buf) {           \
    const T *dy = (const T *)J->dy;                                                                         \
    int64_t Ho = J->Ho, Wo = J->Wo, tb = J->tb;                                                             \
    FOR_RUNS(J, t0, nt, n, ti, tj0, cnt, k) {                                                               \
      int64_t r = 2 * ti, q0 = 2 * tj0, w = 2 * cnt, have = Wo - q0 < w ? Wo - q0 : w;                      \
      T *restrict e0 = buf, *restrict e1 = buf + w;                                                         \
      for (int64_t o = 0; o < J->O; o++) {                                                                  \
        const T *g = dy + ((n * J->O + o) * Ho + r) * Wo + q0;                                              \
        memcpy(e0, g, (size_t)have * sizeof(T));                                                            \
        if (r + 1 < Ho)                                                                                     \
          memcpy(e1, g + Wo, (size_t)have * sizeof(T));                                                     \
        else                                                                                                \
          memset(e1, 0, (size_t)have * sizeof(T));                                                          \
        for (int64_t q = have; q < w; q++) e0[q] = 0, e1[q] = 0;                                            \
        T *restrict z = Z + o * tb + k;                                                                     \
        for (int64_t s = 0; s < cnt; s++) {                                                                 \
          T a0 = e0[2 * s], a1 = e0[2 * s + 1], c0 = e1[2 * s], c1 = e1[2 * s + 1];                         \
          T u[4][2] = {{a0, a1}, {a0 + c0, a1 + c1}, {a0 - c0, a1 - c1}, {-c0, -c1}};                       \
          for (int i = 0; i < 4; i++) {                                                                     \
            z[(4 * i + 0) * ps + s] = u[i][0], z[(4 * i + 1) * ps + s] = u[i][0] + u[i][1];                 \
            z[(4 * i + 2) * ps + s] = u[i][0] - u[i][1], z[(4 * i + 3) * ps + s] = -u[i][1];                \
          }                                                                                                 \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
  }

DEFINE_WINO(f32, float)
DEFINE_WINO(f64, double)

static void input_tiles(const wino_job *J, int64_t t0, int64_t nt, char *V, int64_t ps) {
  if (J->dt == ATTN_F32)
    input_tiles_f32(J, t0, nt, (float *)V, ps);
  else
    input_tiles_f64(J, t0, nt, (double *)V, ps);
}

/* A task's row buffer: 4 rows of tb outputs, or 2 rows of dy (attn_alloc'd, capacity in cap), or
 * NULL after marking the job failed. */
static char *row_buffer(wino_job *J, size_t *cap) {
  char *buf = attn_alloc((size_t)(4 * (2 * J->tw + 2) + 4 * J->tb) * J->es, cap);
  if (!buf) atomic_store(&J->failed, 1);
  return buf;
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

/* A block's workspace of 16 planes of rows x tb entries (plane_stride apart), or NULL after
 * marking the job failed. */
static char *workspace(wino_job *J, int64_t rows, size_t *cap) {
  char *ws = attn_alloc((size_t)(16 * plane_stride(J, rows)) * J->es, cap);
  if (!ws) atomic_store(&J->failed, 1);
  return ws;
}

/* Blocks [b0, b1): input transforms, 16 products over channels, output transforms. */
static void forward_blocks(void *ctx, int64_t b0, int64_t b1) {
  wino_job *J = ctx;
  size_t es = J->es, cap[3] = {0, 0, 0};
  int64_t pv = plane_stride(J, J->C), pm = plane_stride(J, J->O);
  char *V = workspace(J, J->C, &cap[0]), *M = workspace(J, J->O, &cap[1]);
  char *buf = row_buffer(J, &cap[2]);
  for (int64_t bl = b0; V && M && buf && bl < b1; bl++) {
    int64_t t0 = bl * J->tb, nt = J->tiles - t0 < J->tb ? J->tiles - t0 : J->tb;
    input_tiles(J, t0, nt, V, pv);
    for (int xi = 0; xi < 16; xi++)
      attn_gemm(J->dt, 0, 0, J->O, nt, J->C, 1.0, J->U + (size_t)(xi * J->O * J->C) * es, J->C,
                V + (size_t)(xi * pv) * es, J->tb, 0.0, M + (size_t)(xi * pm) * es, J->tb);
    if (J->dt == ATTN_F32)
      output_tiles_f32(J, t0, nt, (const float *)M, pm, (float *)buf);
    else
      output_tiles_f64(J, t0, nt, (const double *)M, pm, (double *)buf);
  }
  if (V) attn_free(V, cap[0]);
  if (M) attn_free(M, cap[1]);
  if (buf) attn_free(buf, cap[2]);
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
  size_t es = J->es, cap[3] = {0, 0, 0};
  int64_t pv = plane_stride(J, J->C), pz = plane_stride(J, J->O);
  char *V = workspace(J, J->C, &cap[0]), *Z = workspace(J, J->O, &cap[1]);
  char *buf = row_buffer(J, &cap[2]);
  for (int64_t k = k0; V && Z && buf && k < k1; k++) {
    int64_t bend = (k + 1) * J->chunk < J->blocks ? (k + 1) * J->chunk : J->blocks;
    for (int64_t bl = k * J->chunk; bl < bend; bl++) {
      int64_t t0 = bl * J->tb, nt = J->tiles - t0 < J->tb ? J->tiles - t0 : J->tb;
      input_tiles(J, t0, nt, V, pv);
      if (J->dt == ATTN_F32)
        grad_tiles_f32(J, t0, nt, (float *)Z, pz, (float *)buf);
      else
        grad_tiles_f64(J, t0, nt, (double *)Z, pz, (double *)buf);
      for (int xi = 0; xi < 16; xi++)
        attn_gemm(J->dt, 0, 1, J->O, J->C, nt, 1.0, Z + (size_t)(xi * pz) * es, J->tb, V + (size_t)(xi * pv) * es,
                  J->tb, bl == k * J->chunk ? 0.0 : 1.0, J->partial + (size_t)((k * 16 + xi) * J->O * J->C) * es,
                  J->C);
    }
  }
  if (V) attn_free(V, cap[0]);
  if (Z) attn_free(Z, cap[1]);
  if (buf) attn_free(buf, cap[2]);
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
