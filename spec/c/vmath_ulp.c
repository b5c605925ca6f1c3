/* The float32 exp, tanh, sigmoid and log of attn_vmath against libm over all 2^32 float inputs
 * (every denormal, +-0, +-inf and every NaN pattern), on every instruction-set path this CPU has.
 * The reference is the double function rounded to float (exp, tanh, log; 1 / (1 + exp(-x)) for the
 * sigmoid), which is correctly rounded except in rare near-halfway cases. Prints the worst error in
 * ulps per function and path and fails when it exceeds the bound the README documents; NaN must
 * give NaN. Run by `make check-vmath-ulp` (a few minutes: not part of `make test`). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn_vmath.h"

enum { CHUNK = 1 << 16, NF = 4 };
static const char *names[NF] = {"exp", "tanh", "sigmoid", "log"};
static const int bound[NF] = {1, 2, 1, 1}; /* the documented bounds, in ulps */

/* floats in ulp order: negative floats mapped below positive ones */
static int64_t order(float v) {
  int32_t i;
  memcpy(&i, &v, 4);
  return i < 0 ? (int64_t)INT32_MIN - i : i;
}

static double ref(int f, float x) {
  double d = x;
  switch (f) {
  case 0: return exp(d);
  case 1: return tanh(d);
  case 2: return 1 / (1 + exp(-d));
  default: return log(d);
  }
}

static void run(int f, const float *x, float *y) {
  void (*fn[NF])(const float *, float *, int64_t) = {attn_vmath_exp_f32, attn_vmath_tanh_f32,
                                                     attn_vmath_sigmoid_f32, attn_vmath_log_f32};
  fn[f](x, y, CHUNK);
}

int main(int argc, char **argv) {
  /* an optional argument N checks every N-th block of 65536 inputs only (a quick look) */
  uint64_t stride = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
  if (stride < 1) stride = 1;
  static float x[CHUNK], r[NF][CHUNK], y[CHUNK];
  const char *paths[] = {"generic", "avx2", "avx512"};
  int64_t worst[3][NF] = {{0}};
  float worst_at[3][NF] = {{0}};
  for (uint64_t base = 0; base < (1ull << 32); base += CHUNK * stride) {
    for (int i = 0; i < CHUNK; i++) {
      uint32_t b = (uint32_t)(base + (uint64_t)i);
      memcpy(&x[i], &b, 4);
    }
    for (int f = 0; f < NF; f++)
      for (int i = 0; i < CHUNK; i++) r[f][i] = (float)ref(f, x[i]);
    for (int p = 0; p < 3; p++) {
      if (!attn_vmath_isa_supported(paths[p]) || attn_vmath_set_isa(paths[p]) != ATTN_OK) continue;
      for (int f = 0; f < NF; f++) {
        run(f, x, y);
        for (int i = 0; i < CHUNK; i++) {
          int64_t d;
          if (isnan(r[f][i]) || isnan(y[i]))
            d = isnan(r[f][i]) && isnan(y[i]) ? 0 : INT64_MAX;
          else
            d = llabs(order(y[i]) - order(r[f][i]));
          if (d > worst[p][f]) worst[p][f] = d, worst_at[p][f] = x[i];
        }
      }
    }
  }
  int bad = 0;
  for (int p = 0; p < 3; p++) {
    if (!attn_vmath_isa_supported(paths[p])) continue;
    for (int f = 0; f < NF; f++) {
      int ok = worst[p][f] <= bound[f];
      bad |= !ok;
      printf("%-8s %-7s max %lld ulp (at %.9g), bound %d: %s\n", paths[p], names[f], (long long)worst[p][f],
             (double)worst_at[p][f], bound[f], ok ? "ok" : "FAIL");
    }
  }
  return bad;
}
