--- `attn.nn.fused`: the one switch and the one rule for every layer and function that has a
-- fused C path and a composed Lua path.
--
-- **The rule.** A dual-path module defines three methods and lets `forward` end with
-- `return fused.forward(self, ...)`:
--
-- - `can_fuse(...)`: whether the fused path can run this call (shapes, dtypes, options,
--   training dropout, stock children: a replaced sublayer is simply not eligible);
-- - `fused_forward(...)`: the fused path (one C call, one autograd node);
-- - `composed_forward(...)`: the same numbers composed from tensor ops and child modules.
--
-- The dispatcher runs `fused_forward` when fused paths are on (`set_fused`), the module's
-- own `fused` field is not false, and `can_fuse` says yes; otherwise `composed_forward`.
-- A function with both paths (`cross_entropy` and `cross_entropy_composed`, ...) and the
-- optimisers' fused steps ask `choose` instead. A new fused layer joins by following the
-- rule and adding a row to spec/nn/fused_paths_spec.lua.
--
-- **The switch.** `attn.nn.set_fused(false)` turns every fused path off at once (layers,
-- functions, optimiser steps): the first thing to try when a number looks wrong, as
-- `ATTN_ISA=generic` is for the SIMD kernels. "Reference" names only the C kernels' plain
-- reference path (`kernel = "reference"`), never a composed path.
--
-- The dispatcher reads fields raw and allocates nothing: the book's calls are a few
-- microseconds long.
-- @module attn.nn.fused
-- @usage
-- attn.nn.set_fused(false)   -- every layer, loss and optimiser takes its composed path
-- local loss = model(X) ...
-- attn.nn.set_fused(true)
local M = {}

local enabled = true
local trace = nil

--- Turns every fused path on (true, the default) or off (false).
-- @tparam boolean on
-- @treturn boolean whether fused paths were on before
-- @raise when `on` is not a boolean
function M.set_fused(on)
  if type(on) ~= "boolean" then error("set_fused: expected a boolean, got a " .. type(on), 2) end
  local before = enabled
  enabled = on
  return before
end

--- Whether fused paths are on (see `set_fused`).
-- @treturn boolean
function M.enabled() return enabled end

--- Sets a function called as `fn(who, path)` at every choice (`who` the module, optimiser or
-- function name; `path` "fused" or "composed"), or nil to stop; for specs and debugging.
-- @tparam[opt] function fn
-- @treturn function|nil the previous one
function M.set_trace(fn)
  local before = trace
  trace = fn
  return before
end

--- The choice of a function with both paths, or an optimiser's step: true (run the fused
-- path) when fused paths are on and `eligible` is not false (the caller's own option and
-- checks); reported to the trace as `who`.
-- @param who the name or object the trace reports
-- @param[opt] eligible false to take the composed path
-- @treturn boolean
function M.choose(who, eligible)
  local on = enabled and eligible ~= false
  if trace ~= nil then trace(who, on and "fused" or "composed") end
  return on
end

--- Whether module `m` may take its fused path at all: fused paths are on and its `fused`
-- field (its attribute, else its class's) is not false. A composite's `can_fuse` asks this
-- of the children its fused path replaces.
-- @tparam Module m
-- @treturn boolean
function M.allowed(m)
  if not enabled then return false end
  local v = rawget(m, "_attrs").fused
  if v == nil then v = getmetatable(m).fused end
  return v ~= false
end

--- Runs module `m` on `...` by the rule (see the module comment): `m:fused_forward(...)` or
-- `m:composed_forward(...)`, returning what it returns.
-- @tparam Module m a module defining can_fuse, fused_forward and composed_forward
-- @param ... forward's arguments
function M.forward(m, ...)
  local cls = getmetatable(m)
  local v = rawget(m, "_attrs").fused -- (allowed, inline: the book's calls are short)
  if v == nil then v = cls.fused end
  if enabled and v ~= false and cls.can_fuse(m, ...) then
    if trace ~= nil then trace(m, "fused") end
    return cls.fused_forward(m, ...)
  end
  if trace ~= nil then trace(m, "composed") end
  return cls.composed_forward(m, ...)
end

return M
