/* attn_saved: see attn_saved.h. */
#include "core/attn_saved.h"

#include <string.h>

/* Only the header: parts past nparts are never read, and clearing all ten cost more than a small
 * op's whole layout. */
void attn_saved_begin(attn_saved_layout *l, const char *op) {
  l->op = op;
  l->nparts = 0;
  l->numel = 0;
  l->fixed = 0;
  l->dtype = ATTN_F32;
}

void attn_saved_set_dtype(attn_saved_layout *l, attn_dtype dt) { l->fixed = 1, l->dtype = dt; }

attn_dtype attn_saved_dtype(const attn_saved_layout *l, attn_dtype op_dtype) { return l->fixed ? l->dtype : op_dtype; }

attn_status attn_saved_refuse(const attn_saved_layout *l, const char *name, int ndim, const int64_t *shape) {
  if (l->nparts >= ATTN_SAVED_MAX_PARTS || ndim < 0 || ndim > ATTN_SAVED_MAX_DIMS)
    return attn_error(ATTN_ERR_ARG, "%s: saved part %s: at most %d parts of %d dims", l->op, name,
                      ATTN_SAVED_MAX_PARTS, ATTN_SAVED_MAX_DIMS);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0)
      return attn_error(ATTN_ERR_SHAPE, "%s: saved part %s would have the negative shape %s", l->op, name,
                        attn_shape_str(ndim, shape));
  return attn_error(ATTN_ERR_SHAPE, "%s: saved part %s %s makes the saved buffer too large (over %lld entries)", l->op,
                    name, attn_shape_str(ndim, shape), (long long)ATTN_SAVED_MAX_NUMEL);
}

int attn_saved_find(const attn_saved_layout *l, const char *name) {
  for (int i = 0; i < l->nparts; i++)
    if (strcmp(l->part[i].name, name) == 0) return i;
  return -1;
}

attn_status attn_saved_check(const char *op, const attn_saved_layout *l, const attn_tensor *buf, attn_dtype dt) {
  if (!buf) return attn_error(ATTN_ERR_ARG, "%s: saved is missing", op);
  dt = attn_saved_dtype(l, dt);
  if (buf->ndim != 1 || buf->shape[0] != l->numel)
    return attn_error(ATTN_ERR_SHAPE, "%s: saved is %s, expected [%lld]", op, attn_tensor_shape_str(buf),
                      (long long)l->numel);
  if (buf->dtype != dt || !attn_tensor_is_contiguous(buf))
    return attn_error(ATTN_ERR_DTYPE, "%s: saved must be a contiguous %s tensor, got a %s one", op,
                      attn_dtype_name(dt), attn_dtype_name(buf->dtype));
  return ATTN_OK;
}

attn_tensor attn_saved_view(const attn_tensor *buf, const attn_saved_layout *l, int i) {
  const attn_saved_part *p = &l->part[i];
  attn_tensor v = *buf;
  v.ndim = p->ndim;
  for (int d = 0; d < p->ndim; d++) v.shape[d] = p->shape[d];
  attn_contiguous_strides(p->ndim, v.shape, v.stride);
  v.offset = buf->offset + p->offset;
  return v;
}

void *attn_saved_data(const attn_tensor *buf, const attn_saved_layout *l, int i, int64_t at) {
  return (char *)attn_tensor_data(buf) + (size_t)(l->part[i].offset + at) * attn_dtype_size(buf->dtype);
}
