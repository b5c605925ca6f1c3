/* Element encodings and atomic file writes of the checkpoint formats (see
 * attn_io.h).
 *
 * Atomic writes: the bytes go to a temporary file next to the target, which
 * is flushed with fsync and renamed over the target; the directory is then
 * fsync'ed (best effort). Where the file system allows it the temporary file
 * is unnamed (O_TMPFILE) until it is complete, so a process killed while
 * writing leaves nothing behind; it gets its name "<path>.tmp.<pid>.<hex>"
 * (created with O_EXCL) just before the rename. Elsewhere it is named from the
 * start, and each save removes such names left by processes that no longer
 * exist. */
#define _GNU_SOURCE /* O_TMPFILE */
#include "attn_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int host_is_little(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

/* ---- element encodings ---- */

static const struct {
  const char *names[3];
  size_t size;
  attn_dtype result; /* the tensor dtype the encoding loads into */
} encodings[] = {
    [ATTN_ENC_F32] = {{"float32", "f32", "F32"}, 4, ATTN_F32},   [ATTN_ENC_F64] = {{"float64", "f64", "F64"}, 8, ATTN_F64},
    [ATTN_ENC_F16] = {{"float16", "f16", "F16"}, 2, ATTN_F32},   [ATTN_ENC_BF16] = {{"bfloat16", "bf16", "BF16"}, 2, ATTN_F32},
    [ATTN_ENC_I32] = {{"int32", "i32", "I32"}, 4, ATTN_I64},     [ATTN_ENC_I64] = {{"int64", "i64", "I64"}, 8, ATTN_I64},
    [ATTN_ENC_U8] = {{"uint8", "u1", "U8"}, 1, ATTN_F32},        [ATTN_ENC_I8] = {{"int8", "i1", "I8"}, 1, ATTN_F32},
    [ATTN_ENC_I16] = {{"int16", "i2", "I16"}, 2, ATTN_F32},
};

int attn_encoding_parse(const char *name, attn_encoding *out) {
  for (size_t i = 0; i < sizeof encodings / sizeof encodings[0]; i++)
    for (int k = 0; k < 3; k++)
      if (strcmp(name, encodings[i].names[k]) == 0) {
        *out = (attn_encoding)i;
        return 0;
      }
  if (strcmp(name, "float") == 0 || strcmp(name, "double") == 0) {
    *out = name[0] == 'f' ? ATTN_ENC_F32 : ATTN_ENC_F64;
    return 0;
  }
  return -1;
}

const char *attn_encoding_name(attn_encoding e) { return encodings[e].names[0]; }
size_t attn_encoding_size(attn_encoding e) { return encodings[e].size; }
attn_dtype attn_encoding_dtype(attn_encoding e) { return encodings[e].result; }

static uint64_t load_uint(const unsigned char *p, size_t size, int big) {
  uint64_t v = 0;
  for (size_t i = 0; i < size; i++) v |= (uint64_t)p[big ? size - 1 - i : i] << (8 * i);
  return v;
}

static void store_uint_le(unsigned char *p, uint64_t v, size_t size) {
  for (size_t i = 0; i < size; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* IEEE binary16 to binary32; exact (every half value is a float). */
static float half_to_float(uint16_t h) {
  unsigned exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = ldexpf((float)mant, -24); /* zero or subnormal */
  } else if (exp == 31) {
    uint32_t bits = 0x7f800000u | (uint32_t)mant << 13; /* inf or NaN, payload kept */
    memcpy(&mag, &bits, 4);
  } else {
    uint32_t bits = (uint32_t)(exp - 15 + 127) << 23 | (uint32_t)mant << 13;
    memcpy(&mag, &bits, 4);
  }
  return (h & 0x8000u) ? -mag : mag;
}

/* Decodes n elements of encoding e from src into the contiguous buffer dst
 * (float, double or int64, per encodings[e].result). */
static void decode(void *dst, const unsigned char *src, int64_t n, attn_encoding e, int big) {
  size_t size = encodings[e].size;
  if ((e == ATTN_ENC_F32 || e == ATTN_ENC_F64 || e == ATTN_ENC_I64) && big == !host_is_little()) {
    memcpy(dst, src, (size_t)n * size);
    return;
  }
  if (e == ATTN_ENC_U8) { /* images: tens of millions of bytes, kept out of the general loop */
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = (float)src[i];
    return;
  }
  for (int64_t i = 0; i < n; i++, src += size) {
    uint64_t u = load_uint(src, size, big);
    switch (e) {
    case ATTN_ENC_F32: {
      uint32_t b = (uint32_t)u;
      memcpy((float *)dst + i, &b, 4);
      break;
    }
    case ATTN_ENC_F64:
      memcpy((double *)dst + i, &u, 8);
      break;
    case ATTN_ENC_F16:
      ((float *)dst)[i] = half_to_float((uint16_t)u);
      break;
    case ATTN_ENC_BF16: {
      uint32_t b = (uint32_t)u << 16;
      memcpy((float *)dst + i, &b, 4);
      break;
    }
    case ATTN_ENC_I32: {
      uint32_t b = (uint32_t)u;
      int32_t s;
      memcpy(&s, &b, 4);
      ((int64_t *)dst)[i] = s;
      break;
    }
    case ATTN_ENC_I64:
      memcpy((int64_t *)dst + i, &u, 8);
      break;
    case ATTN_ENC_U8: /* (the fast path above) */
      ((float *)dst)[i] = (float)u;
      break;
    case ATTN_ENC_I8: /* two's complement by arithmetic: no implementation-defined conversion */
      ((float *)dst)[i] = (float)((int)u - (u & 0x80u ? 256 : 0));
      break;
    case ATTN_ENC_I16:
      ((float *)dst)[i] = (float)((long)u - (u & 0x8000u ? 65536L : 0L));
      break;
    }
  }
}

attn_status attn_io_nbytes(const attn_tensor *t, size_t *nbytes) {
  int64_t n = attn_tensor_numel(t);
  size_t size = attn_dtype_size(t->dtype);
  if (n < 0 || (uint64_t)n > SIZE_MAX / size)
    return attn_error(ATTN_ERR_MEMORY, "tensor %s is too large", attn_tensor_shape_str(t));
  *nbytes = (size_t)n * size;
  return ATTN_OK;
}

int attn_io_is_serialised(const attn_tensor *t) {
  return attn_tensor_numel(t) == 0 || (attn_tensor_is_contiguous(t) && host_is_little());
}

attn_status attn_io_encode(const attn_tensor *t, void *dst, size_t nbytes) {
  size_t need;
  attn_status st = attn_io_nbytes(t, &need);
  if (st != ATTN_OK) return st;
  if (nbytes != need)
    return attn_error(ATTN_ERR_SHAPE, "encode: %s %s has %zu bytes, the buffer %zu", attn_dtype_name(t->dtype),
                      attn_tensor_shape_str(t), need, nbytes);
  if (need == 0) return ATTN_OK;
  attn_tensor c = {0};
  const attn_tensor *src = t;
  if (!attn_tensor_is_contiguous(t)) { /* row-major order first */
    if ((st = attn_tensor_clone(&c, t, t->dtype)) != ATTN_OK) return st;
    src = &c;
  }
  const unsigned char *data = attn_tensor_data(src);
  unsigned char *out = dst;
  if (host_is_little()) {
    memcpy(out, data, need);
  } else {
    size_t size = attn_dtype_size(t->dtype);
    for (size_t i = 0; i < need; i += size) {
      uint64_t u = 0;
      if (size == 4) {
        uint32_t v;
        memcpy(&v, data + i, 4);
        u = v;
      } else {
        memcpy(&u, data + i, 8);
      }
      store_uint_le(out + i, u, size);
    }
  }
  attn_tensor_free(&c);
  return ATTN_OK;
}

attn_status attn_io_check_span(const char *op, size_t len, size_t offset, attn_encoding e, int ndim,
                               const int64_t *shape) {
  uint64_t numel = 1;
  int zero = 0;
  for (int d = 0; d < ndim; d++) zero |= shape[d] == 0;
  for (int d = 0; d < ndim && !zero; d++) {
    if (numel > (uint64_t)INT64_MAX / encodings[e].size / (uint64_t)shape[d])
      return attn_error(ATTN_ERR_SHAPE, "%s: shape %s is too large", op, attn_shape_str(ndim, shape));
    numel *= (uint64_t)shape[d];
  }
  uint64_t need = zero ? 0 : numel * encodings[e].size;
  if (offset > len || need > len - offset)
    return attn_error(ATTN_ERR_IO, "%s: %s %s needs %llu bytes at offset %zu, the data has %zu", op,
                      encodings[e].names[0], attn_shape_str(ndim, shape), (unsigned long long)need, offset, len);
  return ATTN_OK;
}

attn_status attn_io_decode(const void *src, size_t len, size_t offset, attn_encoding e, int big_endian,
                           attn_tensor *out) {
  if (out->dtype != encodings[e].result)
    return attn_error(ATTN_ERR_DTYPE, "decode: %s loads into %s, the output is %s", encodings[e].names[0],
                      attn_dtype_name(encodings[e].result), attn_dtype_name(out->dtype));
  if (!attn_tensor_is_contiguous(out))
    return attn_error(ATTN_ERR_SHAPE, "decode: the output %s must be contiguous", attn_tensor_shape_str(out));
  attn_status st = attn_io_check_span("decode", len, offset, e, out->ndim, out->shape);
  if (st != ATTN_OK) return st;
  int64_t numel = attn_tensor_numel(out);
  if (numel > 0) decode(attn_tensor_data(out), (const unsigned char *)src + offset, numel, e, big_endian);
  return ATTN_OK;
}

/* ---- atomic writes ---- */

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
    ssize_t w = write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* The folder of path into dir (size bytes); returns the file name's start,
 * or NULL when the folder's name does not fit. */
static const char *parent_dir(const char *path, char *dir, size_t size) {
  const char *slash = strrchr(path, '/');
  if (!slash) {
    strcpy(dir, ".");
    return path;
  }
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  if (n >= size) return NULL;
  memcpy(dir, path, n);
  dir[n] = 0;
  return slash + 1;
}

/* Removes "<name>.tmp.<pid>.<hex>" files next to path whose process no longer
 * exists: what a save killed while writing a named temporary leaves. */
static void remove_stale_temps(const char *path) {
  char dir[4096];
  const char *name = parent_dir(path, dir, sizeof dir);
  if (!name) return;
  size_t len = strlen(name);
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *s = e->d_name;
    if (strncmp(s, name, len) != 0 || strncmp(s + len, ".tmp.", 5) != 0) continue;
    char *end;
    long pid = strtol(s + len + 5, &end, 10);
    if (end == s + len + 5 || *end != '.' || pid <= 0 || pid == (long)getpid()) continue;
    size_t hex = strspn(end + 1, "0123456789abcdef");
    if (hex == 0 || end[1 + hex] != 0) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
    (void)unlinkat(dirfd(d), s, 0);
  }
  closedir(d);
}

/* An unnamed file in path's folder (O_TMPFILE), or -1 where unsupported. */
static int open_unnamed(const char *path) {
#ifdef O_TMPFILE
  char dir[4096];
  if (!parent_dir(path, dir, sizeof dir)) return -1;
  return open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
#else
  (void)path;
  return -1;
#endif
}

/* Best effort: makes the rename durable. Errors are ignored (some file
 * systems cannot fsync a directory); the data itself was already synced. */
static void sync_parent_dir(const char *path) {
  char dir[4096];
  if (!parent_dir(path, dir, sizeof dir)) return;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)fsync(fd);
  close(fd);
}

/* Writes the parts to fd and fsyncs it; returns NULL, or what failed with
 * its errno in *err. */
static const char *write_parts(int fd, const attn_io_part *parts, size_t n, int *err) {
  for (size_t i = 0; i < n; i++) {
    if (write_all(fd, parts[i].len ? parts[i].data : "", parts[i].len) != 0) {
      *err = errno;
      return "cannot write temporary file";
    }
  }
  if (fsync(fd) != 0) {
    *err = errno;
    return "cannot fsync temporary file";
  }
  return NULL;
}

/* The temporary name "<path>.tmp.<pid>.<hex>" into tmp. */
static void temp_name(char *tmp, size_t size, const char *path, uint32_t salt, int attempt) {
  snprintf(tmp, size, "%s.tmp.%ld.%08x", path, (long)getpid(), (unsigned)(salt + 0x9e3779b9u * (uint32_t)attempt));
}

attn_status attn_io_write_atomic(const char *path, const attn_io_part *parts, size_t n) {
  size_t tmp_size = strlen(path) + 40;
  char *tmp = malloc(tmp_size);
  if (!tmp) return attn_error(ATTN_ERR_MEMORY, "%s: no memory for the temporary file's name", path);
  tmp[0] = 0;
  remove_stale_temps(path);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint32_t salt = (uint32_t)ts.tv_nsec ^ (uint32_t)ts.tv_sec * 2654435761u ^ (uint32_t)(uintptr_t)&ts;
  int unnamed = open_unnamed(path);
  const char *what = NULL;
  int fd = unnamed, err = 0, named = 0; /* (not fd == unnamed: a new open may reuse the closed number) */
  attn_status st = ATTN_OK;
  if (unnamed >= 0) { /* written first, named once complete */
    what = write_parts(unnamed, parts, n, &err);
    if (!what) {
      char proc[64];
      snprintf(proc, sizeof proc, "/proc/self/fd/%d", unnamed);
      int linked = -1;
      for (int attempt = 0; attempt < 100 && linked != 0; attempt++) {
        temp_name(tmp, tmp_size, path, salt, attempt);
        linked = linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW);
        if (linked != 0 && errno != EEXIST) break;
      }
      if (linked != 0) { /* no /proc, or linking refused: write a named file instead */
        close(unnamed);
        fd = -1;
      } else {
        named = 1;
      }
    }
  }
  if (fd < 0) {
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
      temp_name(tmp, tmp_size, path, salt, attempt);
      fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
      st = attn_error(ATTN_ERR_IO, "%s: cannot create temporary file '%s': %s", path, tmp, strerror(errno));
      free(tmp);
      return st;
    }
    named = 1;
    what = write_parts(fd, parts, n, &err);
  }
  if (what && !named) { /* failed before it had a name: nothing to remove */
    close(fd);
    st = attn_error(ATTN_ERR_IO, "%s: %s: %s", path, what, strerror(err));
  } else {
    if (close(fd) != 0 && !what) {
      what = "cannot close temporary file";
      err = errno;
    }
    if (!what && rename(tmp, path) != 0) {
      what = "cannot rename temporary file";
      err = errno;
    }
    if (what) {
      unlink(tmp);
      st = attn_error(ATTN_ERR_IO, "%s: %s '%s': %s", path, what, tmp, strerror(err));
    } else {
      sync_parent_dir(path);
    }
  }
  free(tmp);
  return st;
}

attn_status attn_io_fsync(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    return attn_error(ATTN_ERR_IO, "%s: cannot fsync: %s", path, strerror(err));
  }
  close(fd);
  return ATTN_OK;
}
