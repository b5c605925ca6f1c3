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

/* Optional per-layer biases b_ih[k], b_hh[k] (G H), as forward takes them. */
attn_status attn_rnn_check_biases(const char *op, int layers, attn_dtype dt, int gates, int64_t H,
                                  const attn_tensor *const *b_ih, const attn_tensor *const *b_hh);

/* Optional per-layer parameter gradients, as backward writes them: dw_ih[k] (G H, in_k),
 * dw_hh[k] (G H, H), db_ih[k] and db_hh[k] (G H), in_k NI for the first layer and H above. */
attn_status attn_rnn_check_grads(const char *op, int layers, attn_dtype dt, int gates, int64_t H, int64_t NI,
                                 attn_tensor *const *dw_ih, attn_tensor *const *dw_hh, attn_tensor *const *db_ih,
                                 attn_tensor *const *db_hh);

/* One part of a saved buffer: (layers, T + extra_step, B, width H). */
typedef struct {
  const char *name;
  int extra_step, width;
} attn_rnn_saved_part;

/* The saved layout of `name` (the kernel, as errors name it) from its n parts. */
attn_status attn_rnn_saved_layout(const char *name, int64_t T, int64_t B, int64_t H, int layers,
                                  const attn_rnn_saved_part *parts, int n, attn_saved_layout *l);

/* The start of layer k's block of part i of saved (every part's first dim is the layer). */
char *attn_rnn_layer_part(const attn_tensor *saved, const attn_saved_layout *l, int i, int k);

/* Layer k's block (bytes) of an (L, B, H) state tensor into dst, or zeros without one. */
void attn_rnn_copy_state(void *dst, const attn_tensor *t, int k, size_t bytes);

/* The n workspace buffers of a kernel: bufs[i] of bytes[i] (NULL where that is 0), capacities in
 * cap. When one cannot be had, frees the others and returns an out-of-memory error naming op and
 * x's shape. */
attn_status attn_rnn_alloc_all(const char *op, const attn_tensor *x, int n, const size_t *bytes, char **bufs,
                               size_t *cap);

/* Frees the workspace buffers that were allocated (n of them, capacities cap). */
void attn_rnn_free_all(char **bufs, const size_t *cap, int n);

/* After forward layer k: its states h_1 .. h_T (T B x H) go to out for the top layer; below, they
 * feed the next layer, through dropout into `dropped` when that is not NULL. Returns the next
 * layer's input. */
const char *attn_rnn_pass_up(attn_dtype dt, int k, int layers, const char *states, int64_t TB, int64_t H,
                             attn_tensor *out, char *dropped, uint64_t seed, double dropout_p);

/* The input forward layer k saw (T B x in_k), for backward: x for the first layer, else the
 * layer below's h_1 .. h_T (part hs of saved, leading h_0 of n_state bytes), through the same
 * dropout again into layer_in when that is not NULL. */
const char *attn_rnn_layer_input(attn_dtype dt, int k, const attn_tensor *x, const attn_tensor *saved,
                                 const attn_saved_layout *l, int hs, size_t n_state, int64_t TB, int64_t H,
                                 char *layer_in, uint64_t seed, double dropout_p);

#endif
