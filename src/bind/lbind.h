/* Shared helpers of the Lua binding (not part of the C core).
 *
 * A Lua tensor is a full userdata holding an attn_tensor by value, with the
 * metatable "attn.Tensor" and three user values (ATTN_L_UV_*). Dims and
 * indices arrive 1-based (negative counts from the end) and leave 0-based for
 * the core. Core failures are raised as Lua errors
 * only after the core has returned. */
#ifndef ATTN_LBIND_H
#define ATTN_LBIND_H

#include <lauxlib.h>
#include <lua.h>

#include "attn.h"

/* The module is built with -fvisibility=hidden: its luaopen_* entry points are the only symbols
 * core.so exports (spec/packaging/exports_spec.lua checks it). */
#if defined(__GNUC__)
#define ATTN_EXPORT __attribute__((visibility("default")))
#else
#define ATTN_EXPORT
#endif

#define ATTN_TENSOR_MT "attn.Tensor"

/* A tensor's user values: a table of its Lua-side fields (grad, _rg for a leaf, a user's own;
 * made by the first assignment), the autograd node that made it (t.grad_fn) and its position
 * among that node's outputs when there are several (t._oi). The autograd fields are slots rather
 * than table entries, so recording an op makes no table per output (src/bind/lgraph.c). */
#define ATTN_L_UV_FIELDS 1
#define ATTN_L_UV_GRAD_FN 2
#define ATTN_L_UV_OUTPUT 3
#define ATTN_L_USER_VALUES 3

/* Argument errors name the function the user called: every binding function
 * is registered (attn_l_setfuncs) as a closure whose upvalue 1 is its luaL_Reg
 * entry, whose public name attn_l_fname reads back. (luaL_check* would name the local variable
 * of the Lua wrapper that made the call, e.g. "bad argument #3 to 'f'".)
 * Messages read "transpose: argument 3 (dim) must be an integer, got no
 * value", counting arguments of the function form attn.transpose(x, d0, d1),
 * which for a method call x:transpose(d0, d1) counts x as argument 1. */
const char *attn_l_fname(lua_State *L);
/* Raises "<fname>: argument <arg> (<what>) must be <expected>, got <value>";
 * what may be NULL. */
int attn_l_argerror(lua_State *L, int arg, const char *what, const char *expected);
lua_Integer attn_l_checkinteger(lua_State *L, int arg, const char *what);
lua_Integer attn_l_optinteger(lua_State *L, int arg, const char *what, lua_Integer def);
double attn_l_checknumber(lua_State *L, int arg, const char *what);
double attn_l_optnumber(lua_State *L, int arg, const char *what, double def);
const char *attn_l_checklstring(lua_State *L, int arg, const char *what, size_t *len);
void attn_l_checktable(lua_State *L, int arg, const char *what);

/* Whether the value at idx is a tensor (freed or not). */
int attn_l_is_tensor(lua_State *L, int idx);
/* The tensor at idx; raises if it is not one or was freed. */
attn_tensor *attn_l_check(lua_State *L, int idx);
/* The tensor at idx, or NULL if the value is not a tensor (raises if freed). */
attn_tensor *attn_l_test(lua_State *L, int idx);
/* Pushes a new contiguous tensor (contents uninitialised); raises on failure. */
attn_tensor *attn_l_push_alloc(lua_State *L, attn_dtype dtype, int ndim, const int64_t *shape);
/* attn_l_push_alloc with `tail` bytes of the binding's own after the struct in the same
 * userdata (at attn_l_tail; the saved buffer keeps its layout there, src/bind/lsaved.c). */
attn_tensor *attn_l_push_alloc_tail(lua_State *L, attn_dtype dtype, int ndim, const int64_t *shape, size_t tail);
/* The tail of a tensor pushed by attn_l_push_alloc_tail. */
#define attn_l_tail(t) ((void *)((attn_tensor *)(t) + 1))
/* Pushes a new tensor with x's dtype and shape. */
attn_tensor *attn_l_push_like(lua_State *L, const attn_tensor *x);
/* A tensor of dtype dt made from the number or nested table of numbers at idx (as attn.tensor),
 * pushed; raises on a ragged table or a non-number element. */
attn_tensor *attn_l_push_table(lua_State *L, int idx, attn_dtype dt);
/* Pushes a view sharing view->storage (retains it). */
attn_tensor *attn_l_push_view(lua_State *L, const attn_tensor *view);
/* Pushes the Lua number at idx as a 0-d tensor of dtype: exact for a Lua
 * integer into int64 (a double would round past 2^53); for int64, a float
 * must hold an integer (errors name fn). */
attn_tensor *attn_l_push_number(lua_State *L, int idx, attn_dtype dtype, const char *fn);
/* Raises the core's last error message. */
int attn_l_raise(lua_State *L);
/* Raises a formatted message (lua_pushfstring formats: %s %d %f %p %c %%)
 * without a source position: luaL_error would name the library's Lua wrapper,
 * not the user's line; the traceback still has every frame. */
int attn_l_error(lua_State *L, const char *fmt, ...);
/* A 1-based index i among `size` (entries of a dim, or dims), a negative one counted
 * from the end (-1 is the last): (i + 1) + size never overflows, where
 * i + size + 1 does at size = 2^63 - 1. Range checks are the caller's. */
static inline lua_Integer attn_l_from_end(lua_Integer i, int64_t size) { return i < 0 ? (i + 1) + size : i; }
/* Checks a 1-based dim (negative from the end) against ndim (+extra, for
 * unsqueeze) and returns it 0-based. */
int attn_l_checkdim(lua_State *L, int arg, int ndim, int extra, const char *fn);
/* Reads a shape from a table at arg, or from the integers arg..top. Returns
 * ndim. Raises on non-integers, NaN and too many dims (not on -1: callers
 * that do not infer check with attn_l_check_sizes). */
int attn_l_checkshape(lua_State *L, int arg, int64_t *shape, const char *fn);
/* The integer size at idx, entry pos (1-based) of a shape; raises "fn: size
 * pos is 1.5, not an integer" otherwise. The sign is not checked. */
int64_t attn_l_checksize(lua_State *L, int idx, int pos, const char *fn);
void attn_l_check_sizes(lua_State *L, int ndim, const int64_t *shape, const char *fn);
/* Optional dtype name at arg (nil or none: def). */
attn_dtype attn_l_optdtype(lua_State *L, int arg, attn_dtype def);
/* Reads 0-based indices from a 1-D tensor or a table of 1-based integers at
 * arg into a buffer owned by a userdata pushed on the stack. Returns count. */
int64_t attn_l_checkindices(lua_State *L, int arg, int64_t **out, const char *fn);
/* Marks an in-place write to t's storage (see attn_storage.version). */
static inline void attn_l_bump_version(attn_tensor *t) { t->storage->version++; }

/* Whether a and b have the same dims and sizes (autograd's per-node checks). */
static inline int attn_l_same_shape(const attn_tensor *a, const attn_tensor *b) {
  int same = a->ndim == b->ndim;
  for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
  return same;
}
/* The per-state random generator. */
attn_rng *attn_l_rng(lua_State *L);

/* Reads t[key] of the table at idx without metamethods (pushes it, returns
 * its type): options are read raw, so no Lua code runs inside a call. */
int attn_l_rawfield(lua_State *L, int idx, const char *key);
/* Whether Lua is running a finalizer now (possibly from an allocation inside
 * another binding call, whose operands must then stay untouched). */
int attn_l_in_finalizer(lua_State *L);

/* Releases t's storage reference (as attn_tensor_free), telling the GC
 * pacing when that frees the storage's bytes. Every release of a tensor the
 * binding made goes through here. */
void attn_l_release(lua_State *L, attn_tensor *t);

/* A fused op's saved buffer (attn_saved.h): allocates one flat tensor with l's entries, of dt (the
 * op's dtype; the layout's own when it fixes one, attn_saved_dtype: so for every dt below), and
 * pushes a table of contiguous views of it, one field per part (saved.qh, saved.kh, ...), and the
 * flat tensor as saved.buffer. The views are made on first read (and by pairs), so a forward
 * whose parts nobody reads makes none; they view the forward's buffer even after saved.buffer
 * is reassigned, as eager views would. Returns the flat tensor for the kernel (a struct copy: the table
 * keeps the storage alive). `extra`: the fields the op sets in the table after (its size). Push every
 * output before taking raw pointers, as for attn_l_push_alloc. */
attn_tensor attn_l_push_saved(lua_State *L, const attn_saved_layout *l, attn_dtype dt, int extra);
/* saved.buffer of the saved table at idx, for a backward: each part must be the forward's view
 * of it with the shape of l (the layout recomputed from the backward's operands; a part never
 * read is checked through the forward's layout kept in the table); raises naming
 * fn, the part and both shapes otherwise. */
attn_tensor attn_l_check_saved(lua_State *L, int idx, const attn_saved_layout *l, attn_dtype dt, const char *fn);

/* Registers fns into the table on top, each wrapped so that what may run Lua
 * code (GC steps paid for tensor bytes, frees requested by finalizers) runs
 * only after the function has returned and its results are on the stack. */
void attn_l_setfuncs(lua_State *L, const luaL_Reg *fns);

/* The upvalues of every binding closure (attn_l_setfuncs, attn_l_pushclosure): the per-state
 * values the binding reads on every call ride in them, where reading one is an index. In the
 * registry they sat under static pointer keys, whose lookup cost depended on where the addresses
 * hashed (a tensor check and creation each read the metatable). A function registered otherwise
 * reads the registry (attn_l_kept). */
#define ATTN_L_UP_REG 1       /* its luaL_Reg entry (light userdata; NULL for a metamethod) */
#define ATTN_L_UP_STATE 2     /* the per-state data (light userdata) */
#define ATTN_L_UP_TENSOR_MT 3 /* the tensor metatable */
#define ATTN_L_UP_SAVED_MT 4  /* the saved tables' metatable (nil in its own metamethods) */
#define ATTN_L_UPVALUES 4

/* Whether the running function is a binding closure. Upvalue 1 a light userdata marks one: the
 * binding's other C closures (the tensor __index, __newindex) hold tables there. */
static inline int attn_l_bound(lua_State *L) {
  return lua_type(L, lua_upvalueindex(ATTN_L_UP_REG)) == LUA_TLIGHTUSERDATA;
}
/* The pseudo-index of the running function's upvalue `slot` when it is a binding closure that
 * holds a table there, else 0 (read the registry). */
static inline int attn_l_kept(lua_State *L, int slot) {
  return attn_l_bound(L) && lua_type(L, lua_upvalueindex(slot)) == LUA_TTABLE ? lua_upvalueindex(slot) : 0;
}
/* Pushes f as a binding closure (ATTN_L_UP_*, no luaL_Reg, no saved tables' metatable): for
 * metamethods, which attn_l_setfuncs does not wrap. Needs the tensor metatable made. */
void attn_l_pushclosure(lua_State *L, lua_CFunction f);
/* Pushes the saved tables' metatable, made on first use (src/bind/lsaved.c). */
void attn_l_push_saved_mt(lua_State *L);

/* Registration of each binding file's functions into the table on top. */
void attn_l_open_tensor(lua_State *L);
void attn_l_open_graph(lua_State *L);
void attn_l_open_math(lua_State *L);
void attn_l_open_linalg(lua_State *L);
void attn_l_open_attention(lua_State *L);
void attn_l_open_io(lua_State *L);
void attn_l_open_rnn(lua_State *L);
void attn_l_open_norm(lua_State *L);
void attn_l_open_optim(lua_State *L);
void attn_l_open_loss(lua_State *L);
void attn_l_open_conv(lua_State *L);
void attn_l_open_linear(lua_State *L);
void attn_l_open_rope(lua_State *L);
void attn_l_open_tokens(lua_State *L);

#define ATTN_L_TRY(L, call)                         \
  do {                                              \
    if ((call) != ATTN_OK) return attn_l_raise(L);  \
  } while (0)

#endif
