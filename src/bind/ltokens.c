/* A vocabulary's tokens and their ids in one userdata (attn.d2l.data's Vocab).
 *
 * A Lua table of tokens is one string object per token, and every full
 * collection marks and sweeps each: a whole-corpus vocabulary (30,000 tokens)
 * cost a training loop ~8 ms per full collection, which its tensors trigger
 * about once per step. Here the tokens are bytes in the userdata's own block,
 * with an open-addressing hash (FNV-1a, linear probing) from token to id:
 * one object for the collector, no finalizer, Lua counts its size. */
#include <stdint.h>
#include <string.h>

#include "bind/lbind.h"

static const char token_index_key = 0;

typedef struct {
  lua_Integer n;      /* tokens; ids 1..n */
  size_t cap;         /* hash slots, a power of two >= 2n */
  size_t *offsets;    /* n + 1: token i is bytes[offsets[i - 1], offsets[i]) */
  lua_Integer *slots; /* cap: 0 empty, else an id */
  char *bytes;
} token_index;

static uint64_t hash_bytes(const char *s, size_t len) {
  uint64_t h = 14695981039346656037u;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211u;
  return h;
}

static token_index *check_index(lua_State *L, int arg) {
  token_index *ix = NULL;
  if (lua_type(L, arg) == LUA_TUSERDATA && lua_getmetatable(L, arg)) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &token_index_key);
    if (lua_rawequal(L, -1, -2)) ix = lua_touserdata(L, arg);
    lua_pop(L, 2);
  }
  if (!ix) attn_l_argerror(L, arg, "index", "a token index");
  return ix;
}

/* The id of s (0 when absent). */
static lua_Integer find(const token_index *ix, const char *s, size_t len) {
  size_t mask = ix->cap - 1;
  for (size_t h = hash_bytes(s, len) & mask;; h = (h + 1) & mask) {
    lua_Integer id = ix->slots[h];
    if (id == 0) return 0;
    size_t off = ix->offsets[id - 1];
    if (ix->offsets[id] - off == len && memcmp(ix->bytes + off, s, len) == 0) return id;
  }
}

/* token_index(tokens): an index of a list of strings, ids their positions (a repeated
 * token keeps its first id). */
static int l_token_index(lua_State *L) {
  attn_l_checktable(L, 1, "tokens");
  lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
  size_t total = 0;
  for (lua_Integer i = 1; i <= n; i++) {
    if (lua_rawgeti(L, 1, i) != LUA_TSTRING)
      attn_l_error(L, "%s: token %d is a %s, not a string", attn_l_fname(L), (int)i, luaL_typename(L, -1));
    total += lua_rawlen(L, -1);
    lua_pop(L, 1);
  }
  size_t cap = 8;
  while (cap < 2 * (size_t)n) cap *= 2;
  size_t head = sizeof(token_index), offs = ((size_t)n + 1) * sizeof(size_t), slots = cap * sizeof(lua_Integer);
  token_index *ix = lua_newuserdatauv(L, head + offs + slots + total, 0);
  ix->n = n;
  ix->cap = cap;
  ix->offsets = (size_t *)(void *)((char *)ix + head);
  ix->slots = (lua_Integer *)(void *)((char *)ix + head + offs);
  ix->bytes = (char *)ix + head + offs + slots;
  memset(ix->slots, 0, slots);
  size_t pos = 0;
  ix->offsets[0] = 0;
  for (lua_Integer i = 1; i <= n; i++) {
    size_t len;
    /* Allocating ix may have run finalizers (Lua code) that changed the table since it was
     * measured: a token that is no longer a string, or longer, must not be copied. */
    if (lua_rawgeti(L, 1, i) != LUA_TSTRING)
      attn_l_error(L, "%s: token %d changed to a %s while the index was built", attn_l_fname(L), (int)i,
                   luaL_typename(L, -1));
    const char *s = lua_tolstring(L, -1, &len);
    if (len > total - pos)
      attn_l_error(L, "%s: token %d grew while the index was built", attn_l_fname(L), (int)i);
    memcpy(ix->bytes + pos, s, len);
    pos += len;
    ix->offsets[i] = pos;
    size_t mask = cap - 1, h = hash_bytes(s, len) & mask;
    int seen = 0;
    for (; ix->slots[h] != 0; h = (h + 1) & mask) {
      lua_Integer id = ix->slots[h];
      size_t off = ix->offsets[id - 1];
      if (ix->offsets[id] - off == len && memcmp(ix->bytes + off, s, len) == 0) {
        seen = 1;
        break;
      }
    }
    if (!seen) ix->slots[h] = i;
    lua_pop(L, 1);
  }
  lua_rawgetp(L, LUA_REGISTRYINDEX, &token_index_key);
  lua_setmetatable(L, -2);
  return 1;
}

/* token_id(index, token): the token's id, or nil (also for a value that is not a string). */
static int l_token_id(lua_State *L) {
  token_index *ix = check_index(L, 1);
  lua_Integer id = 0;
  if (lua_type(L, 2) == LUA_TSTRING) {
    size_t len;
    const char *s = lua_tolstring(L, 2, &len);
    id = find(ix, s, len);
  }
  if (id) lua_pushinteger(L, id);
  else lua_pushnil(L);
  return 1;
}

/* token_ids(index, list, unk[, limit]): a new table of the ids of list[1..min(#list, limit)],
 * unk for a token not in the index (or not a string). */
static int l_token_ids(lua_State *L) {
  token_index *ix = check_index(L, 1);
  attn_l_checktable(L, 2, "list");
  lua_Integer unk = attn_l_checkinteger(L, 3, "unk");
  lua_Integer n = (lua_Integer)lua_rawlen(L, 2), limit = attn_l_optinteger(L, 4, "limit", n);
  if (limit < n) n = limit < 0 ? 0 : limit;
  lua_createtable(L, (int)n, 0);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_Integer id = 0;
    if (lua_rawgeti(L, 2, i) == LUA_TSTRING) {
      size_t len;
      const char *s = lua_tolstring(L, -1, &len);
      id = find(ix, s, len);
    }
    lua_pop(L, 1);
    lua_pushinteger(L, id ? id : unk);
    lua_rawseti(L, -2, i);
  }
  return 1;
}

/* token_at(index, id): the token of an id, or nil outside 1..n. */
static int l_token_at(lua_State *L) {
  token_index *ix = check_index(L, 1);
  lua_Integer id = attn_l_checkinteger(L, 2, "id");
  if (id < 1 || id > ix->n) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushlstring(L, ix->bytes + ix->offsets[id - 1], ix->offsets[id] - ix->offsets[id - 1]);
  return 1;
}

/* token_count(index): the number of tokens. */
static int l_token_count(lua_State *L) {
  lua_pushinteger(L, check_index(L, 1)->n);
  return 1;
}

/* token_list(index): a new list of the tokens, in id order. */
static int l_token_list(lua_State *L) {
  token_index *ix = check_index(L, 1);
  lua_createtable(L, (int)ix->n, 0);
  for (lua_Integer i = 1; i <= ix->n; i++) {
    lua_pushlstring(L, ix->bytes + ix->offsets[i - 1], ix->offsets[i] - ix->offsets[i - 1]);
    lua_rawseti(L, -2, i);
  }
  return 1;
}

static const luaL_Reg token_functions[] = {
    {"token_index", l_token_index}, {"token_id", l_token_id},       {"token_ids", l_token_ids},
    {"token_at", l_token_at},       {"token_count", l_token_count}, {"token_list", l_token_list},
    {NULL, NULL},
};

void attn_l_open_tokens(lua_State *L) {
  lua_newtable(L); /* the metatable: marks an index, no methods (the functions take it) */
  lua_pushliteral(L, "attn.TokenIndex");
  lua_setfield(L, -2, "__name");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &token_index_key);
  attn_l_setfuncs(L, token_functions);
}
