/* attn_vmath's row kernels for the generic path (flags in the Makefile). */
#include "cpu/vmath_cpu.h"

#define VMATH_SUFFIX generic
#include "cpu/vmath_body.h"
