/* ATTN_CPU_INLINE: the kernels' element and block helpers are forced inline,
 * because their loops vectorise (and their constant arguments fold) only when
 * the helper's body sits in the caller; one definition for every ISA body. */
#ifndef ATTN_CPU_INLINE_H
#define ATTN_CPU_INLINE_H

#if defined(__GNUC__)
#define ATTN_CPU_INLINE static inline __attribute__((always_inline))
#else
#define ATTN_CPU_INLINE static inline
#endif

#endif
