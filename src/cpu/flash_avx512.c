/* Flash attention kernels for AVX-512 (16-float vectors, 4 x 6 register block: 24 accumulators
 * covering a whole 64-lane tile row). */
#include "flash_cpu.h"

#if defined(__x86_64__)
#define FLASH_SUFFIX avx512
#define FLASH_NAME "avx512"
#define FLASH_VL 16
#define FLASH_QV 4
#define FLASH_NR 6
#include "flash_body.h"
#endif
