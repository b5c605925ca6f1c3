/* C unit tests of the Lua-free core: allocator, views, copies, broadcasting,
 * error messages, reductions and matmul against naive loops, checkpoint bytes
 * (encode, atomic write, decode) round-tripped from C. Prints one line
 * per failure and ends with "N passed, N failed". */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attn.h"
#include "cpu/cpu_dispatch.h"
#include "cpu/wino_cpu.h"

static int passed, failed;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (cond) {                                            \
      passed++;                                            \
    } else {                                               \
      failed++;                                            \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);          \
      printf(__VA_ARGS__);                                 \
      printf("\n");                                        \
    }                                                      \
  } while (0)

static void test_allocator(void) {
  size_t cap1, cap2;
  attn_alloc_empty_cache();
  void *a = attn_alloc(1000, &cap1);
  CHECK(a && cap1 >= 1000 && cap1 <= 1280, "class for 1000 bytes is %zu", cap1);
  CHECK(((uintptr_t)a & 63) == 0, "64-byte alignment");
  attn_free(a, cap1);
  CHECK(attn_alloc_cached_bytes() == cap1, "freed block is cached");
  void *b = attn_alloc(1010, &cap2);
  CHECK(b == a && cap2 == cap1, "same class reuses the cached block");
  attn_free(b, cap2);
  attn_alloc_empty_cache();
  CHECK(attn_alloc_cached_bytes() == 0, "empty_cache gives everything back");
  size_t cap;
  CHECK(attn_alloc((size_t)1 << 62, &cap) == NULL, "absurd request refused");

  /* The cache holds up to twice the most bytes ever live (4096 here, the
   * first block above was 1024): the 4096 and 3072 blocks both stay, a 2048
   * block then evicts the class used longest ago. */
  size_t cx, cy, cz;
  void *x = attn_alloc(4096, &cx);
  attn_free(x, cx);
  void *y = attn_alloc(3000, &cy);
  attn_free(y, cy);
  CHECK(cx == 4096 && cy == 3072 && attn_alloc_cached_bytes() == cx + cy, "two blocks past one peak are cached: %zu",
        attn_alloc_cached_bytes());
  void *z = attn_alloc(2000, &cz);
  attn_free(z, cz);
  CHECK(cz == 2048 && attn_alloc_cached_bytes() == cy + cz, "past twice the peak the oldest class goes: %zu cached",
        attn_alloc_cached_bytes());
  attn_alloc_empty_cache();
}

static void test_views_and_errors(void) {
  attn_tensor t;
  int64_t shape[3] = {2, 3, 4};
  CHECK(attn_tensor_init(&t, ATTN_F64, 3, shape) == ATTN_OK, "init");
  int64_t n = attn_tensor_numel(&t);
  for (int64_t i = 0; i < n; i++) ((double *)t.storage->data)[i] = (double)i;
  attn_tensor v;
  attn_tensor_view(&v, &t);
  CHECK(t.storage->refcount == 2, "a view retains the storage");
  attn_view_transpose(&v, 0, 2); /* (4, 3, 2) */
  int64_t idx[3] = {3, 1, 1};     /* v[3][1][1] == t[1][1][3] = 12 + 4 + 3 */
  CHECK(attn_tensor_get(&v, idx) == 19.0, "transposed read %g", attn_tensor_get(&v, idx));
  CHECK(!attn_tensor_is_contiguous(&v), "transpose is not contiguous");
  int64_t flat = 24;
  CHECK(attn_view_reshape("view", &v, 1, &flat) == ATTN_ERR_SHAPE, "transposed view cannot flatten");
  CHECK(strstr(attn_last_error(), "not viewable") != NULL, "message: %s", attn_last_error());
  CHECK(attn_view_narrow(&v, 0, 3, 2) == ATTN_ERR_ARG, "narrow past the end fails");
  CHECK(strstr(attn_last_error(), "narrow: start 4 length 2 outside dim 1 of size 4") != NULL, "message: %s",
        attn_last_error());
  attn_tensor_free(&t);
  CHECK(v.storage->refcount == 1, "the view outlives its base");
  attn_tensor_free(&v);
  attn_tensor_free(&v); /* idempotent */
  CHECK(v.storage == NULL, "released");
  int64_t bad[2] = {3, -1};
  CHECK(attn_tensor_init(&t, ATTN_F32, 2, bad) == ATTN_ERR_SHAPE, "negative size refused");
  CHECK(strstr(attn_last_error(), "negative size -1 in shape [3x-1]") != NULL, "message: %s", attn_last_error());
}

static void test_broadcast_and_reduce(void) {
  attn_tensor a, b, out, sum;
  int64_t sa[2] = {3, 1}, sb[1] = {4}, so[2] = {3, 4}, ss[2] = {3, 1};
  attn_tensor_init(&a, ATTN_F32, 2, sa);
  attn_tensor_init(&b, ATTN_F32, 1, sb);
  attn_tensor_init(&out, ATTN_F32, 2, so);
  attn_tensor_init(&sum, ATTN_F32, 2, ss);
  for (int i = 0; i < 3; i++) ((float *)a.storage->data)[i] = (float)(i + 1);
  for (int j = 0; j < 4; j++) ((float *)b.storage->data)[j] = (float)(10 * j);
  CHECK(attn_binary(ATTN_MUL, &a, &b, &out) == ATTN_OK, "broadcast mul");
  int ok = 1;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) ok &= ((float *)out.storage->data)[i * 4 + j] == (float)((i + 1) * 10 * j);
  CHECK(ok, "broadcast values");
  CHECK(attn_reduce(ATTN_SUM, &out, 1, &sum, NULL) == ATTN_OK, "sum over dim 1");
  CHECK(((float *)sum.storage->data)[2] == 180.0f, "row sum %g", ((float *)sum.storage->data)[2]);
  attn_tensor wrong;
  int64_t sw[1] = {5};
  attn_tensor_init(&wrong, ATTN_F32, 1, sw);
  CHECK(attn_binary(ATTN_ADD, &a, &wrong, &out) == ATTN_ERR_SHAPE, "mismatch refused");
  CHECK(strstr(attn_last_error(), "add: output [3x4] is not the broadcast shape [3x5]") != NULL, "message: %s",
        attn_last_error());
  attn_tensor_free(&a);
  attn_tensor_free(&b);
  attn_tensor_free(&out);
  attn_tensor_free(&sum);
  attn_tensor_free(&wrong);
}

/* A new float64 tensor of standard normal draws. */
static void init_randn(attn_tensor *t, int ndim, const int64_t *shape, attn_rng *rng) {
  attn_tensor_init(t, ATTN_F64, ndim, shape);
  attn_rng_normal(rng, t, 0, 1);
}

static void test_matmul(void) {
  enum { M = 37, K = 19, N = 23 };
  attn_tensor a, b, c;
  int64_t sa[2] = {K, M}, sb[2] = {K, N}, sc[2] = {M, N};
  attn_rng rng;
  attn_rng_seed(&rng, 5);
  init_randn(&a, 2, sa, &rng); /* used transposed: (M, K) */
  init_randn(&b, 2, sb, &rng);
  attn_tensor_init(&c, ATTN_F64, 2, sc);
  attn_view_transpose(&a, 0, 1);
  CHECK(attn_matmul(&a, &b, &c) == ATTN_OK, "matmul");
  double worst = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++) {
        int64_t ia[2] = {i, k}, ib[2] = {k, j};
        s += attn_tensor_get(&a, ia) * attn_tensor_get(&b, ib);
      }
      int64_t ic[2] = {i, j};
      double err = fabs(attn_tensor_get(&c, ic) - s);
      if (err > worst) worst = err;
    }
  CHECK(worst < 1e-12, "matmul vs naive loop: worst error %g", worst);
  CHECK(attn_matmul(&b, &b, &c) == ATTN_ERR_SHAPE, "inner dims checked");
  CHECK(strstr(attn_last_error(), "matmul: inner dims differ: [19x23] @ [19x23]") != NULL, "message: %s",
        attn_last_error());
  attn_tensor_free(&a);
  attn_tensor_free(&b);
  attn_tensor_free(&c);
}

/* NumPy's 1-D rule, decided in the core: (K) @ (2, K, N) -> (2, N),
 * (2, M, K) @ (K) -> (2, M), (K) @ (K) -> (), against naive sums. */
static void test_matmul_vectors(void) {
  enum { M = 3, K = 4, N = 5 };
  attn_tensor v, w, batch_kn, batch_mk, out;
  int64_t sv[1] = {K}, skn[3] = {2, K, N}, smk[3] = {2, M, K};
  attn_rng rng;
  attn_rng_seed(&rng, 9);
  init_randn(&v, 1, sv, &rng);
  init_randn(&w, 1, sv, &rng);
  init_randn(&batch_kn, 3, skn, &rng);
  init_randn(&batch_mk, 3, smk, &rng);
  int nd;
  int64_t shape[ATTN_MAX_DIMS];
  CHECK(attn_matmul_shape(&v, &batch_kn, &nd, shape) == ATTN_OK && nd == 2 && shape[0] == 2 && shape[1] == N,
        "(K) @ (2, K, N) is %s", attn_shape_str(nd, shape));
  attn_tensor_init(&out, ATTN_F64, nd, shape);
  CHECK(attn_matmul(&v, &batch_kn, &out) == ATTN_OK, "vector @ batch: %s", attn_last_error());
  double worst = 0;
  for (int64_t p = 0; p < 2; p++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) {
        int64_t ib[3] = {p, k, j};
        s += attn_tensor_get(&v, &k) * attn_tensor_get(&batch_kn, ib);
      }
      int64_t io[2] = {p, j};
      worst = fmax(worst, fabs(attn_tensor_get(&out, io) - s));
    }
  attn_tensor_free(&out);
  CHECK(attn_matmul_shape(&batch_mk, &v, &nd, shape) == ATTN_OK && nd == 2 && shape[0] == 2 && shape[1] == M,
        "(2, M, K) @ (K) is %s", attn_shape_str(nd, shape));
  attn_tensor_init(&out, ATTN_F64, nd, shape);
  CHECK(attn_matmul(&batch_mk, &v, &out) == ATTN_OK, "batch @ vector: %s", attn_last_error());
  for (int64_t p = 0; p < 2; p++)
    for (int64_t i = 0; i < M; i++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) {
        int64_t ia[3] = {p, i, k};
        s += attn_tensor_get(&batch_mk, ia) * attn_tensor_get(&v, &k);
      }
      int64_t io[2] = {p, i};
      worst = fmax(worst, fabs(attn_tensor_get(&out, io) - s));
    }
  attn_tensor_free(&out);
  CHECK(attn_matmul_shape(&v, &w, &nd, shape) == ATTN_OK && nd == 0, "(K) @ (K) is 0-d");
  attn_tensor_init(&out, ATTN_F64, 0, shape);
  CHECK(attn_matmul(&v, &w, &out) == ATTN_OK, "dot: %s", attn_last_error());
  double dot = 0;
  for (int64_t k = 0; k < K; k++) dot += attn_tensor_get(&v, &k) * attn_tensor_get(&w, &k);
  worst = fmax(worst, fabs(attn_tensor_get(&out, NULL) - dot));
  CHECK(worst < 1e-12, "1-D matmul vs naive sums: worst error %g", worst);
  CHECK(attn_matmul_shape(&batch_kn, &v, &nd, shape) == ATTN_ERR_SHAPE, "(2, K, N) @ (K) refused");
  CHECK(strstr(attn_last_error(), "matmul: inner dims differ: [2x4x5] @ [4]") != NULL, "message names the caller's "
        "shapes, not the promoted ones: %s", attn_last_error());
  CHECK(attn_matmul_shape(&out, &v, &nd, shape) == ATTN_ERR_SHAPE, "0-d refused");
  CHECK(strstr(attn_last_error(), "matmul: operands need at least 1 dim, got [] @ [4]") != NULL, "message: %s",
        attn_last_error());
  attn_tensor_free(&out);
  attn_tensor_free(&v);
  attn_tensor_free(&w);
  attn_tensor_free(&batch_kn);
  attn_tensor_free(&batch_mk);
}

/* Save and load from C: tensors encoded to little-endian bytes, written
 * atomically after a header, read back with stdio and decoded; the values
 * and bits must survive, a strided view must come back in row-major order,
 * and a short file must be refused before anything is decoded. */
static void test_io_round_trip(void) {
  char dir[] = "/tmp/attn_test_io_XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char path[64];
  snprintf(path, sizeof path, "%s/ckpt.bin", dir);
  attn_tensor w, ids;
  int64_t sw[2] = {3, 2}, si[1] = {3};
  attn_tensor_init(&w, ATTN_F64, 2, sw);
  attn_tensor_init(&ids, ATTN_I64, 1, si);
  for (int64_t i = 0; i < 6; i++) ((double *)w.storage->data)[i] = 1.0 / 3.0 + (double)i * 1e300 / 7.0;
  const int64_t id_values[3] = {INT64_MIN, -1, (int64_t)1 << 60};
  memcpy(ids.storage->data, id_values, sizeof id_values);
  attn_tensor wt;
  attn_tensor_view(&wt, &w);
  attn_view_transpose(&wt, 0, 1); /* (2, 3), strided: saved in its own row-major order */
  size_t nw, ni;
  CHECK(attn_io_nbytes(&wt, &nw) == ATTN_OK && nw == 48, "nbytes of [2x3] float64: %zu", nw);
  CHECK(attn_io_nbytes(&ids, &ni) == ATTN_OK && ni == 24, "nbytes of [3] int64: %zu", ni);
  CHECK(!attn_io_is_serialised(&wt), "a transposed view is not its own serialisation");
  unsigned char wbytes[48];
  CHECK(attn_io_encode(&wt, wbytes, nw) == ATTN_OK, "encode: %s", attn_last_error());
  const char header[8] = "ATTNv1\n";
  attn_io_part parts[3] = {{header, 8}, {wbytes, nw}, {ids.storage->data, ni}};
  CHECK(attn_io_write_atomic(path, parts, 2) == ATTN_OK, "first save: %s", attn_last_error());
  CHECK(attn_io_write_atomic(path, parts, 3) == ATTN_OK, "save over it: %s", attn_last_error());

  unsigned char file[256];
  FILE *f = fopen(path, "rb");
  size_t len = f ? fread(file, 1, sizeof file, f) : 0;
  if (f) fclose(f);
  CHECK(len == 8 + 48 + 24, "the second save replaced the first: %zu bytes", len);
  CHECK(memcmp(file, "ATTNv1\n", 8) == 0, "header first");
  /* little-endian on every host: the lowest byte of INT64_MIN is 0, its highest 0x80 */
  CHECK(file[8 + 48] == 0 && file[8 + 48 + 7] == 0x80, "int64 bytes are little-endian");
  int64_t s23[2] = {2, 3};
  attn_tensor w2, ids2;
  CHECK(attn_io_check_span("load", len, 8, ATTN_ENC_F64, 2, s23) == ATTN_OK, "span fits");
  attn_tensor_init(&w2, attn_encoding_dtype(ATTN_ENC_F64), 2, s23);
  attn_tensor_init(&ids2, attn_encoding_dtype(ATTN_ENC_I64), 1, si);
  CHECK(attn_io_decode(file, len, 8, ATTN_ENC_F64, 0, &w2) == ATTN_OK, "decode w: %s", attn_last_error());
  CHECK(attn_io_decode(file, len, 8 + 48, ATTN_ENC_I64, 0, &ids2) == ATTN_OK, "decode ids: %s", attn_last_error());
  int same = 1;
  for (int64_t i = 0; i < 2; i++)
    for (int64_t j = 0; j < 3; j++) {
      int64_t at[2] = {i, j}, src[2] = {j, i};
      double a = attn_tensor_get(&w2, at), b = attn_tensor_get(&w, src);
      same &= memcmp(&a, &b, sizeof a) == 0;
    }
  CHECK(same, "float64 values come back bit for bit, in the view's row-major order");
  CHECK(memcmp(ids2.storage->data, id_values, sizeof id_values) == 0, "int64 extremes come back exactly");
  CHECK(attn_io_check_span("load", len - 1, 8 + 48, ATTN_ENC_I64, 1, si) == ATTN_ERR_IO, "a short file is refused");
  CHECK(strstr(attn_last_error(), "load: int64 [3] needs 24 bytes at offset 56, the data has 79") != NULL,
        "message: %s", attn_last_error());

  /* the narrow encodings, big-endian too: 1.0, -2.0, +inf and the smallest subnormal */
  const unsigned char half_be[8] = {0x3c, 0x00, 0xc0, 0x00, 0x7c, 0x00, 0x00, 0x01};
  const unsigned char bf16_le[4] = {0x80, 0x3f, 0x20, 0xc1}; /* 1.0, -10.0 */
  const unsigned char i32_be[4] = {0xff, 0xff, 0xff, 0xfb}; /* -5 */
  int64_t s4[1] = {4}, s2[1] = {2}, s1[1] = {1};
  attn_tensor h, bf, i32;
  attn_tensor_init(&h, ATTN_F32, 1, s4);
  attn_tensor_init(&bf, ATTN_F32, 1, s2);
  attn_tensor_init(&i32, ATTN_I64, 1, s1);
  CHECK(attn_io_decode(half_be, 8, 0, ATTN_ENC_F16, 1, &h) == ATTN_OK, "decode f16");
  const float *hv = h.storage->data;
  CHECK(hv[0] == 1.0f && hv[1] == -2.0f && isinf(hv[2]) && hv[2] > 0 && hv[3] == ldexpf(1, -24),
        "f16: %g %g %g %g", hv[0], hv[1], hv[2], hv[3]);
  CHECK(attn_io_decode(bf16_le, 4, 0, ATTN_ENC_BF16, 0, &bf) == ATTN_OK, "decode bf16");
  CHECK(((float *)bf.storage->data)[0] == 1.0f && ((float *)bf.storage->data)[1] == -10.0f, "bf16 values");
  CHECK(attn_io_decode(i32_be, 4, 0, ATTN_ENC_I32, 1, &i32) == ATTN_OK && ((int64_t *)i32.storage->data)[0] == -5,
        "big-endian int32 -5 into int64");
  CHECK(attn_io_decode(i32_be, 4, 0, ATTN_ENC_F16, 1, &i32) == ATTN_ERR_DTYPE, "float16 does not load into int64");
  attn_encoding e;
  CHECK(attn_encoding_parse("BF16", &e) == 0 && e == ATTN_ENC_BF16 && attn_encoding_size(e) == 2, "parse BF16");
  CHECK(attn_encoding_parse("float8", &e) == -1, "unknown encoding");

  char bad[96];
  snprintf(bad, sizeof bad, "%s/missing/ckpt.bin", dir);
  CHECK(attn_io_write_atomic(bad, parts, 3) == ATTN_ERR_IO, "a missing folder is an I/O error");
  CHECK(strstr(attn_last_error(), bad) != NULL, "the message names the path: %s", attn_last_error());
  CHECK(attn_io_fsync(path) == ATTN_OK, "fsync: %s", attn_last_error());
  CHECK(attn_io_fsync(bad) == ATTN_ERR_IO, "fsync of a missing file");

  int entries = 0; /* nothing but the file is left in the folder */
  DIR *d = opendir(dir);
  for (struct dirent *ent; d && (ent = readdir(d)) != NULL;)
    if (ent->d_name[0] != '.') entries++;
  if (d) closedir(d);
  CHECK(entries == 1, "no temporary file left behind: %d entries", entries);
  remove(path);
  rmdir(dir);
  attn_tensor_free(&wt);
  attn_tensor_free(&w);
  attn_tensor_free(&ids);
  attn_tensor_free(&w2);
  attn_tensor_free(&ids2);
  attn_tensor_free(&h);
  attn_tensor_free(&bf);
  attn_tensor_free(&i32);
}

/* int64: exact values past 2^53, wrapping arithmetic, extremes with int64
 * indices, conversions, index validation, lengths (past the end: all valid;
 * negative: refused), and the float-only rule. */
static void test_int64(void) {
  const int64_t big = ((int64_t)1 << 53) + 1;
  attn_tensor a, b, out, idx, f;
  int64_t s3[1] = {3}, s1[1] = {1};
  CHECK(attn_tensor_init(&a, ATTN_I64, 1, s3) == ATTN_OK, "int64 init");
  CHECK(attn_dtype_size(ATTN_I64) == 8 && !strcmp(attn_dtype_name(ATTN_I64), "int64"), "size and name");
  attn_dtype dt;
  CHECK(attn_dtype_parse("long", &dt) == 0 && dt == ATTN_I64, "'long' parses as int64");
  int64_t *A = a.storage->data;
  A[0] = big;
  A[1] = INT64_MAX;
  A[2] = -7;
  attn_tensor_init(&b, ATTN_I64, 1, s3);
  attn_tensor_init(&out, ATTN_I64, 1, s3);
  CHECK(attn_fill(&b, 1) == ATTN_OK, "fill");
  CHECK(attn_binary(ATTN_ADD, &a, &b, &out) == ATTN_OK, "add");
  const int64_t *O = out.storage->data;
  CHECK(O[0] == big + 1 && O[1] == INT64_MIN && O[2] == -6, "exact, wrapping add: %lld %lld %lld", (long long)O[0],
        (long long)O[1], (long long)O[2]);
  CHECK(attn_binary_scalar(ATTN_MUL, &a, 2.0, 1, &out) == ATTN_OK && O[2] == -14, "scalar mul");
  CHECK(attn_binary_scalar(ATTN_ADD, &a, 0.5, 0, &out) == ATTN_ERR_DTYPE, "non-integer scalar refused");
  CHECK(attn_binary(ATTN_DIV, &a, &b, &out) == ATTN_ERR_DTYPE, "div refused");
  CHECK(strstr(attn_last_error(), "div: needs a float tensor, got int64 [3]; convert with :to(\"float32\")") != NULL,
        "message: %s", attn_last_error());
  CHECK(attn_unary(ATTN_EXP, &a, &out) == ATTN_ERR_DTYPE, "exp refused");
  CHECK(attn_unary(ATTN_NEG, &a, &out) == ATTN_OK && O[0] == -big, "neg");
  attn_tensor_init(&f, ATTN_F32, 1, s3);
  CHECK(attn_binary(ATTN_ADD, &a, &f, &f) == ATTN_ERR_DTYPE, "int64 + float32 refused");
  CHECK(strstr(attn_last_error(), "convert it with :to(\"float32\")") != NULL, "message: %s", attn_last_error());
  /* extremes: the value and its 0-based int64 index */
  attn_tensor mx;
  attn_tensor_init(&mx, ATTN_I64, 1, s1);
  attn_tensor_init(&idx, ATTN_I64, 1, s1);
  CHECK(attn_reduce(ATTN_MAX, &a, 0, &mx, &idx) == ATTN_OK, "max");
  CHECK(((int64_t *)mx.storage->data)[0] == INT64_MAX && ((int64_t *)idx.storage->data)[0] == 1, "max and index");
  CHECK(attn_reduce(ATTN_SUM, &b, 0, &mx, NULL) == ATTN_OK && ((int64_t *)mx.storage->data)[0] == 3, "sum");
  CHECK(attn_reduce(ATTN_MEAN, &a, 0, &mx, NULL) == ATTN_ERR_DTYPE, "mean refused");
  /* conversions: float -> int64 truncates toward zero, NaN and overflow do not trap */
  float *F = f.storage->data;
  F[0] = -2.7f;
  F[1] = NAN;
  F[2] = 1e30f;
  CHECK(attn_copy(&out, &f) == ATTN_OK && O[0] == -2 && O[1] == 0 && O[2] == INT64_MAX, "float to int64");
  /* ids: validation and the shift to 0-based */
  F[0] = 3;
  F[1] = 1;
  F[2] = 2.5f;
  CHECK(attn_index_convert("gather", "index", NULL, &f, 1, 3, &out) == ATTN_ERR_ARG, "non-integer id refused");
  CHECK(strstr(attn_last_error(), "gather: index 2.5 at position 3 is not an integer (indices [3])") != NULL,
        "message: %s", attn_last_error());
  F[2] = 2;
  CHECK(attn_index_convert("gather", "index", NULL, &f, 1, 3, &out) == ATTN_OK && O[0] == 2 && O[1] == 0 && O[2] == 1,
        "ids shifted to 0-based");
  CHECK(attn_index_convert("Embedding", "token id", "ids [3]", &a, 1, 5, NULL) == ATTN_ERR_ARG, "range checked");
  CHECK(strstr(attn_last_error(), "Embedding: token id 9007199254740993 at position 1 is out of range 1..5 (ids [3])") !=
            NULL, "message: %s", attn_last_error());
  /* lengths: int64 read exactly; negative refused */
  int64_t lens[3];
  A[0] = 2;
  A[1] = 0;
  A[2] = 4;
  CHECK(attn_attention_lengths("masked_softmax", "valid_lens", "X", &a, 3, 1, 4, 0, lens) == ATTN_OK &&
            lens[0] == 2 && lens[1] == 0 && lens[2] == 4, "int64 lengths");
  A[1] = 9;
  CHECK(attn_attention_lengths("masked_softmax", "valid_lens", "X", &a, 3, 1, 4, 0, lens) == ATTN_OK && lens[1] == 4,
        "a length past the end means all positions");
  A[1] = -1;
  CHECK(attn_attention_lengths("masked_softmax", "valid_lens", "X", &a, 3, 1, 4, 0, lens) == ATTN_ERR_ARG,
        "negative length refused");
  attn_tensor *all[] = {&a, &b, &out, &idx, &f, &mx};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) attn_tensor_free(all[i]);
}

/* sort against the expected stable order; multinomial never draws a zero weight. */
static void test_sort_and_multinomial(void) {
  attn_tensor x, v, i, p, out;
  int64_t s6[1] = {6};
  attn_tensor_init(&x, ATTN_F32, 1, s6);
  attn_tensor_init(&v, ATTN_F32, 1, s6);
  attn_tensor_init(&i, ATTN_I64, 1, s6);
  const float in[6] = {2, NAN, -1, 2, -0.0f, 0};
  memcpy(x.storage->data, in, sizeof in);
  CHECK(attn_sort(&x, 0, 0, &v, &i) == ATTN_OK, "sort");
  const int64_t want[6] = {2, 4, 5, 0, 3, 1}; /* -1, -0, 0, 2, 2, NaN: ties keep their order */
  int ok = 1;
  for (int k = 0; k < 6; k++) ok &= ((int64_t *)i.storage->data)[k] == want[k];
  CHECK(ok, "stable ascending order with NaN last");
  CHECK(isnan(((float *)v.storage->data)[5]) && ((float *)v.storage->data)[0] == -1, "values follow the indices");
  int64_t sp[2] = {1, 4}, so[2] = {1, 200};
  attn_tensor_init(&p, ATTN_F64, 2, sp);
  attn_tensor_init(&out, ATTN_I64, 2, so);
  const double w[4] = {0.5, 0, 2, 0};
  memcpy(p.storage->data, w, sizeof w);
  attn_rng rng;
  attn_rng_seed(&rng, 3);
  CHECK(attn_rng_multinomial(&rng, &p, 200, 1, &out) == ATTN_OK, "multinomial with replacement");
  ok = 1;
  for (int k = 0; k < 200; k++) {
    int64_t c = ((int64_t *)out.storage->data)[k];
    ok &= c == 0 || c == 2;
  }
  CHECK(ok, "zero weights are never drawn");
  CHECK(attn_rng_multinomial(&rng, &p, 200, 0, &out) == ATTN_ERR_ARG, "too many draws without replacement");
  CHECK(strstr(attn_last_error(), "row 1 has 2 categories with nonzero probability") != NULL, "message: %s",
        attn_last_error());
  attn_tensor *all[] = {&x, &v, &i, &p, &out};
  for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) attn_tensor_free(all[k]);
}

/* One GRU step, one layer, B = H = 1, input size 1, against the equations by
 * hand (PyTorch's gate order r, z, n), its backward against central
 * differences, and a refused shape naming the operand. */
static double gru_by_hand(const double *wi, const double *wh, const double *bi, const double *bh, double x,
                          double h) {
  double r = 1 / (1 + exp(-(wi[0] * x + bi[0] + wh[0] * h + bh[0])));
  double z = 1 / (1 + exp(-(wi[1] * x + bi[1] + wh[1] * h + bh[1])));
  double n = tanh(wi[2] * x + bi[2] + r * (wh[2] * h + bh[2]));
  return (1 - z) * n + z * h;
}

static void test_gru(void) {
  const double wi[3] = {0.5, -0.3, 0.8}, wh[3] = {0.2, 0.7, -0.4}, bi[3] = {0.1, -0.2, 0.3}, bh[3] = {-0.1, 0.05, 0.2};
  const double xv = 0.9, hv = -0.6;
  attn_saved_layout lay;
  CHECK(attn_gru_saved_layout(1, 1, 1, 1, &lay) == ATTN_OK, "gru layout");
  int64_t s3[3] = {1, 1, 1}, s2[2] = {3, 1}, s1 = 3, sn = lay.numel;
  attn_tensor x, h0, w_ih, w_hh, b_ih, b_hh, out, hn, saved, dx, dh0, dwi, dwh, dbi, dbh, g;
  attn_tensor_init(&x, ATTN_F64, 3, s3);
  attn_tensor_init(&h0, ATTN_F64, 3, s3);
  attn_tensor_init(&w_ih, ATTN_F64, 2, s2);
  attn_tensor_init(&w_hh, ATTN_F64, 2, s2);
  attn_tensor_init(&b_ih, ATTN_F64, 1, &s1);
  attn_tensor_init(&b_hh, ATTN_F64, 1, &s1);
  attn_tensor_init(&out, ATTN_F64, 3, s3);
  attn_tensor_init(&hn, ATTN_F64, 3, s3);
  attn_tensor_init(&saved, ATTN_F64, 1, &sn);
  double *X = attn_tensor_data(&x), *H0 = attn_tensor_data(&h0), *WI = attn_tensor_data(&w_ih);
  X[0] = xv;
  H0[0] = hv;
  memcpy(WI, wi, sizeof wi);
  memcpy(attn_tensor_data(&w_hh), wh, sizeof wh);
  memcpy(attn_tensor_data(&b_ih), bi, sizeof bi);
  memcpy(attn_tensor_data(&b_hh), bh, sizeof bh);
  const attn_tensor *WIs[1] = {&w_ih}, *WHs[1] = {&w_hh}, *BIs[1] = {&b_ih}, *BHs[1] = {&b_hh};
  CHECK(attn_gru_forward(&x, &h0, 1, WIs, WHs, BIs, BHs, 0, 0, &out, &hn, &saved) == ATTN_OK, "gru forward");
  double want = gru_by_hand(wi, wh, bi, bh, xv, hv), got = ((double *)attn_tensor_data(&out))[0];
  CHECK(fabs(got - want) < 1e-14, "gru step %.17g, by hand %.17g", got, want);
  CHECK(((double *)attn_tensor_data(&hn))[0] == got, "final state is the last output");

  attn_tensor_init(&g, ATTN_F64, 3, s3);
  ((double *)attn_tensor_data(&g))[0] = 1;
  attn_tensor_init_like(&dx, &x);
  attn_tensor_init_like(&dh0, &h0);
  attn_tensor_init_like(&dwi, &w_ih);
  attn_tensor_init_like(&dwh, &w_hh);
  attn_tensor_init_like(&dbi, &b_ih);
  attn_tensor_init_like(&dbh, &b_hh);
  attn_tensor *DWI[1] = {&dwi}, *DWH[1] = {&dwh}, *DBI[1] = {&dbi}, *DBH[1] = {&dbh};
  CHECK(attn_gru_backward(&x, &h0, 1, WIs, WHs, 0, 0, &saved, &g, NULL, &dx, &dh0, DWI, DWH, DBI, DBH) == ATTN_OK,
        "gru backward");
  const double eps = 1e-6;
  double num_x = (gru_by_hand(wi, wh, bi, bh, xv + eps, hv) - gru_by_hand(wi, wh, bi, bh, xv - eps, hv)) / (2 * eps);
  double num_h = (gru_by_hand(wi, wh, bi, bh, xv, hv + eps) - gru_by_hand(wi, wh, bi, bh, xv, hv - eps)) / (2 * eps);
  CHECK(fabs(((double *)attn_tensor_data(&dx))[0] - num_x) < 1e-8, "dx %.10g vs %.10g",
        ((double *)attn_tensor_data(&dx))[0], num_x);
  CHECK(fabs(((double *)attn_tensor_data(&dh0))[0] - num_h) < 1e-8, "dh0 %.10g vs %.10g",
        ((double *)attn_tensor_data(&dh0))[0], num_h);
  for (int k = 0; k < 3; k++) {
    double wp[3], wm[3];
    memcpy(wp, wh, sizeof wp);
    memcpy(wm, wh, sizeof wm);
    wp[k] += eps;
    wm[k] -= eps;
    double num = (gru_by_hand(wi, wp, bi, bh, xv, hv) - gru_by_hand(wi, wm, bi, bh, xv, hv)) / (2 * eps);
    CHECK(fabs(((double *)attn_tensor_data(&dwh))[k] - num) < 1e-8, "dw_hh[%d] %.10g vs %.10g", k,
          ((double *)attn_tensor_data(&dwh))[k], num);
  }

  const attn_tensor *wrong[1] = {&w_hh};
  int64_t s33[3] = {1, 1, 2};
  attn_tensor x2;
  attn_tensor_init(&x2, ATTN_F64, 3, s33);
  CHECK(attn_gru_forward(&x2, NULL, 1, wrong, WHs, BIs, BHs, 0, 0, &out, &hn, &saved) == ATTN_ERR_SHAPE,
        "a weight of the wrong width is refused");
  CHECK(strstr(attn_last_error(), "gru: weight_ih of layer 0 is [3x1], expected [3x2]") != NULL, "message: %s",
        attn_last_error());
  attn_tensor *all[] = {&x, &h0, &w_ih, &w_hh, &b_ih, &b_hh, &out, &hn, &saved, &dx, &dh0, &dwi, &dwh, &dbi, &dbh, &g, &x2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) attn_tensor_free(all[i]);
}

/* Two LSTM steps, one layer, B = H = 1, input size 1, against the equations by hand (PyTorch's
 * gate order i, f, g, o); backward against central differences of loss = out_1 + out_2 + c_n / 2,
 * the saved layout's size, and a refused shape naming the operand. */
static double lstm_by_hand(const double *wi, const double *wh, const double *bi, const double *bh, const double *xs,
                           double h, double c, double *out) {
  double s[2];
  if (!out) out = s;
  for (int t = 0; t < 2; t++) {
    double a[4];
    for (int g = 0; g < 4; g++) a[g] = wi[g] * xs[t] + bi[g] + wh[g] * h + bh[g];
    double i = 1 / (1 + exp(-a[0])), f = 1 / (1 + exp(-a[1])), gg = tanh(a[2]), o = 1 / (1 + exp(-a[3]));
    c = f * c + i * gg;
    h = o * tanh(c);
    out[t] = h;
  }
  return out[0] + out[1] + 0.5 * c;
}

static void test_lstm(void) {
  double wi[4] = {0.5, -0.3, 0.8, 0.4}, wh[4] = {0.2, 0.7, -0.4, 0.3}, bi[4] = {0.1, -0.2, 0.3, 0.05};
  const double bh[4] = {-0.1, 0.05, 0.2, -0.3}, xs[2] = {0.9, -0.4}, hv = -0.6, cv = 0.7;
  attn_saved_layout lay;
  CHECK(attn_lstm_saved_layout(2, 1, 1, 1, &lay) == ATTN_OK && lay.numel == 3 + 3 + 8 + 2, "lstm layout (%lld)",
        (long long)lay.numel);
  int64_t sx[3] = {2, 1, 1}, s3[3] = {1, 1, 1}, s2[2] = {4, 1}, s1 = 4, sn = lay.numel;
  attn_tensor x, h0, c0, w_ih, w_hh, b_ih, b_hh, out, hn, cn, saved, dx, dh0, dc0, dwi, dwh, dbi, dbh, dout, dcn;
  attn_tensor_init(&x, ATTN_F64, 3, sx);
  attn_tensor_init(&h0, ATTN_F64, 3, s3);
  attn_tensor_init(&c0, ATTN_F64, 3, s3);
  attn_tensor_init(&w_ih, ATTN_F64, 2, s2);
  attn_tensor_init(&w_hh, ATTN_F64, 2, s2);
  attn_tensor_init(&b_ih, ATTN_F64, 1, &s1);
  attn_tensor_init(&b_hh, ATTN_F64, 1, &s1);
  attn_tensor_init(&out, ATTN_F64, 3, sx);
  attn_tensor_init(&hn, ATTN_F64, 3, s3);
  attn_tensor_init(&cn, ATTN_F64, 3, s3);
  attn_tensor_init(&saved, ATTN_F64, 1, &sn);
  memcpy(attn_tensor_data(&x), xs, sizeof xs);
  ((double *)attn_tensor_data(&h0))[0] = hv;
  ((double *)attn_tensor_data(&c0))[0] = cv;
  memcpy(attn_tensor_data(&w_ih), wi, sizeof wi);
  memcpy(attn_tensor_data(&w_hh), wh, sizeof wh);
  memcpy(attn_tensor_data(&b_ih), bi, sizeof bi);
  memcpy(attn_tensor_data(&b_hh), bh, sizeof bh);
  const attn_tensor *WIs[1] = {&w_ih}, *WHs[1] = {&w_hh}, *BIs[1] = {&b_ih}, *BHs[1] = {&b_hh};
  CHECK(attn_lstm_forward(&x, &h0, &c0, 1, WIs, WHs, BIs, BHs, 0, 0, &out, &hn, &cn, &saved) == ATTN_OK,
        "lstm forward: %s", attn_last_error());
  double want[2];
  lstm_by_hand(wi, wh, bi, bh, xs, hv, cv, want);
  const double *got = attn_tensor_data(&out);
  CHECK(fabs(got[0] - want[0]) < 1e-15 && fabs(got[1] - want[1]) < 1e-15,
        "lstm steps %.17g %.17g, by hand %.17g %.17g", got[0], got[1], want[0], want[1]);
  CHECK(((double *)attn_tensor_data(&hn))[0] == got[1], "the final state is the last output");

  attn_tensor_init(&dout, ATTN_F64, 3, sx);
  attn_tensor_init(&dcn, ATTN_F64, 3, s3);
  ((double *)attn_tensor_data(&dout))[0] = ((double *)attn_tensor_data(&dout))[1] = 1;
  ((double *)attn_tensor_data(&dcn))[0] = 0.5;
  attn_tensor_init_like(&dx, &x);
  attn_tensor_init_like(&dh0, &h0);
  attn_tensor_init_like(&dc0, &c0);
  attn_tensor_init_like(&dwi, &w_ih);
  attn_tensor_init_like(&dwh, &w_hh);
  attn_tensor_init_like(&dbi, &b_ih);
  attn_tensor_init_like(&dbh, &b_hh);
  attn_tensor *DWI[1] = {&dwi}, *DWH[1] = {&dwh}, *DBI[1] = {&dbi}, *DBH[1] = {&dbh};
  CHECK(attn_lstm_backward(&x, 1, WIs, WHs, 0, 0, &saved, &dout, NULL, &dcn, &dx, &dh0, &dc0, DWI, DWH, DBI, DBH) ==
            ATTN_OK,
        "lstm backward: %s", attn_last_error());
  const double eps = 1e-6;
  double xp[2] = {xs[0] + eps, xs[1]}, xm[2] = {xs[0] - eps, xs[1]};
  double num_x = (lstm_by_hand(wi, wh, bi, bh, xp, hv, cv, NULL) - lstm_by_hand(wi, wh, bi, bh, xm, hv, cv, NULL)) /
                 (2 * eps);
  double num_h = (lstm_by_hand(wi, wh, bi, bh, xs, hv + eps, cv, NULL) -
                  lstm_by_hand(wi, wh, bi, bh, xs, hv - eps, cv, NULL)) / (2 * eps);
  double num_c = (lstm_by_hand(wi, wh, bi, bh, xs, hv, cv + eps, NULL) -
                  lstm_by_hand(wi, wh, bi, bh, xs, hv, cv - eps, NULL)) / (2 * eps);
  double gx = ((double *)attn_tensor_data(&dx))[0], gh = ((double *)attn_tensor_data(&dh0))[0];
  double gc = ((double *)attn_tensor_data(&dc0))[0];
  CHECK(fabs(gx - num_x) < 1e-8, "dx %.10g vs %.10g", gx, num_x);
  CHECK(fabs(gh - num_h) < 1e-8, "dh0 %.10g vs %.10g", gh, num_h);
  CHECK(fabs(gc - num_c) < 1e-8, "dc0 %.10g vs %.10g", gc, num_c);
  /* every gate's recurrent weight, input weight and bias */
  double *params[3] = {wh, wi, bi};
  attn_tensor *grads[3] = {&dwh, &dwi, &dbi};
  for (int which = 0; which < 3; which++)
    for (int k = 0; k < 4; k++) {
      double *w = params[which], keep = w[k];
      w[k] = keep + eps;
      double up = lstm_by_hand(wi, wh, bi, bh, xs, hv, cv, NULL);
      w[k] = keep - eps;
      double down = lstm_by_hand(wi, wh, bi, bh, xs, hv, cv, NULL);
      w[k] = keep;
      double num = (up - down) / (2 * eps), g = ((double *)attn_tensor_data(grads[which]))[k];
      CHECK(fabs(g - num) < 1e-8, "lstm parameter %d gate %d: %.10g vs %.10g", which, k, g, num);
    }
  CHECK(memcmp(attn_tensor_data(&dbi), attn_tensor_data(&dbh), 4 * sizeof(double)) == 0,
        "both bias gradients are the same sums");

  const attn_tensor *wrong[1] = {&b_ih};
  CHECK(attn_lstm_forward(&x, NULL, NULL, 1, WIs, wrong, BIs, BHs, 0, 0, &out, &hn, &cn, &saved) == ATTN_ERR_ARG,
        "a 1-D weight_hh is refused");
  CHECK(attn_lstm_forward(&x, &h0, &x, 1, WIs, WHs, BIs, BHs, 0, 0, &out, &hn, &cn, &saved) == ATTN_ERR_SHAPE &&
            strstr(attn_last_error(), "lstm: c0 of layer 0 is [2x1x1], expected [1x1x1]") != NULL,
        "message: %s", attn_last_error());
  attn_tensor *all[] = {&x, &h0, &c0, &w_ih, &w_hh, &b_ih, &b_hh, &out, &hn, &cn, &saved, &dx, &dh0, &dc0, &dwi, &dwh,
                        &dbi, &dbh, &dout, &dcn};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) attn_tensor_free(all[i]);
}

/* The row math on every path this CPU has, against libm at a few points. */
static void test_vmath(void) {
  const char *paths[3] = {"generic", "avx2", "avx512"};
  const float xs[6] = {-3.5f, -0.25f, 1e-20f, 0.75f, 2.0f, 30.0f};
  for (int p = 0; p < 3; p++) {
    if (!attn_vmath_isa_supported(paths[p])) continue;
    CHECK(attn_vmath_set_isa(paths[p]) == ATTN_OK, "select %s", paths[p]);
    float y[6];
    attn_vmath_tanh_f32(xs, y, 6);
    for (int i = 0; i < 6; i++)
      CHECK(fabsf(y[i] - tanhf(xs[i])) <= 2e-7f * fabsf(tanhf(xs[i])), "%s tanh(%g) = %.9g", paths[p], xs[i], y[i]);
    attn_vmath_exp_f32(xs, y, 6);
    for (int i = 0; i < 6; i++)
      CHECK(fabsf(y[i] - expf(xs[i])) <= 2e-7f * expf(xs[i]), "%s exp(%g) = %.9g", paths[p], xs[i], y[i]);
  }
  CHECK(attn_vmath_set_isa("neon9") == ATTN_ERR_ARG, "an unknown path is refused");
  CHECK(attn_vmath_set_isa("auto") == ATTN_OK, "auto picks the best");
}

/* Sparse patterns and global tokens (attn_attention.h): a fixed pattern equals its explicit
 * keep-mask, window 0 gives each query its own value, and bad global positions are refused. */
static void test_attention_sparse(void) {
  attn_tensor q, out, ref, mask;
  int64_t qs[3] = {2, 5, 4}, ms[3] = {1, 5, 5};
  CHECK(attn_tensor_init(&q, ATTN_F64, 3, qs) == ATTN_OK && attn_tensor_init(&out, ATTN_F64, 3, qs) == ATTN_OK &&
            attn_tensor_init(&ref, ATTN_F64, 3, qs) == ATTN_OK && attn_tensor_init(&mask, ATTN_F64, 3, ms) == ATTN_OK,
        "init");
  for (int64_t i = 0; i < 40; i++) ((double *)q.storage->data)[i] = (double)((i * 5) % 11) / 11.0;
  /* fixed, stride 2, summary 1, not causal: same block of 2, or j odd; query 4 also sees global 1 */
  int64_t g = 0;
  for (int64_t i = 0; i < 5; i++)
    for (int64_t j = 0; j < 5; j++) ((double *)mask.storage->data)[i * 5 + j] = i / 2 == j / 2 || j % 2 == 1 || j == g || i == g;
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.pattern = ATTN_PATTERN_FIXED;
  o.stride = 2;
  o.global = &g;
  o.nglobal = 1;
  CHECK(attn_sdpa_forward(&q, &q, &q, &o, &out, NULL, NULL, NULL) == ATTN_OK, "fixed: %s", attn_last_error());
  attn_attention_opts_init(&o);
  o.mask = &mask;
  CHECK(attn_sdpa_forward(&q, &q, &q, &o, &ref, NULL, NULL, NULL) == ATTN_OK, "mask: %s", attn_last_error());
  double err = 0;
  for (int64_t i = 0; i < 40; i++)
    err = fmax(err, fabs(((double *)out.storage->data)[i] - ((double *)ref.storage->data)[i]));
  CHECK(err < 1e-12, "fixed pattern equals its keep-mask: error %g", err);
  attn_attention_opts_init(&o);
  o.window = 0;
  CHECK(attn_sdpa_forward(&q, &q, &q, &o, &out, NULL, NULL, NULL) == ATTN_OK &&
            memcmp(out.storage->data, q.storage->data, 40 * sizeof(double)) == 0,
        "window 0: each query its own value");
  int64_t bad[2] = {1, 5};
  o.global = bad;
  o.nglobal = 2;
  CHECK(attn_sdpa_forward(&q, &q, &q, &o, &out, NULL, NULL, NULL) == ATTN_ERR_ARG &&
            strstr(attn_last_error(), "global position 6 is out of range 1..5 (Nq 5, Nk 5)") != NULL,
        "global out of range: %s", attn_last_error());
  attn_tensor_free(&q);
  attn_tensor_free(&out);
  attn_tensor_free(&ref);
  attn_tensor_free(&mask);
}

/* The attention options are checked in the core, so a C caller gets what Lua gets. */
static void test_attention_checks(void) {
  attn_tensor q, out, mask;
  int64_t qs[3] = {2, 3, 4}, ms[5] = {1, 1, 1, 1, 3};
  CHECK(attn_tensor_init(&q, ATTN_F64, 3, qs) == ATTN_OK && attn_tensor_init(&out, ATTN_F64, 3, qs) == ATTN_OK &&
            attn_tensor_init(&mask, ATTN_F64, 5, ms) == ATTN_OK,
        "init");
  for (int64_t i = 0; i < 24; i++) ((double *)q.storage->data)[i] = (double)(i % 7) / 7.0;
  for (int64_t j = 0; j < 3; j++) ((double *)mask.storage->data)[j] = j != 1;
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.dropout = 1.5;
  o.training = 0; /* evaluation: no dropout, but the probability is still checked */
  CHECK(attn_sdpa_forward(&q, &q, &q, &o, &out, NULL, NULL, NULL) == ATTN_ERR_ARG, "dropout 1.5 refused");
  CHECK(strstr(attn_last_error(), "dot_product_attention: dropout must be a probability in [0, 1], got 1.5") != NULL,
        "message: %s", attn_last_error());
  attn_attention_opts_init(&o);
  o.kernel = 42;
  CHECK(attn_sdpa_forward(&q, &q, &q, &o, &out, NULL, NULL, NULL) == ATTN_ERR_ARG, "kernel 42 refused: %s",
        attn_last_error());
  attn_attention_opts_init(&o);
  o.mask = &mask; /* (1, 1, 1, 1, Nk): NumPy broadcasting drops the leading ones */
  o.dropout = 0.5;
  o.training = 0;
  CHECK(attn_sdpa_forward(&q, &q, &q, &o, &out, NULL, NULL, NULL) == ATTN_OK, "5-D keep-mask: %s", attn_last_error());
  /* key 1 is removed for every query, and evaluation mode applies no dropout: output row 0 is the
   * softmax-weighted mean of values 0 and 2 */
  const double *x = q.storage->data, *y = out.storage->data;
  double s0 = 0, s2 = 0;
  for (int c = 0; c < 4; c++) {
    s0 += x[c] * x[c];
    s2 += x[c] * x[8 + c];
  }
  double w0 = 1 / (1 + exp((s2 - s0) / 2)), want = w0 * x[0] + (1 - w0) * x[8];
  CHECK(fabs(y[0] - want) < 1e-12, "masked, no dropout: %g vs %g", y[0], want);
  attn_tensor_free(&q);
  attn_tensor_free(&out);
  attn_tensor_free(&mask);
}

/* d2l's MultiHeadAttention in one core call against naive loops (float64): projections, heads,
 * softmax with the book's -1e6 past each sample's length, the output projection. */
static double fill_value(int64_t i, int salt) { return sin(0.7 * (double)i + salt) * 0.8; }

static void test_mha_layer(void) {
  enum { B = 2, Nq = 3, Nk = 4, Dq = 5, Dk = 3, Dv = 4, h = 6, H = 3, dh = h / H };
  int64_t xs[3][3] = {{B, Nq, Dq}, {B, Nk, Dk}, {B, Nk, Dv}}, ws[4][2] = {{h, Dq}, {h, Dk}, {h, Dv}, {h, h}};
  int64_t bs[1] = {h}, ls[1] = {B}, os[3] = {B, Nq, h};
  attn_saved_layout lay;
  CHECK(attn_mha_saved_layout(B, Nq, Nk, h, H, &lay) == ATTN_OK, "mha layout: %s", attn_last_error());
  attn_tensor x[3], w[4], bq, lens, out, saved;
  int ok = attn_tensor_init(&bq, ATTN_F64, 1, bs) == ATTN_OK && attn_tensor_init(&lens, ATTN_I64, 1, ls) == ATTN_OK;
  for (int i = 0; i < 3; i++) ok = ok && attn_tensor_init(&x[i], ATTN_F64, 3, xs[i]) == ATTN_OK;
  for (int i = 0; i < 4; i++) ok = ok && attn_tensor_init(&w[i], ATTN_F64, 2, ws[i]) == ATTN_OK;
  ok = ok && attn_tensor_init(&out, ATTN_F64, 3, os) == ATTN_OK &&
       attn_tensor_init(&saved, ATTN_F64, 1, &lay.numel) == ATTN_OK;
  CHECK(ok, "init");
  if (!ok) return;
  for (int i = 0; i < 3; i++)
    for (int64_t j = 0; j < attn_tensor_numel(&x[i]); j++) ((double *)x[i].storage->data)[j] = fill_value(j, i);
  for (int i = 0; i < 4; i++)
    for (int64_t j = 0; j < attn_tensor_numel(&w[i]); j++) ((double *)w[i].storage->data)[j] = fill_value(j, 10 + i);
  for (int64_t j = 0; j < h; j++) ((double *)bq.storage->data)[j] = 0.1 * (double)j;
  int64_t len[B] = {4, 2};
  for (int b = 0; b < B; b++) ((int64_t *)lens.storage->data)[b] = len[b];
  attn_mha_params p = {&w[0], &w[1], &w[2], &w[3], &bq, NULL, NULL, NULL, H};
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.valid_lens = &lens;
  CHECK(attn_attention_mha_forward(&x[0], &x[1], &x[2], &p, &o, &out, NULL, NULL, &saved, NULL) == ATTN_OK, "mha: %s",
        attn_last_error());
  /* the same by loops */
  const double *X[3] = {x[0].storage->data, x[1].storage->data, x[2].storage->data};
  const double *W[4] = {w[0].storage->data, w[1].storage->data, w[2].storage->data, w[3].storage->data};
  const double *bias = bq.storage->data, *got = out.storage->data;
  const int64_t N[3] = {Nq, Nk, Nk}, D[3] = {Dq, Dk, Dv};
  double P[3][B][Nk][h], C[B][Nq][h], worst = 0;
  for (int m = 0; m < 3; m++)
    for (int b = 0; b < B; b++)
      for (int n = 0; n < N[m]; n++)
        for (int c = 0; c < h; c++) {
          double s = m == 0 ? bias[c] : 0;
          for (int d = 0; d < D[m]; d++) s += X[m][(b * N[m] + n) * D[m] + d] * W[m][c * D[m] + d];
          P[m][b][n][c] = s;
        }
  for (int b = 0; b < B; b++)
    for (int j = 0; j < H; j++)
      for (int i = 0; i < Nq; i++) {
        double sc[Nk], mx = -INFINITY, sum = 0;
        for (int k = 0; k < Nk; k++) {
          double s = 0;
          for (int c = 0; c < dh; c++) s += P[0][b][i][j * dh + c] * P[1][b][k][j * dh + c];
          sc[k] = k < len[b] ? s / sqrt((double)dh) : -1e6;
          if (sc[k] > mx) mx = sc[k];
        }
        for (int k = 0; k < Nk; k++) sum += (sc[k] = exp(sc[k] - mx));
        for (int c = 0; c < dh; c++) {
          double s = 0;
          for (int k = 0; k < Nk; k++) s += sc[k] / sum * P[2][b][k][j * dh + c];
          C[b][i][j * dh + c] = s;
        }
      }
  for (int b = 0; b < B; b++)
    for (int i = 0; i < Nq; i++)
      for (int c = 0; c < h; c++) {
        double s = 0;
        for (int d = 0; d < h; d++) s += C[b][i][d] * W[3][c * h + d];
        double e = fabs(got[(b * Nq + i) * h + c] - s);
        if (e > worst) worst = e;
      }
  CHECK(worst < 1e-12, "mha forward equals the loops: worst error %g", worst);
  /* a length vector that does not fit the batch is refused with the shapes */
  int64_t bad_shape[1] = {3};
  attn_tensor bad;
  CHECK(attn_tensor_init(&bad, ATTN_I64, 1, bad_shape) == ATTN_OK, "init");
  for (int b = 0; b < 3; b++) ((int64_t *)bad.storage->data)[b] = 1;
  o.valid_lens = &bad;
  CHECK(attn_attention_mha_forward(&x[0], &x[1], &x[2], &p, &o, &out, NULL, NULL, &saved, NULL) == ATTN_ERR_SHAPE &&
            strstr(attn_last_error(), "valid_lens [3] does not fit queries [2x3x5]") != NULL,
        "message: %s", attn_last_error());
  attn_tensor_free(&bad);
  for (int i = 0; i < 3; i++) attn_tensor_free(&x[i]);
  for (int i = 0; i < 4; i++) attn_tensor_free(&w[i]);
  attn_tensor *rest[] = {&bq, &lens, &out, &saved};
  for (size_t i = 0; i < sizeof rest / sizeof *rest; i++) attn_tensor_free(rest[i]);
}

/* A saved-buffer layout (attn_saved.h): the decoder's parts in order with their shapes, offsets
 * and sizes, a view of one part, and the refusals (overflow, a wrong buffer, heads not dividing). */
static void test_saved_layout(void) {
  attn_decoder_dims d = {.T = 3, .B = 2, .Nk = 4, .ha = 5, .dv = 6, .e = 7, .H = 8, .layers = 2};
  attn_saved_layout l;
  CHECK(attn_decoder_saved_layout(&d, &l) == ATTN_OK, "decoder layout: %s", attn_last_error());
  /* by hand: kh 2*4*5, qh 3*2*5, scores and weights 3*2*4, ctx 3*2*6, hs 2*4*2*8, rz 2*3*2*16, n and ghn 2*3*2*8 */
  const char *names[9] = {"kh", "qh", "scores", "weights", "ctx", "hs", "rz", "n", "ghn"};
  const int64_t sizes[9] = {40, 30, 24, 24, 36, 128, 192, 96, 96};
  int64_t at = 0;
  CHECK(l.nparts == 9, "9 parts, got %d", l.nparts);
  for (int i = 0; i < 9 && i < l.nparts; i++) {
    CHECK(strcmp(l.part[i].name, names[i]) == 0 && l.part[i].offset == at && l.part[i].numel == sizes[i],
          "part %d: %s at %lld of %lld, expected %s at %lld of %lld", i, l.part[i].name, (long long)l.part[i].offset,
          (long long)l.part[i].numel, names[i], (long long)at, (long long)sizes[i]);
    at += sizes[i];
  }
  CHECK(l.numel == 666 && at == 666, "total %lld, expected 666", (long long)l.numel);
  const attn_saved_part *rz = &l.part[attn_saved_find(&l, "rz")];
  CHECK(rz->ndim == 4 && rz->shape[0] == 2 && rz->shape[1] == 3 && rz->shape[2] == 2 && rz->shape[3] == 16,
        "rz is (L, T, B, 2H)");
  CHECK(attn_saved_find(&l, "lse") == -1, "no part lse");
  attn_tensor buf, small;
  int64_t n = l.numel, seven = 7;
  CHECK(attn_tensor_init(&buf, ATTN_F32, 1, &n) == ATTN_OK && attn_tensor_init(&small, ATTN_F32, 1, &seven) == ATTN_OK,
        "init");
  CHECK(attn_saved_check("decoder", &l, &buf, ATTN_F32) == ATTN_OK, "the right buffer passes");
  attn_tensor v = attn_saved_view(&buf, &l, ATTN_DECODER_SAVED_CTX);
  CHECK(v.ndim == 3 && v.shape[2] == 6 && v.stride[0] == 12 && v.offset == 118 && attn_tensor_is_contiguous(&v),
        "ctx is a contiguous (3, 2, 6) view at 118");
  CHECK((char *)attn_saved_data(&buf, &l, ATTN_DECODER_SAVED_HS, 1) == (char *)attn_tensor_data(&buf) + 155 * 4,
        "entry 1 of hs");
  CHECK(attn_saved_check("decoder backward", &l, &small, ATTN_F32) == ATTN_ERR_SHAPE &&
            strcmp(attn_last_error(), "decoder backward: saved is [7], expected [666]") == 0,
        "message: %s", attn_last_error());
  CHECK(attn_saved_check("decoder", &l, &buf, ATTN_F64) == ATTN_ERR_DTYPE, "a float32 buffer for float64 is refused");
  attn_tensor_free(&buf);
  attn_tensor_free(&small);
  /* sizes: one part past int64 and a sum past the limit are refused, naming the part; an empty dim is no overflow */
  CHECK(attn_mha_saved_layout((int64_t)1 << 40, (int64_t)1 << 20, 1, 1 << 10, 1, &l) == ATTN_ERR_SHAPE &&
            strstr(attn_last_error(), "multi_head_attention: saved part qh [1099511627776x1048576x1024]") != NULL,
        "message: %s", attn_last_error());
  CHECK(attn_additive_saved_layout(1, (int64_t)1 << 30, (int64_t)1 << 30, 1, &l) == ATTN_ERR_SHAPE &&
            strstr(attn_last_error(), "saved part scores [1x1073741824x1073741824] makes the saved buffer too large") !=
                NULL,
        "message: %s", attn_last_error());
  CHECK(attn_additive_saved_layout(0, (int64_t)1 << 62, (int64_t)1 << 62, 1 << 20, &l) == ATTN_OK && l.numel == 0,
        "an empty batch saves nothing");
  CHECK(attn_mha_saved_layout(2, 3, 4, 6, 4, &l) == ATTN_ERR_ARG &&
            strcmp(attn_last_error(), "multi_head_attention: num_hiddens 6 is not divisible by num_heads 4") == 0,
        "message: %s", attn_last_error());
  CHECK(attn_gru_saved_layout(-1, 2, 3, 1, &l) == ATTN_ERR_SHAPE, "a negative step count is refused");

  /* a layout that fixes its dtype: LayerNorm's mean and rstd are float64 for a float32 op, and the
   * float32 forward fills them as naive double loops over the rows give */
  CHECK(attn_layer_norm_saved_layout(3, &l) == ATTN_OK && l.nparts == 2 && l.numel == 6, "layer_norm layout");
  CHECK(strcmp(l.part[0].name, "mean") == 0 && l.part[0].offset == 0 && strcmp(l.part[1].name, "rstd") == 0 &&
            l.part[1].offset == 3 && l.part[1].ndim == 1 && l.part[1].shape[0] == 3,
        "mean at 0, rstd at 3, each (3)");
  CHECK(attn_saved_dtype(&l, ATTN_F32) == ATTN_F64 && attn_saved_dtype(&l, ATTN_F64) == ATTN_F64, "float64 for both");
  attn_saved_layout plain;
  attn_saved_begin(&plain, "plain");
  CHECK(attn_saved_dtype(&plain, ATTN_F32) == ATTN_F32, "a plain layout has the op's dtype");
  int64_t xs[2] = {3, 4}, six = 6;
  attn_tensor x, out, st, st32;
  CHECK(attn_tensor_init(&x, ATTN_F32, 2, xs) == ATTN_OK && attn_tensor_init(&out, ATTN_F32, 2, xs) == ATTN_OK &&
            attn_tensor_init(&st, ATTN_F64, 1, &six) == ATTN_OK &&
            attn_tensor_init(&st32, ATTN_F32, 1, &six) == ATTN_OK,
        "init");
  float *xd = attn_tensor_data(&x);
  for (int i = 0; i < 12; i++) xd[i] = (float)(sin(i + 1.0) * 3);
  CHECK(attn_saved_check("layer_norm", &l, &st, ATTN_F32) == ATTN_OK, "a float64 buffer for a float32 op passes");
  CHECK(attn_layer_norm_forward(&x, 4, NULL, NULL, 1e-5, &out, &st32) == ATTN_ERR_DTYPE &&
            strstr(attn_last_error(), "layer_norm: saved must be a contiguous float64 tensor, got a float32 one"),
        "message: %s", attn_last_error());
  CHECK(attn_layer_norm_forward(&x, 4, NULL, NULL, 1e-5, &out, &st) == ATTN_OK, "layer_norm: %s", attn_last_error());
  const double *mean = attn_saved_data(&st, &l, ATTN_LAYER_NORM_SAVED_MEAN, 0);
  const double *rstd = attn_saved_data(&st, &l, ATTN_LAYER_NORM_SAVED_RSTD, 0);
  for (int r = 0; r < 3; r++) {
    double mu = 0, var = 0;
    for (int j = 0; j < 4; j++) mu += xd[4 * r + j];
    mu /= 4;
    for (int j = 0; j < 4; j++) var += (xd[4 * r + j] - mu) * (xd[4 * r + j] - mu);
    double rs = 1 / sqrt(var / 4 + 1e-5);
    CHECK(fabs(mean[r] - mu) < 1e-14 && fabs(rstd[r] - rs) < 1e-13 * rs, "row %d: %.17g %.17g vs %.17g %.17g", r,
          mean[r], rstd[r], mu, rs);
  }
  attn_tensor *ln[] = {&x, &out, &st, &st32};
  for (size_t i = 0; i < sizeof ln / sizeof *ln; i++) attn_tensor_free(ln[i]);
}

/* Fused optimizer updates, gradient norms and the cross-entropy kernels
 * against the formulas written out here. */
static void test_optim_and_loss(void) {
  int64_t three = 3;
  attn_tensor p, g, m, v;
  attn_tensor_init(&p, ATTN_F64, 1, &three);
  attn_tensor_init(&g, ATTN_F64, 1, &three);
  attn_tensor_init_zeros(&m, ATTN_F64, 1, &three);
  attn_tensor_init_zeros(&v, ATTN_F64, 1, &three);
  double *pd = attn_tensor_data(&p), *gd = attn_tensor_data(&g), p0[3] = {1, -2, 0.5}, g0[3] = {0.5, -3, 2};
  memcpy(pd, p0, sizeof p0);
  memcpy(gd, g0, sizeof g0);
  attn_adam_options o = {0.1, 0.9, 0.999, 1e-8, 0, 0, 1, 0};
  CHECK(attn_adam_step(&p, &g, &m, &v, NULL, &o) == ATTN_OK, "adam_step: %s", attn_last_error());
  for (int i = 0; i < 3; i++) { /* step 1: m/(1-b1) = g, sqrt(v/(1-b2)) = |g|: p moves by lr * sign(g) */
    double expect = p0[i] - 0.1 * g0[i] / (fabs(g0[i]) + 1e-8);
    CHECK(fabs(pd[i] - expect) < 1e-12, "adam entry %d: %.17g vs %.17g", i, pd[i], expect);
  }
  CHECK(attn_adam_step(&p, &g, &m, &p, NULL, &o) == ATTN_ERR_ARG, "aliasing buffers refused");
  attn_sgd_options so = {0.5, 0, 0, 0.1, 0, 0, 0};
  memcpy(pd, p0, sizeof p0);
  CHECK(attn_sgd_step(&p, &g, NULL, &so) == ATTN_OK, "sgd_step: %s", attn_last_error());
  for (int i = 0; i < 3; i++) {
    double expect = p0[i] - (p0[i] * 0.1 + g0[i]) * 0.5;
    CHECK(fabs(pd[i] - expect) < 1e-15, "sgd entry %d: %.17g vs %.17g", i, pd[i], expect);
  }
  const attn_tensor *both[2] = {&p, &g};
  double norm;
  CHECK(attn_grads_norm(2, both, &norm) == ATTN_OK, "grads_norm");
  double sq = 0;
  for (int i = 0; i < 3; i++) sq += pd[i] * pd[i] + gd[i] * gd[i];
  CHECK(fabs(norm - sqrt(sq)) < 1e-14 * sqrt(sq), "norm %.17g vs %.17g", norm, sqrt(sq));

  /* cross-entropy: 2 sequences x 2 steps of 3 classes, valid lengths 1 and 2 */
  int64_t xs[3] = {2, 2, 3}, rows = 4, stat_n = 8, two = 2;
  attn_tensor x, idx, valid, loss, stats, dloss, dx;
  attn_tensor_init(&x, ATTN_F64, 3, xs);
  attn_tensor_init(&idx, ATTN_I64, 1, &rows);
  attn_tensor_init(&valid, ATTN_I64, 1, &two);
  attn_tensor_init(&loss, ATTN_F64, 1, &rows);
  attn_tensor_init(&stats, ATTN_F64, 1, &stat_n);
  attn_tensor_init(&dloss, ATTN_F64, 1, &rows);
  attn_tensor_init(&dx, ATTN_F64, 3, xs);
  double *xd = attn_tensor_data(&x), *ld = attn_tensor_data(&loss), *dd = attn_tensor_data(&dx);
  int64_t *id = attn_tensor_data(&idx), *vd = attn_tensor_data(&valid);
  for (int i = 0; i < 12; i++) xd[i] = sin(i + 1.0) * 2;
  for (int r = 0; r < 4; r++) id[r] = (r * 2 + 1) % 3, ((double *)attn_tensor_data(&dloss))[r] = 1;
  vd[0] = 1, vd[1] = 2;
  int64_t count;
  CHECK(attn_softmax_ce_forward(&x, &idx, &valid, 2, &loss, &stats, &count) == ATTN_OK, "ce forward: %s",
        attn_last_error());
  CHECK(attn_softmax_ce_backward(&x, &idx, &valid, 2, &stats, &dloss, &dx) == ATTN_OK, "ce backward: %s",
        attn_last_error());
  /* the saved stats (R, 2): each row's max and log-sum-exp about it */
  const double *sd = attn_tensor_data(&stats);
  for (int r = 0; r < 4; r++) {
    double m = fmax(fmax(xd[3 * r], xd[3 * r + 1]), xd[3 * r + 2]);
    double s = log(exp(xd[3 * r] - m) + exp(xd[3 * r + 1] - m) + exp(xd[3 * r + 2] - m));
    CHECK(sd[2 * r] == m && fabs(sd[2 * r + 1] - s) < 1e-12, "ce stats row %d: %.17g %.17g vs %.17g %.17g", r,
          sd[2 * r], sd[2 * r + 1], m, s);
  }
  CHECK(count == 3, "3 rows count, got %lld", (long long)count);
  for (int r = 0; r < 4; r++) {
    int counts = r != 1; /* sequence 0 has one valid step */
    double lse = log(exp(xd[3 * r]) + exp(xd[3 * r + 1]) + exp(xd[3 * r + 2]));
    double expect = counts ? lse - xd[3 * r + id[r]] : 0;
    CHECK(fabs(ld[r] - expect) < 1e-12, "ce row %d: %.17g vs %.17g", r, ld[r], expect);
    for (int c = 0; c < 3; c++) {
      double grad = counts ? exp(xd[3 * r + c] - lse) - (c == id[r]) : 0;
      CHECK(fabs(dd[3 * r + c] - grad) < 1e-12, "ce grad %d,%d: %.17g vs %.17g", r, c, dd[3 * r + c], grad);
    }
  }
  /* label smoothing eps: (1 - eps) * nll + eps * -mean log p; dx = p - (1 - eps) onehot - eps / 3 */
  const double eps = 0.2;
  CHECK(attn_softmax_ce_smoothed_forward(&x, &idx, &valid, 2, eps, &loss, &stats, &count) == ATTN_OK,
        "smoothed ce forward: %s", attn_last_error());
  CHECK(attn_softmax_ce_smoothed_backward(&x, &idx, &valid, 2, eps, &stats, &dloss, &dx) == ATTN_OK,
        "smoothed ce backward: %s", attn_last_error());
  for (int r = 0; r < 4; r++) {
    int counts = r != 1;
    double lse = log(exp(xd[3 * r]) + exp(xd[3 * r + 1]) + exp(xd[3 * r + 2]));
    double mean_logp = (xd[3 * r] + xd[3 * r + 1] + xd[3 * r + 2]) / 3 - lse;
    double expect = counts ? (1 - eps) * (lse - xd[3 * r + id[r]]) - eps * mean_logp : 0;
    CHECK(fabs(ld[r] - expect) < 1e-12, "smoothed ce row %d: %.17g vs %.17g", r, ld[r], expect);
    for (int c = 0; c < 3; c++) {
      double grad = counts ? exp(xd[3 * r + c] - lse) - (1 - eps) * (c == id[r]) - eps / 3 : 0;
      CHECK(fabs(dd[3 * r + c] - grad) < 1e-12, "smoothed ce grad %d,%d: %.17g vs %.17g", r, c, dd[3 * r + c], grad);
    }
  }
  CHECK(attn_softmax_ce_smoothed_forward(&x, &idx, NULL, 0, 1.5, &loss, &stats, &count) == ATTN_ERR_ARG,
        "smoothing 1.5 refused");
  id[2] = 3;
  CHECK(attn_softmax_ce_forward(&x, &idx, NULL, 0, &loss, &stats, &count) == ATTN_ERR_ARG, "id 3 of 3 refused");
  CHECK(strstr(attn_last_error(), "index 3 at row 3 is out of range 0..2") != NULL, "message: %s", attn_last_error());
  attn_tensor *all[] = {&p, &g, &m, &v, &x, &idx, &valid, &loss, &stats, &dloss, &dx};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) attn_tensor_free(all[i]);
}

/* The parity kernels (issue 19): cumsum/cumprod and cumprod's gradient through a zero, tril/triu,
 * the exact GELU, and the size check that runs before inputs are walked. */
static void test_parity_kernels(void) {
  int64_t shape[2] = {2, 3};
  attn_tensor x, y, g, d, t;
  CHECK(attn_tensor_init(&x, ATTN_F64, 2, shape) == ATTN_OK && attn_tensor_init(&y, ATTN_F64, 2, shape) == ATTN_OK &&
            attn_tensor_init(&g, ATTN_F64, 2, shape) == ATTN_OK && attn_tensor_init(&d, ATTN_F64, 2, shape) == ATTN_OK &&
            attn_tensor_init(&t, ATTN_F64, 2, shape) == ATTN_OK,
        "init");
  double *xd = x.storage->data, *yd = y.storage->data, *dd = d.storage->data, *td = t.storage->data;
  const double vals[6] = {2, 0, 3, 1, 2, 4};
  for (int i = 0; i < 6; i++) xd[i] = vals[i];
  attn_fill(&g, 1);
  CHECK(attn_cumulative(ATTN_CUMSUM, &x, 1, &y) == ATTN_OK && yd[2] == 5 && yd[5] == 7, "cumsum rows %g %g", yd[2],
        yd[5]);
  CHECK(attn_cumulative(ATTN_CUMPROD, &x, 1, &y) == ATTN_OK && yd[1] == 0 && yd[5] == 8, "cumprod rows");
  /* row {2, 0, 3}: y = {2, 0, 0}; d/dx of sum y = {1, 2 + 2 * 3, 0}; row {1, 2, 4}: {1 + 2 + 8, 1 + 4, 2} */
  CHECK(attn_cumprod_backward(&x, &y, &g, 1, &d) == ATTN_OK, "cumprod_backward");
  const double want[6] = {1, 8, 0, 11, 5, 2};
  for (int i = 0; i < 6; i++) CHECK(dd[i] == want[i], "cumprod grad %d: %g vs %g", i, dd[i], want[i]);
  CHECK(attn_cumulative(ATTN_CUMSUM, &x, 2, &y) == ATTN_ERR_ARG, "dim out of range refused");
  CHECK(strstr(attn_last_error(), "cumsum: dim 3 out of range for 2-D tensor [2x3]") != NULL, "message: %s",
        attn_last_error());
  CHECK(attn_triangle(&x, 0, 0, &t) == ATTN_OK && td[1] == 0 && td[2] == 0 && td[3] == 1 && td[4] == 2, "tril");
  CHECK(attn_triangle(&x, 1, 1, &t) == ATTN_OK && td[0] == 0 && td[1] == 0 && td[2] == 3 && td[4] == 0 && td[5] == 4,
        "triu 1");
  xd[0] = -1;
  CHECK(attn_unary(ATTN_GELU, &x, &t) == ATTN_OK && fabs(td[0] - -0.15865525393145705) < 1e-16, "gelu(-1) %.17g",
        td[0]);
  int64_t huge[2] = {3, (int64_t)1 << 40};
  CHECK(attn_tensor_check_size("embedding", "output", ATTN_F32, 2, huge) == ATTN_ERR_MEMORY, "huge output refused");
  CHECK(strstr(attn_last_error(), "embedding: output float32 [3x1099511627776] needs") != NULL, "message: %s",
        attn_last_error());
  CHECK(attn_tensor_check_size("embedding", "output", ATTN_F32, 2, shape) == ATTN_OK, "small output accepted");
  attn_tensor *all[] = {&x, &y, &g, &d, &t};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) attn_tensor_free(all[i]);
}

/* conv2d's GEMM path against its reference loops (one known value too), backward shapes, the
 * errors naming values; max pooling's indices and gradient. */
static void test_conv_and_pool(void) {
  int64_t xs[4] = {3, 4, 5, 6}, ws[4] = {6, 2, 3, 2}, bs[1] = {6}, ys[4];
  attn_conv2d_params p = {{2, 1}, {1, 1}, {1, 2}, 2};
  attn_tensor x, w, b, y, yr, dx, dxr, dw, dwr, db;
  CHECK(attn_tensor_init(&x, ATTN_F64, 4, xs) == ATTN_OK && attn_tensor_init(&w, ATTN_F64, 4, ws) == ATTN_OK &&
            attn_tensor_init(&b, ATTN_F64, 1, bs) == ATTN_OK,
        "init");
  double *xd = x.storage->data, *wd = w.storage->data, *bd = b.storage->data;
  for (int i = 0; i < 360; i++) xd[i] = sin(0.37 * i);
  for (int i = 0; i < 72; i++) wd[i] = cos(0.11 * i);
  for (int i = 0; i < 6; i++) bd[i] = 0.1 * i;
  CHECK(attn_conv2d_shape("conv2d", &x, &w, &p, ys) == ATTN_OK && ys[2] == 3 && ys[3] == 6, "shape %lld %lld",
        (long long)ys[2], (long long)ys[3]);
  CHECK(attn_tensor_init(&y, ATTN_F64, 4, ys) == ATTN_OK && attn_tensor_init(&yr, ATTN_F64, 4, ys) == ATTN_OK &&
            attn_tensor_init(&dx, ATTN_F64, 4, xs) == ATTN_OK && attn_tensor_init(&dxr, ATTN_F64, 4, xs) == ATTN_OK &&
            attn_tensor_init(&dw, ATTN_F64, 4, ws) == ATTN_OK && attn_tensor_init(&dwr, ATTN_F64, 4, ws) == ATTN_OK &&
            attn_tensor_init(&db, ATTN_F64, 1, bs) == ATTN_OK,
        "init outputs");
  CHECK(attn_conv2d_forward(&x, &w, &b, &p, 0, &y) == ATTN_OK && attn_conv2d_forward(&x, &w, &b, &p, 1, &yr) == ATTN_OK,
        "forward");
  double *yd = y.storage->data, *yrd = yr.storage->data, worst = 0;
  for (int64_t i = 0; i < attn_tensor_numel(&y); i++) worst = fmax(worst, fabs(yd[i] - yrd[i]));
  CHECK(worst < 1e-12, "forward paths differ by %g", worst);
  /* y[0, 0, 0, 0]: tap (c, p, q) reads row -1 + p, column -1 + 2 q: inside for p = 1, 2 and q = 1 */
  CHECK(fabs(yd[0] - (wd[3] * xd[1] + wd[5] * xd[7] + wd[9] * xd[31] + wd[11] * xd[37])) < 1e-14, "y[0] %.17g",
        yd[0]);
  CHECK(attn_conv2d_backward(&x, &w, &p, &y, 0, &dx, &dw, &db) == ATTN_OK &&
            attn_conv2d_backward(&x, &w, &p, &y, 1, &dxr, &dwr, NULL) == ATTN_OK,
        "backward");
  double *a = dx.storage->data, *r = dxr.storage->data;
  worst = 0;
  for (int i = 0; i < 360; i++) worst = fmax(worst, fabs(a[i] - r[i]));
  a = dw.storage->data, r = dwr.storage->data;
  for (int i = 0; i < 72; i++) worst = fmax(worst, fabs(a[i] - r[i]));
  CHECK(worst < 1e-11, "backward paths differ by %g", worst);
  p.groups = 3;
  CHECK(attn_conv2d_forward(&x, &w, &b, &p, 0, &y) == ATTN_ERR_ARG, "groups 3 refused");
  CHECK(strstr(attn_last_error(), "conv2d: groups 3 must divide in_channels 4 and out_channels 6") != NULL, "msg: %s",
        attn_last_error());
  p.groups = 2, p.stride[0] = 0;
  CHECK(attn_conv2d_forward(&x, &w, &b, &p, 0, &y) == ATTN_ERR_ARG &&
            strstr(attn_last_error(), "conv2d: stride 0x1 must be positive") != NULL,
        "msg: %s", attn_last_error());

  /* max pooling 2x2 over a 2x3 plane with padding 0x1: windows cover columns -1..0 and 1..2 */
  int64_t ps[4] = {1, 1, 2, 3}, qs[4];
  attn_pool2d_params pp = {{2, 2}, {2, 2}, {0, 1}, 1};
  attn_tensor px, py, pi, pdx;
  CHECK(attn_tensor_init(&px, ATTN_F64, 4, ps) == ATTN_OK && attn_pool2d_shape("max_pool2d", &px, &pp, qs) == ATTN_OK &&
            qs[2] == 1 && qs[3] == 2,
        "pool shape");
  const double pv[6] = {1, 7, 3, 5, 2, 9};
  for (int i = 0; i < 6; i++) ((double *)px.storage->data)[i] = pv[i];
  CHECK(attn_tensor_init(&py, ATTN_F64, 4, qs) == ATTN_OK && attn_tensor_init(&pi, ATTN_I64, 4, qs) == ATTN_OK &&
            attn_tensor_init(&pdx, ATTN_F64, 4, ps) == ATTN_OK,
        "pool init");
  CHECK(attn_max_pool2d_forward(&px, &pp, &py, &pi) == ATTN_OK, "max_pool2d");
  double *pyd = py.storage->data;
  int64_t *pid = pi.storage->data;
  CHECK(pyd[0] == 5 && pyd[1] == 9 && pid[0] == 3 && pid[1] == 5, "max %g %g at %lld %lld", pyd[0], pyd[1],
        (long long)pid[0], (long long)pid[1]);
  CHECK(attn_max_pool2d_backward(&pi, &py, &pdx) == ATTN_OK, "max_pool2d backward");
  double *pdd = pdx.storage->data;
  CHECK(pdd[3] == 5 && pdd[5] == 9 && pdd[0] == 0 && pdd[1] == 0, "pool grad");
  pp.padding[1] = 2;
  CHECK(attn_max_pool2d_forward(&px, &pp, &py, &pi) == ATTN_ERR_ARG &&
            strstr(attn_last_error(), "max_pool2d: padding 0x2 must be >= 0 and at most half of kernel_size 2x2"),
        "msg: %s", attn_last_error());
  attn_tensor *all[] = {&x, &w, &b, &y, &yr, &dx, &dxr, &dw, &dwr, &db, &px, &py, &pi, &pdx};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) attn_tensor_free(all[i]);
}

/* Causal linear attention (phi = elu + 1) on one tiny item against the formula in loops, its
 * backward against central differences of sum(g * out), and the causal length check. */
static double lin_phi(double x) { return x > 0 ? x + 1 : exp(x); }

static void lin_formula(const double *q, const double *k, const double *v, int N, int d, int dv, double eps,
                        double *out) {
  for (int i = 0; i < N; i++) {
    double den = eps;
    for (int e = 0; e < dv; e++) out[i * dv + e] = 0;
    for (int j = 0; j <= i; j++) {
      double s = 0;
      for (int c = 0; c < d; c++) s += lin_phi(q[i * d + c]) * lin_phi(k[j * d + c]);
      den += s;
      for (int e = 0; e < dv; e++) out[i * dv + e] += s * v[j * dv + e];
    }
    for (int e = 0; e < dv; e++) out[i * dv + e] /= den;
  }
}

/* Every ISA set's float32 Winograd transforms (AVX-512 has its own, wino_avx512.c) give the same
 * bits as the generic set's loops, over plane shapes of 1 to 24 tiles a row and every band. The
 * input transform's dummy tile (tj = tw) holds whatever each path reads there: not compared. */
static int wino_same(const float *a, const float *b, int64_t n) { return memcmp(a, b, (size_t)n * sizeof *a) == 0; }

static void test_wino_transforms(void) {
  const int shapes[][4] = {{14, 14, 1, 1}, {7, 5, 1, 1}, {8, 9, 0, 0}, {29, 31, 0, 2}, {45, 47, 1, 1}, {1, 1, 1, 1}, {6, 6, 2, 2}};
  const char *paths[2] = {"avx2", "avx512"};
  const attn_wino_transforms *ref = &attn_wino_kernels_generic.f2;
  for (int p = 0; p < 2; p++) {
    const attn_cpu_kernels *set = attn_cpu_find(paths[p]);
    if (!set || !attn_cpu_supported(set)) continue;
    const attn_wino_transforms *k = &set->wino->f2;
    int mismatches = 0, bands = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      attn_wino_geom g = {shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], 0, 0, 0, 0};
      g.Ho = g.H + 2 * g.ph - 2, g.Wo = g.W + 2 * g.pw - 2, g.th = (g.Ho + 1) / 2, g.tw = (g.Wo + 1) / 2;
      int64_t Tr = g.tw + 1, ps = g.th * Tr + 19, nx = g.H * g.W, ny = g.Ho * g.Wo;
      float *x = malloc((size_t)nx * sizeof *x), *dy = malloc((size_t)ny * sizeof *dy);
      float *V[2], *y[2], *sc = malloc((size_t)attn_wino_scratch(g.th, g.tw) * sizeof *sc);
      for (int i = 0; i < 2; i++) V[i] = calloc((size_t)(16 * ps), sizeof *V[i]), y[i] = calloc((size_t)ny, sizeof *y[i]);
      for (int64_t i = 0; i < nx; i++) x[i] = (float)sin(0.7 * (double)i) * 3.0f;
      for (int64_t i = 0; i < ny; i++) dy[i] = (float)cos(0.3 * (double)i);
      for (int64_t rows = 1; rows <= g.th; rows++)
        for (int64_t ti0 = 0; ti0 + rows <= g.th; ti0 += rows) {
          bands++;
          for (int i = 0; i < 2; i++) (i ? k : ref)->input_f32(&g, x, ti0, rows, V[i], ps, sc);
          for (int64_t q = 0; q < 16; q++)
            for (int64_t t = 0; t < rows; t++) mismatches += !wino_same(V[0] + q * ps + t * Tr, V[1] + q * ps + t * Tr, g.tw);
          for (int i = 0; i < 2; i++) (i ? k : ref)->output_f32(&g, V[0], ps, ti0, rows, 0.25f, y[i], sc);
          mismatches += !wino_same(y[0], y[1], ny);
          for (int i = 0; i < 2; i++) (i ? k : ref)->grad_f32(&g, dy, ti0, rows, V[i], ps, sc, NULL);
          mismatches += !wino_same(V[0], V[1], 16 * ps);
        }
      /* the adjoint: the bands of one height as the backward runs them, the even bands and then
       * the odd ones adding into the seams the even ones wrote, from tiles whose dummy holds
       * zeros, into planes of NaNs (an entry left unwritten, or added to before written, stays NaN) */
      float *D = calloc((size_t)(16 * ps), sizeof *D), *dx[2] = {malloc((size_t)nx * sizeof *x), malloc((size_t)nx * sizeof *x)};
      for (int64_t q = 0; q < 16; q++)
        for (int64_t t = 0; t < g.th; t++)
          for (int64_t j = 0; j < g.tw; j++) D[q * ps + t * Tr + j] = (float)sin(0.37 * (double)(q * ps + t * Tr + j) + 0.1);
      for (int64_t rows = 1; rows <= g.th; rows++) {
        int64_t nb = (g.th + rows - 1) / rows;
        for (int i = 0; i < 2; i++) {
          for (int64_t e = 0; e < nx; e++) dx[i][e] = NAN;
          for (int phase = 0; phase < 2; phase++)
            for (int64_t b = phase; b < nb; b += 2) {
              int64_t ti0 = b * rows, n = g.th - ti0 < rows ? g.th - ti0 : rows;
              int seams = b % 2 ? ATTN_WINO_ADD_TOP | (b + 1 < nb ? ATTN_WINO_ADD_BOTTOM : 0) : 0;
              (i ? k : ref)->adjoint_f32(&g, D + ti0 * Tr, ps, ti0, n, dx[i], sc, seams);
            }
        }
        int unwritten = 0;
        for (int64_t e = 0; e < nx; e++) unwritten += isnan(dx[0][e]) || isnan(dx[1][e]);
        mismatches += !wino_same(dx[0], dx[1], nx) || unwritten > 0, bands++;
      }
      free(D), free(dx[0]), free(dx[1]);
      free(x), free(dy), free(sc);
      for (int i = 0; i < 2; i++) free(V[i]), free(y[i]);
    }
    CHECK(mismatches == 0 && bands > 100, "%s float32 Winograd transforms: %d of %d bands differ from generic", paths[p],
          mismatches, bands);
  }
}

/* The AVX-512 set's Winograd block products give, plane by plane, the bits of its small GEMM (the
 * products attn_gemm takes for such planes), over shapes with row tails (M of 1-40: tiles of 8 and
 * 16), column tails and panels of one to three vectors (N of 1-100), K of 1-70, A as stored and
 * transposed, both betas of the product with B transposed, into outputs filled with NaN around
 * what is written. */
static void test_wino_products(void) {
  const attn_cpu_kernels *set = attn_cpu_find("avx512");
  if (!set || !attn_cpu_supported(set) || !set->wino->gemm_nn_f32) return;
  const int64_t dims[][3] = {{32, 48, 16}, {16, 48, 32}, {32, 16, 48}, {7, 100, 5}, {40, 33, 9},
                             {1, 1, 1},    {17, 64, 70}, {9, 17, 3},  {24, 96, 16}, {5, 49, 31}};
  const int64_t np = 3;
  float pack[16384];
  int mismatches = 0, cases = 0;
  for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
    /* planes ps (or pk) apart, rows of all planes interleaved ld (or lda) apart, as in a workspace */
    const int64_t M = dims[d][0], N = dims[d][1], K = dims[d][2], ps = N + 3, ld = np * ps + 2, pk = K + 2,
                  lda = np * pk + 1;
    /* nn: A planes (M, K) packed, B and C planes of workspace layout */
    float *A = malloc((size_t)(np * M * K) * sizeof *A), *B = malloc((size_t)(np * ps + K * ld) * sizeof *B);
    float *C[2] = {malloc((size_t)(np * ps + M * ld) * sizeof(float)), malloc((size_t)(np * ps + M * ld) * sizeof(float))};
    for (int64_t i = 0; i < np * M * K; i++) A[i] = (float)sin(0.37 * (double)i + 0.2);
    for (int64_t i = 0; i < np * ps + K * ld; i++) B[i] = (float)cos(0.23 * (double)i);
    for (int ta = 0; ta < 2; ta++) { /* A_p (M, K), or (K, M) taken transposed */
      for (int i = 0; i < 2; i++)
        for (int64_t e = 0; e < np * ps + M * ld; e++) C[i][e] = NAN;
      for (int64_t p = 0; p < np; p++)
        set->gemm_small_f32(ta, 0, M, N, K, 1.0f, A + p * M * K, ta ? M : K, B + p * ps, ld, 0.0f, C[0] + p * ps, ld,
                            pack);
      set->wino->gemm_nn_f32(np, ta, M, N, K, A, B, ps, ld, C[1], ps, ld);
      mismatches += memcmp(C[0], C[1], (size_t)(np * ps + M * ld) * sizeof(float)) != 0, cases++;
    }
    /* nt: A and B planes of workspace layout (planes pk apart, rows lda apart), C planes (M, N) packed */
    float *Z = malloc((size_t)(np * pk + M * lda) * sizeof *Z), *V = malloc((size_t)(np * pk + N * lda) * sizeof *V);
    float *P[2] = {malloc((size_t)(np * M * N) * sizeof(float)), malloc((size_t)(np * M * N) * sizeof(float))};
    float *pkb = aligned_alloc(64, (size_t)attn_wino_gemm_pack(K) * sizeof *pkb);
    for (int64_t i = 0; i < np * pk + M * lda; i++) Z[i] = (float)sin(0.19 * (double)i);
    for (int64_t i = 0; i < np * pk + N * lda; i++) V[i] = (float)cos(0.41 * (double)i + 1);
    for (int beta = 0; beta < 2; beta++) {
      for (int i = 0; i < 2; i++)
        for (int64_t e = 0; e < np * M * N; e++) P[i][e] = beta ? (float)e * 0.01f : NAN;
      for (int64_t p = 0; p < np; p++)
        set->gemm_small_f32(0, 1, M, N, K, 1.0f, Z + p * pk, lda, V + p * pk, lda, (float)beta, P[0] + p * M * N, N, pack);
      set->wino->gemm_nt_f32(np, M, N, K, Z, pk, lda, V, pk, lda, (float)beta, P[1], pkb);
      mismatches += memcmp(P[0], P[1], (size_t)(np * M * N) * sizeof(float)) != 0, cases++;
    }
    free(A), free(B), free(C[0]), free(C[1]), free(Z), free(V), free(P[0]), free(P[1]), free(pkb);
  }
  CHECK(mismatches == 0, "avx512 Winograd block products: %d of %d cases differ from the small GEMM's bits", mismatches,
        cases);
}

static void test_linear_attention(void) {
  enum { N = 4, D = 3, DV = 2 };
  int64_t sq[3] = {1, N, D}, sv[3] = {1, N, DV};
  attn_tensor q, k, v, out, g, dq, dk, dv;
  attn_tensor_init(&q, ATTN_F64, 3, sq), attn_tensor_init(&k, ATTN_F64, 3, sq), attn_tensor_init(&v, ATTN_F64, 3, sv);
  attn_tensor_init(&out, ATTN_F64, 3, sv), attn_tensor_init(&g, ATTN_F64, 3, sv);
  attn_tensor_init(&dq, ATTN_F64, 3, sq), attn_tensor_init(&dk, ATTN_F64, 3, sq), attn_tensor_init(&dv, ATTN_F64, 3, sv);
  double *Q = attn_tensor_data(&q), *K = attn_tensor_data(&k), *V = attn_tensor_data(&v), *G = attn_tensor_data(&g);
  for (int i = 0; i < N * D; i++) Q[i] = sin(1.3 * i) * 1.5, K[i] = cos(0.7 * i + 0.2) * 1.5;
  for (int i = 0; i < N * DV; i++) V[i] = sin(0.9 * i + 1), G[i] = cos(2.1 * i);
  attn_linear_opts o = {1, 1e-6, ATTN_LINEAR_ELU1};
  CHECK(attn_linear_attention_forward(&q, &k, &v, &o, &out) == ATTN_OK, "linear forward: %s", attn_last_error());
  double ref[N * DV], err = 0;
  lin_formula(Q, K, V, N, D, DV, 1e-6, ref);
  const double *O = attn_tensor_data(&out);
  for (int i = 0; i < N * DV; i++) err = fmax(err, fabs(O[i] - ref[i]));
  CHECK(err < 1e-12, "causal linear attention off the formula by %g", err);
  CHECK(attn_linear_attention_backward(&q, &k, &v, &out, &g, &o, &dq, &dk, &dv) == ATTN_OK, "linear backward: %s",
        attn_last_error());
  double *ops[3] = {Q, K, V}, *grads[3] = {attn_tensor_data(&dq), attn_tensor_data(&dk), attn_tensor_data(&dv)};
  int sizes[3] = {N * D, N * D, N * DV};
  double gerr = 0;
  for (int a = 0; a < 3; a++)
    for (int i = 0; i < sizes[a]; i++) {
      double keep = ops[a][i], f[2];
      for (int s = 0; s < 2; s++) {
        ops[a][i] = keep + (s ? -1e-6 : 1e-6);
        lin_formula(Q, K, V, N, D, DV, 1e-6, ref);
        f[s] = 0;
        for (int t = 0; t < N * DV; t++) f[s] += G[t] * ref[t];
      }
      ops[a][i] = keep;
      gerr = fmax(gerr, fabs((f[0] - f[1]) / 2e-6 - grads[a][i]));
    }
  CHECK(gerr < 1e-7, "linear attention gradients off central differences by %g", gerr);
  int64_t sk[3] = {1, N - 1, D};
  int64_t sv2[3] = {1, N - 1, DV};
  attn_tensor k2, v2;
  attn_tensor_init(&k2, ATTN_F64, 3, sk), attn_tensor_init(&v2, ATTN_F64, 3, sv2);
  CHECK(attn_linear_attention_forward(&q, &k2, &v2, &o, &out) == ATTN_ERR_SHAPE, "causal length mismatch refused");
  CHECK(strstr(attn_last_error(), "causal needs as many queries as keys, got queries [1x4x3] and keys [1x3x3]") != NULL,
        "message: %s", attn_last_error());
  attn_tensor *all[10] = {&q, &k, &v, &out, &g, &dq, &dk, &dv, &k2, &v2};
  for (int i = 0; i < 10; i++) attn_tensor_free(all[i]);
}

/* RoPE on a transposed (strided) x against the closed form in both conventions, with positions
 * past the tables and inside them; backward undoes forward; odd d and a negative position. */
static void test_rope(void) {
  enum { B = 2, N = 3, D = 6, H = D / 2 };
  int64_t sx[3] = {B, D, N}, so[3] = {B, N, D}, sp[1] = {N}, st[2] = {2, H};
  attn_tensor x, out, back, pos, c, s;
  attn_tensor_init(&x, ATTN_F64, 3, sx), attn_tensor_init(&out, ATTN_F64, 3, so);
  attn_tensor_init(&back, ATTN_F64, 3, so), attn_tensor_init(&pos, ATTN_I64, 1, sp);
  attn_tensor_init(&c, ATTN_F64, 2, st), attn_tensor_init(&s, ATTN_F64, 2, st);
  double *X = attn_tensor_data(&x);
  for (int i = 0; i < B * N * D; i++) X[i] = sin(0.37 * i + 0.1);
  int64_t *P = attn_tensor_data(&pos);
  P[0] = 7, P[1] = 1, P[2] = 0; /* 7 is past the two rows of the tables */
  attn_view_transpose(&x, 1, 2);  /* (B, N, D), strided */
  CHECK(attn_rope_tables(100, &c, &s) == ATTN_OK, "rope tables: %s", attn_last_error());
  for (int inter = 0; inter < 2; inter++) {
    attn_rope_opts o = {&pos, &c, &s, 100, inter};
    CHECK(attn_rope_forward(NULL, &x, &o, &out) == ATTN_OK, "rope forward: %s", attn_last_error());
    double err = 0;
    const double *O = attn_tensor_data(&out);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < N; t++)
        for (int i = 0; i < H; i++) {
          int ia = inter ? 2 * i : i, ib = inter ? 2 * i + 1 : i + H;
          double a = P[t] * pow(100, -2.0 * i / D);
          double xa = X[(b * D + ia) * N + t], xb = X[(b * D + ib) * N + t];
          const double *o = O + (b * N + t) * D;
          err = fmax(err, fabs(o[ia] - (xa * cos(a) - xb * sin(a))));
          err = fmax(err, fabs(o[ib] - (xb * cos(a) + xa * sin(a))));
        }
    CHECK(err < 1e-12, "rope (interleaved %d) off the closed form by %g", inter, err);
    CHECK(attn_rope_backward(NULL, &out, &o, &back) == ATTN_OK, "rope backward: %s", attn_last_error());
    double berr = 0;
    const double *Bk = attn_tensor_data(&back);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < N; t++)
        for (int j = 0; j < D; j++) berr = fmax(berr, fabs(Bk[(b * N + t) * D + j] - X[(b * D + j) * N + t]));
    CHECK(berr < 1e-14, "rope backward does not undo forward: %g", berr);
  }
  attn_rope_opts o = {&pos, NULL, NULL, 10000, 0};
  P[1] = -3;
  CHECK(attn_rope_forward(NULL, &x, &o, &out) == ATTN_ERR_ARG &&
            strstr(attn_last_error(), "rope: positions[2] = -3 is not a non-negative integer"),
        "negative position: %s", attn_last_error());
  attn_view_narrow(&x, 2, 0, 5);
  CHECK(attn_rope_forward(NULL, &x, &o, &out) == ATTN_ERR_SHAPE &&
            strstr(attn_last_error(), "rope: the feature size d = 5 of x [2x3x5] must be even"),
        "odd d: %s", attn_last_error());
  attn_tensor *all[6] = {&x, &out, &back, &pos, &c, &s};
  for (int i = 0; i < 6; i++) attn_tensor_free(all[i]);
}

/* Heads as a dimension with grouped keys and values, an additive bias and ALiBi (attn_sdpa_forward,
 * attn_sdpa_backward on 4-D operands): q (1, 2, 3, 4) over one key/value head, a (1, Nk) bias
 * broadcast over heads and queries, slopes 1/2, 1/4; against plain loops, and dk against the 3-D
 * call on keys repeated per head (summed). */
static void test_attention_heads_bias(void) {
  attn_tensor q, k, v, out, bias, slopes, q3, k3, v3, out3, dout, dq, dk, dv, dq3, dk3, dv3;
  int64_t qs[4] = {1, 2, 3, 4}, ks[4] = {1, 1, 3, 4}, bs[2] = {1, 3}, ss[1] = {2}, q3s[3] = {2, 3, 4};
  CHECK(attn_tensor_init(&q, ATTN_F64, 4, qs) == ATTN_OK && attn_tensor_init(&k, ATTN_F64, 4, ks) == ATTN_OK &&
            attn_tensor_init(&v, ATTN_F64, 4, ks) == ATTN_OK && attn_tensor_init(&out, ATTN_F64, 4, qs) == ATTN_OK &&
            attn_tensor_init(&bias, ATTN_F64, 2, bs) == ATTN_OK && attn_tensor_init(&slopes, ATTN_F64, 1, ss) == ATTN_OK &&
            attn_tensor_init(&dout, ATTN_F64, 4, qs) == ATTN_OK && attn_tensor_init(&dq, ATTN_F64, 4, qs) == ATTN_OK &&
            attn_tensor_init(&dk, ATTN_F64, 4, ks) == ATTN_OK && attn_tensor_init(&dv, ATTN_F64, 4, ks) == ATTN_OK,
        "init");
  double *Q = q.storage->data, *K = k.storage->data, *V = v.storage->data, *Bi = bias.storage->data;
  for (int i = 0; i < 24; i++) Q[i] = sin(0.7 * i);
  for (int i = 0; i < 12; i++) {
    K[i] = cos(0.3 * i);
    V[i] = 0.1 * i - 0.5;
  }
  for (int i = 0; i < 24; i++) ((double *)dout.storage->data)[i] = cos(1.3 * i);
  Bi[0] = 0.25, Bi[1] = -1, Bi[2] = 0.5;
  ((double *)slopes.storage->data)[0] = 0.5, ((double *)slopes.storage->data)[1] = 0.25;
  attn_attention_opts o;
  attn_attention_opts_init(&o);
  o.bias = &bias;
  o.alibi = &slopes;
  CHECK(attn_sdpa_forward(&q, &k, &v, &o, &out, NULL, NULL, NULL) == ATTN_OK, "4-D forward: %s", attn_last_error());
  double worst = 0;
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 3; i++) {
      double s[3], m = -INFINITY, z = 0;
      for (int j = 0; j < 3; j++) {
        s[j] = 0;
        for (int c = 0; c < 4; c++) s[j] += Q[(h * 3 + i) * 4 + c] * K[j * 4 + c];
        s[j] = s[j] / 2 + Bi[j] - (h ? 0.25 : 0.5) * fabs((double)(i - j));
        m = fmax(m, s[j]);
      }
      for (int j = 0; j < 3; j++) z += exp(s[j] - m);
      for (int c = 0; c < 4; c++) {
        double want = 0;
        for (int j = 0; j < 3; j++) want += exp(s[j] - m) / z * V[j * 4 + c];
        worst = fmax(worst, fabs(((double *)out.storage->data)[(h * 3 + i) * 4 + c] - want));
      }
    }
  CHECK(worst < 1e-14, "bias and ALiBi over a grouped key/value head: max error %g", worst);
  CHECK(attn_sdpa_backward(&q, &k, &v, &o, NULL, &out, NULL, &dout, NULL, &dq, &dk, &dv) == ATTN_OK,
        "4-D backward: %s", attn_last_error());
  /* the 3-D call on the (B*H) rows with the key/value head repeated; the heads are its rows */
  CHECK(attn_tensor_init(&q3, ATTN_F64, 3, q3s) == ATTN_OK && attn_tensor_init(&k3, ATTN_F64, 3, q3s) == ATTN_OK &&
            attn_tensor_init(&v3, ATTN_F64, 3, q3s) == ATTN_OK && attn_tensor_init(&out3, ATTN_F64, 3, q3s) == ATTN_OK &&
            attn_tensor_init(&dq3, ATTN_F64, 3, q3s) == ATTN_OK && attn_tensor_init(&dk3, ATTN_F64, 3, q3s) == ATTN_OK &&
            attn_tensor_init(&dv3, ATTN_F64, 3, q3s) == ATTN_OK,
        "init 3-D");
  memcpy(q3.storage->data, Q, 24 * sizeof(double));
  for (int r = 0; r < 2; r++) {
    memcpy((double *)k3.storage->data + 12 * r, K, 12 * sizeof(double));
    memcpy((double *)v3.storage->data + 12 * r, V, 12 * sizeof(double));
  }
  o.heads = 2; /* rows b*2 + h: the slopes per head */
  attn_tensor dout3 = dout;
  dout3.ndim = 3, dout3.shape[0] = 2, dout3.shape[1] = 3, dout3.shape[2] = 4;
  dout3.stride[0] = 12, dout3.stride[1] = 4, dout3.stride[2] = 1;
  CHECK(attn_sdpa_backward(&q3, &k3, &v3, &o, NULL, NULL, NULL, &dout3, NULL, &dq3, &dk3, &dv3) == ATTN_OK,
        "3-D backward: %s", attn_last_error());
  worst = 0;
  for (int i = 0; i < 12; i++) {
    const double *a = dk3.storage->data, *b = dv3.storage->data;
    worst = fmax(worst, fabs(((double *)dk.storage->data)[i] - (a[i] + a[12 + i])));
    worst = fmax(worst, fabs(((double *)dv.storage->data)[i] - (b[i] + b[12 + i])));
  }
  for (int i = 0; i < 24; i++)
    worst = fmax(worst, fabs(((double *)dq.storage->data)[i] - ((double *)dq3.storage->data)[i]));
  CHECK(worst < 1e-14, "grouped dk, dv sum their query heads: max error %g", worst);
  /* two key/value heads do not divide three query heads... here two query heads and k of 3 */
  int64_t bad[4] = {1, 3, 3, 4};
  attn_tensor kb;
  CHECK(attn_tensor_init(&kb, ATTN_F64, 4, bad) == ATTN_OK, "init");
  attn_attention_opts_init(&o);
  CHECK(attn_sdpa_forward(&q, &kb, &kb, &o, &out, NULL, NULL, NULL) == ATTN_ERR_SHAPE &&
            strstr(attn_last_error(), "key/value heads Hkv = 3 must divide query heads H = 2") != NULL,
        "message: %s", attn_last_error());
  /* with the sparse rule too: window 0, global position 0, causal: query 0 keeps key 0, query
   * i > 0 keys 0 and i, each scored with the bias and its head's ALiBi */
  int64_t g0 = 0;
  attn_attention_opts_init(&o);
  o.bias = &bias;
  o.alibi = &slopes;
  o.window = 0;
  o.global = &g0;
  o.nglobal = 1;
  o.causal = 1;
  CHECK(attn_sdpa_forward(&q, &k, &v, &o, &out, NULL, NULL, NULL) == ATTN_OK, "sparse 4-D: %s", attn_last_error());
  worst = 0;
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 3; i++) {
      double s[2] = {0, 0}, p1 = 0;
      for (int c = 0; c < 4; c++) {
        s[0] += Q[(h * 3 + i) * 4 + c] * K[c];
        s[1] += Q[(h * 3 + i) * 4 + c] * K[i * 4 + c];
      }
      s[0] = s[0] / 2 + Bi[0] - (h ? 0.25 : 0.5) * i;
      s[1] = s[1] / 2 + Bi[i];
      if (i > 0) p1 = 1 / (1 + exp(s[0] - s[1]));
      for (int c = 0; c < 4; c++)
        worst = fmax(worst, fabs(((double *)out.storage->data)[(h * 3 + i) * 4 + c] -
                                 ((1 - p1) * V[c] + p1 * V[i * 4 + c])));
    }
  CHECK(worst < 1e-14, "window + global + causal with bias and ALiBi over grouped heads: max error %g", worst);
  attn_tensor *all[] = {&q, &k, &v, &out, &bias, &slopes, &q3, &k3, &v3, &out3, &dout, &dq, &dk, &dv, &dq3, &dk3, &dv3, &kb};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) attn_tensor_free(all[i]);
}

/* RMSNorm (the LayerNorm kernels without the centring): forward against its formula, dx and
 * dweight against central differences of sum(g * y). */
static double rms_loss(const double *X, const double *W, const double *G, double eps) {
  double total = 0;
  for (int r = 0; r < 2; r++) {
    double ms = 0;
    for (int j = 0; j < 4; j++) ms += X[r * 4 + j] * X[r * 4 + j] / 4;
    for (int j = 0; j < 4; j++) total += G[r * 4 + j] * X[r * 4 + j] / sqrt(ms + eps) * W[j];
  }
  return total;
}

static void test_rms_norm(void) {
  int64_t sx[2] = {2, 4}, sw[1] = {4};
  attn_tensor x, w, out, g, dx, dw, saved;
  attn_tensor_init(&x, ATTN_F64, 2, sx), attn_tensor_init(&w, ATTN_F64, 1, sw), attn_tensor_init(&out, ATTN_F64, 2, sx);
  attn_tensor_init(&g, ATTN_F64, 2, sx), attn_tensor_init(&dx, ATTN_F64, 2, sx), attn_tensor_init(&dw, ATTN_F64, 1, sw);
  attn_saved_layout l;
  attn_layer_norm_saved_layout(2, &l);
  attn_tensor_init(&saved, ATTN_F64, 1, &l.numel);
  double *X = attn_tensor_data(&x), *W = attn_tensor_data(&w), *G = attn_tensor_data(&g);
  for (int i = 0; i < 8; i++) X[i] = sin(1.7 * i) * 2 + 0.5, G[i] = cos(0.9 * i);
  for (int j = 0; j < 4; j++) W[j] = 0.5 + 0.25 * j;
  CHECK(attn_rms_norm_forward(&x, 4, &w, 1e-3, &out, &saved) == ATTN_OK, "rms_norm: %s", attn_last_error());
  double err = 0;
  const double *O = attn_tensor_data(&out);
  for (int r = 0; r < 2; r++) {
    double ms = 0;
    for (int j = 0; j < 4; j++) ms += X[r * 4 + j] * X[r * 4 + j] / 4;
    for (int j = 0; j < 4; j++) err = fmax(err, fabs(O[r * 4 + j] - X[r * 4 + j] / sqrt(ms + 1e-3) * W[j]));
  }
  CHECK(err < 1e-14, "rms_norm off its formula by %g", err);
  CHECK(attn_rms_norm_backward(&x, 4, &w, &saved, &g, &dx, &dw) == ATTN_OK, "rms_norm backward: %s",
        attn_last_error());
  double gerr = 0, *ops[2] = {X, W}, *grads[2] = {attn_tensor_data(&dx), attn_tensor_data(&dw)};
  for (int a = 0; a < 2; a++)
    for (int i = 0; i < (a ? 4 : 8); i++) {
      double keep = ops[a][i];
      ops[a][i] = keep + 1e-6;
      double up = rms_loss(X, W, G, 1e-3);
      ops[a][i] = keep - 1e-6;
      double down = rms_loss(X, W, G, 1e-3);
      ops[a][i] = keep;
      gerr = fmax(gerr, fabs((up - down) / 2e-6 - grads[a][i]));
    }
  CHECK(gerr < 1e-8, "rms_norm gradients off central differences by %g", gerr);
  attn_tensor *all[7] = {&x, &w, &out, &g, &dx, &dw, &saved};
  for (int i = 0; i < 7; i++) attn_tensor_free(all[i]);
}

int main(void) {
  test_allocator();
  test_views_and_errors();
  test_broadcast_and_reduce();
  test_matmul();
  test_matmul_vectors();
  test_io_round_trip();
  test_int64();
  test_sort_and_multinomial();

  test_gru();
  test_lstm();
  test_vmath();
  test_attention_checks();
  test_attention_heads_bias();
  test_attention_sparse();
  test_mha_layer();
  test_saved_layout();
  test_optim_and_loss();
  test_parity_kernels();
  test_conv_and_pool();
  test_wino_transforms();
  test_wino_products();
  test_linear_attention();
  test_rope();
  test_rms_norm();
  attn_alloc_empty_cache();
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
