-- The book's kit under its new names, and the deprecated old names (one
-- release): each old module name is the same table as the new one, except
-- attn.data, now a general module that also holds the kit's data names.
local attn = require "attn"

local MOVED = { metrics = "metrics", seq2seq = "train", translation = "translation", cli = "cli",
  report = "report" }

describe("attn.d2l", function()
  it("is a package of the kit's modules, loaded on first use", function()
    local d2l = require "attn.d2l"
    assert.equal(d2l, attn.d2l)
    for _, new in pairs(MOVED) do
      assert.equal(require("attn.d2l." .. new), d2l[new], new)
    end
    assert.equal(require "attn.d2l.data", d2l.data)
    assert.is_nil(d2l.no_such_module)
    assert.is_nil(d2l.plot) -- plot and progress stay general: attn.plot, attn.progress
  end)

  it("keeps the deprecated old names as the same tables", function()
    for old, new in pairs(MOVED) do
      local m = require("attn.d2l." .. new)
      assert.equal("table", type(m))
      assert.equal(m, require("attn." .. old), "attn." .. old)
    end
    -- attn.data is a general module of its own now, which holds every name of
    -- the kit's data module (the same values) for one release
    local general, kit = require "attn.data", require "attn.d2l.data"
    assert.are_not.equal(kit, general)
    local n = 0
    for k, v in pairs(kit) do
      assert.equal(v, general[k], "attn.data." .. k)
      n = n + 1
    end
    assert.is_true(n >= 10)
    assert.equal(kit.Vocab, general.Vocab)
    assert.equal("function", type(general.read_idx))
    assert.is_nil(kit.read_idx)
    assert.equal(require "attn.d2l.train", attn.seq2seq) -- the facade's old name
    assert.equal(require("attn.d2l.train").train_seq2seq, require("attn.seq2seq").train_seq2seq)
  end)
end)
