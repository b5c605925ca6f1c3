/* Binding: linalg functions (being written). */
#include "lbind.h"

void attn_l_open_linalg(lua_State *L) { (void)L; }
