/* attn_saved: the layout of the buffer a fused op's forward fills for its backward.
 *
 * A fused op (additive and multi-head attention, the GRU, the LSTM, the Bahdanau and the
 * captioning decoders, LayerNorm and AddNorm, the softmax cross-entropy) keeps what its backward
 * needs in one flat contiguous tensor: named parts, each a contiguous block of that buffer, one
 * after the other. Each op describes its layout in ONE function computed from its operands'
 * shapes (attn_additive_saved_layout, attn_mha_saved_layout in attn_attention.h,
 * attn_gru_saved_layout in attn_rnn.h, attn_lstm_saved_layout in attn_lstm.h,
 * attn_decoder_saved_layout in attn_decoder.h, attn_caption_saved_layout in attn_caption.h,
 * attn_layer_norm_saved_layout in attn_layernorm.h, attn_softmax_ce_saved_layout in
 * attn_loss.h). The kernel
 * finds its parts through it, the binding allocates the buffer and hands Lua one view per part
 * from it, and the backward's binding checks the parts it is given against the layout
 * recomputed from the backward's operands. So the layout is written once.
 *
 * Every part has the buffer's dtype: the op's (the dtype its binding passes as op_dtype below),
 * unless the layout function fixes another with attn_saved_set_dtype (LayerNorm keeps its row
 * statistics in float64 whatever x's dtype, attn_layer_norm_saved_layout). A layout holds one
 * dtype, so one buffer of plain views serves it: what an op needs in another dtype rides along
 * beside the parts (the loss's int64 ids, multi-head attention's float64 lse). Sizes are checked:
 * a layout whose entries would not fit ATTN_SAVED_MAX_NUMEL is refused with a message naming the
 * op, the part and the shape. */
#ifndef ATTN_SAVED_H
#define ATTN_SAVED_H

#include "core/attn_tensor.h"

#define ATTN_SAVED_MAX_PARTS 10
#define ATTN_SAVED_MAX_DIMS 4
/* Most entries of one buffer: its bytes fit an int64 for every dtype. */
#define ATTN_SAVED_MAX_NUMEL (INT64_MAX / 8)

typedef struct attn_saved_part {
  const char *name; /* a static string, the Lua field name */
  int ndim;
  int64_t shape[ATTN_SAVED_MAX_DIMS];
  int64_t offset; /* entries from the buffer's start */
  int64_t numel;
} attn_saved_part;

typedef struct attn_saved_layout {
  const char *op; /* names the op in errors (a static string) */
  int nparts;
  attn_saved_part part[ATTN_SAVED_MAX_PARTS];
  int64_t numel; /* entries of the whole buffer */
  int fixed;        /* whether dtype below is the buffer's, whatever the op's */
  attn_dtype dtype; /* the buffer's dtype when fixed */
} attn_saved_layout;

/* Starts an empty layout for op, of the op's dtype. */
void attn_saved_begin(attn_saved_layout *l, const char *op);

/* Fixes the buffer's dtype at dt whatever the op's (for a layout function to call). */
void attn_saved_set_dtype(attn_saved_layout *l, attn_dtype dt);

/* The buffer's dtype for an op of op_dtype: l's fixed one, else op_dtype. The helpers below that
 * take a dtype all resolve it through here, so callers pass the op's. */
attn_dtype attn_saved_dtype(const attn_saved_layout *l, attn_dtype op_dtype);

/* attn_saved_add's refusal of a part (its message); for attn_saved_add only. */
attn_status attn_saved_refuse(const attn_saved_layout *l, const char *name, int ndim, const int64_t *shape);

/* Appends the part `name` of shape (ndim <= ATTN_SAVED_MAX_DIMS dims) after the others. Refuses
 * a negative size, too many parts or dims, and a buffer past ATTN_SAVED_MAX_NUMEL entries (the
 * message names the op, the part and its shape).
 * Inline: a layout function's shapes are mostly constants there, and a small op's layout is
 * built on every call (by its binding and again by its kernel). One pass copies the shape and
 * checks sign, emptiness and the product's overflow together; refusals go out of line. */
static inline attn_status attn_saved_add(attn_saved_layout *l, const char *name, int ndim, const int64_t *shape) {
  if (l->nparts >= ATTN_SAVED_MAX_PARTS || ndim < 0 || ndim > ATTN_SAVED_MAX_DIMS)
    return attn_saved_refuse(l, name, ndim, shape);
  attn_saved_part *p = &l->part[l->nparts];
  int64_t n = 1, end;
  int over = 0, negative = 0, empty = 0;
  for (int d = 0; d < ndim; d++) {
    int64_t s = shape[d];
    p->shape[d] = s;
    negative |= s < 0;
    empty |= s == 0;
    over |= __builtin_mul_overflow(n, s, &n);
  }
  if (negative) return attn_saved_refuse(l, name, ndim, shape);
  if (over || __builtin_add_overflow(l->numel, n, &end) || end > ATTN_SAVED_MAX_NUMEL) {
    if (!empty) return attn_saved_refuse(l, name, ndim, shape);
    n = 0, end = l->numel; /* an empty dim makes the part empty whatever the others are */
  }
  p->name = name;
  p->ndim = ndim;
  p->offset = l->numel;
  p->numel = n;
  l->numel = end;
  l->nparts++;
  return ATTN_OK;
}

/* Index of the part called name, -1 when there is none. */
int attn_saved_find(const attn_saved_layout *l, const char *name);

/* ATTN_OK when buf is a contiguous 1-D tensor of attn_saved_dtype(l, dt) with l->numel entries,
 * else an error naming op (the calling kernel, e.g. "gru backward") and both sizes. */
attn_status attn_saved_check(const char *op, const attn_saved_layout *l, const attn_tensor *buf, attn_dtype dt);

/* Part i of buf (checked with attn_saved_check) as a contiguous view of its shape: a borrowed
 * struct copy sharing buf's storage reference, never freed. */
attn_tensor attn_saved_view(const attn_tensor *buf, const attn_saved_layout *l, int i);

/* Address of entry `at` of part i of buf (the kernels' raw access). */
void *attn_saved_data(const attn_tensor *buf, const attn_saved_layout *l, int i, int64_t at);

#endif
