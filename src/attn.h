/* attn: the C core of the attention engine (Lua-free). One header per
 * component; this one pulls them all in. */
#ifndef ATTN_H
#define ATTN_H

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 1
#define ATTN_VERSION_PATCH 0

#include "core/attn_alloc.h"
#include "attention/attn_attention.h"
#include "nn/attn_caption.h"
#include "nn/attn_conv.h"
#include "nn/attn_decoder.h"
#include "core/attn_dropout.h"
#include "core/attn_error.h"
#include "core/attn_gemm.h"
#include "core/attn_io.h"
#include "nn/attn_layernorm.h"
#include "core/attn_linalg.h"
#include "attention/attn_linear.h"
#include "nn/attn_loss.h"
#include "core/attn_ops.h"
#include "nn/attn_optim.h"
#include "nn/attn_pool.h"
#include "core/attn_parallel.h"
#include "core/attn_rng.h"
#include "nn/attn_lstm.h"
#include "nn/attn_rnn.h"
#include "nn/attn_rope.h"
#include "core/attn_saved.h"
#include "core/attn_tensor.h"
#include "core/attn_vmath.h"

#endif
