-- nn.LSTM and nn.LSTMCell: naive step loops of PyTorch's equations (written below), finite
-- differences for the input, (h0, c0) and every parameter, the fused kernel against the
-- composed path (dropout streams, every instruction-set path), 1 and 2 threads, PyTorch 1.13
-- fixtures, and bad input. Fused against composed for every option: spec/nn/fused_paths_spec.lua.
local attn = require "attn"
local helper = require "helper"
local F = require "nn.torch_fixtures"
local lstm = require "attn.nn.lstm"
local R = require "nn.rnn_reference"
local nn = attn.nn

-- ---------------------------------------------------------------- naive reference (Lua numbers)
-- PyTorch 1.13 (torch/nn/modules/rnn.py, LSTM), gate order i, f, g, o, for an input x, state h
-- and cell c:
--   i  = sigmoid(W_ii x + b_ii + W_hi h + b_hi)      f = sigmoid(W_if x + b_if + W_hf h + b_hf)
--   g  = tanh(W_ig x + b_ig + W_hg h + b_hg)         o = sigmoid(W_io x + b_io + W_ho h + b_ho)
--   c' = f * c + i * g                               h' = o * tanh(c')
-- Layer k, direction d (0 forward, 1 reverse: steps T .. 1) starts from h0[k * D + d] and
-- c0[k * D + d] (zeros without a state); the output at step t is the forward then the reverse
-- state (2h wide), the input of layer k + 1; h_n, c_n[k * D + d] the direction's last ones.

local sigmoid, tanh, affine = R.sigmoid, R.tanh, R.affine

local function lstm_step(p, x, h, c, H)
  local a = {}
  for g = 0, 3 do
    local u, v = affine(p.w_ih, p.b_ih, x, g, H), affine(p.w_hh, p.b_hh, h, g, H)
    a[g] = {}
    for j = 1, H do a[g][j] = u[j] + v[j] end
  end
  local h2, c2 = {}, {}
  for j = 1, H do
    local i, f, g, o = sigmoid(a[0][j]), sigmoid(a[1][j]), tanh(a[2][j]), sigmoid(a[3][j])
    c2[j] = f * c[j] + i * g
    h2[j] = o * tanh(c2[j])
  end
  return h2, c2
end

-- X nested (T, B, in) time-major, h0, c0 nested (D L, B, H) or nil -> out (T, B, D H), hn, cn.
local function naive_lstm(m, X, h0, c0) return R.naive_layers(m, lstm_step, X, h0, c0, true) end
local swap12, randomize = R.swap12, helper.randomize

local TOL = { float32 = 2e-5, float64 = 1e-12 }

-- Outputs and every gradient of one call of m under fixed output gradients, as a flat list.
local function run(m, X, h0, c0, probes)
  for _, p in ipairs(m:parameters()) do p.grad = nil end
  for _, t in ipairs { X, h0, c0 } do t.grad = nil end
  local out, state = m(X, { h0, c0 })
  ;((out * probes[1]):sum() + (state[1] * probes[2]):sum() + (state[2] * probes[3]):sum()):backward()
  local r = { out, state[1], state[2], X.grad, h0.grad, c0.grad }
  for _, p in ipairs(m:parameters()) do r[#r + 1] = p.grad end
  return r
end

describe("nn.LSTM and nn.LSTMCell", function()
  before_each(function() attn.manual_seed(26) end)
  after_each(function()
    attn.set_num_threads(1)
    nn.set_fused(true)
  end)

  it("have PyTorch's keys, shapes, order, init bound and repr", function()
    local m = nn.LSTM(3, 4, 2, { bidirectional = true })
    assert.same({ "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_ih_l0_reverse",
      "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse", "weight_ih_l1", "weight_hh_l1",
      "bias_ih_l1", "bias_hh_l1", "weight_ih_l1_reverse", "weight_hh_l1_reverse", "bias_ih_l1_reverse",
      "bias_hh_l1_reverse" }, m:parameter_names())
    assert.same({ 16, 3 }, m.weight_ih_l0:shape())
    assert.same({ 16, 8 }, m.weight_ih_l1_reverse:shape())
    assert.same({ 16, 4 }, m.weight_hh_l1:shape())
    assert.same({ 16 }, m.bias_hh_l0:shape())
    for _, p in ipairs(m:parameters()) do assert.is_true(p:abs():max():item() <= 0.5) end
    assert.equal("LSTM(3, 4, num_layers=2, bidirectional=True)", tostring(m))
    assert.equal("LSTM(3, 4, bias=False, batch_first=True, dropout=0.2)",
      tostring(nn.LSTM(3, 4, 1, { bias = false, batch_first = true, dropout = 0.2 })))
    assert.same({ "weight_ih_l0", "weight_hh_l0" }, nn.LSTM(3, 4, 1, { bias = false }):parameter_names())
    assert.equal(0.3, nn.LSTM(3, 4, 2, 0.3).dropout)
    assert.equal("float64", nn.LSTM{ input_size = 3, hidden_size = 4, dtype = "float64" }.weight_hh_l0:dtype())
    assert.equal(0, nn.LSTM(3, 4, 1, { proj_size = 0 }).dropout)
    local c = nn.LSTMCell(3, 4)
    assert.same({ "weight_ih", "weight_hh", "bias_ih", "bias_hh" }, c:parameter_names())
    assert.same({ 16, 3 }, c.weight_ih:shape())
    assert.same({ 16, 4 }, c.weight_hh:shape())
    assert.equal("LSTMCell(3, 4, bias=False)", tostring(nn.LSTMCell(3, 4, { bias = false })))
  end)

  local configs = {
    { "2 layers", 2, {} },
    { "2 layers, bidirectional, batch_first", 2, { bidirectional = true, batch_first = true } },
    { "1 layer, no bias, bidirectional", 1, { bias = false, bidirectional = true } },
    { "3 layers, no bias", 3, { bias = false } },
  }
  for _, cfg in ipairs(configs) do
    local label, L, opts = table.unpack(cfg)
    it("matches the naive loops, " .. label .. " (both paths, float64 1e-12 and float32, batched and unbatched)",
      function()
        for _, dtype in ipairs { "float64", "float32" } do
          local o = helper.with(opts, { dtype = dtype })
          local m = randomize(nn.LSTM(3, 4, L, o), 0.5)
          local D, T, B = m.bidirectional and 2 or 1, 5, 2
          local X = attn.randn(opts.batch_first and { B, T, 3 } or { T, B, 3 }, dtype)
          local h0, c0 = attn.randn({ D * L, B, 4 }, dtype), attn.randn({ D * L, B, 4 }, dtype)
          for _, fused in ipairs { true, false } do
            nn.set_fused(fused)
            for _, given in ipairs { false, true } do
              local state = given and { h0, c0 } or nil
              local out, s = m(X, state)
              local xt = X:totable()
              if opts.batch_first then xt = swap12(xt) end
              local eo, eh, ec = naive_lstm(m, xt, given and h0:totable(), given and c0:totable())
              if opts.batch_first then eo = swap12(eo) end
              local tol = { atol = TOL[dtype], rtol = TOL[dtype] }
              assert.close(out, eo, tol)
              assert.close(s[1], eh, tol)
              assert.close(s[2], ec, tol)
              -- unbatched: sample 2 alone, (T, in) and (D L, h)
              local uo, us = m(X:select(opts.batch_first and 1 or 2, 2), given and { h0:select(2, 2), c0:select(2, 2) } or nil)
              assert.same({ T, D * 4 }, uo:shape())
              assert.close(uo, (opts.batch_first and out:select(1, 2) or out:select(2, 2)):totable(), tol)
              assert.close(us[1], s[1]:select(2, 2):totable(), tol)
              assert.close(us[2], s[2]:select(2, 2):totable(), tol)
            end
          end
        end
      end)
  end

  for _, fused in ipairs { true, false } do
    it("passes finite differences for X, h0, c0 and every parameter (" .. (fused and "fused" or "composed") .. ")",
      function()
        nn.set_fused(fused)
        for _, opts in ipairs { {}, { bidirectional = true, batch_first = true, bias = false } } do
          local m = randomize(nn.LSTM(3, 2, 2, helper.with(opts, { dtype = "float64" })), 0.5)
          local D = m.bidirectional and 2 or 1
          local inputs = { helper.param({ 2, 2, 3 }), helper.param({ 2 * D, 2, 2 }), helper.param({ 2 * D, 2, 2 }) }
          for _, p in ipairs(m:parameters()) do inputs[#inputs + 1] = p end
          helper.gradcheck(function(x, h, c)
            local out, s = m(x, { h, c })
            return attn.cat({ out:reshape({ -1 }), s[1]:reshape({ -1 }), s[2]:reshape({ -1 }) }, 1)
          end, inputs)
        end
        -- the cell, and the zero state (no h, c inputs)
        local cell = randomize(nn.LSTMCell(3, 4, { dtype = "float64" }), 0.5)
        local inputs = { helper.param({ 2, 3 }), helper.param({ 2, 4 }), helper.param({ 2, 4 }) }
        for _, p in ipairs(cell:parameters()) do inputs[#inputs + 1] = p end
        helper.gradcheck(function(x, h, c) return attn.cat(table.pack(cell(x, { h, c })), 2) end, inputs)
        table.remove(inputs, 2)
        table.remove(inputs, 2)
        helper.gradcheck(function(x) return attn.cat(table.pack(cell(x)), 2) end, inputs)
      end)
  end

  it("LSTMCell is one step of the naive loop, batched and unbatched, on both paths", function()
    for _, dtype in ipairs { "float64", "float32" } do
      for _, bias in ipairs { true, false } do
        local m = randomize(nn.LSTMCell(3, 4, { bias = bias, dtype = dtype }), 0.5)
        local p = { w_ih = m.weight_ih:totable(), w_hh = m.weight_hh:totable(),
          b_ih = m.bias_ih and m.bias_ih:totable(), b_hh = m.bias_hh and m.bias_hh:totable() }
        local x, h, c = attn.randn({ 2, 3 }, dtype), attn.randn({ 2, 4 }, dtype), attn.randn({ 2, 4 }, dtype)
        local tol = { atol = TOL[dtype], rtol = TOL[dtype] }
        for _, fused in ipairs { true, false } do
          nn.set_fused(fused)
          local h1, c1 = m(x, { h, c })
          for b = 1, 2 do
            local eh, ec = lstm_step(p, x:totable()[b], h:totable()[b], c:totable()[b], 4)
            assert.close(h1:select(1, b), eh, tol)
            assert.close(c1:select(1, b), ec, tol)
            local uh, uc = m(x:select(1, b), { h:select(1, b), c:select(1, b) })
            assert.close(uh, eh, tol)
            assert.close(uc, ec, tol)
            local zh, zc = lstm_step(p, x:totable()[b], { 0, 0, 0, 0 }, { 0, 0, 0, 0 }, 4)
            local gh, gc = m(x)
            assert.close(gh:select(1, b), zh, tol)
            assert.close(gc:select(1, b), zc, tol)
          end
        end
      end
    end
  end)

  it("LSTMCell stepped over a sequence gives nn.LSTM's outputs and gradients (a decoder's loop)", function()
    local m = nn.LSTM(3, 5, 1, { dtype = "float64" })
    local cell = nn.LSTMCell(3, 5, { dtype = "float64" })
    cell:load_state_dict({ weight_ih = m.weight_ih_l0, weight_hh = m.weight_hh_l0, bias_ih = m.bias_ih_l0,
      bias_hh = m.bias_hh_l0 })
    local X = attn.randn({ 4, 2, 3 }, { dtype = "float64", requires_grad = true })
    local out = m(X)
    out:square():sum():backward()
    local gx = X.grad
    X.grad = nil
    local state, total = nil, nil
    for t = 1, 4 do
      local h, c = cell(X:select(1, t), state)
      helper.assert_close(h, out:select(1, t), { atol = 1e-14 })
      state = { h, c }
      total = total and total + h:square():sum() or h:square():sum()
    end
    total:backward()
    helper.assert_close(X.grad, gx, { atol = 1e-13 })
    helper.assert_close(cell.weight_hh.grad, m.weight_hh_l0.grad, { atol = 1e-13 })
  end)

  it("continues a sequence from the returned {h_n, c_n}", function()
    local m = nn.LSTM(3, 4, 2, { dtype = "float64" })
    local X = attn.randn({ 6, 2, 3 }, "float64")
    local full, fs = m(X)
    local a, sa = m(X:narrow(1, 1, 4))
    local b, sb = m(X:narrow(1, 5, 2), sa)
    helper.assert_close(a, full:narrow(1, 1, 4), { atol = 1e-14 })
    helper.assert_close(b, full:narrow(1, 5, 2), { atol = 1e-14 })
    helper.assert_close(sb[1], fs[1], { atol = 1e-14 })
    helper.assert_close(sb[2], fs[2], { atol = 1e-14 })
  end)

  it("fused dropout drops what the composed path drops for one seed (one and both directions)", function()
    for _, bidirectional in ipairs { false, true } do
      local m = randomize(nn.LSTM(3, 6, 3, { dropout = 0.4, bidirectional = bidirectional, dtype = "float64" }), 0.5)
      m:train()
      local D = bidirectional and 2 or 1
      local X = attn.randn({ 4, 2, 3 }, { dtype = "float64", requires_grad = true })
      local h0 = attn.randn({ 3 * D, 2, 6 }, { dtype = "float64", requires_grad = true })
      local c0 = attn.randn({ 3 * D, 2, 6 }, { dtype = "float64", requires_grad = true })
      local probes = { attn.randn({ 4, 2, 6 * D }, "float64"), attn.randn({ 3 * D, 2, 6 }, "float64"),
        attn.randn({ 3 * D, 2, 6 }, "float64") }
      local function once(path, seed)
        m:zero_grad()
        for _, t in ipairs { X, h0, c0 } do t.grad = nil end
        local out, hn, cn = m[path](m, X, h0, c0, seed)
        ;((out * probes[1]):sum() + (hn * probes[2]):sum() + (cn * probes[3]):sum()):backward()
        local r = { out, hn, cn, X.grad, h0.grad, c0.grad }
        for _, p in ipairs(m:parameters()) do r[#r + 1] = p.grad end
        return r
      end
      local a, b = once("fused_forward", 0x5eed), once("composed_forward", 0x5eed)
      for i = 1, #b do helper.assert_close(a[i], b[i], { rtol = 1e-12, atol = 1e-13 }) end
      -- the seed matters, and dropout acts: another seed drops other entries
      assert.is_false(helper.compare(once("composed_forward", 0x5eed + 100)[1], b[1]))
      m:eval()
      assert.is_false(helper.compare(m:fused_forward(X, h0, c0), b[1]))
    end
  end)

  it("gives the same bits on 1 and 2 threads (fused, with dropout, float32 and float64)", function()
    for _, dtype in ipairs { "float32", "float64" } do
      local m = nn.LSTM(5, 40, 3, { dropout = 0.3, dtype = dtype })
      local X = attn.randn({ 6, 16, 5 }, { dtype = dtype, requires_grad = true })
      local h0 = attn.randn({ 3, 16, 40 }, { dtype = dtype, requires_grad = true })
      local c0 = attn.randn({ 3, 16, 40 }, { dtype = dtype, requires_grad = true })
      local probes = { attn.randn({ 6, 16, 40 }, dtype), attn.randn({ 3, 16, 40 }, dtype),
        attn.randn({ 3, 16, 40 }, dtype) }
      local function once(threads)
        attn.set_num_threads(threads)
        attn.manual_seed(3)
        return run(m, X, h0, c0, probes)
      end
      local a, b = once(1), once(2)
      for i = 1, #a do helper.assert_identical(b[i], a[i]) end
    end
  end)

  -- The float32 gate math calls attn_vmath's rows: each instruction-set path against the composed
  -- path, at H 32 (whole vectors) and 37 (tails).
  it("fused equals the composed path on every instruction-set path (float32, H 32 and 37)", function()
    local core, saved = attn.core, attn.core.isa()
    finally(function() core.isa(saved) end)
    for _, H in ipairs { 32, 37 } do
      local m = nn.LSTM(6, H, 2)
      local X = attn.randn({ 4, 5, 6 }, { requires_grad = true })
      local h0, c0 = attn.randn({ 2, 5, H }, { requires_grad = true }), attn.randn({ 2, 5, H }, { requires_grad = true })
      local probes = { attn.randn({ 4, 5, H }), attn.randn({ 2, 5, H }), attn.randn({ 2, 5, H }) }
      nn.set_fused(false)
      local want = run(m, X, h0, c0, probes)
      nn.set_fused(true)
      for _, isa in ipairs(helper.isa_paths()) do
        core.isa(isa)
        local got = run(m, X, h0, c0, probes)
        for i = 1, #want do assert.close(got[i], want[i], { rtol = 1e-5, atol = 1e-5 }) end
      end
    end
  end)

  describe("PyTorch 1.13 fixtures (float64 to 1e-10, float32 to 1e-5)", function()
    for _, name in ipairs(F.lstm_cases) do
      it(name, function()
        for _, threads in ipairs { 1, 2 } do
          attn.set_num_threads(threads)
          for _, fused in ipairs { true, false } do
            nn.set_fused(fused)
            F.check(name, { min_n = 4, where = string.format(" (%d threads, fused %s)", threads, tostring(fused)) })
          end
        end
        F.check(name, { dtype = "float32", tol = 1e-5, where = " in float32" })
      end)
    end
  end)

  it("bad input names the argument and the shapes", function()
    local m = nn.LSTM(3, 4, 2, { bidirectional = true })
    assert.error_matches(function() m(attn.ones({ 2, 5, 4 })) end,
      "LSTM: input %[2x5x4%] must be %(T, B, 3%) or unbatched %(T, 3%)")
    assert.error_matches(function() m(attn.ones({ 2, 2, 2, 3 })) end, "LSTM: input %[2x2x2x3%] must be")
    assert.error_matches(function() m(attn.ones({ 5, 2, 3 }), { attn.zeros({ 2, 2, 4 }), attn.zeros({ 4, 2, 4 }) }) end,
      "LSTM: h0 %[2x2x4%] must be %(2 %* num_layers, B, h%) = %[4x2x4%]")
    assert.error_matches(function() m(attn.ones({ 5, 2, 3 }), { attn.zeros({ 4, 2, 4 }), attn.zeros({ 4, 3, 4 }) }) end,
      "LSTM: c0 %[4x3x4%] must be %(2 %* num_layers, B, h%) = %[4x2x4%]")
    assert.error_matches(function() m(attn.ones({ 5, 3 }), { attn.zeros({ 4, 4 }), attn.zeros({ 4, 2, 4 }) }) end,
      "LSTM: c0 %[4x2x4%] must be %(2 %* num_layers, h%) = %[4x4%] for the unbatched input %[5x3%]")
    assert.error_matches(function() m(attn.ones({ 5, 2, 3 }), attn.zeros({ 4, 2, 4 })) end,
      "LSTM: the state must be a table {h, c} of two tensors, got a tensor")
    assert.error_matches(function() m(attn.ones({ 5, 2, 3 }), { attn.zeros({ 4, 2, 4 }) }) end,
      "LSTM: the state must be a table {h, c} of two tensors, got a table")
    assert.error_matches(function() nn.LSTM(3, 4, 1, { proj_size = 2 }) end,
      "LSTM: proj_size 2 is not supported")
    assert.error_matches(function() nn.LSTM(3, 4, 1, { bidirectonal = true }) end, "LSTM: unknown option 'bidirectonal'")
    assert.error_matches(function() nn.LSTM(3, 0) end, "LSTM: num_hiddens must be an integer >= 1, got 0")
    local c = nn.LSTMCell(3, 4)
    assert.error_matches(function() c(attn.ones({ 2, 2, 3 })) end,
      "LSTMCell: input %[2x2x3%] must be %(B, 3%) or unbatched %(3%)")
    assert.error_matches(function() c(attn.ones({ 2, 3 }), { attn.ones({ 3, 4 }), attn.ones({ 2, 4 }) }) end,
      "LSTMCell: h %[3x4%] must be %[2x4%] for the input %[2x3%]")
    assert.error_matches(function() c(attn.ones({ 3 }), { attn.ones({ 4 }), attn.ones({ 5 }) }) end,
      "LSTMCell: c %[5%] must be %[4%] for the input %[3%]")
    assert.error_matches(function() nn.LSTMCell(3, 4, { nonlinearity = "relu" }) end,
      "LSTMCell: unknown option 'nonlinearity'")
    -- the kernel names the operand and both shapes
    local w_ih, w_hh = attn.randn({ 16, 3 }), attn.randn({ 16, 4 })
    assert.error_matches(function() lstm.lstm(attn.ones({ 2, 5, 2 }), nil, nil, { w_ih, w_hh, false, false }) end,
      "lstm: weight_ih of layer 0 is %[16x3%], expected %[16x2%]")
    assert.error_matches(function()
      lstm.lstm(attn.ones({ 2, 5, 3 }), nil, attn.ones({ 1, 4, 4 }), { w_ih, w_hh, false, false })
    end, "lstm: c0 of layer 0 is %[1x4x4%], expected %[1x5x4%]")
    assert.error_matches(function()
      lstm.lstm(attn.ones({ 2, 5, 3 }), nil, nil, { w_ih, attn.randn({ 12, 4 }), false, false })
    end, "lstm: weight_hh of layer 0 is %[12x4%], expected %[16x4%]")
  end)
end)
