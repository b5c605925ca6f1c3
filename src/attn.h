/* attn: the C core of the attention engine (Lua-free). One header per
 * component; this one pulls them all in. */
#ifndef ATTN_H
#define ATTN_H

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 1
#define ATTN_VERSION_PATCH 0

#include "attn_alloc.h"
#include "attn_attention.h"
#include "attn_decoder.h"
#include "attn_dropout.h"
#include "attn_error.h"
#include "attn_gemm.h"
#include "attn_io.h"
#include "attn_layernorm.h"
#include "attn_linalg.h"
#include "attn_loss.h"
#include "attn_ops.h"
#include "attn_optim.h"
#include "attn_parallel.h"
#include "attn_rng.h"
#include "attn_rnn.h"
#include "attn_saved.h"
#include "attn_tensor.h"
#include "attn_vmath.h"

#endif
