/* The Transformer's sinusoidal positional encoding table (d2l's PositionalEncoding), computed in
 * double and stored in the table's dtype. */
#include <math.h>

#include "attention/attn_attention.h"

attn_status attn_attention_positional_encoding(attn_tensor *out) {
  if (attn_check_float("positional_encoding", out) != ATTN_OK) return ATTN_ERR_DTYPE;
  if (out->ndim != 2 || !attn_tensor_is_contiguous(out))
    return attn_error(ATTN_ERR_SHAPE, "positional_encoding: output %s must be a contiguous (max_len, d) tensor",
                      attn_tensor_shape_str(out));
  int64_t n = out->shape[0], d = out->shape[1];
  if (n == 0) return ATTN_OK; /* the loop below walks columns: no rows, no work (d may be huge) */
  char *base = attn_tensor_data(out);
  for (int64_t c = 0; c < d; c++) {
    double freq = pow(10000.0, (double)(c - c % 2) / (double)d);
    for (int64_t pos = 0; pos < n; pos++) {
      double a = (double)pos / freq;
      double v = c % 2 == 0 ? sin(a) : cos(a);
      if (out->dtype == ATTN_F32)
        ((float *)base)[pos * d + c] = (float)v;
      else
        ((double *)base)[pos * d + c] = v;
    }
  }
  return ATTN_OK;
}
