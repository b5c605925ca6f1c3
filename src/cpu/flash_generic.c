/* Flash attention kernels, portable C (any target; 4-float vectors, 2 x 4 register block). */
#include "cpu/flash_cpu.h"

#define FLASH_SUFFIX generic
#define FLASH_NAME "generic"
#define FLASH_VL 4
#define FLASH_QV 2
#define FLASH_NR 4
#include "cpu/flash_body.h"
