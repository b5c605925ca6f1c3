/* Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution: see attn_conv_internal.h for the model. */
#include <stdatomic.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "core/attn_gemm.h"
#include "core/attn_parallel.h"
#include "cpu/cpu_dispatch.h"
#include "cpu/wino_cpu.h"
#include "nn/attn_conv_internal.h"

/* A block's transformed inputs and products take about this many bytes: they stay in the
 * core's L2 cache between the transforms and the GEMMs. */
#define BLOCK_BYTES (384 * 1024)
/* The weight gradient is summed over at most this many chunks of blocks (fixed by the shape). */
#define DW_CHUNKS 8
/* Work below about this many multiply-adds stays on the calling thread. */
#define GRAIN_FLOPS 200000

typedef struct {
  attn_dtype dt;
  size_t es;
  const attn_wino_transforms *t; /* the active set's transforms of the job's tile size */
  attn_wino_geom g;
  const char *x, *b, *dy;
  char *U, *y, *dx, *partial;
  double *dbp; /* the bias gradient's sums per chunk and output channel (chunks, O), or NULL */
  int64_t N, C, O;
  int m, np;    /* outputs per tile side (2 or 4), planes (16 or 36) */
  int64_t cpr;  /* columns per tile row: tw + 1 (F(2x2): a dummy tile), 16 tw (F(4x4): groups) */
  /* blocks: nb whole images each (band == th), or one band of band tile rows of one image (nb 1,
   * bands per image); tb columns at most */
  int64_t nb, band, bands, tb, blocks;
  int64_t chunk, chunks; /* backward: blocks per chunk, chunks */
  int phase;              /* backward: 0 runs the images' even bands, 1 the odd ones */
  char *started;          /* backward: per chunk, whether its partial holds a block yet */
  atomic_int failed;
} wino_job;

int attn_conv2d_winograd_applies(int64_t kh, int64_t kw, const int64_t stride[2], const int64_t dilation[2],
                                 int64_t groups) {
  return kh == 3 && kw == 3 && stride[0] == 1 && stride[1] == 1 && dilation[0] == 1 && dilation[1] == 1 && groups == 1;
}

/* The job's tiling from the shape alone: output (Ho, Wo) from input (H, W) and padding, blocks
 * of whole images or of bands of tile rows. */
static void tiling(wino_job *J, int m, int64_t H, int64_t W, int64_t ph, int64_t pw) {
  attn_wino_geom *g = &J->g;
  J->es = attn_dtype_size(J->dt);
  J->t = m == 2 ? &attn_cpu()->wino->f2 : &attn_cpu()->wino->f4;
  J->m = m, J->np = (m + 2) * (m + 2);
  g->H = H, g->W = W, g->ph = ph, g->pw = pw, g->Ho = H + 2 * ph - 2, g->Wo = W + 2 * pw - 2;
  if (m == 2)
    g->th = (g->Ho + 1) / 2, g->tw = (g->Wo + 1) / 2, J->cpr = g->tw + 1;
  else /* groups of 4x4 tiles of 4x4 outputs */
    g->th = (g->Ho + 15) / 16, g->tw = (g->Wo + 15) / 16, J->cpr = 16 * g->tw;
  int64_t per_tile = J->np * (J->C + J->O) * (int64_t)J->es, row = J->cpr * per_tile, image = g->th * row;
  if (image <= BLOCK_BYTES) {
    J->band = g->th, J->bands = 1, J->nb = BLOCK_BYTES / (image > 0 ? image : 1);
    if (J->nb > J->N) J->nb = J->N > 0 ? J->N : 1;
    J->blocks = (J->N + J->nb - 1) / J->nb;
  } else {
    J->nb = 1, J->band = BLOCK_BYTES / row > 0 ? BLOCK_BYTES / row : 1;
    J->bands = (g->th + J->band - 1) / J->band, J->blocks = J->N * J->bands;
  }
  J->tb = J->nb * J->band * J->cpr;
  atomic_init(&J->failed, 0);
}

/* Block bl's first image, images, first tile row and tile rows; returns its columns. */
static int64_t block_of(const wino_job *J, int64_t bl, int64_t *n0, int64_t *ni, int64_t *ti0, int64_t *rows) {
  if (J->bands == 1)
    *n0 = bl * J->nb, *ni = J->N - *n0 < J->nb ? J->N - *n0 : J->nb, *ti0 = 0, *rows = J->g.th;
  else
    *n0 = bl / J->bands, *ni = 1, *ti0 = bl % J->bands * J->band,
    *rows = J->g.th - *ti0 < J->band ? J->g.th - *ti0 : J->band;
  return *ni * *rows * J->cpr;
}

/* A workspace holds np planes of (rows, tb) entries channel by channel: entry (plane xi, channel
 * c, column) at (c np + xi) tb + column. A channel's planes are then adjacent (tb apart), so a
 * transform reads or writes one run of np tb entries per channel (which the prefetchers follow)
 * rather than np runs far apart; the GEMMs see each plane as a matrix of leading dimension np tb. */
static int64_t ws_ld(const wino_job *J) { return J->np * J->tb; }

/* Planes ahead that the per-plane loops below ask the memory for. In a training loop the tensors
 * a step writes (y, dx) and reads back (dy) were last touched steps before: Lua's collector frees
 * a cycle's garbage at once, so several outputs of one size take turns, and they lie in memory or
 * a far cache. A transform's row loads and stores then wait on one line after another (the output
 * transform took twice its time); asked for a few planes ahead, the lines come while the planes in
 * between are transformed. */
#define PLANES_AHEAD 4

/* Before plane q of a loop over planes up to end: the lines of plane q + PLANES_AHEAD's rows that
 * the band [ti0, ti0 + rows) touches, to be written or read. Planes of the input (x, dx: a band's
 * patches start ph rows before its outputs and reach 2 further) or of the output (y, dy); clipped
 * to the plane, where a band may lie all in the padding. */
static void prefetch_ahead(const wino_job *J, const char *base, int64_t q, int64_t end, int input, int64_t ti0,
                           int64_t rows, int write) {
  const int64_t t = J->m == 2 ? 2 : 16; /* output rows per tile row (F(4x4): per group row) */
  const int64_t h = input ? J->g.H : J->g.Ho, w = input ? J->g.W : J->g.Wo;
  int64_t r0 = ti0 * t - (input ? J->g.ph : 0), r1 = (ti0 + rows) * t + (input ? 2 - J->g.ph : 0);
  r0 = r0 < 0 ? 0 : r0, r1 = r1 > h ? h : r1;
  if (q + PLANES_AHEAD >= end || r0 >= r1) return;
  const char *plane = base + (size_t)((q + PLANES_AHEAD) * h * w) * J->es;
  for (size_t at = (size_t)(r0 * w) * J->es; at < (size_t)(r1 * w) * J->es; at += 64)
    if (write)
      __builtin_prefetch(plane + at, 1, 3);
    else
      __builtin_prefetch(plane + at, 0, 3);
}

/* The job's transforms of its dtype on one plane's band (cpu/wino_cpu.h). */
static void xf_input(const wino_job *J, const char *x, int64_t ti0, int64_t rows, char *V, int64_t ps, char *buf) {
  if (J->dt == ATTN_F32)
    J->t->input_f32(&J->g, (const float *)x, ti0, rows, (float *)V, ps, (float *)buf);
  else
    J->t->input_f64(&J->g, (const double *)x, ti0, rows, (double *)V, ps, (double *)buf);
}
static void xf_output(const wino_job *J, const char *M, int64_t ps, int64_t ti0, int64_t rows, int64_t o, char *y,
                      char *buf) {
  if (J->dt == ATTN_F32)
    J->t->output_f32(&J->g, (const float *)M, ps, ti0, rows, J->b ? ((const float *)J->b)[o] : 0.0f, (float *)y,
                     (float *)buf);
  else
    J->t->output_f64(&J->g, (const double *)M, ps, ti0, rows, J->b ? ((const double *)J->b)[o] : 0.0, (double *)y,
                     (double *)buf);
}
static void xf_grad(const wino_job *J, const char *dy, int64_t ti0, int64_t rows, char *Z, int64_t ps, char *buf,
                    double *sum) {
  if (J->dt == ATTN_F32)
    J->t->grad_f32(&J->g, (const float *)dy, ti0, rows, (float *)Z, ps, (float *)buf, sum);
  else
    J->t->grad_f64(&J->g, (const double *)dy, ti0, rows, (double *)Z, ps, (double *)buf, sum);
}
static void xf_adjoint(const wino_job *J, const char *M, int64_t ps, int64_t ti0, int64_t rows, char *dx, char *buf,
                       int seams) {
  if (J->dt == ATTN_F32)
    J->t->adjoint_f32(&J->g, (const float *)M, ps, ti0, rows, (float *)dx, (float *)buf, seams);
  else
    J->t->adjoint_f64(&J->g, (const double *)M, ps, ti0, rows, (double *)dx, (double *)buf, seams);
}

/* V (np planes of (C, tb)): the input transforms of block bl's planes of src (N, C, H, W). */
static void input_block(const wino_job *J, const char *src, int64_t bl, char *V, char *scratch) {
  int64_t n0, ni, ti0, rows, C = J->C, HW = J->g.H * J->g.W;
  int64_t cols = block_of(J, bl, &n0, &ni, &ti0, &rows); /* sets ni: read it after the call */
  int64_t per = cols / (ni > 0 ? ni : 1);
  for (int64_t i = 0; i < ni; i++)
    for (int64_t c = 0; c < C; c++) {
      prefetch_ahead(J, src, (n0 + i) * C + c, (n0 + ni) * C, 1, ti0, rows, 0);
      xf_input(J, src + (size_t)((n0 + i) * C + c) * HW * J->es, ti0, rows, V + (size_t)(c * ws_ld(J) + i * per) * J->es,
               J->tb, scratch);
    }
}

/* Per-task scratch for the transforms (attn_wino_scratch entries), or NULL after marking the job
 * failed. */
static char *scratch_buffer(wino_job *J, size_t *cap) {
  char *buf = attn_alloc((size_t)attn_wino_scratch(J->band, J->g.tw) * J->es, cap);
  if (!buf) atomic_store(&J->failed, 1);
  return buf;
}

static void store(attn_dtype dt, void *base, int64_t i, double v) {
  if (dt == ATTN_F32)
    ((float *)base)[i] = (float)v;
  else
    ((double *)base)[i] = v;
}

/* U (np, O, C) = G g G^T for every pair of channels: the active set's loops
 * (cpu/wino_weights_body.h). */
static void weight_transform(const wino_job *J, const void *w) {
  const attn_wino_kernels *k = attn_cpu()->wino;
  if (J->dt == ATTN_F32)
    k->weights_f32(J->m, w, J->O, J->C, (float *)J->U);
  else
    k->weights_f64(J->m, w, J->O, J->C, (double *)J->U);
}

/* C_p (M, N) = op(A_p) B_p over the np planes: A_p at A + p M K, op(A_p) = A_p (M, K), or A_p^T
 * (A_p (K, M)) with ta set (the input gradient's U^T Z from U); B_p and C_p planes of workspaces.
 * The active set's own block products in float32 (cpu/wino_cpu.h), else attn_gemm plane by plane
 * (the small GEMM's bits either way where it takes the planes). */
static void products(const wino_job *J, int ta, int64_t M, int64_t N, int64_t K, const char *A, const char *B,
                     char *C) {
  int64_t ld = ws_ld(J), tb = J->tb;
  attn_wino_gemm_nn_f32 own = J->dt == ATTN_F32 ? attn_cpu()->wino->gemm_nn_f32 : NULL;
  if (own) {
    own(J->np, ta, M, N, K, (const float *)A, (const float *)B, tb, ld, (float *)C, tb, ld);
    return;
  }
  for (int xi = 0; xi < J->np; xi++)
    attn_gemm(J->dt, ta, 0, M, N, K, 1.0, A + (size_t)(xi * M * K) * J->es, ta ? M : K, B + (size_t)(xi * tb) * J->es,
              ld, 0.0, C + (size_t)(xi * tb) * J->es, ld);
}

/* P_p (O, C) = beta P_p + Z_p V_p^T over the np planes (Z's and V's planes of workspaces, K
 * columns), P_p at P + p O C: as products(), the set's own (with pack, attn_wino_gemm_pack(tb)
 * floats) when it has them. */
static void products_t(const wino_job *J, int64_t K, const char *Z, const char *V, double beta, char *P, float *pack) {
  int64_t ld = ws_ld(J), tb = J->tb, O = J->O, C = J->C;
  attn_wino_gemm_nt_f32 own = J->dt == ATTN_F32 ? attn_cpu()->wino->gemm_nt_f32 : NULL;
  if (own) {
    own(J->np, O, C, K, (const float *)Z, tb, ld, (const float *)V, tb, ld, (float)beta, (float *)P, pack);
    return;
  }
  for (int xi = 0; xi < J->np; xi++)
    attn_gemm(J->dt, 0, 1, O, C, K, 1.0, Z + (size_t)(xi * tb) * J->es, ld, V + (size_t)(xi * tb) * J->es, ld, beta,
              P + (size_t)(xi * O * C) * J->es, C);
}

/* A block's workspace of np planes of rows x tb entries (ws_ld), or NULL after marking the job
 * failed. */
static char *workspace(wino_job *J, int64_t rows, size_t *cap) {
  char *ws = attn_alloc((size_t)(rows * ws_ld(J)) * J->es, cap);
  if (!ws) atomic_store(&J->failed, 1);
  return ws;
}

/* Blocks [b0, b1): input transforms, np products over channels, output transforms. */
static void forward_blocks(void *ctx, int64_t b0, int64_t b1) {
  wino_job *J = ctx;
  size_t es = J->es, cap[3] = {0, 0, 0};
  int64_t ld = ws_ld(J), tb = J->tb, HoWo = J->g.Ho * J->g.Wo;
  char *V = workspace(J, J->C, &cap[0]), *M = workspace(J, J->O, &cap[1]);
  char *buf = scratch_buffer(J, &cap[2]);
  for (int64_t bl = b0; V && M && buf && bl < b1; bl++) {
    int64_t n0, ni, ti0, rows, nt = block_of(J, bl, &n0, &ni, &ti0, &rows), per = nt / ni;
    input_block(J, J->x, bl, V, buf);
    products(J, 0, J->O, nt, J->C, J->U, V, M);
    for (int64_t i = 0; i < ni; i++)
      for (int64_t o = 0; o < J->O; o++) {
        prefetch_ahead(J, J->y, (n0 + i) * J->O + o, (n0 + ni) * J->O, 0, ti0, rows, 1);
        xf_output(J, M + (size_t)(o * ld + i * per) * es, tb, ti0, rows, o,
                  J->y + (size_t)((n0 + i) * J->O + o) * HoWo * es, buf);
      }
  }
  if (V) attn_free(V, cap[0]);
  if (M) attn_free(M, cap[1]);
  if (buf) attn_free(buf, cap[2]);
}

static int64_t grain(const wino_job *J) {
  int64_t work = J->np * J->tb * J->O * J->C;
  return work >= GRAIN_FLOPS ? 1 : GRAIN_FLOPS / (work > 0 ? work : 1) + 1;
}

int attn_conv2d_winograd(attn_dtype dt, int m, const void *x, int64_t N, int64_t C, int64_t H, int64_t W,
                         const void *w, const void *b, int64_t O, int64_t ph, int64_t pw, void *y) {
  wino_job J;
  memset(&J, 0, sizeof J);
  J.dt = dt, J.x = x, J.b = b, J.y = y, J.N = N, J.C = C, J.O = O;
  tiling(&J, m, H, W, ph, pw);
  if (J.blocks == 0 || J.g.th == 0 || J.g.tw == 0) return 0;
  size_t cap;
  J.U = attn_alloc((size_t)(J.np * O * C) * J.es, &cap);
  if (!J.U) return -1;
  weight_transform(&J, w);
  attn_parallel_for(J.blocks, grain(&J), forward_blocks, &J);
  attn_free(J.U, cap);
  return atomic_load(&J.failed) ? -1 : 0;
}

/* Chunks [k0, k1) of the backward in the job's phase, their blocks of that phase in order (an
 * image's even bands in phase 0, its odd bands in phase 1, whole images in phase 0): the bands
 * next to each other share two rows of dx (the seams), which the even band writes and the odd
 * band then adds into, so the bands of one phase run in parallel and the sums keep one order.
 * Z = the gradient transforms of dy (and the chunk's bias gradient sums);
 * for the weight gradient, V = the input transforms of x and the chunk's partial (np, O, C) +=
 * Z V^T; for the input gradient, dV = U^T Z (in V's place) and its adjoint transforms into dx. */
static void backward_chunks(void *ctx, int64_t k0, int64_t k1) {
  wino_job *J = ctx;
  size_t es = J->es, cap[3] = {0, 0, 0};
  int64_t ld = ws_ld(J), tb = J->tb, HoWo = J->g.Ho * J->g.Wo, HW = J->g.H * J->g.W;
  char *V = workspace(J, J->C, &cap[0]), *Z = workspace(J, J->O, &cap[1]);
  char *buf = scratch_buffer(J, &cap[2]);
  /* the set's own weight-gradient products pack V's planes here */
  size_t pack_cap = 0;
  int packs = J->partial && J->dt == ATTN_F32 && attn_cpu()->wino->gemm_nt_f32;
  float *pack = packs ? attn_alloc((size_t)attn_wino_gemm_pack(J->tb) * sizeof(float), &pack_cap) : NULL;
  if (packs && !pack) atomic_store(&J->failed, 1);
  for (int64_t k = k0; V && Z && buf && (pack || !packs) && k < k1; k++) {
    int64_t bend = (k + 1) * J->chunk < J->blocks ? (k + 1) * J->chunk : J->blocks;
    for (int64_t bl = k * J->chunk; bl < bend; bl++) {
      int64_t band = J->bands > 1 ? bl % J->bands : 0;
      if ((J->dx ? band % 2 : 0) != J->phase) continue; /* without dx, no seams: one phase */
      int64_t n0, ni, ti0, rows, nt = block_of(J, bl, &n0, &ni, &ti0, &rows), per = nt / ni;
      int seams = band % 2 ? ATTN_WINO_ADD_TOP | (band + 1 < J->bands ? ATTN_WINO_ADD_BOTTOM : 0) : 0;
      for (int64_t i = 0; i < ni; i++)
        for (int64_t o = 0; o < J->O; o++) {
          prefetch_ahead(J, J->dy, (n0 + i) * J->O + o, (n0 + ni) * J->O, 0, ti0, rows, 0);
          xf_grad(J, J->dy + (size_t)((n0 + i) * J->O + o) * HoWo * es, ti0, rows, Z + (size_t)(o * ld + i * per) * es,
                  tb, buf, J->dbp ? J->dbp + k * J->O + o : NULL);
        }
      if (J->partial) {
        input_block(J, J->x, bl, V, buf);
        products_t(J, nt, Z, V, J->started[k] ? 1.0 : 0.0, J->partial + (size_t)(k * J->np * J->O * J->C) * es, pack);
        J->started[k] = 1;
      }
      if (!J->dx) continue;
      products(J, 1, J->C, nt, J->O, J->U, Z, V);
      for (int64_t i = 0; i < ni; i++)
        for (int64_t c = 0; c < J->C; c++) {
          prefetch_ahead(J, J->dx, (n0 + i) * J->C + c, (n0 + ni) * J->C, 1, ti0, rows, 1);
          xf_adjoint(J, V + (size_t)(c * ld + i * per) * es, tb, ti0, rows,
                     J->dx + (size_t)((n0 + i) * J->C + c) * HW * es, buf, seams);
        }
    }
  }
  if (V) attn_free(V, cap[0]);
  if (Z) attn_free(Z, cap[1]);
  if (buf) attn_free(buf, cap[2]);
  if (pack) attn_free(pack, pack_cap);
}

typedef struct {
  const wino_job *J;
  void *dw;
} reduce_job;

/* dw[o, c] for pairs [e0, e1): the chunks' partials added in chunk order, then G^T D G (the active
 * set's loops, cpu/wino_weights_body.h). */
static void reduce_dweight(void *ctx, int64_t e0, int64_t e1) {
  const reduce_job *R = ctx;
  const wino_job *J = R->J;
  const attn_wino_kernels *k = attn_cpu()->wino;
  if (J->dt == ATTN_F32)
    k->reduce_f32(J->m, (const float *)J->partial, J->chunks, J->O, J->C, e0, e1, R->dw);
  else
    k->reduce_f64(J->m, (const double *)J->partial, J->chunks, J->O, J->C, e0, e1, R->dw);
}

int attn_conv2d_winograd_backward(attn_dtype dt, int m, const void *x, int64_t N, int64_t C, int64_t H, int64_t W,
                                  const void *w, const void *dy, int64_t O, int64_t ph, int64_t pw, void *dx, void *dw,
                                  void *db) {
  wino_job J;
  memset(&J, 0, sizeof J);
  J.dt = dt, J.x = x, J.dy = dy, J.dx = dx, J.N = N, J.C = C, J.O = O;
  tiling(&J, m, H, W, ph, pw);
  if (J.g.th == 0 || J.g.tw == 0) J.blocks = 0; /* no outputs: dx and dw are zero */
  int64_t chunks = J.blocks < DW_CHUNKS ? J.blocks : DW_CHUNKS;
  J.chunk = chunks > 0 ? (J.blocks + chunks - 1) / chunks : 1;
  J.chunks = (J.blocks + J.chunk - 1) / J.chunk;
  if (J.blocks == 0) {
    if (dx) memset(dx, 0, (size_t)(N * C * H * W) * J.es);
    if (dw) memset(dw, 0, (size_t)(O * C * 9) * J.es);
    if (db) memset(db, 0, (size_t)O * J.es);
    return 0;
  }
  size_t cap[4] = {0, 0, 0, 0};
  J.partial = dw ? attn_alloc((size_t)(J.chunks * J.np * O * C) * J.es, &cap[0]) : NULL;
  J.U = dx ? attn_alloc((size_t)(J.np * O * C) * J.es, &cap[1]) : NULL;
  J.dbp = db ? attn_alloc((size_t)(J.chunks * O) * sizeof(double), &cap[2]) : NULL;
  J.started = attn_alloc((size_t)J.chunks, &cap[3]);
  if ((dw && !J.partial) || (dx && !J.U) || (db && !J.dbp) || !J.started) atomic_store(&J.failed, 1);
  if (!atomic_load(&J.failed)) {
    if (J.dbp) memset(J.dbp, 0, (size_t)(J.chunks * O) * sizeof(double));
    memset(J.started, 0, (size_t)J.chunks);
    if (dx) weight_transform(&J, w);
    for (J.phase = 0; J.phase < (J.bands > 1 && dx ? 2 : 1); J.phase++)
      attn_parallel_for(J.chunks, 1, backward_chunks, &J);
  }
  reduce_job R = {&J, dw};
  if (dw && !atomic_load(&J.failed)) attn_parallel_for(O * C, 512, reduce_dweight, &R);
  for (int64_t o = 0; db && !atomic_load(&J.failed) && o < O; o++) { /* the chunks' sums, in chunk order */
    double s = 0;
    for (int64_t k = 0; k < J.chunks; k++) s += J.dbp[k * O + o];
    store(dt, db, o, s);
  }
  if (J.partial) attn_free(J.partial, cap[0]);
  if (J.U) attn_free(J.U, cap[1]);
  if (J.dbp) attn_free(J.dbp, cap[2]);
  if (J.started) attn_free(J.started, cap[3]);
  return atomic_load(&J.failed) ? -1 : 0;
}
