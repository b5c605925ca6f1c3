/* Short-row attention kernels, portable C (flags in the Makefile). */
#include "cpu/sdpa_small_cpu.h"

#define SMALL_SUFFIX generic
#include "cpu/sdpa_small_body.h"
