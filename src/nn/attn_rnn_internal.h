/* attn_rnn_internal (internal): the operand checks and saved-buffer access the fused recurrent
 * kernels share (attn_rnn.c, the GRU; attn_lstm.c, the LSTM). Not API. */
#ifndef ATTN_RNN_INTERNAL_H
#define ATTN_RNN_INTERNAL_H

#include "core/attn_saved.h"
#include "core/attn_tensor.h"

/* t (of layer k, named `what` in errors) is present, of dtype dt, contiguous and of shape
 * (a, b, c)'s first nd sizes; else an error naming op, the operand and both shapes. */
attn_status attn_rnn_check_operand(const char *op, const char *what, int k, const attn_tensor *t, attn_dtype dt,
                                   int nd, int64_t a, int64_t b, int64_t c);

/* The operands a recurrent kernel's forward and backward share: x (T, B, I) contiguous and
 * float, at least one layer, weight_ih[k] (G H, in_k) and weight_hh[k] (G H, H) for G gates,
 * dropout in [0, 1). Sets T, B, NI (the input size) and H. */
attn_status attn_rnn_check_input(const char *op, const attn_tensor *x, int layers, const attn_tensor *const *w_ih,
                                 const attn_tensor *const *w_hh, int gates, double dropout_p, int64_t *T, int64_t *B,
                                 int64_t *NI, int64_t *H);

/* The start of layer k's block of part i of saved (every part's first dim is the layer). */
char *attn_rnn_layer_part(const attn_tensor *saved, const attn_saved_layout *l, int i, int k);

#endif
