/* Binding: raw bytes <-> tensors and atomic file writes, the C half of the
 * checkpoint formats in lua/attn/io.lua (safetensors and NumPy .npy).
 *
 * Byte order: every function here reads and writes explicit byte orders
 * (little-endian unless told otherwise) by assembling bytes, so it is correct
 * on any host; a host-order memcpy is only a fast path, taken when the host is
 * detected (at run time) to be little-endian.
 *
 * Atomic writes: the bytes go to a temporary file next to the target, which
 * is flushed with fsync and renamed over the target; the directory is then
 * fsync'ed (best effort). Where the file system allows it the temporary file
 * is unnamed (O_TMPFILE) until it is complete, so a process killed while
 * writing leaves nothing behind; it gets its name "<path>.tmp.<pid>.<hex>"
 * (created with O_EXCL) just before the rename. Elsewhere it is named from the
 * start, and each save removes such names left by processes that no longer
 * exist. On any failure the temporary file is removed and the target is
 * untouched. Bad argument types raise; I/O failures return nil, msg. */
#define _GNU_SOURCE /* O_TMPFILE */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lbind.h"

static int host_is_little(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

/* ---- element encodings ---- */

typedef enum { ENC_F32, ENC_F64, ENC_F16, ENC_BF16, ENC_I32, ENC_I64 } encoding;

static const struct {
  const char *names[3];
  encoding enc;
  size_t size;
  attn_dtype result; /* the tensor dtype the encoding loads into */
} encodings[] = {
    {{"float32", "f32", "F32"}, ENC_F32, 4, ATTN_F32},    {{"float64", "f64", "F64"}, ENC_F64, 8, ATTN_F64},
    {{"float16", "f16", "F16"}, ENC_F16, 2, ATTN_F32},    {{"bfloat16", "bf16", "BF16"}, ENC_BF16, 2, ATTN_F32},
    {{"int32", "i32", "I32"}, ENC_I32, 4, ATTN_I64},      {{"int64", "i64", "I64"}, ENC_I64, 8, ATTN_I64},
};

static int find_encoding(const char *name) {
  for (size_t i = 0; i < sizeof encodings / sizeof encodings[0]; i++)
    for (int k = 0; k < 3; k++)
      if (strcmp(name, encodings[i].names[k]) == 0) return (int)i;
  if (strcmp(name, "float") == 0) return 0;
  if (strcmp(name, "double") == 0) return 1;
  return -1;
}

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
static void decode(void *dst, const unsigned char *src, int64_t n, int e, int big) {
  size_t size = encodings[e].size;
  encoding enc = encodings[e].enc;
  if ((enc == ENC_F32 || enc == ENC_F64 || enc == ENC_I64) && big == !host_is_little()) {
    memcpy(dst, src, (size_t)n * size);
    return;
  }
  for (int64_t i = 0; i < n; i++, src += size) {
    uint64_t u = load_uint(src, size, big);
    switch (enc) {
    case ENC_F32: {
      uint32_t b = (uint32_t)u;
      memcpy((float *)dst + i, &b, 4);
      break;
    }
    case ENC_F64:
      memcpy((double *)dst + i, &u, 8);
      break;
    case ENC_F16:
      ((float *)dst)[i] = half_to_float((uint16_t)u);
      break;
    case ENC_BF16: {
      uint32_t b = (uint32_t)u << 16;
      memcpy((float *)dst + i, &b, 4);
      break;
    }
    case ENC_I32: {
      uint32_t b = (uint32_t)u;
      int32_t s;
      memcpy(&s, &b, 4);
      ((int64_t *)dst)[i] = s;
      break;
    }
    case ENC_I64:
      memcpy((int64_t *)dst + i, &u, 8);
      break;
    }
  }
}

/* Number of bytes of t's elements; raises if it does not fit a size_t. */
static size_t tensor_nbytes(lua_State *L, const attn_tensor *t) {
  int64_t n = attn_tensor_numel(t);
  size_t size = attn_dtype_size(t->dtype);
  if (n < 0 || (uint64_t)n > SIZE_MAX / size) attn_l_error(L, "tensor %s is too large", attn_tensor_shape_str(t));
  return (size_t)n * size;
}

/* Does t need converting before its storage bytes are its little-endian,
 * row-major serialisation? */
static int needs_packing(const attn_tensor *t) {
  return attn_tensor_numel(t) > 0 && (!attn_tensor_is_contiguous(t) || !host_is_little());
}

/* Pushes the little-endian row-major bytes of the tensor at idx as a string. */
static void push_tensor_bytes(lua_State *L, int idx) {
  attn_tensor *t = attn_l_check(L, idx);
  size_t nbytes = tensor_nbytes(L, t);
  if (nbytes == 0) {
    lua_pushliteral(L, "");
    return;
  }
  if (!attn_tensor_is_contiguous(t)) { /* contiguous copy, owned by Lua */
    attn_tensor *c = attn_l_push_like(L, t);
    if (attn_copy(c, t) != ATTN_OK) attn_l_raise(L);
    lua_replace(L, idx < 0 ? idx - 1 : idx); /* keep stack shape: the copy stands in for t */
    t = c;
  }
  luaL_Buffer b;
  unsigned char *out = (unsigned char *)luaL_buffinitsize(L, &b, nbytes);
  const unsigned char *data = attn_tensor_data(t);
  if (host_is_little()) {
    memcpy(out, data, nbytes);
  } else {
    size_t size = attn_dtype_size(t->dtype);
    for (size_t i = 0; i < nbytes; i += size) {
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
  luaL_pushresultsize(&b, nbytes);
}

/***
 * The elements of a tensor as a string of little-endian bytes in row-major
 * order (a contiguous copy is made for strided views).
 * @function tensor_to_bytes
 * @tparam Tensor t
 * @treturn string numel(t) * itemsize bytes
 */
static int l_tensor_to_bytes(lua_State *L) {
  attn_l_check(L, 1);
  lua_settop(L, 1);
  push_tensor_bytes(L, 1);
  return 1;
}

/***
 * A new contiguous tensor decoded from bytes of a string.
 * Encodings: "float32"/"F32", "float64"/"F64" (bit-exact), "float16"/"F16"
 * and "bfloat16"/"BF16" (to float32, exact), "int32"/"I32" and "int64"/"I64"
 * (to int64, exact).
 * @function tensor_from_bytes
 * @tparam string str
 * @tparam integer offset 0-based byte offset of the first element
 * @tparam string encoding
 * @tparam {integer,...} shape row-major, outermost first ({} for 0-d)
 * @tparam[opt=false] boolean big_endian
 * @treturn Tensor
 * @raise when offset + bytes needed exceeds #str, on bad shapes or encodings
 */
static int l_tensor_from_bytes(lua_State *L) {
  size_t len;
  const char *s = attn_l_checklstring(L, 1, "bytes", &len);
  lua_Integer offset = attn_l_checkinteger(L, 2, "offset");
  const char *name = attn_l_checklstring(L, 3, "encoding", NULL);
  attn_l_checktable(L, 4, "shape");
  int big = lua_toboolean(L, 5);
  int e = find_encoding(name);
  if (e < 0)
    return attn_l_error(L, "tensor_from_bytes: unknown encoding '%s' (expected float32, float64, float16, "
                         "bfloat16, int32 or int64)", name);
  int64_t shape[ATTN_MAX_DIMS];
  int ndim = attn_l_checkshape(L, 4, shape, "tensor_from_bytes");
  attn_l_check_sizes(L, ndim, shape, "tensor_from_bytes");
  uint64_t numel = 1;
  int zero = 0;
  for (int d = 0; d < ndim; d++) zero |= shape[d] == 0;
  for (int d = 0; d < ndim && !zero; d++) {
    if (numel > (uint64_t)INT64_MAX / encodings[e].size / (uint64_t)shape[d])
      return attn_l_error(L, "tensor_from_bytes: shape %s is too large", attn_shape_str(ndim, shape));
    numel *= (uint64_t)shape[d];
  }
  if (zero) numel = 0;
  uint64_t need = numel * encodings[e].size;
  if (offset < 0 || (uint64_t)offset > len || need > len - (uint64_t)offset)
    return attn_l_error(L, "tensor_from_bytes: %s %s needs %I bytes at offset %I, the string has %I",
                      encodings[e].names[0], attn_shape_str(ndim, shape), (lua_Integer)need, offset,
                      (lua_Integer)len);
  attn_tensor *t = attn_l_push_alloc(L, encodings[e].result, ndim, shape);
  if (numel > 0) decode(attn_tensor_data(t), (const unsigned char *)s + offset, (int64_t)numel, e, big);
  return 1;
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

/* Writes the n resolved parts (table at index 3) to fd and fsyncs it;
 * returns NULL, or what failed with its errno in *err. */
static const char *write_parts(lua_State *L, int fd, lua_Integer n, int *err) {
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 3, i);
    const char *p;
    size_t len;
    if (lua_type(L, -1) == LUA_TSTRING) {
      p = lua_tolstring(L, -1, &len);
    } else {
      attn_tensor *t = attn_l_test(L, -1);
      len = tensor_nbytes(L, t);
      p = len ? (const char *)attn_tensor_data(t) : "";
    }
    int failed = write_all(fd, p, len) != 0;
    lua_pop(L, 1);
    if (failed) {
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

/* Pushes (at index 4) and returns the temporary name "<path>.tmp.<pid>.<hex>". */
static const char *push_temp_name(lua_State *L, const char *path, uint32_t salt, int attempt) {
  lua_settop(L, 3);
  char suffix[40];
  snprintf(suffix, sizeof suffix, ".tmp.%ld.%08x", (long)getpid(), (unsigned)(salt + 0x9e3779b9u * (uint32_t)attempt));
  return lua_pushfstring(L, "%s%s", path, suffix);
}

/***
 * Writes strings (and tensors, as their little-endian row-major bytes) in
 * order to a temporary file in the directory of path (unnamed until complete
 * where the file system allows), fsyncs it and renames it over path. On
 * failure the temporary file is removed and path is left as it was; stale
 * temporaries of killed saves to path are removed first.
 * @function write_file_atomic
 * @tparam string path
 * @tparam {string|Tensor,...} parts
 * @treturn[1] boolean true
 * @treturn[2] nil
 * @treturn[2] string "<path>: cannot ...: <reason>"
 * @raise when a part is neither a string nor a tensor, or path contains a NUL byte
 */
static int l_write_file_atomic(lua_State *L) {
  size_t path_len;
  const char *path = attn_l_checklstring(L, 1, "path", &path_len);
  if (strlen(path) != path_len) return attn_l_error(L, "write_file_atomic: path contains a NUL byte");
  attn_l_checktable(L, 2, "parts");
  lua_settop(L, 2);
  lua_Integer n = (lua_Integer)lua_rawlen(L, 2);
  /* Resolve every part before creating the file, so that nothing raises
   * while it exists: strings stay, tensors stay if their storage already
   * holds their serialisation, else they become strings. */
  lua_createtable(L, (int)(n < 1 << 20 ? n : 1 << 20), 0); /* index 3 */
  for (lua_Integer i = 1; i <= n; i++) {
    int type = lua_rawgeti(L, 2, i);
    if (type == LUA_TSTRING) {
      /* keep */
    } else if (attn_l_test(L, -1)) {
      if (needs_packing(attn_l_test(L, -1))) {
        push_tensor_bytes(L, lua_gettop(L));
        lua_remove(L, -2);
      }
    } else {
      return attn_l_error(L, "write_file_atomic: part %I is a %s, not a string or tensor", i, luaL_typename(L, -1));
    }
    lua_rawseti(L, 3, i);
  }

  remove_stale_temps(path);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint32_t salt = (uint32_t)ts.tv_nsec ^ (uint32_t)ts.tv_sec * 2654435761u ^ (uint32_t)(uintptr_t)&ts;
  int unnamed = open_unnamed(path);
  const char *tmp = NULL, *what = NULL;
  int fd = unnamed, err = 0;
  if (unnamed >= 0) { /* written first, named once complete */
    what = write_parts(L, unnamed, n, &err);
    if (!what) {
      char proc[64];
      snprintf(proc, sizeof proc, "/proc/self/fd/%d", unnamed);
      int linked = -1;
      for (int attempt = 0; attempt < 100 && linked != 0; attempt++) {
        tmp = push_temp_name(L, path, salt, attempt);
        linked = linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW);
        if (linked != 0 && errno != EEXIST) break;
      }
      if (linked != 0) { /* no /proc, or linking refused: write a named file instead */
        close(unnamed);
        fd = -1;
      }
    }
  }
  if (fd < 0) {
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
      tmp = push_temp_name(L, path, salt, attempt);
      fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
      err = errno;
      lua_pushnil(L);
      lua_pushfstring(L, "%s: cannot create temporary file '%s': %s", path, tmp, strerror(err));
      return 2;
    }
    what = write_parts(L, fd, n, &err);
  }
  if (what && fd == unnamed) { /* failed before it had a name: nothing to remove */
    close(fd);
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s: %s", path, what, strerror(err));
    return 2;
  }
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
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s '%s': %s", path, what, tmp, strerror(err));
    return 2;
  }
  sync_parent_dir(path);
  lua_pushboolean(L, 1);
  return 1;
}

/***
 * fsync a file by path (flushes its data to the device).
 * @function fsync
 * @tparam string path
 * @treturn[1] boolean true
 * @treturn[2] nil
 * @treturn[2] string message
 */
static int l_fsync(lua_State *L) {
  const char *path = attn_l_checklstring(L, 1, "path", NULL);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    lua_pushnil(L);
    lua_pushfstring(L, "%s: cannot fsync: %s", path, strerror(err));
    return 2;
  }
  close(fd);
  lua_pushboolean(L, 1);
  return 1;
}

static const luaL_Reg io_functions[] = {
    {"tensor_to_bytes", l_tensor_to_bytes},
    {"tensor_from_bytes", l_tensor_from_bytes},
    {"write_file_atomic", l_write_file_atomic},
    {"fsync", l_fsync},
    {NULL, NULL},
};

void attn_l_open_io(lua_State *L) { attn_l_setfuncs(L, io_functions); }
