/* Short-row attention kernels for the avx2 path, compiled with its own flags (see
 * CPU_FLAGS_avx2 in the Makefile); only on x86-64. */
#if defined(__x86_64__)
#include "cpu/sdpa_small_cpu.h"

#define SMALL_SUFFIX avx2
#include "cpu/sdpa_small_body.h"
#endif
