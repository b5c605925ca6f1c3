/* attn_vmath's row kernels for the avx2 path, compiled with its own flags
 * (see CPU_FLAGS_avx2 in the Makefile); only on x86-64. */
#if defined(__x86_64__)
#include "cpu/vmath_cpu.h"

#define VMATH_SUFFIX avx2
#include "cpu/vmath_body.h"
#endif
