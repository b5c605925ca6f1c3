/* Flash attention kernels for AVX2 + FMA (8-float vectors, 2 x 6 register block: 12 accumulators). */
#include "cpu/flash_cpu.h"

#if defined(__x86_64__)
#define FLASH_SUFFIX avx2
#define FLASH_NAME "avx2"
#define FLASH_VL 8
#define FLASH_QV 2
#define FLASH_NR 6
#include "cpu/flash_body.h"
#endif
