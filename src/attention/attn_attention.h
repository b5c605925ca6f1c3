/* attn_attention: the attention chapter's kernels, forward and backward.
 *
 * Shapes (0-based dims, row-major):
 *   B  batch (for multi-head attention: batch * heads, batch-major: row b*H + h)
 *   Nq queries, Nk keys (= values), d query/key width, dv value width.
 *
 * Two masking conventions, never mixed up:
 *
 * 1. valid_lens (d2l's convention). An int64 tensor, or a float tensor of
 *    integer values, either 1-D (B): one length per sample, for every query row, or 2-D (B, Nq): one
 *    length per query row. Keys j >= len get the score -1e6 (after scaling)
 *    before the softmax, exactly as the book's masked_softmax: they are not
 *    read, but they still take part in the softmax, so a row with len = 0 comes
 *    out uniform over all Nk keys (padding included). With ordinary scores the
 *    filled entries underflow to an exact 0 weight. Lengths must be
 *    non-negative integers; a length above Nk means every key is valid (as in
 *    PyTorch).
 *
 * 2. Keep-masks: `mask` (1 attend, 0 ignore; any float tensor broadcastable to
 *    (B, Nq, Nk), values must be 0 or 1; int64 masks are converted by the
 *    binding), `causal` (query i sees keys j <= i)
 *    and `window` (query i sees keys with |i - j| <= window; 0: its own key only; >= Nk: all),
 *    the fixed sparse patterns and the global tokens (below). Entries they
 *    remove are left out of the softmax by selection, never by adding a
 *    sentinel: they get weight exactly 0 and gradient exactly 0, and a query
 *    with no key left gets zero weights, zero output and zero gradients (never
 *    NaN; see "Softmax rows" below). When both conventions are given, the
 *    keep-masks remove keys first and valid_lens fills among the remaining
 *    ones.
 *
 * Softmax rows: one definition for every kernel here (masked_softmax, both
 * attention functions, the reference, blocked and flash paths, forward and
 * backward). Call a key of query row i masked when the keep-masks remove it
 * or valid_lens fills it.
 *  - A row with no key left after the keep-masks: zero weights, zero output,
 *    zero gradient.
 *  - Any other row is the ordinary softmax of its kept keys' scores (filled
 *    keys at -1e6 included), as attn_softmax computes it. So a row whose kept
 *    scores are all -inf, or hold NaN or +inf, is NaN on every kept key (and
 *    its output and gradients are NaN): a NaN the inputs cause is never
 *    hidden. Removed keys keep weight exactly 0 even then.
 *  - Masked keys are the only entries a kernel may leave out, and only where
 *    their weight is exactly 0 (a filled key's weight is usually 0, but not in
 *    a length-0 row). An unmasked key always counts: a NaN or inf in its value
 *    makes the output NaN even when its weight underflowed to 0 (0 * NaN, as
 *    BLAS and PyTorch give), and likewise in the gradients. So a NaN or inf
 *    stored in a masked key, value or score never reaches the result, and one
 *    in an unmasked entry always does.
 *
 * Dropout (probability p) acts on the weights before they multiply V: kept
 * weights are scaled by 1/(1-p). The returned weights are the softmax output
 * before dropout (the book's attention_weights). The keep decision for entry
 * (b, i, j) is the engine's one dropout mask (attn_dropout.h) at index
 * (b*Nq + i)*Nk + j of the stream seed, so the backward pass recomputes the
 * same mask, and results do not depend on the thread count.
 *
 * Speed: float32 dot-product attention runs the flash kernels
 * (src/attention/attn_sdpa_flash.c, src/cpu/flash_*.c): per block of 64 queries
 * the scores of 64 keys at a time are made by a register-blocked
 * micro-kernel (AVX-512, AVX2+FMA or portable C, chosen at run time), masked
 * inside the tile, folded into a running max and sum (online softmax) and
 * multiplied into the output at once, so no score row is ever stored; tiles
 * no query sees (causal, window, sparse patterns, lengths) are skipped. The backward pass
 * rebuilds the weights tile by tile from the saved log-sum-exp. The blocked
 * path below stays the reference (and runs for float64, for gradients of
 * the weights, when opts.kernel asks for it, and for every call whose flash
 * results come out not finite: the flash kernels never scan their operands
 * for inf or NaN, see attn_flash_item_fn); the two agree within 1e-5 relative.
 *
 * Reference path: dot-product attention computes the two products with cblas gemm,
 * in blocks of ATTN_SDPA_BLOCK query rows, parallel over (batch, row block)
 * with attn_parallel_for; each worker needs an O(block x Nk) workspace, so
 * skipping the weights (weights == NULL) never allocates (Nq x Nk) per batch.
 * Writing the weights out uses the same code path, so asking for them does
 * not change the numerics. The backward pass recomputes the weights block by
 * block unless the stored weights are passed in.
 *
 * Conventions of attn_ops.h apply: inputs may be any strided view (a copy is
 * made once per call when BLAS cannot read the layout), all tensors of one
 * call share a dtype (masks and lengths may be either float dtype), outputs
 * are passed in, contiguous and of the documented shape, and errors name the
 * operation, the argument and the shapes. */
#ifndef ATTN_ATTENTION_H
#define ATTN_ATTENTION_H

#include "core/attn_saved.h"
#include "core/attn_tensor.h"

/* Sparse patterns (0-based i query, j key; "local" replaces the window rule, everything else
 * applies on top of it): query i keeps key j when
 *     (not causal or j <= i) and (local(i, j) or global(i) or global(j))
 * with local(i, j), for stride s >= 1 and summary c (1 <= c <= s):
 *   no pattern, no window: 1;   window r: |i - j| <= r
 *   strided (Child et al. 2019): |i - j| < s  or  (i - j) mod s == 0
 *   fixed   (Child et al. 2019): floor(i / s) == floor(j / s)  or  j mod s >= s - c
 * (the paper's patterns are these with causal set), and global(p): p is one of the global positions
 * (Longformer: a global query sees every key, every query sees a global key). The work is banded:
 * the flash kernels visit only the key tiles some query of a block keeps (window + g global keys:
 * O(N (r + g)) per head; the global queries' rows are full rows), and a keep rule per entry inside
 * them. A window and a pattern exclude each other. */
enum { ATTN_PATTERN_NONE = 0, ATTN_PATTERN_STRIDED, ATTN_PATTERN_FIXED };

/* Query rows per block of the dot-product attention kernels. */
#define ATTN_SDPA_BLOCK 64
/* The score d2l's masked_softmax writes into positions past valid_lens. */
#define ATTN_MASKED_SOFTMAX_FILL (-1e6)

/* Which dot-product attention kernel runs (attn_attention_opts.kernel). */
enum {
  ATTN_KERNEL_AUTO = 0,      /* flash where it applies (float32, Nq * Nk >= 64 * 64; results not finite: reference),
                                else tiny where it applies, else reference */
  ATTN_KERNEL_REFERENCE,     /* the blocked sgemm path */
  ATTN_KERNEL_FLASH,         /* as AUTO */
  ATTN_KERNEL_FLASH_GENERIC, /* flash with the portable C micro-kernels */
  ATTN_KERNEL_FLASH_AVX2,    /* flash with the AVX2 + FMA micro-kernels (error when the CPU lacks them) */
  ATTN_KERNEL_FLASH_AVX512,  /* flash with the AVX-512 micro-kernels (likewise) */
  ATTN_KERNEL_TINY           /* the blocked path with its products as plain C loops (AUTO's choice for
                                heads below one flash tile with d, dv <= ATTN_SDPA_TINY_WIDTH) */
};

/* Widest d and dv for which AUTO runs the tiny-head path (plain-loop products) rather than sgemm. */
#define ATTN_SDPA_TINY_WIDTH 64

typedef struct attn_attention_opts {
  const attn_tensor *valid_lens; /* NULL, (B) or (B, Nq): integers >= 0, above Nk = all (d2l semantics) */
  const attn_tensor *mask;       /* NULL or keep-mask broadcastable to (B, Nq, Nk), values 0/1 (extra
                                    leading size-1 dims are allowed, as NumPy broadcasts) */
  int causal;                    /* nonzero: query i sees keys j <= i */
  int64_t window;                /* >= 0: query i sees keys |i - j| <= window; < 0: off */
  int pattern;                   /* ATTN_PATTERN_*: a fixed sparse pattern (needs stride, no window) */
  int64_t stride;                /* the pattern's stride or block size s >= 1 */
  int64_t summary;               /* fixed: summary columns per block c, 1 <= c <= stride (0: 1) */
  const int64_t *global;         /* nglobal distinct 0-based positions < min(Nq, Nk), any order, or NULL */
  int64_t nglobal;
  double scale;                  /* scores are multiplied by it; NaN: default (1/sqrt(d) for
                                    dot products, 1 for given scores) */
  double dropout;                /* probability in [0, 1] (checked on every call); 0 turns dropout off */
  int training;                  /* nonzero (attn_attention_opts_init's default): dropout applies; 0:
                                    evaluation, no dropout (the probability is still checked) */
  uint64_t seed;                 /* dropout stream (same seed forward and backward) */
  int kernel;                    /* ATTN_KERNEL_*: dot-product attention's kernel (default AUTO) */
  /* Scores (dot-product attention only; "Heads" below): */
  const attn_tensor *bias;       /* NULL or an additive bias of the queries' dtype broadcastable to
                                    (B, H, Nq, Nk) (3-D calls: (B, Nq, Nk)), read through its
                                    strides (a broadcast dim costs nothing), added to the scaled
                                    scores before the masks; -inf removes a key by its weight (0),
                                    as PyTorch's float attn_mask does */
  const attn_tensor *alibi;      /* NULL or ALiBi slopes (H), any float dtype: head h adds
                                    -slope_h * |i - j| to the scaled scores (with causal: the kept
                                    keys j <= i, so -slope_h * (i - j)), computed in the kernel */
  int64_t heads;                 /* 3-D calls: rows are batch-major heads (row b*heads + h) of
                                    `heads` heads, for a 4-D bias or mask and ALiBi; 0: 1 head */
} attn_attention_opts;

/* No masks, default scale, no dropout (training on, so a dropout set later applies). */
void attn_attention_opts_init(attn_attention_opts *opts);

/* Reads lengths for (B, Nq) rows from lens, a 1-D (B) or (when allow_2d) 2-D
 * (B, Nq) int64 or float tensor, into out[b * Nq + i] (B * Nq entries), checking
 * that every value is a non-negative integer. A length above max_len means "all
 * max_len positions valid" and is stored as max_len (PyTorch's masking does
 * the same; the book's predict_seq2seq passes the source length before
 * truncation). op and arg name the operation and argument in errors; ctx
 * describes the shapes it must fit (e.g. "keys [2x10x4]"). */
attn_status attn_attention_lengths(const char *op, const char *arg, const char *ctx, const attn_tensor *lens, int64_t B,
                                   int64_t Nq, int64_t max_len, int allow_2d, int64_t *out);

/* ---- scaled dot-product attention ---------------------------------------- */

/* Heads: dot-product attention takes 3-D operands q (B, Nq, d), k (B, Nk, d), v (B, Nk, dv)
 * (shapes below) or 4-D ones q (B, H, Nq, d), k (B, Hkv, Nk, d), v (B, Hkv, Nk, dv) with Hkv
 * dividing H (grouped-query attention; Hkv = 1: multi-query): query head h (0-based) reads
 * key/value head h / (H / Hkv), consecutive groups as Llama's repeat_kv, and K and V are never
 * copied (the kernels map the head index; dk and dv sum their group's query heads in head order,
 * so the result does not depend on the thread count). A 4-D call is the 3-D call on its
 * (B*H, N, .) rows (row b*H + h), outputs and dropout stream included: out (B, H, Nq, dv),
 * weights (B, H, Nq, Nk), lse (B*H, Nq), dq/dk/dv in q's/k's/v's shapes. valid_lens (B) or
 * (B, Nq) apply to every head; keep-masks and the bias broadcast to (B, H, Nq, Nk) (NumPy: a
 * 3-D mask is (H, Nq, Nk)). The short-row kernels take no bias or ALiBi: such calls run the
 * blocked path with its plain-loop products (ATTN_KERNEL_TINY's numbers). The window, sparse
 * patterns and global tokens are one keep rule for every head; the bias and ALiBi are added to
 * the scores of the keys it keeps. */

/* Whether the flash kernel may run for Nq queries and Nk keys under opts->kernel (it then also
 * needs float32, and finite results to keep its own): calls smaller than one 64 x 64 tile stay
 * on the reference path unless a flash kernel is asked for, as the tile's padding would dominate. */
static inline int attn_sdpa_flash_size(int64_t Nq, int64_t Nk, int kernel) {
  return kernel != ATTN_KERNEL_REFERENCE && kernel != ATTN_KERNEL_TINY && (kernel != ATTN_KERNEL_AUTO || Nq * Nk >= 64 * 64);
}

/* q (B, Nq, d), k (B, Nk, d), v (B, Nk, dv) -> out (B, Nq, dv) and, when
 * weights is not NULL, weights (B, Nq, Nk) (the softmax before dropout).
 * scores = scale * q k^T, masked as opts says, softmax over keys, dropout,
 * times v. lse (B, Nq) float64, contiguous, or NULL: receives each row's
 * log-sum-exp of the scaled, masked scores (+inf for a row with no key) when
 * the flash kernel ran, NaN when the reference path ran; the backward pass
 * uses it to rebuild the weights. *flash (when flash is not NULL) receives
 * which path ran: 1 the flash kernel (lse holds the row statistics), 0 the
 * reference or tiny path (lse is NaN; give the backward no lse). */
attn_status attn_sdpa_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_attention_opts *opts, attn_tensor *out, attn_tensor *weights,
                              attn_tensor *lse, int *flash);

/* Gradients of attn_sdpa_forward. dout (B, Nq, dv) and dweights (B, Nq, Nk)
 * are the gradients of the two outputs (either may be NULL: unused output).
 * weights (B, Nq, Nk) are the stored forward weights, or NULL to recompute
 * them block by block. dq (B, Nq, d), dk (B, Nk, d), dv (B, Nk, dv) receive
 * the gradients; any of them may be NULL when not wanted. opts must equal
 * the forward's (including the seed). Masked entries contribute exactly 0.
 * out (B, Nq, dv) and lse (B, Nq) are the forward's outputs or NULL; with
 * both (and lse not NaN) and no dweights, the flash backward runs. */
attn_status attn_sdpa_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_attention_opts *opts, const attn_tensor *weights, const attn_tensor *out,
                               const attn_tensor *lse, const attn_tensor *dout, const attn_tensor *dweights,
                               attn_tensor *dq, attn_tensor *dk, attn_tensor *dv);

/* The FMA throughput of one core in FLOP/s (the best of a few short runs of
 * independent multiply-add chains in the widest vectors the flash kernels use
 * on this CPU, timed in thread CPU time so other processes do not lower it).
 * *isa, when not NULL, receives the kernel set's name ("avx512", "avx2" or
 * "generic"). */
double attn_flash_fma_peak(const char **isa);

/* Test hook: the score tiles (up to 64 queries x 128 keys) the flash forward has computed in this
 * process, all calls and threads together; specs check with it that the work of a window or
 * sparse pattern is banded, without timing anything. */
long long attn_flash_tiles(void);

/* ---- attention over given scores ----------------------------------------- */

/* The same masking, softmax, dropout and weighted sum for precomputed scores
 * (B, Nq, Nk) (e.g. additive attention). v (B, Nk, dv) may be NULL: then only
 * the weights are computed and out must be NULL. out (B, Nq, dv) and weights
 * (B, Nq, Nk) may each be NULL. op names the operation in errors. */
attn_status attn_attention_scores_forward(const char *op, const attn_tensor *scores, const attn_tensor *v,
                                          const attn_attention_opts *opts, attn_tensor *out, attn_tensor *weights);

/* Gradients of attn_attention_scores_forward: dscores (B, Nq, Nk) and, when v
 * and dv are given, dv (B, Nk, dv). weights: stored forward weights or NULL. */
attn_status attn_attention_scores_backward(const char *op, const attn_tensor *scores, const attn_tensor *v,
                                           const attn_attention_opts *opts, const attn_tensor *weights,
                                           const attn_tensor *dout, const attn_tensor *dweights, attn_tensor *dscores,
                                           attn_tensor *dv);

/* ---- d2l's masked softmax and sequence mask ------------------------------- */

/* x (B, Q, K), valid_lens NULL, (B) or (B, Q) -> out (B, Q, K): softmax over
 * the last dim after setting entries past the valid length to -1e6 (d2l). */
attn_status attn_attention_masked_softmax_forward(const attn_tensor *x, const attn_tensor *valid_lens,
                                                  attn_tensor *out);

/* y = forward output, dy its gradient -> dx (B, Q, K); dx is exactly 0 past
 * the valid lengths. */
attn_status attn_attention_masked_softmax_backward(const attn_tensor *y, const attn_tensor *dy,
                                                   const attn_tensor *valid_lens, attn_tensor *dx);

/* x (B, T, ...) with valid_len (B) (integers >= 0; above T keeps all) -> out (x's shape): a
 * copy of x where every entry of sample b at time steps t >= valid_len[b] is
 * value (the masked entries of x are not read). The gradient is the same op
 * applied to the output's gradient with value 0. */
attn_status attn_attention_sequence_mask(const attn_tensor *x, const attn_tensor *valid_len, double value,
                                         attn_tensor *out);

/* ---- additive attention scores ------------------------------------------- */

/* qh (B, Nq, h), kh (B, Nk, h), wv (h) -> out (B, Nq, Nk) with
 * out[b,i,j] = sum_c wv[c] tanh(qh[b,i,c] + kh[b,j,c]), without forming the
 * (B, Nq, Nk, h) tensor. float64: libm tanh, double sums (the reference);
 * float32: the vectorised attn_vmath tanh over blocks of (i, j) pairs, float
 * sums in a fixed order per row. */
attn_status attn_attention_additive_scores_forward(const attn_tensor *qh, const attn_tensor *kh, const attn_tensor *wv,
                                                   attn_tensor *out);

/* The same scores (the same bits), also writing the tanh values it sums, tanh_out (B, Nq, Nk, h)
 * contiguous [b,i,j,c] = tanh(qh[b,i,c] + kh[b,j,c]), or NULL: a backward that keeps them needs
 * no tanh of its own (the captioning decoder, attn_caption.h). */
attn_status attn_attention_additive_scores_forward_tanh(const attn_tensor *qh, const attn_tensor *kh,
                                                        const attn_tensor *wv, attn_tensor *out,
                                                        attn_tensor *tanh_out);

/* dscores (B, Nq, Nk) -> dqh (B, Nq, h), dkh (B, Nk, h), dwv (h); any output
 * may be NULL. When qh and kh are finite, entries with an exactly-zero
 * dscores (masked) are skipped: they contribute exactly 0 and their tanh is
 * never evaluated; otherwise every pair is evaluated, so a NaN in qh or kh
 * reaches the gradients as it would through the elementwise ops. The result
 * does not depend on the thread count. */
attn_status attn_attention_additive_scores_backward(const attn_tensor *qh, const attn_tensor *kh, const attn_tensor *wv,
                                                    const attn_tensor *dscores, attn_tensor *dqh, attn_tensor *dkh,
                                                    attn_tensor *dwv);

/* ---- head layout of multi-head attention ---------------------------------- */

/* x (B, N, H*dh), any strides -> out (B*H, N, dh), contiguous: row b*H + h of out holds head h
 * of sample b (d2l's transpose_qkv, batch-major). One strided copy. */
attn_status attn_attention_split_heads(const attn_tensor *x, int64_t heads, attn_tensor *out);

/* x (B*H, N, dh), any strides -> out (B, N, H*dh), contiguous: the inverse of split_heads (d2l's
 * transpose_output). One strided copy. */
attn_status attn_attention_merge_heads(const attn_tensor *x, int64_t heads, attn_tensor *out);

/* x (R, ...) -> out (R*n, ...), contiguous: row r of x repeated n times at rows r*n .. r*n+n-1
 * (torch.repeat_interleave(x, n, dim=0)); the valid lengths of a sample given to its heads. */
attn_status attn_attention_repeat_rows(const attn_tensor *x, int64_t n, attn_tensor *out);

/* ---- the attention layers in one call ------------------------------------- */

/* The buffer additive attention saves for its backward (attn_saved.h), for B samples, Nq
 * queries, Nk keys and h hidden units: qh (B, Nq, h) = queries W_q^T, kh (B, Nk, h) = keys
 * W_k^T, scores (B, Nq, Nk); parts in that order (the ATTN_ADDITIVE_SAVED_* indices). */
enum { ATTN_ADDITIVE_SAVED_QH, ATTN_ADDITIVE_SAVED_KH, ATTN_ADDITIVE_SAVED_SCORES };
attn_status attn_additive_saved_layout(int64_t B, int64_t Nq, int64_t Nk, int64_t h, attn_saved_layout *l);

/* d2l's AdditiveAttention forward: qh = queries W_q^T (B, Nq, h), kh = keys W_k^T (B, Nk, h),
 * scores = attn_attention_additive_scores_forward(qh, kh, w_v) (B, Nq, Nk), then
 * attn_attention_scores_forward(scores, values, opts, out, weights). queries (B, Nq, q),
 * keys (B, Nk, k), values (B, Nk, dv), w_q (h, q), w_k (h, k), w_v (1, h) or (h). qh, kh and
 * scores go to saved (1-D, contiguous, attn_additive_saved_layout's size) for the backward;
 * weights may be NULL. */
attn_status attn_attention_additive_layer_forward(const attn_tensor *queries, const attn_tensor *keys,
                                                  const attn_tensor *values, const attn_tensor *w_q,
                                                  const attn_tensor *w_k, const attn_tensor *w_v,
                                                  const attn_attention_opts *opts, attn_tensor *out,
                                                  attn_tensor *weights, attn_tensor *saved);

/* Parameters of d2l's MultiHeadAttention, as nn.Linear holds them. */
typedef struct attn_mha_params {
  const attn_tensor *w_q, *w_k, *w_v, *w_o; /* (h, q), (h, k), (h, v), (h, h) */
  const attn_tensor *b_q, *b_k, *b_v, *b_o; /* (h) each, or NULL */
  int64_t heads;                            /* H, divides h; head width dh = h / H */
} attn_mha_params;

/* The buffer multi-head attention saves for its backward (attn_saved.h), for B samples, Nq
 * queries, Nk keys, h hidden units in `heads` heads of dh = h / heads: qh (B*H, Nq, dh), kh and
 * vh (B*H, Nk, dh) (the projections split into heads), ctx (B*H, Nq, dh) (attention per head)
 * and merged (B*Nq, h) (ctx with its heads merged, the input of W_o); parts in that order (the
 * ATTN_MHA_SAVED_* indices). Refuses heads not dividing h. */
enum { ATTN_MHA_SAVED_QH, ATTN_MHA_SAVED_KH, ATTN_MHA_SAVED_VH, ATTN_MHA_SAVED_CTX, ATTN_MHA_SAVED_MERGED };
attn_status attn_mha_saved_layout(int64_t B, int64_t Nq, int64_t Nk, int64_t h, int64_t heads,
                                  attn_saved_layout *l);

/* d2l's MultiHeadAttention forward: queries (B, Nq, q), keys (B, Nk, k), values (B, Nk, v) ->
 * out (B, Nq, h) = merge_heads(sdpa(split_heads(queries W_q^T + b_q), ...)) W_o^T + b_o, with
 * the heads batch-major (row b*H + j is head j of sample b). opts are per sample: valid_lens
 * (B) or (B, Nq) are repeated for the heads here; a mask must broadcast to (B*H, Nq, Nk).
 * weights (B*H, Nq, Nk), lse (B*H, Nq) and flash are as for attn_sdpa_forward and may be NULL.
 * saved (1-D, contiguous, attn_mha_saved_layout's size) receives what the backward needs. */
attn_status attn_attention_mha_forward(const attn_tensor *queries, const attn_tensor *keys,
                                       const attn_tensor *values, const attn_mha_params *p,
                                       const attn_attention_opts *opts, attn_tensor *out, attn_tensor *weights,
                                       attn_tensor *lse, attn_tensor *saved, int *flash);

/* ---- positional encoding ------------------------------------------------- */

/* out (max_len, d), contiguous: out[pos, 2j] = sin(pos / 10000^(2j/d)),
 * out[pos, 2j+1] = cos(pos / 10000^(2j/d)), pos and j 0-based; computed in
 * double. For odd d the last column is a sine. */
attn_status attn_attention_positional_encoding(attn_tensor *out);

#endif
