/* Binding: autograd graph bookkeeping (lua/attn/autograd.lua): a node's checks in one
 * call each, instead of a metatable test, a field read through __index and a
 * version read per tensor from Lua. A tensor's autograd state is in its user
 * values (lbind.h): the node that made it (grad_fn) and its position among
 * the node's outputs (_oi) in slots, and the requires-grad flag of a leaf
 * (_rg) in its fields table; a tensor a node made requires grad. Only raw
 * access: no metamethod runs. */
#include "bind/lbind.h"

/* Pushes the grad_fn slot of the tensor at idx (nil for a leaf), or nil when
 * the value is not a tensor; returns the type pushed. */
static int push_grad_fn(lua_State *L, int idx) {
  if (!attn_l_is_tensor(L, idx)) {
    lua_pushnil(L);
    return LUA_TNIL;
  }
  return lua_getiuservalue(L, idx, ATTN_L_UV_GRAD_FN);
}

/* Whether the tensor at idx (any value) requires grad: a node made it, or it
 * is a leaf whose flag is set. */
static int requires_grad_at(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  if (push_grad_fn(L, idx) != LUA_TNIL) {
    lua_pop(L, 1);
    return 1;
  }
  lua_pop(L, 1);
  if (!attn_l_is_tensor(L, idx)) return 0;
  if (lua_getiuservalue(L, idx, ATTN_L_UV_FIELDS) != LUA_TTABLE) {
    lua_pop(L, 1);
    return 0;
  }
  lua_pushliteral(L, "_rg");
  int yes = lua_rawget(L, -2) == LUA_TBOOLEAN && lua_toboolean(L, -1);
  lua_pop(L, 2);
  return yes;
}

/* graph_requires(...): whether any argument is a tensor that requires grad. */
static int l_graph_requires(lua_State *L) {
  int n = lua_gettop(L), yes = 0;
  for (int i = 1; i <= n && !yes; i++) yes = requires_grad_at(L, i);
  lua_pushboolean(L, yes);
  return 1;
}

/* graph_requires_in(list): the same over list[1..#list] (a table). */
static int l_graph_requires_in(lua_State *L) {
  attn_l_checktable(L, 1, "inputs");
  lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
  int yes = 0;
  for (lua_Integer i = 1; i <= n && !yes; i++) {
    lua_rawgeti(L, 1, i);
    yes = requires_grad_at(L, -1);
    lua_pop(L, 1);
  }
  lua_pushboolean(L, yes);
  return 1;
}

/* graph_target(input, g): where backward sends g, the gradient of input:
 * input's node (a table), true for a tensor that requires grad and has no
 * node (a leaf), false otherwise; then whether g has input's shape (checked
 * only when there is a target). */
static int l_graph_target(lua_State *L) {
  int type = push_grad_fn(L, 1);
  if (type == LUA_TNIL || type == LUA_TBOOLEAN) {
    lua_pop(L, 1);
    if (!requires_grad_at(L, 1)) {
      lua_pushboolean(L, 0);
      return 1;
    }
    lua_pushboolean(L, 1);
  }
  const attn_tensor *x = attn_l_check(L, 1), *g = attn_l_test(L, 2);
  lua_pushboolean(L, g && attn_l_same_shape(g, x));
  return 2;
}

/* graph_root(root, grad): what backward starts from: root's node (a table),
 * true for a leaf that requires grad, or false when root is no tensor that
 * requires grad; then whether grad is a tensor of root's dtype and shape
 * (false for nil). */
static int l_graph_root(lua_State *L) {
  lua_settop(L, 2);
  if (push_grad_fn(L, 1) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_pushboolean(L, requires_grad_at(L, 1));
  }
  const attn_tensor *r = attn_l_test(L, 1), *g = attn_l_test(L, 2);
  lua_pushboolean(L, r && g && g->dtype == r->dtype && attn_l_same_shape(g, r));
  return 2;
}

/* Sum of the write versions of the tensors in the table at idx (others skipped). */
static lua_Integer list_versions(lua_State *L, int idx) {
  lua_Integer sum = 0, n = (lua_Integer)lua_rawlen(L, idx);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);
    const attn_tensor *t = attn_l_test(L, -1);
    if (t) sum = (lua_Integer)((uint64_t)sum + t->storage->version);
    lua_pop(L, 1);
  }
  return sum;
}

/* The version sum of a node's inputs (the list at `inputs`) and its output
 * or list of outputs (at `out`) (see autograd.lua). */
static lua_Integer node_versions(lua_State *L, int inputs, int out) {
  attn_l_checktable(L, inputs, "inputs");
  lua_Integer sum = list_versions(L, inputs);
  const attn_tensor *t = attn_l_test(L, out);
  if (t) return (lua_Integer)((uint64_t)sum + t->storage->version);
  attn_l_checktable(L, out, "outputs");
  return (lua_Integer)((uint64_t)sum + (uint64_t)list_versions(L, out));
}

/* graph_versions(inputs, out): the version sum of a node's inputs and its
 * output (a tensor) or outputs (a list) now. */
static int l_graph_versions(lua_State *L) {
  lua_pushinteger(L, node_versions(L, 1, 2));
  return 1;
}

/* Marks the tensor at idx as made by the node at `node` (in slots: see
 * lbind.h), and for one of several outputs, its position. */
static void mark_output(lua_State *L, int idx, int node, lua_Integer position) {
  attn_l_check(L, idx);
  lua_pushvalue(L, node);
  lua_setiuservalue(L, idx, ATTN_L_UV_GRAD_FN);
  if (position > 0) {
    lua_pushinteger(L, position);
    lua_setiuservalue(L, idx, ATTN_L_UV_OUTPUT);
  }
}

/* Whether a value of the list at `outs` (or the value at `outs` itself when
 * `single`) is one of the list at `inputs` (raw identity). */
static int returns_input(lua_State *L, int inputs, int outs, int single) {
  lua_Integer nin = (lua_Integer)lua_rawlen(L, inputs), nout = single ? 1 : (lua_Integer)lua_rawlen(L, outs);
  for (lua_Integer k = 1; k <= nout; k++) {
    if (single) lua_pushvalue(L, outs);
    else lua_rawgeti(L, outs, k);
    for (lua_Integer i = 1; i <= nin; i++) {
      lua_rawgeti(L, inputs, i);
      int same = lua_rawequal(L, -1, -2);
      lua_pop(L, 1);
      if (same) {
        lua_pop(L, 1);
        return 1;
      }
    }
    lua_pop(L, 1);
  }
  return 0;
}

/* graph_link(node, inputs, out): marks out (a tensor), or each tensor of the
 * list out, as made by node and returns the version sum of inputs and out
 * (node.vsum); or, when out is (or holds) one of the inputs, marks nothing
 * and returns false: the op was the identity (to() of the same dtype,
 * contiguous() of a contiguous tensor) and its input carries its history. */
static int l_graph_link(lua_State *L) {
  lua_settop(L, 3);
  if (!lua_istable(L, 1)) attn_l_argerror(L, 1, "node", "a table");
  lua_Integer vsum = node_versions(L, 2, 3);
  int single = lua_type(L, 3) != LUA_TTABLE;
  if (returns_input(L, 2, 3, single)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (!single) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, 3);
    for (lua_Integer k = 1; k <= n; k++) {
      lua_rawgeti(L, 3, k);
      mark_output(L, 4, 1, k);
      lua_pop(L, 1);
    }
  } else {
    mark_output(L, 3, 1, 0);
  }
  lua_pushinteger(L, vsum);
  return 1;
}

/* graph_order(root, order, visited, stack_node, stack_pos): appends to
 * `order` the nodes reachable from the node root through their inputs'
 * grad_fn, each after every node it reaches (a topological order; backward
 * runs it from the end), and sets visited[node] = true for each. An
 * iterative walk over the two stack lists (empty on entry and on return), so
 * deep graphs need no C stack. Returns nothing, or a node whose graph an
 * earlier backward freed (its inputs are gone). Only raw access. */
static int l_graph_order(lua_State *L) {
  lua_settop(L, 5);
  for (int i = 2; i <= 5; i++) attn_l_checktable(L, i, "work list");
  if (!lua_istable(L, 1)) attn_l_argerror(L, 1, "root", "a node");
  lua_Integer top = 1, n = (lua_Integer)lua_rawlen(L, 2);
  lua_pushvalue(L, 1);
  lua_rawseti(L, 4, 1);
  lua_pushinteger(L, 1);
  lua_rawseti(L, 5, 1);
  while (top > 0) {
    lua_rawgeti(L, 4, top); /* node: 6 */
    lua_rawgeti(L, 5, top);
    lua_Integer i = lua_tointeger(L, -1);
    lua_pop(L, 1);
    if (i == 1) {
      lua_pushvalue(L, 6);
      if (lua_rawget(L, 3) != LUA_TNIL) { /* reached before through another path */
        lua_pop(L, 2);
        lua_pushnil(L);
        lua_rawseti(L, 4, top);
        lua_pushnil(L);
        lua_rawseti(L, 5, top);
        top--;
        continue;
      }
      lua_pop(L, 1);
      lua_pushvalue(L, 6);
      lua_pushboolean(L, 1);
      lua_rawset(L, 3);
    }
    if (attn_l_rawfield(L, 6, "inputs") != LUA_TTABLE) { /* 7: freed by an earlier backward */
      lua_pop(L, 1);
      for (; top > 0; top--) { /* leave the stacks empty */
        lua_pushnil(L);
        lua_rawseti(L, 4, top);
        lua_pushnil(L);
        lua_rawseti(L, 5, top);
      }
      return 1; /* the node */
    }
    lua_Integer nin = (lua_Integer)lua_rawlen(L, 7);
    int pushed = 0;
    for (; i <= nin && !pushed; i++) {
      lua_rawgeti(L, 7, i);
      if (push_grad_fn(L, -1) == LUA_TTABLE) {
        lua_pushvalue(L, -1);
        if (lua_rawget(L, 3) == LUA_TNIL) { /* a child not reached yet: walk it next */
          lua_pop(L, 1);
          lua_pushinteger(L, i + 1);
          lua_rawseti(L, 5, top);
          top++;
          lua_rawseti(L, 4, top); /* the child */
          lua_pushinteger(L, 1);
          lua_rawseti(L, 5, top);
          pushed = 1;
        } else {
          lua_pop(L, 2);
        }
      } else {
        lua_pop(L, 1);
      }
      lua_pop(L, 1); /* the input */
    }
    if (!pushed) { /* every input done: the node follows its children */
      lua_pushvalue(L, 6);
      lua_rawseti(L, 2, ++n);
      lua_pushnil(L);
      lua_rawseti(L, 4, top);
      lua_pushnil(L);
      lua_rawseti(L, 5, top);
      top--;
    }
    lua_settop(L, 5);
  }
  return 0;
}

static const luaL_Reg graph_functions[] = {
    {"graph_requires", l_graph_requires}, {"graph_requires_in", l_graph_requires_in},
    {"graph_target", l_graph_target},     {"graph_versions", l_graph_versions},
    {"graph_link", l_graph_link},         {"graph_order", l_graph_order},
    {"graph_root", l_graph_root},         {NULL, NULL},
};

void attn_l_open_graph(lua_State *L) { attn_l_setfuncs(L, graph_functions); }
