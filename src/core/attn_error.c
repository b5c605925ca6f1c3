#include "core/attn_error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char error_message[1024];
/* One slot per shape a message may name: some name eight (an op's operands and the shape they
 * must fit), and C leaves the order in which a call's arguments are formatted to the compiler,
 * so a ring shorter than a message's shapes overwrote different ones on x86-64 and aarch64. */
#define SHAPE_RING 8
static _Thread_local char shape_ring[SHAPE_RING][160];
static _Thread_local int shape_ring_next;

attn_status attn_error(attn_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_message, sizeof error_message, fmt, ap);
  va_end(ap);
  return status;
}

const char *attn_last_error(void) { return error_message; }

const char *attn_shape_str(int ndim, const int64_t *shape) {
  char *buf = shape_ring[shape_ring_next];
  shape_ring_next = (shape_ring_next + 1) % SHAPE_RING;
  size_t cap = sizeof shape_ring[0], len = 0;
  buf[len++] = '[';
  for (int i = 0; i < ndim && len < cap - 24; i++)
    len += (size_t)snprintf(buf + len, cap - len, i ? "x%lld" : "%lld", (long long)shape[i]);
  if (ndim > 0 && len >= cap - 24) len += (size_t)snprintf(buf + len, cap - len, "...");
  snprintf(buf + len, cap - len, "]");
  return buf;
}
