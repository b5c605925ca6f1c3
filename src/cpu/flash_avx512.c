/* Flash attention kernels for AVX-512 (16-float vectors, 4 x 4 register block: 16 accumulators
 * covering a whole 64-lane tile row; 4 rows divide the 64- and 128-row tiles, and measured faster
 * than 4 x 6 on Zen 5). */
#include "cpu/flash_cpu.h"

#if defined(__x86_64__)
#define FLASH_SUFFIX avx512
#define FLASH_NAME "avx512"
#define FLASH_VL 16
#define FLASH_QV 4
#define FLASH_NR 4
#include "cpu/flash_body.h"
#endif
