/* 2-D convolution kernels: see attn_conv.h for the model. */
#include "nn/attn_conv.h"

#include <stdatomic.h>
#include <string.h>

#include "core/attn_alloc.h"
#include "core/attn_gemm.h"
#include "core/attn_parallel.h"
#include "cpu/cpu_dispatch.h"
#include "cpu/wino_cpu.h"
#include "nn/attn_conv_internal.h"

/* Work below about this many multiply-adds stays on the calling thread. */
#define GRAIN_FLOPS 200000
/* Images are taken in blocks of about this many output positions (columns of one product): a
 * product over one small image is too thin for the GEMM to run at its rate. */
#define BLOCK_COLS 512
/* Backward sums dW over at most this many chunks of blocks: fixed by the shape alone, so the sum's order
 * (chunk partials added in chunk order) is the same on every thread count. */
#define DW_CHUNKS 8
/* AUTO runs Winograd (where it applies) from this many input and output channels and output
 * rows and columns up, where it measured faster than im2col forward and forward+backward
 * (attn_conv.h); below, the transforms and the dummy tile per tile row cost more than they save. */
#define WINO_MIN_CHANNELS 8
#define WINO_MIN_SIDE 12

typedef struct {
  attn_dtype dt;
  size_t es;
  const char *x, *w, *b, *dy;
  char *y, *dx, *partial;
  int64_t N, C, H, W, O, kh, kw, Ho, Wo, G;
  int64_t Cg, Og, Kg, L; /* channels in and out per group, rows of a group's columns, positions */
  int64_t nb;            /* images per block: one product per group covers a block's columns */
  int64_t chunk, chunks; /* blocks per dW chunk, chunks */
  attn_conv2d_params p;
  atomic_int failed;
} conv_job;

/* The output positions j in [0, n) whose tap j * s + off lies in [0, size): [*lo, *hi). */
static void valid_range(int64_t n, int64_t s, int64_t off, int64_t size, int64_t *lo, int64_t *hi) {
  int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;                   /* first j with j s + off >= 0 */
  int64_t b = size - off <= 0 ? 0 : (size - off - 1) / s + 1;      /* first j with j s + off >= size */
  *lo = a < n ? a : n;
  *hi = b < n ? b : n;
  if (*hi < *lo) *hi = *lo;
}

/* im2col: col (C kh kw, Ho Wo) from one image xn (C, H, W); col2im adds dcol back into dxn. */
#define DEFINE_COL(S, T)                                                                              \
  /* n entries from src to dst: a row of an image is often shorter than memcpy's call costs, so */  \
  /* runs of 32 bytes by fixed-size copies (inlined), the last one overlapping the one before */    \
  static void copy_run_##S(T *dst, const T *src, int64_t n) {                                         \
    const int64_t v = (int64_t)(32 / sizeof(T));                                                      \
    if (n < v) {                                                                                      \
      memcpy(dst, src, (size_t)(n > 0 ? n : 0) * sizeof(T));                                          \
      return;                                                                                         \
    }                                                                                                 \
    int64_t j = 0;                                                                                    \
    for (; j + v <= n; j += v) memcpy(dst + j, src + j, 32);                                          \
    if (j < n) memcpy(dst + n - v, src + n - v, 32);                                                  \
  }                                                                                                   \
  static void im2col_##S(const conv_job *J, const T *xn, T *col, int64_t L) {                         \
    int64_t Wo = J->Wo;                                                                               \
    for (int64_t c = 0; c < J->C; c++)                                                                \
      for (int64_t p = 0; p < J->kh; p++)                                                             \
        for (int64_t q = 0; q < J->kw; q++) {                                                         \
          T *dst = col + ((c * J->kh + p) * J->kw + q) * L;                                           \
          int64_t offw = q * J->p.dilation[1] - J->p.padding[1], lo, hi;                              \
          valid_range(Wo, J->p.stride[1], offw, J->W, &lo, &hi);                                      \
          for (int64_t i = 0; i < J->Ho; i++, dst += Wo) {                                            \
            int64_t ih = i * J->p.stride[0] - J->p.padding[0] + p * J->p.dilation[0];                 \
            if (ih < 0 || ih >= J->H) {                                                               \
              memset(dst, 0, (size_t)Wo * sizeof(T));                                                 \
              continue;                                                                               \
            }                                                                                         \
            const T *src = xn + (c * J->H + ih) * J->W + offw;                                        \
            int64_t s = J->p.stride[1];                                                               \
            for (int64_t j = 0; j < lo; j++) dst[j] = 0;                                              \
            if (s == 1)                                                                               \
              copy_run_##S(dst + lo, src + lo, hi - lo);                                              \
            else                                                                                      \
              for (int64_t j = lo; j < hi; j++) dst[j] = src[j * s];                                  \
            for (int64_t j = hi; j < Wo; j++) dst[j] = 0;                                             \
          }                                                                                           \
        }                                                                                             \
  }                                                                                                   \
  static void col2im_##S(const conv_job *J, const T *col, T *dxn, int64_t L) {                        \
    int64_t Wo = J->Wo;                                                                               \
    memset(dxn, 0, (size_t)(J->C * J->H * J->W) * sizeof(T));                                         \
    for (int64_t c = 0; c < J->C; c++)                                                                \
      for (int64_t p = 0; p < J->kh; p++)                                                             \
        for (int64_t q = 0; q < J->kw; q++) {                                                         \
          const T *src = col + ((c * J->kh + p) * J->kw + q) * L;                                     \
          int64_t offw = q * J->p.dilation[1] - J->p.padding[1], lo, hi;                              \
          valid_range(Wo, J->p.stride[1], offw, J->W, &lo, &hi);                                      \
          int64_t s = J->p.stride[1];                                                                 \
          for (int64_t i = 0; i < J->Ho; i++, src += Wo) {                                            \
            int64_t ih = i * J->p.stride[0] - J->p.padding[0] + p * J->p.dilation[0];                 \
            if (ih < 0 || ih >= J->H) continue;                                                       \
            T *dst = dxn + (c * J->H + ih) * J->W + offw;                                             \
            if (s == 1) /* unit stride: a loop the compiler vectorises */                             \
              for (int64_t j = lo; j < hi; j++) dst[j] += src[j];                                     \
            else                                                                                      \
              for (int64_t j = lo; j < hi; j++) dst[j * s] += src[j];                                 \
          }                                                                                           \
        }                                                                                             \
  }                                                                                                   \
  /* rows o of a block's outputs (O, cols) = b[o]: the products then add onto them */               \
  static void fill_bias_##S(const conv_job *J, T *yb, int64_t cols) {                                 \
    const T *b = (const T *)J->b;                                                                     \
    for (int64_t o = 0; o < J->O; o++)                                                                \
      for (int64_t l = 0; l < cols; l++) yb[o * cols + l] = b[o];                                     \
  }                                                                                                   \
  /* db[o] for o in [o0, o1): each image's row of dy summed in 32 lanes of T (position l in lane */ \
  /* l mod 32; vector adds even on the baseline ISA), the lanes added into doubles after every 256 */ \
  /* positions (at most 8 terms per lane in T, whatever the plane's size), then pairwise: a fixed */ \
  /* order */                                                                                       \
  static void sum_db_##S(const conv_job *J, T *db, int64_t o0, int64_t o1) {                          \
    const T *dy = (const T *)J->dy;                                                                   \
    for (int64_t o = o0; o < o1; o++) {                                                               \
      double acc[32] = {0};                                                                           \
      for (int64_t n = 0; n < J->N; n++) {                                                            \
        const T *row = dy + (n * J->O + o) * J->L;                                                    \
        for (int64_t l0 = 0; l0 < J->L; l0 += 256) {                                                  \
          const int64_t end = J->L - l0 < 256 ? J->L : l0 + 256;                                      \
          T lane[32] = {0};                                                                           \
          int64_t l = l0;                                                                             \
          for (; l + 32 <= end; l += 32)                                                              \
            for (int i = 0; i < 32; i++) lane[i] += row[l + i];                                       \
          for (int i = 0; l + i < end; i++) lane[i] += row[l + i];                                    \
          for (int i = 0; i < 32; i++) acc[i] += (double)lane[i];                                     \
        }                                                                                             \
      }                                                                                               \
      for (int w = 16; w > 0; w /= 2)                                                                 \
        for (int i = 0; i < w; i++) acc[i] += acc[i + w];                                             \
      db[o] = (T)acc[0];                                                                              \
    }                                                                                                 \
  }

DEFINE_COL(f32, float)
DEFINE_COL(f64, double)

/* Columns of one image at col, rows ld entries apart (ld = the block's columns). */
static void im2col(const conv_job *J, const char *xn, char *col, int64_t ld) {
  if (J->dt == ATTN_F32)
    im2col_f32(J, (const float *)xn, (float *)col, ld);
  else
    im2col_f64(J, (const double *)xn, (double *)col, ld);
}

static void col2im(const conv_job *J, const char *col, char *dxn, int64_t ld) {
  if (J->dt == ATTN_F32)
    col2im_f32(J, (const float *)col, (float *)dxn, ld);
  else
    col2im_f64(J, (const double *)col, (double *)dxn, ld);
}

/* Images [n0, n0 + t) of block b (the last block may be short). */
static int64_t block_images(const conv_job *J, int64_t b, int64_t *n0) {
  *n0 = b * J->nb;
  return J->N - *n0 < J->nb ? J->N - *n0 : J->nb;
}

/* rows (O) of per-image planes (N, O, L) <-> a block matrix (O, t L): gather copies images
 * [n0, n0 + t) of planes into block, scatter the other way. */
static void gather(const conv_job *J, const char *planes, int64_t n0, int64_t t, char *block) {
  size_t row = (size_t)J->L * J->es;
  for (int64_t i = 0; i < t; i++)
    for (int64_t o = 0; o < J->O; o++)
      memcpy(block + (size_t)(o * t + i) * row, planes + (size_t)((n0 + i) * J->O + o) * row, row);
}
static void scatter(const conv_job *J, const char *block, int64_t n0, int64_t t, char *planes) {
  size_t row = (size_t)J->L * J->es;
  for (int64_t i = 0; i < t; i++)
    for (int64_t o = 0; o < J->O; o++)
      memcpy(planes + (size_t)((n0 + i) * J->O + o) * row, block + (size_t)(o * t + i) * row, row);
}

/* A workspace of rows rows of one block's columns, or NULL after marking the job failed. */
static char *workspace(conv_job *J, int64_t rows, size_t *cap) {
  char *ws = attn_alloc((size_t)(rows * J->nb * J->L) * J->es, cap);
  if (!ws) atomic_store(&J->failed, 1);
  return ws;
}

/* Blocks [b0, b1) of images: columns, one product per group, outputs back to (N, O, L). */
static void forward_blocks(void *ctx, int64_t b0, int64_t b1) {
  conv_job *J = ctx;
  size_t es = J->es, cap[2] = {0, 0};
  char *col = workspace(J, J->C * J->kh * J->kw, &cap[0]);
  char *out = J->nb > 1 ? workspace(J, J->O, &cap[1]) : NULL;
  if (!col || (J->nb > 1 && !out)) goto done;
  for (int64_t b = b0; b < b1; b++) {
    int64_t n0, t = block_images(J, b, &n0), cols = t * J->L;
    for (int64_t i = 0; i < t; i++)
      im2col(J, J->x + (size_t)((n0 + i) * J->C * J->H * J->W) * es, col + (size_t)(i * J->L) * es, cols);
    char *yb = t > 1 ? out : J->y + (size_t)(n0 * J->O * J->L) * es;
    if (J->b && J->dt == ATTN_F32)
      fill_bias_f32(J, (float *)yb, cols);
    else if (J->b)
      fill_bias_f64(J, (double *)yb, cols);
    for (int64_t g = 0; g < J->G; g++)
      attn_gemm(J->dt, 0, 0, J->Og, cols, J->Kg, 1.0, J->w + (size_t)(g * J->Og * J->Kg) * es, J->Kg,
                col + (size_t)(g * J->Kg * cols) * es, cols, J->b ? 1.0 : 0.0, yb + (size_t)(g * J->Og * cols) * es,
                cols);
    if (t > 1) scatter(J, out, n0, t, J->y);
  }
done:
  if (col) attn_free(col, cap[0]);
  if (out) attn_free(out, cap[1]);
}

/* Chunks [k0, k1) of blocks: dW partials (chunk k's sum into partial k) and dx per image. A
 * partial holds dW transposed, per group (Kg, Og) = col_g dY_g^T: the product then packs only the
 * short dY_g^T rather than the whole of col_g^T. */
static void backward_chunks(void *ctx, int64_t k0, int64_t k1) {
  conv_job *J = ctx;
  size_t es = J->es, cap[3] = {0, 0, 0};
  int64_t K = J->C * J->kh * J->kw;
  char *col = workspace(J, K, &cap[0]); /* columns for dW, then dcol for dx */
  char *dyb = J->nb > 1 ? workspace(J, J->O, &cap[1]) : NULL;
  char *dcol = J->partial && J->dx ? workspace(J, K, &cap[2]) : col;
  if (!col || (J->nb > 1 && !dyb) || !dcol) goto done;
  int64_t wn = J->O * J->Kg, blocks = (J->N + J->nb - 1) / J->nb;
  for (int64_t k = k0; k < k1; k++) {
    int64_t bend = (k + 1) * J->chunk < blocks ? (k + 1) * J->chunk : blocks;
    for (int64_t b = k * J->chunk; b < bend; b++) {
      int64_t n0, t = block_images(J, b, &n0), cols = t * J->L;
      const char *dy = J->dy + (size_t)(n0 * J->O * J->L) * es;
      if (t > 1) gather(J, J->dy, n0, t, dyb), dy = dyb;
      if (J->partial) {
        for (int64_t i = 0; i < t; i++)
          im2col(J, J->x + (size_t)((n0 + i) * J->C * J->H * J->W) * es, col + (size_t)(i * J->L) * es, cols);
        for (int64_t g = 0; g < J->G; g++)
          attn_gemm(J->dt, 0, 1, J->Kg, J->Og, cols, 1.0, col + (size_t)(g * J->Kg * cols) * es, cols,
                    dy + (size_t)(g * J->Og * cols) * es, cols, b == k * J->chunk ? 0.0 : 1.0,
                    J->partial + (size_t)(k * wn + g * J->Og * J->Kg) * es, J->Og);
      }
      if (J->dx) {
        for (int64_t g = 0; g < J->G; g++)
          attn_gemm(J->dt, 1, 0, J->Kg, cols, J->Og, 1.0, J->w + (size_t)(g * J->Og * J->Kg) * es, J->Kg,
                    dy + (size_t)(g * J->Og * cols) * es, cols, 0.0, dcol + (size_t)(g * J->Kg * cols) * es, cols);
        for (int64_t i = 0; i < t; i++)
          col2im(J, dcol + (size_t)(i * J->L) * es, J->dx + (size_t)((n0 + i) * J->C * J->H * J->W) * es, cols);
      }
    }
  }
done:
  if (col) attn_free(col, cap[0]);
  if (dyb) attn_free(dyb, cap[1]);
  if (dcol && dcol != col) attn_free(dcol, cap[2]);
}

typedef struct {
  const conv_job *J;
  void *dw, *db;
} reduce_job;

/* dW entries [e0, e1): the chunk partials (transposed per group) added in chunk order (in double). */
static void reduce_dw(void *ctx, int64_t e0, int64_t e1) {
  const reduce_job *R = ctx;
  const conv_job *J = R->J;
  int64_t wn = J->O * J->Kg, chunks = J->chunks, gn = J->Og * J->Kg;
  for (int64_t e = e0; e < e1; e++) {
    int64_t g = e / gn, o = e % gn / J->Kg, r = e % J->Kg, at = g * gn + r * J->Og + o;
    double s = 0;
    for (int64_t k = 0; k < chunks; k++)
      s += J->dt == ATTN_F32 ? (double)((const float *)J->partial)[k * wn + at]
                             : ((const double *)J->partial)[k * wn + at];
    if (J->dt == ATTN_F32)
      ((float *)R->dw)[e] = (float)s;
    else
      ((double *)R->dw)[e] = s;
  }
}

static void fast_db(void *ctx, int64_t o0, int64_t o1) {
  const reduce_job *R = ctx;
  if (R->J->dt == ATTN_F32)
    sum_db_f32(R->J, R->db, o0, o1);
  else
    sum_db_f64(R->J, R->db, o0, o1);
}

/* The reference path's db[o] for o in [o0, o1): dy summed over images, then positions, one at a
 * time in order (in double). */
static void reduce_db(void *ctx, int64_t o0, int64_t o1) {
  const reduce_job *R = ctx;
  const conv_job *J = R->J;
  for (int64_t o = o0; o < o1; o++) {
    double s = 0;
    for (int64_t n = 0; n < J->N; n++) {
      int64_t at = (n * J->O + o) * J->L;
      if (J->dt == ATTN_F32)
        for (int64_t l = 0; l < J->L; l++) s += ((const float *)J->dy)[at + l];
      else
        for (int64_t l = 0; l < J->L; l++) s += ((const double *)J->dy)[at + l];
    }
    if (J->dt == ATTN_F32)
      ((float *)R->db)[o] = (float)s;
    else
      ((double *)R->db)[o] = s;
  }
}

/* ---------------------------------------------------------------- reference */

/* The formula of attn_conv2d.h as loops: calls visit(ctx, x index, w index, y index) for every
 * tap that reads the input, in a fixed order. */
typedef void (*tap_fn)(void *ctx, int64_t xi, int64_t wi, int64_t yi);
static void for_each_tap(const conv_job *J, tap_fn visit, void *ctx) {
  for (int64_t n = 0; n < J->N; n++)
    for (int64_t o = 0; o < J->O; o++) {
      int64_t g = o / J->Og;
      for (int64_t i = 0; i < J->Ho; i++)
        for (int64_t j = 0; j < J->Wo; j++) {
          int64_t yi = ((n * J->O + o) * J->Ho + i) * J->Wo + j;
          for (int64_t c = 0; c < J->Cg; c++)
            for (int64_t p = 0; p < J->kh; p++) {
              int64_t ih = i * J->p.stride[0] - J->p.padding[0] + p * J->p.dilation[0];
              if (ih < 0 || ih >= J->H) continue;
              for (int64_t q = 0; q < J->kw; q++) {
                int64_t iw = j * J->p.stride[1] - J->p.padding[1] + q * J->p.dilation[1];
                if (iw < 0 || iw >= J->W) continue;
                int64_t xi = ((n * J->C + g * J->Cg + c) * J->H + ih) * J->W + iw;
                visit(ctx, xi, ((o * J->Cg + c) * J->kh + p) * J->kw + q, yi);
              }
            }
        }
    }
}

typedef struct {
  const conv_job *J;
  double *acc_x, *acc_w, *acc_y;
} ref_job;

static double get(attn_dtype dt, const char *base, int64_t i) {
  return dt == ATTN_F32 ? (double)((const float *)base)[i] : ((const double *)base)[i];
}
static void put(attn_dtype dt, char *base, int64_t i, double v) {
  if (dt == ATTN_F32)
    ((float *)base)[i] = (float)v;
  else
    ((double *)base)[i] = v;
}

static void ref_forward_tap(void *ctx, int64_t xi, int64_t wi, int64_t yi) {
  ref_job *R = ctx;
  R->acc_y[yi] += get(R->J->dt, R->J->w, wi) * get(R->J->dt, R->J->x, xi);
}

static void ref_backward_tap(void *ctx, int64_t xi, int64_t wi, int64_t yi) {
  ref_job *R = ctx;
  double g = get(R->J->dt, R->J->dy, yi);
  if (R->acc_x) R->acc_x[xi] += g * get(R->J->dt, R->J->w, wi);
  if (R->acc_w) R->acc_w[wi] += g * get(R->J->dt, R->J->x, xi);
}

/* A zeroed double buffer of n entries (at least one), or NULL with an error. */
static double *zeros(const char *op, int64_t n, size_t *cap) {
  double *d = attn_alloc((size_t)(n > 0 ? n : 1) * sizeof(double), cap);
  if (d) memset(d, 0, (size_t)(n > 0 ? n : 1) * sizeof(double));
  if (!d) attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the reference path's sums", op);
  return d;
}

/* ---------------------------------------------------------------- checks */

static attn_status check_operand(const char *op, const char *what, const attn_tensor *t, attn_dtype dt, int ndim,
                                 const int64_t *shape) {
  if (t->dtype != dt)
    return attn_error(ATTN_ERR_DTYPE, "%s: %s %s is %s, expected %s", op, what, attn_tensor_shape_str(t),
                      attn_dtype_name(t->dtype), attn_dtype_name(dt));
  int same = t->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (!same)
    return attn_error(ATTN_ERR_SHAPE, "%s: %s %s must be %s", op, what, attn_tensor_shape_str(t),
                      attn_shape_str(ndim, shape));
  if (!attn_tensor_is_contiguous(t))
    return attn_error(ATTN_ERR_ARG, "%s: %s %s must be contiguous", op, what, attn_tensor_shape_str(t));
  return ATTN_OK;
}

attn_status attn_conv2d_shape(const char *op, const attn_tensor *x, const attn_tensor *weight,
                              const attn_conv2d_params *p, int64_t out[4]) {
  if (attn_check_float(op, x) != ATTN_OK) return ATTN_ERR_DTYPE;
  if (x->ndim != 4)
    return attn_error(ATTN_ERR_SHAPE, "%s: input %s must be 4-D (N, C, H, W)", op, attn_tensor_shape_str(x));
  if (weight->ndim != 4)
    return attn_error(ATTN_ERR_SHAPE, "%s: weight %s must be 4-D (out_channels, in_channels / groups, kh, kw)", op,
                      attn_tensor_shape_str(weight));
  const int64_t *s = p->stride, *pad = p->padding, *d = p->dilation;
  if (s[0] < 1 || s[1] < 1)
    return attn_error(ATTN_ERR_ARG, "%s: stride %lldx%lld must be positive", op, (long long)s[0], (long long)s[1]);
  if (pad[0] < 0 || pad[1] < 0)
    return attn_error(ATTN_ERR_ARG, "%s: padding %lldx%lld must be >= 0", op, (long long)pad[0], (long long)pad[1]);
  if (d[0] < 1 || d[1] < 1)
    return attn_error(ATTN_ERR_ARG, "%s: dilation %lldx%lld must be positive", op, (long long)d[0], (long long)d[1]);
  int64_t C = x->shape[1], O = weight->shape[0], G = p->groups;
  if (G < 1 || C % G != 0 || O % G != 0)
    return attn_error(ATTN_ERR_ARG, "%s: groups %lld must divide in_channels %lld and out_channels %lld", op,
                      (long long)G, (long long)C, (long long)O);
  if (weight->shape[1] * G != C)
    return attn_error(ATTN_ERR_SHAPE,
                      "%s: input %s has %lld channels, weight %s with groups %lld expects %lld", op,
                      attn_tensor_shape_str(x), (long long)C, attn_tensor_shape_str(weight), (long long)G,
                      (long long)(weight->shape[1] * G));
  int64_t kh = weight->shape[2], kw = weight->shape[3];
  int64_t eh = d[0] * (kh - 1) + 1, ew = d[1] * (kw - 1) + 1;
  int64_t ph = x->shape[2] + 2 * pad[0], pw = x->shape[3] + 2 * pad[1];
  if (kh < 1 || kw < 1 || eh > ph || ew > pw)
    return attn_error(ATTN_ERR_SHAPE,
                      "%s: kernel %lldx%lld (dilation %lldx%lld: %lldx%lld) is larger than the padded input "
                      "%lldx%lld (input %s, padding %lldx%lld)",
                      op, (long long)kh, (long long)kw, (long long)d[0], (long long)d[1], (long long)eh,
                      (long long)ew, (long long)ph, (long long)pw, attn_tensor_shape_str(x), (long long)pad[0],
                      (long long)pad[1]);
  out[0] = x->shape[0], out[1] = O;
  out[2] = (ph - eh) / s[0] + 1, out[3] = (pw - ew) / s[1] + 1;
  /* BLAS's int sizes: one image's columns and products stay below 2^31 entries */
  if (C * kh * kw * out[2] * out[3] > INT32_MAX || O * out[2] * out[3] > INT32_MAX)
    return attn_error(ATTN_ERR_SHAPE, "%s: input %s with weight %s unfolds to more than 2^31 entries per image", op,
                      attn_tensor_shape_str(x), attn_tensor_shape_str(weight));
  return ATTN_OK;
}

static attn_status setup(const char *op, const attn_tensor *x, const attn_tensor *weight,
                         const attn_conv2d_params *p, conv_job *J, int64_t yshape[4]) {
  attn_status st = attn_conv2d_shape(op, x, weight, p, yshape);
  if (st == ATTN_OK && !attn_tensor_is_contiguous(x))
    st = attn_error(ATTN_ERR_ARG, "%s: input %s must be contiguous", op, attn_tensor_shape_str(x));
  if (st == ATTN_OK) st = check_operand(op, "weight", weight, x->dtype, 4, weight->shape);
  if (st != ATTN_OK) return st;
  memset(J, 0, sizeof *J);
  J->dt = x->dtype, J->es = attn_dtype_size(x->dtype), J->p = *p;
  J->x = attn_tensor_data(x), J->w = attn_tensor_data(weight);
  J->N = x->shape[0], J->C = x->shape[1], J->H = x->shape[2], J->W = x->shape[3];
  J->O = weight->shape[0], J->kh = weight->shape[2], J->kw = weight->shape[3];
  J->Ho = yshape[2], J->Wo = yshape[3], J->G = p->groups;
  J->Cg = J->C / J->G, J->Og = J->O / J->G, J->Kg = J->Cg * J->kh * J->kw, J->L = J->Ho * J->Wo;
  /* one image per product when the engine's small kernel takes it (it runs as fast on one
   * image's columns and then needs no copies between the block and (N, O, L) layouts) */
  int small = J->dt == ATTN_F32 && attn_gemm_is_small(0, J->Og, J->L, J->Kg);
  J->nb = small || J->L >= BLOCK_COLS ? 1 : BLOCK_COLS / J->L;
  if (J->nb > J->N) J->nb = J->N > 0 ? J->N : 1;
  atomic_init(&J->failed, 0);
  return ATTN_OK;
}

static int64_t grain(const conv_job *J, int64_t images) {
  int64_t work = images * J->O * J->Kg * J->L;
  return work >= GRAIN_FLOPS ? 1 : GRAIN_FLOPS / (work > 0 ? work : 1) + 1;
}

/* Whether kernel runs Winograd on J (attn_conv.h): in *wino its tile side (2 or 4), or 0; fails
 * when WINOGRAD or WINOGRAD4 was asked for and does not apply. */
static attn_status pick_winograd(const char *op, const conv_job *J, attn_conv2d_kernel kernel, const attn_tensor *x,
                                 const attn_tensor *weight, int *wino) {
  int applies = attn_conv2d_winograd_applies(J->kh, J->kw, J->p.stride, J->p.dilation, J->G);
  int asked = kernel == ATTN_CONV_WINOGRAD || kernel == ATTN_CONV_WINOGRAD4;
  if (asked && !applies)
    return attn_error(ATTN_ERR_ARG,
                      "%s: kernel '%s' takes 3x3 kernels at stride 1, dilation 1 and groups 1, got input %s, weight %s, "
                      "stride %lldx%lld, dilation %lldx%lld, groups %lld",
                      op, kernel == ATTN_CONV_WINOGRAD ? "winograd" : "winograd4", attn_tensor_shape_str(x),
                      attn_tensor_shape_str(weight), (long long)J->p.stride[0], (long long)J->p.stride[1],
                      (long long)J->p.dilation[0], (long long)J->p.dilation[1], (long long)J->G);
  int automatic = kernel == ATTN_CONV_AUTO && applies && J->C >= WINO_MIN_CHANNELS && J->O >= WINO_MIN_CHANNELS &&
                  J->Ho >= WINO_MIN_SIDE && J->Wo >= WINO_MIN_SIDE;
  /* AUTO takes F(4x4) where the active set has its own float32 transforms for it */
  int four = kernel == ATTN_CONV_WINOGRAD4 || (automatic && J->dt == ATTN_F32 && attn_cpu()->wino->own4_f32);
  *wino = four ? 4 : asked || automatic ? 2 : 0;
  return ATTN_OK;
}

attn_status attn_conv2d_forward(const attn_tensor *x, const attn_tensor *weight, const attn_tensor *bias,
                                const attn_conv2d_params *p, attn_conv2d_kernel kernel, attn_tensor *y) {
  const char *op = "conv2d";
  conv_job J;
  int64_t ys[4];
  int wino = 0;
  attn_status st = setup(op, x, weight, p, &J, ys);
  if (st == ATTN_OK) st = pick_winograd(op, &J, kernel, x, weight, &wino);
  if (st == ATTN_OK && bias) st = check_operand(op, "bias", bias, x->dtype, 1, &ys[1]);
  if (st == ATTN_OK) st = check_operand(op, "output", y, x->dtype, 4, ys);
  if (st != ATTN_OK) return st;
  J.b = bias ? attn_tensor_data(bias) : NULL, J.y = attn_tensor_data(y);
  if (wino) {
    if (attn_conv2d_winograd(J.dt, wino, J.x, J.N, J.C, J.H, J.W, J.w, J.b, J.O, J.p.padding[0], J.p.padding[1], J.y))
      return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the Winograd tiles of input %s", op,
                        attn_tensor_shape_str(x));
    return ATTN_OK;
  }
  if (kernel == ATTN_CONV_REFERENCE) {
    size_t cap;
    int64_t ny = attn_tensor_numel(y);
    double *acc = zeros(op, ny, &cap);
    if (!acc) return ATTN_ERR_MEMORY;
    ref_job R = {&J, NULL, NULL, acc};
    for_each_tap(&J, ref_forward_tap, &R);
    for (int64_t i = 0; i < ny; i++) put(J.dt, J.y, i, acc[i] + (J.b ? get(J.dt, J.b, (i / J.L) % J.O) : 0));
    attn_free(acc, cap);
    return ATTN_OK;
  }
  attn_parallel_for((J.N + J.nb - 1) / J.nb, grain(&J, J.nb), forward_blocks, &J);
  if (atomic_load(&J.failed))
    return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the columns of input %s", op, attn_tensor_shape_str(x));
  return ATTN_OK;
}

attn_status attn_conv2d_backward(const attn_tensor *x, const attn_tensor *weight, const attn_conv2d_params *p,
                                 const attn_tensor *dy, attn_conv2d_kernel kernel, attn_tensor *dx,
                                 attn_tensor *dweight, attn_tensor *dbias) {
  const char *op = "conv2d backward";
  conv_job J;
  int64_t ys[4];
  int wino = 0;
  attn_status st = setup(op, x, weight, p, &J, ys);
  if (st == ATTN_OK) st = pick_winograd(op, &J, kernel, x, weight, &wino);
  if (st == ATTN_OK) st = check_operand(op, "output gradient", dy, x->dtype, 4, ys);
  if (st == ATTN_OK && dx) st = check_operand(op, "input gradient", dx, x->dtype, 4, x->shape);
  if (st == ATTN_OK && dweight) st = check_operand(op, "weight gradient", dweight, x->dtype, 4, weight->shape);
  if (st == ATTN_OK && dbias) st = check_operand(op, "bias gradient", dbias, x->dtype, 1, &ys[1]);
  if (st != ATTN_OK) return st;
  J.dy = attn_tensor_data(dy), J.dx = dx ? attn_tensor_data(dx) : NULL;
  reduce_job R = {&J, dweight ? attn_tensor_data(dweight) : NULL, dbias ? attn_tensor_data(dbias) : NULL};
  int64_t wn = J.O * J.Kg;
  if (wino) {
    /* the bias gradient as the gradient transforms read dy; alone, by its own sum */
    if ((dx || dweight) && attn_conv2d_winograd_backward(J.dt, wino, J.x, J.N, J.C, J.H, J.W, J.w, J.dy, J.O,
                                                         J.p.padding[0], J.p.padding[1], J.dx, R.dw, R.db))
      return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the Winograd tiles of input %s", op,
                        attn_tensor_shape_str(x));
    if (dbias && !dx && !dweight) attn_parallel_for(J.O, 64, fast_db, &R);
    return ATTN_OK;
  }
  if (kernel == ATTN_CONV_REFERENCE) {
    size_t cap[2];
    int64_t nx = attn_tensor_numel(x);
    ref_job F = {&J, dx ? zeros(op, nx, &cap[0]) : NULL, dweight ? zeros(op, wn, &cap[1]) : NULL, NULL};
    if ((dx && !F.acc_x) || (dweight && !F.acc_w)) {
      if (F.acc_x) attn_free(F.acc_x, cap[0]);
      if (F.acc_w) attn_free(F.acc_w, cap[1]);
      return ATTN_ERR_MEMORY;
    }
    for_each_tap(&J, ref_backward_tap, &F);
    for (int64_t i = 0; dx && i < nx; i++) put(J.dt, J.dx, i, F.acc_x[i]);
    for (int64_t i = 0; dweight && i < wn; i++) put(J.dt, R.dw, i, F.acc_w[i]);
    if (F.acc_x) attn_free(F.acc_x, cap[0]);
    if (F.acc_w) attn_free(F.acc_w, cap[1]);
    if (dbias) reduce_db(&R, 0, J.O);
    return ATTN_OK;
  }
  int64_t blocks = (J.N + J.nb - 1) / J.nb, chunks = blocks < DW_CHUNKS ? blocks : DW_CHUNKS;
  J.chunk = chunks > 0 ? (blocks + chunks - 1) / chunks : 1;
  chunks = J.chunks = (blocks + J.chunk - 1) / J.chunk; /* no images: no chunks, dW is zero */
  size_t cap = 0;
  if (dweight) {
    J.partial = attn_alloc((size_t)((chunks > 0 ? chunks : 1) * wn) * J.es, &cap);
    if (!J.partial) return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for weight %s's partial sums", op,
                                      attn_tensor_shape_str(weight));
  }
  if (dx || dweight) attn_parallel_for(chunks, grain(&J, J.chunk * J.nb * 2), backward_chunks, &J);
  if (!atomic_load(&J.failed) && dweight) attn_parallel_for(wn, 4096, reduce_dw, &R);
  if (J.partial) attn_free(J.partial, cap);
  if (atomic_load(&J.failed))
    return attn_error(ATTN_ERR_MEMORY, "%s: out of memory for the columns of input %s", op, attn_tensor_shape_str(x));
  if (dbias) attn_parallel_for(J.O, 64, fast_db, &R);
  return ATTN_OK;
}
