/* Binding: attention functions (being written). */
#include "lbind.h"

void attn_l_open_attention(lua_State *L) { (void)L; }
