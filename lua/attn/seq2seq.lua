--- Deprecated: the old name of `attn.d2l.train`, kept for one release (see
-- CHANGELOG.md, Unreleased). `require "attn.seq2seq"` returns the same table as
-- `require "attn.d2l.train"`; use the new name.
-- @module attn.seq2seq
return require "attn.d2l.train" -- deprecated alias: the book's kit moved to lua/attn/d2l/
