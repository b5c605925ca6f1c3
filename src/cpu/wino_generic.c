/* The Winograd transforms for the generic path (flags in the Makefile). */
#define WINO_SUFFIX generic
#include "cpu/wino_body.h"
