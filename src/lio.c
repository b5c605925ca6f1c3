/* Binding of src/attn_io.h: raw bytes <-> tensors and atomic file writes,
 * the C half of the checkpoint formats in lua/attn/io.lua (safetensors and
 * NumPy .npy). Bad argument types raise; I/O failures return nil, msg. */
#include <string.h>

#include "lbind.h"

/* Pushes the little-endian row-major bytes of tensor t as a string. */
static void push_tensor_bytes(lua_State *L, const attn_tensor *t) {
  size_t nbytes;
  if (attn_io_nbytes(t, &nbytes) != ATTN_OK) attn_l_raise(L);
  if (nbytes == 0) {
    lua_pushliteral(L, "");
    return;
  }
  /* The string is one request like any tensor's: the allocator's bound holds
   * (an expanded view of 2^31 entries would otherwise be a 8 GiB string). */
  if (nbytes > attn_alloc_max_request())
    attn_l_error(L, "%s: cannot allocate %I bytes for %s %s", attn_l_fname(L), (lua_Integer)nbytes,
                 attn_dtype_name(t->dtype), attn_tensor_shape_str(t));
  luaL_Buffer b;
  unsigned char *out = (unsigned char *)luaL_buffinitsize(L, &b, nbytes);
  if (attn_io_encode(t, out, nbytes) != ATTN_OK) attn_l_raise(L);
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
  attn_tensor *t = attn_l_check(L, 1);
  push_tensor_bytes(L, t);
  return 1;
}

/***
 * A new contiguous tensor decoded from bytes of a string.
 * Encodings: "float32"/"F32", "float64"/"F64" (bit-exact), "float16"/"F16"
 * and "bfloat16"/"BF16" (to float32, exact), "int32"/"I32" and "int64"/"I64"
 * (to int64, exact), "uint8"/"U8", "int8"/"I8" and "int16"/"I16" (to
 * float32, exact: pixels and labels of idx files).
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
  attn_encoding e;
  if (attn_encoding_parse(name, &e) != 0)
    return attn_l_error(L, "tensor_from_bytes: unknown encoding '%s' (expected float32, float64, float16, "
                         "bfloat16, int32, int64, uint8, int8 or int16)", name);
  int64_t shape[ATTN_MAX_DIMS];
  int ndim = attn_l_checkshape(L, 4, shape, "tensor_from_bytes");
  attn_l_check_sizes(L, ndim, shape, "tensor_from_bytes");
  if (offset < 0) return attn_l_error(L, "tensor_from_bytes: offset %I must be >= 0", offset);
  /* checked before allocating: a shape past the string's end must not allocate its bytes */
  ATTN_L_TRY(L, attn_io_check_span("tensor_from_bytes", len, (size_t)offset, e, ndim, shape));
  attn_tensor *t = attn_l_push_alloc(L, attn_encoding_dtype(e), ndim, shape);
  ATTN_L_TRY(L, attn_io_decode(s, len, (size_t)offset, e, big, t));
  return 1;
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
  if ((size_t)n > SIZE_MAX / sizeof(attn_io_part)) return attn_l_error(L, "write_file_atomic: %I parts", n);
  /* Resolve every part before the core writes, so that no Lua code runs
   * while it holds the pointers: strings stay, tensors stay if their storage
   * already holds their serialisation, else they become strings. All are
   * kept in the table at index 3, which keeps them alive. */
  lua_createtable(L, (int)(n < 1 << 20 ? n : 1 << 20), 0); /* index 3 */
  for (lua_Integer i = 1; i <= n; i++) {
    int type = lua_rawgeti(L, 2, i);
    attn_tensor *t = type == LUA_TSTRING ? NULL : attn_l_test(L, -1);
    if (type != LUA_TSTRING && !t)
      return attn_l_error(L, "write_file_atomic: part %I is a %s, not a string or tensor", i, luaL_typename(L, -1));
    if (t && !attn_io_is_serialised(t)) {
      push_tensor_bytes(L, t);
      lua_remove(L, -2);
    }
    lua_rawseti(L, 3, i);
  }
  attn_io_part *parts = lua_newuserdatauv(L, (size_t)n * sizeof *parts + 1, 0); /* index 4 */
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 3, i); /* the table keeps it alive after the pop */
    attn_tensor *t = attn_l_test(L, -1);
    if (t) {
      if (attn_io_nbytes(t, &parts[i - 1].len) != ATTN_OK) return attn_l_raise(L);
      parts[i - 1].data = parts[i - 1].len ? attn_tensor_data(t) : "";
    } else {
      parts[i - 1].data = lua_tolstring(L, -1, &parts[i - 1].len);
    }
    lua_pop(L, 1);
  }
  attn_status st = attn_io_write_atomic(path, parts, (size_t)n);
  if (st == ATTN_ERR_IO) {
    lua_pushnil(L);
    lua_pushstring(L, attn_last_error());
    return 2;
  }
  if (st != ATTN_OK) return attn_l_raise(L);
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
  if (attn_io_fsync(path) != ATTN_OK) {
    lua_pushnil(L);
    lua_pushstring(L, attn_last_error());
    return 2;
  }
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
