/* attn.mpi: a thin Lua binding of MPI for attn.distributed (not part of the
 * numeric core; lua/attn/core.so links no MPI, and this module links no core).
 *
 * Tensors are read through the core's public header only: a Lua tensor is a
 * full userdata with the metatable "attn.Tensor" holding an attn_tensor by
 * value (src/lbind.h), so the struct gives dtype, shape, strides and the
 * storage pointer without calling into core.so. The raw data pointer is taken
 * right before the MPI call and no Lua code runs until the call has returned.
 *
 * Ranks here are MPI's, 0-based; attn.distributed turns them 1-based. Every
 * MPI failure is returned (MPI_ERRORS_RETURN on MPI_COMM_WORLD) and raised as
 * a Lua error naming the call. */
#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "../attn_tensor.h"

#define TENSOR_MT "attn.Tensor"
/* Header of a tensor compared across ranks: dtype, ndim, shape. */
#define HDR_LEN (2 + ATTN_MAX_DIMS)

static int failed(lua_State *L, const char *fn, const char *call, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error code %d", rc);
  return luaL_error(L, "%s: %s failed: %s", fn, call, msg);
}

#define TRY(L, fn, call, expr)                          \
  do {                                                  \
    int rc_ = (expr);                                   \
    if (rc_ != MPI_SUCCESS) return failed(L, fn, call, rc_); \
  } while (0)

static int is_live(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

static void need_init(lua_State *L, const char *fn) {
  if (!is_live()) luaL_error(L, "%s: MPI is not initialised (call attn.distributed.init() first)", fn);
}

static const char *dtype_name(attn_dtype d) {
  return d == ATTN_F32 ? "float32" : d == ATTN_F64 ? "float64" : d == ATTN_I64 ? "int64" : "unknown";
}

static size_t dtype_size(attn_dtype d) { return d == ATTN_F32 ? 4 : 8; }

static MPI_Datatype mpi_type(attn_dtype d) {
  return d == ATTN_F32 ? MPI_FLOAT : d == ATTN_F64 ? MPI_DOUBLE : MPI_INT64_T;
}

static attn_tensor *check_tensor(lua_State *L, int idx, const char *fn) {
  attn_tensor *t = luaL_testudata(L, idx, TENSOR_MT);
  if (!t) {
    luaL_error(L, "%s: argument %d must be a tensor, got %s", fn, idx, luaL_typename(L, idx));
    return NULL; /* not reached: luaL_error does not return */
  }
  if (!t->storage) luaL_error(L, "%s: use of freed tensor", fn);
  if (t->dtype != ATTN_F32 && t->dtype != ATTN_F64 && t->dtype != ATTN_I64) luaL_error(L, "%s: unknown dtype", fn);
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->stride[d] != expect)
      luaL_error(L, "%s: the tensor must be contiguous (attn.distributed copies views)", fn);
    expect *= t->shape[d];
  }
  return t;
}

static int64_t numel(const attn_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

static void header(const attn_tensor *t, int64_t *h) {
  memset(h, 0, HDR_LEN * sizeof *h);
  h[0] = t->dtype;
  h[1] = t->ndim;
  for (int d = 0; d < t->ndim; d++) h[2 + d] = t->shape[d];
}

static void add_desc(luaL_Buffer *b, const int64_t *h) {
  char s[32];
  luaL_addstring(b, dtype_name((attn_dtype)h[0]));
  luaL_addstring(b, " (");
  for (int d = 0; d < h[1] && d < ATTN_MAX_DIMS; d++) {
    snprintf(s, sizeof s, d ? ", %lld" : "%lld", (long long)h[2 + d]);
    luaL_addstring(b, s);
  }
  luaL_addstring(b, ")");
}

/* Every rank gathers every rank's header; all of them see the same mismatch
 * and raise the same message, so none is left waiting in the next call. */
static void check_same(lua_State *L, const attn_tensor *t, const char *fn) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int64_t mine[HDR_LEN];
  header(t, mine);
  int64_t *all = lua_newuserdatauv(L, (size_t)size * HDR_LEN * sizeof *all, 0); /* freed by the GC */
  int rc = MPI_Allgather(mine, HDR_LEN, MPI_INT64_T, all, HDR_LEN, MPI_INT64_T, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) failed(L, fn, "MPI_Allgather (shape check)", rc);
  int same = 1;
  for (int r = 1; r < size && same; r++) same = memcmp(all, all + (size_t)r * HDR_LEN, sizeof mine) == 0;
  if (!same) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, fn);
    luaL_addstring(&b, ": tensors differ across ranks (dtype and shape must match):");
    for (int r = 0; r < size && r < 16; r++) {
      char s[32];
      snprintf(s, sizeof s, " rank %d ", r + 1);
      luaL_addstring(&b, r ? "," : "");
      luaL_addstring(&b, s);
      add_desc(&b, all + (size_t)r * HDR_LEN);
    }
    if (size > 16) luaL_addstring(&b, ", ...");
    luaL_pushresult(&b);
    lua_error(L);
  }
  lua_pop(L, 1);
}

/* libmpi loaded by Lua's dlopen is RTLD_LOCAL, but Open MPI's plugins look up
 * its symbols globally: promote it before MPI_Init (mpi4py does the same). */
static void promote_libmpi(void) {
  static const char *names[] = { "libmpi.so.40", "libmpi.so.12", "libmpi.so" };
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (h) return; /* the handle stays open for the process's life */
  }
}

static int l_init(lua_State *L) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) return luaL_error(L, "init: MPI was finalised already (it cannot be started twice in a process)");
  if (!init) {
    promote_libmpi();
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return luaL_error(L, "init: MPI_Init_thread failed with code %d", rc);
  }
  TRY(L, "init", "MPI_Comm_set_errhandler", MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  return 0;
}

static int l_initialized(lua_State *L) {
  lua_pushboolean(L, is_live());
  return 1;
}

static int l_rank(lua_State *L) {
  need_init(L, "rank");
  int r = 0;
  TRY(L, "rank", "MPI_Comm_rank", MPI_Comm_rank(MPI_COMM_WORLD, &r));
  lua_pushinteger(L, r);
  return 1;
}

static int l_size(lua_State *L) {
  need_init(L, "world_size");
  int n = 0;
  TRY(L, "world_size", "MPI_Comm_size", MPI_Comm_size(MPI_COMM_WORLD, &n));
  lua_pushinteger(L, n);
  return 1;
}

/* allreduce(t, op): t contiguous, op "sum" or "mean", in place. */
static int l_allreduce(lua_State *L) {
  const char *fn = "allreduce_";
  need_init(L, fn);
  attn_tensor *t = check_tensor(L, 1, fn);
  const char *op = luaL_checkstring(L, 2);
  int mean = strcmp(op, "mean") == 0;
  if (!mean && strcmp(op, "sum") != 0) return luaL_error(L, "%s: op must be \"sum\" or \"mean\", got \"%s\"", fn, op);
  if (mean && t->dtype == ATTN_I64)
    return luaL_error(L, "%s: \"mean\" of an int64 tensor would truncate; use \"sum\" or a float tensor", fn);
  int64_t n = numel(t);
  if (n > INT32_MAX) return luaL_error(L, "%s: %lld elements exceed MPI's int count", fn, (long long)n);
  check_same(L, t, fn);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  /* The pointer is taken here and used only by C until the call returns. */
  void *p = (char *)t->storage->data + t->offset * (int64_t)dtype_size(t->dtype);
  int rc = n ? MPI_Allreduce(MPI_IN_PLACE, p, (int)n, mpi_type(t->dtype), MPI_SUM, MPI_COMM_WORLD) : MPI_SUCCESS;
  if (rc == MPI_SUCCESS && mean) {
    /* a division (not a product by 1/size) keeps one process's values exact */
    if (t->dtype == ATTN_F32) {
      float *f = p, s = (float)size;
      for (int64_t i = 0; i < n; i++) f[i] /= s;
    } else {
      double *f = p, s = size;
      for (int64_t i = 0; i < n; i++) f[i] /= s;
    }
  }
  t->storage->version++;
  if (rc != MPI_SUCCESS) return failed(L, fn, "MPI_Allreduce", rc);
  return 0;
}

/* bcast(t, root): root 0-based. */
static int l_bcast(lua_State *L) {
  const char *fn = "broadcast_";
  need_init(L, fn);
  attn_tensor *t = check_tensor(L, 1, fn);
  lua_Integer root = luaL_checkinteger(L, 2);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (root < 0 || root >= size)
    return luaL_error(L, "%s: root must be a rank in 1..%d, got %d", fn, size, (int)(root + 1));
  int64_t n = numel(t);
  if (n > INT32_MAX) return luaL_error(L, "%s: %lld elements exceed MPI's int count", fn, (long long)n);
  check_same(L, t, fn);
  void *p = (char *)t->storage->data + t->offset * (int64_t)dtype_size(t->dtype);
  int rc = n ? MPI_Bcast(p, (int)n, mpi_type(t->dtype), (int)root, MPI_COMM_WORLD) : MPI_SUCCESS;
  t->storage->version++;
  if (rc != MPI_SUCCESS) return failed(L, fn, "MPI_Bcast", rc);
  return 0;
}

static int l_barrier(lua_State *L) {
  need_init(L, "barrier");
  TRY(L, "barrier", "MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD));
  return 0;
}

static int l_finalize(lua_State *L) {
  if (is_live()) TRY(L, "finalize", "MPI_Finalize", MPI_Finalize());
  return 0;
}

/* abort(code): ends every process of the job (after a rank's error). */
static int l_abort(lua_State *L) {
  int code = (int)luaL_optinteger(L, 1, 1);
  if (is_live()) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

static int l_wtime(lua_State *L) {
  lua_pushnumber(L, MPI_Wtime());
  return 1;
}

static int l_version(lua_State *L) {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  lua_pushlstring(L, v, (size_t)len);
  return 1;
}

int luaopen_attn_mpi(lua_State *L) {
  static const luaL_Reg fns[] = {
    { "init", l_init },           { "initialized", l_initialized }, { "rank", l_rank },
    { "size", l_size },           { "allreduce", l_allreduce },     { "bcast", l_bcast },
    { "barrier", l_barrier },     { "finalize", l_finalize },       { "abort", l_abort },
    { "wtime", l_wtime },         { "version", l_version },         { NULL, NULL },
  };
  luaL_newlib(L, fns);
  return 1;
}
