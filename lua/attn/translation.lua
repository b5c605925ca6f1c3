--- Deprecated: the old name of `attn.d2l.translation`, kept for one release (see
-- CHANGELOG.md, Unreleased). `require "attn.translation"` returns the same table as
-- `require "attn.d2l.translation"`; use the new name.
-- @module attn.translation
return require "attn.d2l.translation" -- deprecated alias: the book's kit moved to lua/attn/d2l/
