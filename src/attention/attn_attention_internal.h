/* attn_attention_internal (internal): types and entry points shared by the
 * attention kernel files. Not API.
 *   attn_attention.c       sets every call up (checks, lengths, keep-mask, operands) and runs
 *                          attention over given scores
 *   attn_sdpa.c            dot-product attention's entry points: flash or reference
 *   attn_sdpa_reference.c  the blocked reference driver over (batch, row block)
 *   attn_sdpa_rows.c       its row kernels (softmax row, its backward, dropout, fallbacks)
 *   attn_sdpa_flash.c      the flash drivers; the kernels are src/cpu/flash_*.c */
#ifndef ATTN_ATTENTION_INTERNAL_H
#define ATTN_ATTENTION_INTERNAL_H

#include <stdatomic.h>

#include "attention/attn_attention.h"
#include "core/attn_dropout.h"

/* The head mapping of a call's rows: row b = s*H + h of the (B*H) rows is head h of sample s;
 * an operand of nh heads per sample and grp query heads per head (grouped-query keys and values:
 * grp = H / Hkv) keeps head h / grp of sample s at s*sb + (h / grp)*sh elements. nh = 1, grp = 1
 * (3-D operands): row b at b*sb. */
static inline int64_t attn_attention_head_off(int64_t b, int64_t nh, int64_t grp, int64_t sb, int64_t sh) {
  return nh == 1 ? b * sb : (b / nh) * sb + ((b % nh) / grp) * sh;
}

/* An operand: element [b][r][c] (b one of the call's rows, attn_attention_head_off) at
 * p + (head_off(b) + r*sr + c*sc) elements. For BLAS, each batch matrix is row-major (trans 0,
 * ld = sr) or column-major (trans 1, ld = sc). */
typedef struct {
  const char *p;
  int64_t sb, sr, sc;
  int64_t sh, nh, grp; /* heads: 3-D operands have nh = grp = 1 */
  int trans;
  int ld;
} attn_attention_mat;

static inline const void *attn_attention_at(const attn_attention_mat *m, size_t es, int64_t b, int64_t r, int64_t c) {
  return m->p + (size_t)(attn_attention_head_off(b, m->nh, m->grp, m->sb, m->sh) + r * m->sr + c * m->sc) * es;
}


/* One call of the kernels (src/attention/attn_sdpa_reference.c runs it, src/attention/attn_attention.c sets it up). */
typedef struct attn_attention_job {
  attn_dtype dt;
  size_t es;
  int64_t B, Nq, Nk, d, dv, nblk;
  int dot;                                       /* scores = scale * q k^T (else read from sc) */
  int tiny;                                      /* products as plain loops, not sgemm (ATTN_KERNEL_TINY) */
  attn_attention_mat q, k, v, sc, wst, dout, dw; /* wst: stored weights */
  int has_v, has_wst, has_dout, has_dw;
  int nd4;             /* 4-D operands (B, H, N, .) */
  int64_t H, grp, lh;  /* heads per sample (rows b*H + h; 1 without heads), query heads per
                          key/value head, rows per valid_lens entry (H for 4-D calls, else 1) */
  const int64_t *lens; /* B / lh * Nq, or NULL */
  const char *mask;    /* element [0,0,0,0] of the expanded mask, or NULL */
  attn_dtype mdt;
  int64_t msb, msh, msr, msc; /* row b's mask at attn_attention_head_off(b, H, 1, msb, msh) */
  const char *bias;           /* the additive bias (dtype dt; strides as the mask's), or NULL */
  int64_t bsb, bsh, bsr, bsc;
  const double *slopes;       /* ALiBi: H slopes (head b % H), or NULL */
  int causal;
  int64_t window;
  int pattern;           /* ATTN_PATTERN_* */
  int64_t stride, summary;
  const int64_t *gcount; /* global positions: gcount[p] of them below p, p <= glen = min(Nq, Nk); or NULL */
  int64_t glen, gmin, gmax;
  int rule;              /* a keep rule per entry (attn_attention_rule_keeps) applies inside the key ranges */
  double scale;
  int dropout;
  attn_dropout_rule drop; /* entry (b, i, j) has index (b*Nq + i)*Nk + j in its stream */
  char *out, *weights;         /* forward outputs (contiguous), may be NULL */
  char *gq, *gk, *gv, *gs;     /* backward outputs dq, dk, dv, dscores (contiguous), may be NULL */
  int64_t groups;              /* backward: query-block groups per batch */
  char *partial_k, *partial_v; /* (B, groups, Nk, d|dv) when groups > 1 */
  atomic_int failed;
} attn_attention_job;

/* Whether position p is a global token (attn_attention.h, "Sparse patterns"). */
static inline int attn_attention_global(const attn_attention_job *J, int64_t p) {
  return J->gcount && p >= 0 && p < J->glen && J->gcount[p + 1] > J->gcount[p];
}

/* Keys query i may see before the keep-mask and the lengths: [*a, *b) (causal, window, and the
 * global keys around the band; the pattern's rule per entry inside: attn_attention_rule_keeps). */
static inline void attn_attention_key_range(const attn_attention_job *J, int64_t i, int64_t *a, int64_t *b) {
  int64_t lo = 0, hi = J->Nk;
  if (J->window >= 0 && !attn_attention_global(J, i)) {
    lo = i - J->window;
    hi = i + J->window + 1;
    if (J->gcount) { /* the band plus the global keys: the rule removes the keys between */
      lo = J->gmin < lo ? J->gmin : lo;
      hi = J->gmax + 1 > hi ? J->gmax + 1 : hi;
    }
    if (lo < 0) lo = 0;
    if (hi > J->Nk) hi = J->Nk;
  }
  if (J->causal && i + 1 < hi) hi = i + 1;
  if (lo > hi) lo = hi;
  *a = lo;
  *b = hi;
}

/* Floor division and remainder for a divisor s > 0 (differences i - j may be negative). */
static inline int64_t attn_attention_floordiv(int64_t x, int64_t s) { return x >= 0 ? x / s : -((-x + s - 1) / s); }

/* Whether the sparse pattern, window and global tokens keep key j of query i, j inside the key
 * range of i (the rule of attn_attention.h, "Sparse patterns"; 1 when J->rule is 0). */
static inline int attn_attention_rule_keeps(const attn_attention_job *J, int64_t i, int64_t j) {
  if (!J->rule || attn_attention_global(J, i) || attn_attention_global(J, j)) return 1;
  const int64_t s = J->stride, dd = i - j;
  if (J->pattern == ATTN_PATTERN_STRIDED) return (dd < s && dd > -s) || dd % s == 0;
  if (J->pattern == ATTN_PATTERN_FIXED) return i / s == j / s || j % s >= s - J->summary;
  return J->window < 0 || (dd <= J->window && dd >= -J->window);
}

/* Whether some query of [i0, i1) may keep some key of [j0, j1) (both non-empty) under causal,
 * window, pattern and global tokens: a superset (1 may still find every entry removed), in O(1),
 * so the drivers skip the tiles no query sees and the work follows the pattern. */
static inline int attn_attention_tile_visible(const attn_attention_job *J, int64_t i0, int64_t i1, int64_t j0,
                                              int64_t j1) {
  if (J->causal && j0 > i1 - 1) return 0;
  if (J->gcount) {
    int64_t qe = i1 < J->glen ? i1 : J->glen, ke = j1 < J->glen ? j1 : J->glen;
    if (J->causal && i1 < ke) ke = i1;
    if ((i0 < qe && J->gcount[qe] > J->gcount[i0]) || (j0 < ke && J->gcount[ke] > J->gcount[j0])) return 1;
  }
  int64_t dlo = i0 - (j1 - 1), dhi = (i1 - 1) - j0, s = J->stride; /* the differences i - j */
  if (J->causal && dlo < 0) dlo = 0;
  if (J->pattern == ATTN_PATTERN_STRIDED)
    return (dlo < s && dhi > -s) || attn_attention_floordiv(dhi, s) * s >= dlo;
  if (J->pattern == ATTN_PATTERN_FIXED) /* a shared block, or a summary column in the tile */
    return (i0 / s <= (j1 - 1) / s && j0 / s <= (i1 - 1) / s) || j0 / s != (j1 - 1) / s ||
           (j1 - 1) % s >= s - J->summary;
  return J->window < 0 || (dlo <= J->window && dhi >= -J->window);
}

/* Whether the pattern's rule keeps every entry of queries [i0, i1) x keys [j0, j1) that the key
 * ranges keep (so the tile needs no rule per entry). */
static inline int attn_attention_tile_full(const attn_attention_job *J, int64_t i0, int64_t i1, int64_t j0,
                                           int64_t j1) {
  if (!J->rule) return 1;
  int64_t dlo = i0 - (j1 - 1), dhi = (i1 - 1) - j0, s = J->stride;
  if (J->pattern == ATTN_PATTERN_STRIDED) return dlo > -s && dhi < s;
  if (J->pattern == ATTN_PATTERN_FIXED) return i0 / s == (i1 - 1) / s && j0 / s == (j1 - 1) / s && i0 / s == j0 / s;
  return J->window < 0 || (dlo >= -J->window && dhi <= J->window);
}

/* Dropout keep factor of entry (b, i, j): 0 when dropped, 1/(1-p) when kept. */
static inline double attn_attention_keep(const attn_attention_job *J, int64_t b, int64_t i, int64_t j) {
  uint64_t idx = ((uint64_t)b * (uint64_t)J->Nq + (uint64_t)i) * (uint64_t)J->Nk + (uint64_t)j;
  return attn_dropout_drops(&J->drop, idx) ? 0.0 : J->drop.scale;
}

/* The masking of query row i of batch b (the rules are in attn_attention.h): keys outside [a, b)
 * are removed (causal, window), and so are the keys whose keep-mask entry is 0 (mrow: the row of
 * the expanded keep-mask, stride J->msc, NULL without one); keys in [e, b) are filled (d2l's
 * valid_lens). A key is unmasked when a <= j < e and the keep-mask keeps it: only the others may
 * be skipped, and only where their weight is exactly 0. */
typedef struct attn_attention_rowmask {
  int64_t a, e, b;
  const char *mrow;
  int64_t i; /* the query, for the pattern's rule (J->rule) */
} attn_attention_rowmask;

static inline void attn_attention_row_mask(const attn_attention_job *J, int64_t b, int64_t i,
                                           attn_attention_rowmask *m) {
  attn_attention_key_range(J, i, &m->a, &m->b);
  int64_t len = J->lens ? J->lens[(b / J->lh) * J->Nq + i] : J->Nk;
  m->e = len < m->b ? (len > m->a ? len : m->a) : m->b;
  m->mrow = J->mask ? J->mask + (size_t)(attn_attention_head_off(b, J->H, 1, J->msb, J->msh) + i * J->msr) *
                                    attn_dtype_size(J->mdt)
                    : NULL;
  m->i = i;
}

/* Whether the scores get an additive part (a bias or ALiBi). */
static inline int attn_attention_has_bias(const attn_attention_job *J) { return J->bias || J->slopes; }

/* The additive part of row i of row b's scores (attn_attention_has_bias): the bias row (element
 * j at brow[j * J->bsc], NULL without a bias) and the ALiBi slope (0 without). */
static inline const char *attn_attention_bias_row(const attn_attention_job *J, int64_t b, int64_t i, double *slope) {
  *slope = J->slopes ? J->slopes[b % J->H] : 0.0;
  return J->bias ? J->bias + (size_t)(attn_attention_head_off(b, J->H, 1, J->bsb, J->bsh) + i * J->bsr) * J->es
                 : NULL;
}

/* Whether the keep-mask row mrow (NULL: none) keeps key j. */
static inline int attn_attention_kept(const attn_attention_job *J, const char *mrow, int64_t j) {
  if (!mrow) return 1;
  size_t off = (size_t)(j * J->msc);
  return J->mdt == ATTN_F32 ? ((const float *)mrow)[off] != 0 : ((const double *)mrow)[off] != 0;
}

/* Whether row m keeps key j of its range [a, b): the keep-mask and the pattern's rule. */
static inline int attn_attention_row_keeps(const attn_attention_job *J, const attn_attention_rowmask *m, int64_t j) {
  return attn_attention_kept(J, m->mrow, j) && attn_attention_rule_keeps(J, m->i, j);
}

/* Whether row m removes keys inside its range (a keep-mask or a rule per entry). */
static inline int attn_attention_row_sparse(const attn_attention_job *J, const attn_attention_rowmask *m) {
  return m->mrow != NULL || J->rule;
}

static inline int attn_attention_unmasked(const attn_attention_job *J, const attn_attention_rowmask *m, int64_t j) {
  return j >= m->a && j < m->e && attn_attention_row_keeps(J, m, j);
}

/* ---- row kernels (src/attention/attn_sdpa_rows.c): rows of J->Nk entries of J->dt ---- */

/* Softmax of row x in place: the scaled scores are valid on [m->a, m->e); [e, b) get the d2l
 * fill, removed keys weight 0, and a row with no finite softmax goes to attn_sdpa_bad_row. */
void attn_sdpa_softmax_row(const attn_attention_job *J, void *x, const attn_attention_rowmask *m);
/* attn_sdpa_softmax_row on the r rows (rm[i]: row i's masks) of the block ws (r x J->Nk): row by
 * row, or for tiny heads in float32 with one exp over the whole block (the same values). */
void attn_sdpa_softmax_block(const attn_attention_job *J, void *ws, const attn_attention_rowmask *rm, int64_t r);
/* Softmax backward on keys [n0, n1): dp holds dL/dweights, p the weights; dp becomes dL/dscores
 * times scale on the unmasked keys and exactly 0 on the others. A masked key's dp is read only
 * where its weight is not 0 (a filled key still takes part in the softmax). */
void attn_sdpa_softmax_back_row(const attn_attention_job *J, const void *p, void *dp, int64_t n0, int64_t n1,
                                const attn_attention_rowmask *m, double scale);
/* x[j] += (bias + ALiBi)(b, i, j) on [j0, j1) (attn_attention_has_bias; x holds the row's Nk scaled
 * scores): the additive part of the scores, before the softmax. */
void attn_sdpa_bias_row(const attn_attention_job *J, int64_t b, int64_t i, void *x, int64_t j0, int64_t j1);
/* dst[j] = scale * src[j * stride], j < n. */
void attn_sdpa_load_row(const attn_attention_job *J, void *dst, const void *src, int64_t stride, int64_t n,
                        double scale);
/* x[j] += src[j * stride], j < n. */
void attn_sdpa_add_row(const attn_attention_job *J, void *x, const void *src, int64_t stride, int64_t n);
/* Dropout on x[n0:n1] (entry j has stream index base + j): kept entries scaled, dropped ones 0. */
void attn_sdpa_dropout_row(const attn_attention_job *J, void *x, int64_t n0, int64_t n1, uint64_t base);

/* Whether the row has a key left after the removal (filled keys count: they take part). */
int attn_sdpa_row_has_key(const attn_attention_job *J, const attn_attention_rowmask *m);
/* A row whose softmax has no finite answer (its kept scores are all -inf, or hold NaN or +inf):
 * NaN on every kept key of [a, b), as softmax gives, exactly 0 elsewhere; a row with no key
 * left gets zeros. x holds J->Nk entries of J->dt. */
void attn_sdpa_bad_row(const attn_attention_job *J, void *x, const attn_attention_rowmask *m);
/* [*lo, *hi): the smallest range of keys holding every unmasked key and every key whose weight
 * w[j] is not 0 (empty: lo = hi). */
void attn_sdpa_live_range(const attn_attention_job *J, const attn_attention_rowmask *m, const void *w,
                               int64_t *lo, int64_t *hi);
/* out[c] = sum over j in [n0, n1) of w[j] * X[b, j, c], c < width, leaving out only the masked
 * keys of m with w[j] == 0 (the NaN-safe recomputation of a product that came out non-finite). */
void attn_sdpa_combine_row(const attn_attention_job *J, const attn_attention_rowmask *m, const void *w,
                                int64_t n0, int64_t n1, const attn_attention_mat *X, int64_t b, void *out,
                                int64_t width);
/* acc[j, c] += sum over rows r < rows of w[r][j] * X[b, i0 + r, c] on j in [n0, n1), leaving out
 * the masked keys of row r (ms[r]) with w[r][j] == 0; w rows have ld nk. */
void attn_sdpa_outer_acc(const attn_attention_job *J, const attn_attention_rowmask *ms, const void *w,
                              int64_t nk, int64_t rows, int64_t n0, int64_t n1, const attn_attention_mat *X,
                              int64_t b, int64_t i0, void *acc, int64_t width);
/* 1 when every X[b, i0 + r, c] (r < rows, c < width) is finite. */
int attn_sdpa_block_finite(const attn_attention_job *J, const attn_attention_mat *X, int64_t b, int64_t i0,
                                int64_t rows, int64_t width);
/* 1 when x[0:n] (J->dt, contiguous) is finite. */
int attn_sdpa_row_finite(const attn_attention_job *J, const void *x, int64_t n);

/* ---- short rows (float32; src/cpu/sdpa_small_*.c, chosen in src/cpu/cpu_dispatch.c) ---- */

/* Keys per row of the short-row kernels: a row's keys fill the lanes of one 16-float vector. The
 * blocked driver hands them its items when J->tiny, float32 dot products, Nk <= this, no
 * keep-mask, no bias or ALiBi (those run the blocked path) and no stored weights or weight
 * gradients: the rows of a head then go from scores to output (forward) or to dq and their
 * share of dk, dv (backward) in registers, with the same
 * masking, fill, exp and dropout mask as the row kernels below, and the item falls back to the
 * blocked path when a result comes out not finite (src/cpu/sdpa_small_body.h). */
#define ATTN_SDPA_SMALL_KEYS 16

/* ---- call setup (src/attention/attn_attention.c), shared by every entry point ---- */

/* The operand shapes error messages name, formatted on first use: most calls never fail, and
 * formatting three shapes costs as much as a book-sized kernel. */
typedef struct {
  char buf[256];
  const attn_tensor *a, *b, *c; /* queries, keys, values; or scores and values (b), c NULL */
  int scores, named_x;          /* scores form; masked_softmax names its input X as the book does */
  int done;
} attn_attention_ctx;

const char *attn_attention_ctx_str(attn_attention_ctx *x);

/* Temporaries of one call, released by attn_attention_mem_free. */
typedef struct {
  attn_tensor tmp[16];
  int ntmp;
  int64_t *lens;
  size_t lens_cap;
  double *slopes;
  size_t slopes_cap;
  int64_t *gcount;
  size_t gcount_cap;
} attn_attention_mem;

void attn_attention_mem_free(attn_attention_mem *m);

int attn_attention_same_shape(const attn_tensor *t, int ndim, const int64_t *shape);
/* t must have `shape` (3-D) and dtype dt; the message names the call's operands. */
attn_status attn_attention_check_input(const char *op, const char *name, const attn_tensor *t, attn_dtype dt,
                                       const int64_t *shape, attn_attention_ctx *ctx);
/* An output: contiguous, of dtype dt and shape `shape` (3-D). */
attn_status attn_attention_check_output(const char *op, const char *name, const attn_tensor *t, attn_dtype dt,
                                        const int64_t *shape);
/* J's sparse pattern and global tokens (src/attention/attn_masking.c): checks the options (a
 * window with a pattern, the stride and summary, global positions in range and distinct) and
 * builds the prefix counts of the global positions in mem. */
attn_status attn_attention_prepare_pattern(attn_attention_job *J, attn_attention_mem *mem, const char *op,
                                           const attn_attention_opts *o);
/* Fills J's common fields from its sizes and the options: BLAS range, blocks, causal, window,
 * dropout (probability checked), scale (checked), lengths and keep-mask (checked, expanded). */
attn_status attn_attention_prepare(attn_attention_job *J, attn_attention_mem *mem, const char *op,
                                   attn_attention_ctx *ctx, const attn_attention_opts *o);
/* m describes the 3-D operand t (a copy in mem when blas is set and BLAS cannot read t). */
attn_status attn_attention_operand(attn_attention_mem *mem, const attn_tensor *t, int blas, attn_attention_mat *m);
/* Backward's optional inputs (stored weights, gradients of out and of the weights), checked and
 * attached to J. */
attn_status attn_attention_attach_backward_inputs(const char *op, attn_attention_job *J, attn_attention_mem *mem,
                                                  attn_attention_ctx *ctx, const attn_tensor *weights,
                                                  const attn_tensor *dout, const attn_tensor *dweights);

/* Forward over (batch, row block), writing J->out and/or J->weights. */
attn_status attn_attention_run_forward(attn_attention_job *J, const char *op);
/* Backward, writing the gradient outputs that are not NULL. */
attn_status attn_attention_run_backward(attn_attention_job *J, const char *op);

/* ---- flash kernels (float32; src/attention/attn_sdpa_flash.c, src/cpu/flash_*.c) ---- */

/* Lanes per tile: a tile holds 64 queries (or keys) side by side in vector
 * lanes, times up to ATTN_FLASH_TILE keys (or queries) in rows. */
#define ATTN_FLASH_TILE 64

/* A float32 operand with unit column stride: row r of batch b at p + b*sb + r*sr. */
typedef struct {
  const float *p;
  int64_t sb, sr;
  int64_t sh, nh, grp; /* heads as in attn_attention_mat */
} attn_flash_mat;

/* Row 0 of row b's matrix (attn_attention_head_off). */
static inline const float *attn_flash_head(const attn_flash_mat *m, int64_t b) {
  return m->p + attn_attention_head_off(b, m->nh, m->grp, m->sb, m->sh);
}

typedef struct {
  const attn_attention_job *J;
  attn_flash_mat q, k, v, dout;
  float qscale;       /* scale * log2(e): scores in base-2 units */
  float fill2;        /* d2l's fill value in the same units */
  float *out, *weights;       /* forward outputs */
  double *lse;                /* forward: natural log-sum-exp per (b, i), +inf for a row with no key */
  const float *lse2, *D;      /* backward: per (b, i) log2-sum-exp and dout . out */
  const float *fillp;         /* backward: per (b, i) weight of one filled key (d2l's -1e6), in double
                                 precision before rounding (lse2 alone is too coarse near -1e6) */
  float *dq, *dk, *dv;        /* backward outputs (contiguous), may be NULL */
  atomic_llong *tiles;        /* forward: takes the count of score tiles computed (attn_flash_tiles), or NULL */
} attn_flash_job;

/* Floats of per-thread workspace an item needs (int64 masks included). */
static inline size_t attn_flash_workspace(int64_t d, int64_t dv) {
  return (size_t)(2 * d + 2 * dv + 2 * ATTN_FLASH_TILE + 16) * ATTN_FLASH_TILE;
}

/* One query block (forward, dq) or key block (dk, dv) of head b, row offset i0. Returns 1 when
 * every row it wrote is finite (a forward row without keys counts: zeros, log-sum-exp +inf), else
 * 0. The kernels never test their operands for inf or NaN: they leave masked entries out exactly
 * where the reference does (by selection), and any inf or NaN they do read reaches a result they
 * return 0 for, so the call then runs on the reference path, which owns every rule for
 * non-finite values ("Softmax rows" in attn_attention.h). */
typedef int (*attn_flash_item_fn)(const attn_flash_job *F, int64_t b, int64_t i0, float *ws);
typedef struct attn_flash_kernels {
  const char *name;
  attn_flash_item_fn forward, backward_q, backward_k;
  double (*fma_loop)(int64_t iters); /* the FMA peak probe: fma_flops per iteration */
  int fma_flops;
} attn_flash_kernels;

/* The kernel set for opts->kernel (ATTN_KERNEL_*): a named ISA, or the best this CPU runs. */
attn_status attn_attention_flash_kernels(int kernel, const char *op, const attn_flash_kernels **ks);
/* Writes F->out, F->lse and (when not NULL) F->weights; *done is 0 when a result came out not
 * finite (an item returned 0): the outputs are then unfinished and the caller runs the reference. */
attn_status attn_attention_run_flash_forward(const attn_flash_job *F, const attn_flash_kernels *ks, const char *op,
                                             int *done);
/* Writes F->dq, F->dk, F->dv (those not NULL) from the forward's out (B, Nq, dv) and lse
 * (element [b][i] at lse[b * lse_sb + i]); F->dout must be set. *done as above, and 0 when an lse
 * entry is NaN (the forward ran on the reference path). */
attn_status attn_attention_run_flash_backward(attn_flash_job *F, const attn_flash_kernels *ks, attn_flash_mat out,
                                              const double *lse, int64_t lse_sb, const char *op, int *done);

#endif
