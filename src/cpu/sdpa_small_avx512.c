/* Short-row attention kernels for the avx512 path, compiled with its own flags (see
 * CPU_FLAGS_avx512 in the Makefile); only on x86-64. */
#if defined(__x86_64__)
#include "cpu/sdpa_small_cpu.h"

#define SMALL_SUFFIX avx512
#include "cpu/sdpa_small_body.h"
#endif
