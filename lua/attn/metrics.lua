--- Deprecated: the old name of `attn.d2l.metrics`, kept for one release (see
-- CHANGELOG.md, Unreleased). `require "attn.metrics"` returns the same table as
-- `require "attn.d2l.metrics"`; use the new name.
-- @module attn.metrics
return require "attn.d2l.metrics" -- deprecated alias: the book's kit moved to lua/attn/d2l/
