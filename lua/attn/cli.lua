--- Deprecated: the old name of `attn.d2l.cli`, kept for one release (see
-- CHANGELOG.md, Unreleased). `require "attn.cli"` returns the same table as
-- `require "attn.d2l.cli"`; use the new name.
-- @module attn.cli
return require "attn.d2l.cli" -- deprecated alias: the book's kit moved to lua/attn/d2l/
