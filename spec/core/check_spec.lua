local attn = require "attn"
local check = require "attn.check"
local data = require "attn.d2l.data"

-- The one option-table checker and the shared argument checks: their messages,
-- and that every caller's error points at the user's line.
describe("attn.check", function()
  local THIS_FILE = "check_spec.lua"

  local function message(f, ...)
    local ok, err = pcall(f, ...)
    assert.is_false(ok, "expected an error")
    return tostring(err)
  end

  it("names the unknown key and the allowed ones: a list in its order, a set sorted", function()
    assert.is_nil(check.unknown_option("f", { b = 1, a = 2 }, { "a", "b" }))
    assert.equal("f: unknown option 'c' (expected b, a)", check.unknown_option("f", { c = 1 }, { "b", "a" }))
    assert.equal("f: unknown option 'c' (expected a, b, z)",
      check.unknown_option("f", { c = 1 }, { z = true, b = true, a = true }))
    assert.equal("f: unknown option '1' (expected a)", check.unknown_option("f", { 5 }, { a = true }))
  end)

  it("options: nil gives an empty table, a good table comes back as it is", function()
    assert.same({}, check.options("f", nil, { a = true }))
    local opts = { a = 1 }
    assert.equal(opts, check.options("f", opts, { "a" }))
    assert.matches("f: options must be a table, got a number", message(check.options, "f", 3, { a = true }, 1), 1, true)
  end)

  it("core.shape_str is the one shape format: a tensor, or any list of integers", function()
    local shape_str = attn.core.shape_str
    assert.equal("[2x3]", shape_str(attn.zeros(2, 3)))
    assert.equal("[]", shape_str(attn.tensor(1)))
    assert.equal("[]", shape_str({}))
    assert.equal("[0x5]", shape_str({ 0, 5 }))
    -- as read from a bad file: more dims than a tensor has, negative sizes
    assert.equal("[1x2x3x4x5x6x7x8x9x10]", shape_str({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }))
    assert.equal("[-1x4611686018427387904]", shape_str({ -1, 1 << 62 }))
    local many = {}
    for i = 1, 1000 do many[i] = 7 end
    local long = shape_str(many)
    assert.truthy(#long < 170 and long:find("^%[7x7x") and long:find("%.%.%.%]$"), long)
    assert.matches("shape_str: size 2 is 1.5, not an integer", message(shape_str, { 1, 1.5 }), 1, true)
    assert.matches("shape_str: size 1 is a table, not an integer", message(shape_str, { {} }), 1, true)
  end)

  it("refuses a tensor as the allowed names instead of walking its 2^40 rows (make fuzz, seed 31337)", function()
    local huge = attn.zeros(1, 0):expand(1 << 40, 0)
    assert.matches("unknown_option: allowed must be a table of names, got a userdata",
      message(check.options, "f", { dtype = "int64" }, huge, 1), 1, true)
    assert.matches("unknown_option: opts must be a table, got a string",
      message(check.unknown_option, "f", "x", { a = true }), 1, true)
  end)

  it("lua_type returns the value or names the expected and the given type", function()
    assert.equal("a", check.lua_type("f", "s", "a", "string"))
    assert.matches("f: s must be a string, got a nil", message(check.lua_type, "f", "s", nil, "string", 1), 1, true)
  end)

  it("positive_int and tensor", function()
    assert.equal(3, check.positive_int("f", "n", 3))
    for _, bad in ipairs { 0, -1, 1.5, "2" } do
      local err = message(check.positive_int, "f", "n", bad, 1)
      assert.matches("f: n must be a positive integer, got " .. tostring(bad), err, 1, true)
    end
    local x = attn.zeros(2, 3)
    assert.equal(x, check.tensor("f", "x", x, 2, "(B, n)"))
    local err = message(check.tensor, "f", "x", {}, 2, "(B, n)", 1)
    assert.matches("f: x must be a tensor (B, n), got a table", err, 1, true)
    assert.matches("f: x must be (B, n, d), got [2x3]", message(check.tensor, "f", "x", x, 3, "(B, n, d)", 1), 1, true)
    assert.matches("f: x must be 1-D, got [2x3]", message(check.tensor, "f", "x", x, 1, nil, 1), 1, true)
  end)

  -- Each public caller raises at the user's line with the shared message (the
  -- cases keep their frame: a tail call would leave no line to blame).
  local callers = {
    { "zeros: unknown option 'dtyp' (expected dtype, requires_grad)",
      function() local r = attn.zeros(2, { dtyp = 1 }); return r end },
    { "Linear: unknown option 'biass' (expected bias, dtype)",
      function() local r = attn.nn.Linear(2, 2, { biass = 1 }); return r end },
    { "DotProductAttention: unknown option 'drop' (expected dropout)",
      function() local r = attn.nn.DotProductAttention { drop = 0.1 }; return r end },
    { "MultiHeadAttention: num_heads must be a positive integer, got 0",
      function() local r = attn.nn.MultiHeadAttention { num_hiddens = 4, num_heads = 0, dropout = 0 }; return r end },
    { "dot_product_attention: unknown option 'valid_len' (expected alibi, bias, causal, dropout, global, mask, "
      .. "need_weights, pattern, scale, stride, summary, training, valid_lens, window)", function()
        local q = attn.zeros(1, 2, 4)
        local r = attn.dot_product_attention(q, q, q, { valid_len = 1 })
        return r
      end },
    { "progress.new: unknown option 'totl' (expected clock, every, label, out, total, tty, unit)",
      function() local r = require("attn.progress").new { totl = 3 }; return r end },
    { "GELU: options must be a table, got a string", function() local r = attn.nn.GELU("tanh"); return r end },
    { "split_heads: num_heads must be a positive integer, got 0",
      function() local r = attn.split_heads(attn.zeros(1, 2, 4), 0); return r end },
    { "BatchNorm1d: num_features must be a positive integer, got 0",
      function() local r = attn.nn.BatchNorm1d(0); return r end },
    -- found by make fuzz: these raised Lua runtime errors inside lua/attn
    { "lower: s must be a string, got a nil", function() local r = data.lower(nil); return r end },
    { "preprocess: text must be a string, got a number", function() local r = data.preprocess(1); return r end },
    { "split: s must be a string, got a table", function() local r = data.split({}); return r end },
    { "truncate_pad: ids must be a table, got a nil",
      function() local r = data.truncate_pad(nil, 4, 1); return r end },
    { "build_array: lines must be a table, got a string",
      function() local r = data.build_array("go .", {}, 4); return r end },
    { "build_array: vocab must be a table, got a nil",
      function() local r = data.build_array({}, nil, 4); return r end },
    { "backward: options must be a table, got a number", function()
        local x = attn.ones({ 1 }, { requires_grad = true })
        local r = x:sum():backward(nil, 5)
        return r
      end },
    { "sum_to: shape must be a table of at most 1 sizes (the gradient is [0]), got a userdata",
      function() local r = attn.autograd.sum_to(attn.zeros(0), attn.zeros(2 ^ 40, 0)); return r end },
    { "sum_to: shape must be a table of at most 1 sizes (the gradient is [3]), got 2 sizes",
      function() local r = attn.autograd.sum_to(attn.zeros(3), { 1, 3 }); return r end },
    { "needs_grad: inputs must be a table of values, got a userdata",
      function() local r = attn.autograd.needs_grad(attn.zeros(1):expand(1 << 62)); return r end },
    { "record: out must be a tensor or a table of tensors, got a number", function()
        local r = attn.autograd.record("f", 1, { attn.zeros({ 1 }, { requires_grad = true }) }, function() end)
        return r
      end },
    { "gradcheck: inputs must be a table, got a nil",
      function() local r = attn.autograd.gradcheck(function(x) return x end, nil); return r end },
  }
  for _, case in ipairs(callers) do
    it("blames the user's line: " .. case[1]:match("^[^:]+"), function()
      local err = message(case[2])
      assert.truthy(err:find(case[1], 1, true), "got: " .. err)
      assert.truthy(err:find(THIS_FILE, 1, true), "the error should point at this spec's line, got: " .. err)
    end)
  end

  it("optim returns the same message as the others raise", function()
    local p = attn.zeros({ 2 }, { dtype = "float32", requires_grad = true })
    local err = message(function() return attn.optim.SGD { params = { p }, lr = 0.1, momentun = 0.9 } end)
    assert.truthy(err:find("SGD: unknown option 'momentun' (expected ", 1, true), err)
  end)
end)
