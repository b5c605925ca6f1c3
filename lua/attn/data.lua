--- Deprecated: the old name of `attn.d2l.data`, kept for one release (see
-- CHANGELOG.md, Unreleased). `require "attn.data"` returns the same table as
-- `require "attn.d2l.data"`; use the new name.
-- @module attn.data
return require "attn.d2l.data" -- deprecated alias: the book's kit moved to lua/attn/d2l/
