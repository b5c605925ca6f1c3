/* attn_attention_internal (internal): types and entry points shared by the
 * attention kernel files (attn_attention.c sets a call up, _blocks.c runs it
 * over (batch, row block), _rows.c has the per-row kernels). Not API. */
#ifndef ATTN_ATTENTION_INTERNAL_H
#define ATTN_ATTENTION_INTERNAL_H

#include <stdatomic.h>

#include "attn_attention.h"

/* A 3-D operand: element [b][r][c] at p + (b*sb + r*sr + c*sc) elements. For
 * BLAS, each batch matrix is row-major (trans 0, ld = sr) or column-major
 * (trans 1, ld = sc). */
typedef struct {
  const char *p;
  int64_t sb, sr, sc;
  int trans;
  int ld;
} attn_attention_mat;

static inline const void *attn_attention_at(const attn_attention_mat *m, size_t es, int64_t b, int64_t r, int64_t c) {
  return m->p + (size_t)(b * m->sb + r * m->sr + c * m->sc) * es;
}

/* Dropout stream: entry (b, i, j) has index (b*Nq + i)*Nk + j; splitmix64 of seed + index. */
static inline uint64_t attn_attention_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

typedef struct {
  uint64_t seed, threshold; /* drop when the 53-bit draw is below threshold */
  double factor;            /* 1 / (1 - p), 0 when p = 1 */
} attn_attention_dropout;

/* Row kernels of one dtype (src/attn_attention_rows.c). */
typedef struct {
  void (*softmax_row)(void *, int64_t, int64_t, int64_t, int64_t, const void *, int64_t, attn_dtype, int64_t *,
                      int64_t *);
  void (*load_row)(void *, const void *, int64_t, int64_t, double);
  void (*add_row)(void *, const void *, int64_t, int64_t);
  void (*nonzero_range)(const void *, int64_t, int64_t *, int64_t *);
  void (*dropout_row)(void *, int64_t, int64_t, uint64_t, const attn_attention_dropout *);
  void (*softmax_back_row)(const void *, void *, int64_t, int64_t, int64_t, double);
  void (*combine_row)(const void *, int64_t, int64_t, const attn_attention_mat *, int64_t, void *, int64_t);
  void (*outer_acc)(const void *, int64_t, int64_t, int64_t, int64_t, const attn_attention_mat *, int64_t, int64_t,
                    void *, int64_t);
  int (*block_finite)(const attn_attention_mat *, int64_t, int64_t, int64_t, int64_t);
  int (*row_finite)(const void *, int64_t);
  void (*add_vec)(void *, const void *, int64_t);
} attn_attention_row_ops;
extern const attn_attention_row_ops attn_attention_ops_f32, attn_attention_ops_f64;

/* One call of the kernels (src/attn_attention_blocks.c runs it, src/attn_attention.c sets it up). */
typedef struct {
  const attn_attention_row_ops *ops;
  attn_dtype dt;
  size_t es;
  int64_t B, Nq, Nk, d, dv, nblk;
  int dot;                                       /* scores = scale * q k^T (else read from sc) */
  attn_attention_mat q, k, v, sc, wst, dout, dw; /* wst: stored weights */
  int has_v, has_wst, has_dout, has_dw;
  const int64_t *lens; /* B * Nq, or NULL */
  const char *mask;    /* element [0,0,0] of the expanded mask, or NULL */
  attn_dtype mdt;
  int64_t msb, msr, msc;
  int causal;
  int64_t window;
  double scale;
  int dropout;
  attn_attention_dropout drop;
  char *out, *weights;         /* forward outputs (contiguous), may be NULL */
  char *gq, *gk, *gv, *gs;     /* backward outputs dq, dk, dv, dscores (contiguous), may be NULL */
  int64_t groups;              /* backward: query-block groups per batch */
  char *partial_k, *partial_v; /* (B, groups, Nk, d|dv) when groups > 1 */
  atomic_int failed;
} attn_attention_job;

/* Forward over (batch, row block), writing J->out and/or J->weights. */
attn_status attn_attention_run_forward(attn_attention_job *J, const char *op);
/* Backward, writing the gradient outputs that are not NULL. */
attn_status attn_attention_run_backward(attn_attention_job *J, const char *op);

#endif
