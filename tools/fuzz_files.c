/* libFuzzer harness for the file readers (`make fuzz-files`). The first byte
 * of an input picks the reader: attn.load (safetensors), attn.load_npy or
 * attn.d2l.data.read_fra_eng (the corpus reader); the rest is the file. The C
 * module is linked in (coverage-instrumented) and preloaded as attn.core.
 * A reader may return nil, message; a raise from load or load_npy is a
 * finding (format problems must not raise), and so is any sanitizer report. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

int luaopen_attn_core(lua_State *L);
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lua_State *L;
static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  L = luaL_newstate();
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_attn_core);
  lua_setfield(L, -2, "attn.core");
  lua_pop(L, 1);
  snprintf(path, sizeof path, "/tmp/attn-fuzz-files.%ld", (long)getpid());
  if (luaL_dostring(L, "local attn = require 'attn'\n"
                       "attn.core.set_max_request(64 << 20)\n"
                       "return { attn.load, attn.load_npy, require('attn.d2l.data').read_fra_eng }") != LUA_OK) {
    fprintf(stderr, "fuzz_files: %s\n", lua_tostring(L, -1));
    exit(1);
  }
  lua_setglobal(L, "ATTN_FUZZ_READERS");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(data + 1, 1, size - 1, f);
  fclose(f);
  int reader = data[0] % 3;
  lua_getglobal(L, "ATTN_FUZZ_READERS");
  lua_rawgeti(L, -1, reader + 1);
  lua_pushstring(L, path);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK && reader < 2) {
    fprintf(stderr, "fuzz_files: reader %d raised: %s\n", reader, lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 0);
  unlink(path);
  return 0;
}
