-- LuaRocks package of attn. From a checkout: `luarocks make` builds with the
-- Makefile (LuaRocks passes its compiler and install variables, see
-- build_variables and install_variables) and installs into the rock tree;
-- `luarocks remove attn` removes it.
rockspec_format = "3.0"
package = "attn"
version = "0.1.0-1"
source = {
  -- Built from the working copy: `luarocks make` in the checkout.
  url = "file://.",
}
description = {
  summary = "Attention mechanisms for Lua 5.4: tensors over a C core, autograd, layers",
  detailed = [[
A numeric engine for the attention chapter of Dive into Deep Learning: a
Lua-free C core over OpenBLAS and LAPACKE, a Lua 5.4 binding, reverse-mode
autograd, attention kernels (masked softmax, scaled dot-product, additive,
multi-head), nn layers with PyTorch's parameter names, optimisers,
safetensors checkpoints and attention heatmaps.]],
  license = "MIT",
  labels = { "tensor", "attention", "deep-learning", "autograd" },
}
dependencies = {
  "lua >= 5.4, < 5.5",
  "lua-cjson >= 2.1",
}
external_dependencies = {
  OPENBLAS = { library = "openblas" },
  LAPACKE = { header = "lapacke.h", library = "lapacke" },
  CAIRO = { header = "cairo/cairo.h", library = "cairo" },
}
build = {
  type = "make",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
    LIBFLAG = "$(LIBFLAG)",
    LUA_INCDIR = "$(LUA_INCDIR)",
    LUA = "$(LUA)",
    NO_DEPS = "1",
  },
  install_variables = {
    LUADIR = "$(LUADIR)",
    LIBDIR = "$(LIBDIR)",
    NO_DEPS = "1",
  },
}
