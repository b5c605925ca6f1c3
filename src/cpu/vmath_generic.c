/* attn_vmath's row kernels for the generic path (flags in the Makefile). */
#include "vmath_cpu.h"

#define VMATH_SUFFIX generic
#include "vmath_body.h"
