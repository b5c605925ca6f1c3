/* Binding: io functions (being written). */
#include "lbind.h"

void attn_l_open_io(lua_State *L) { (void)L; }
