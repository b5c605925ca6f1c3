/* The Winograd transforms for the avx2 path, compiled with its own flags
 * (see CPU_FLAGS_avx2 in the Makefile); only on x86-64. */
#if defined(__x86_64__)
#define WINO_SUFFIX avx2
#include "cpu/wino_body.h"
#endif
