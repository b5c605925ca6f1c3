--- Deprecated: the old name of `attn.d2l.report`, kept for one release (see
-- CHANGELOG.md, Unreleased). `require "attn.report"` returns the same table as
-- `require "attn.d2l.report"`; use the new name.
-- @module attn.report
return require "attn.d2l.report" -- deprecated alias: the book's kit moved to lua/attn/d2l/
