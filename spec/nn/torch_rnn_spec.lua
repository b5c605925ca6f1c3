-- PyTorch's recurrent classes (nn.GRU's options batch_first, bidirectional, bias = false and
-- unbatched input; nn.GRUCell; nn.RNN; nn.RNNCell): PyTorch 1.13 fixtures, naive step loops
-- written from PyTorch's equations, finite-difference gradients for the inputs and every
-- parameter, float32 and float64, 1 and 2 threads, and bad input.
local attn = require "attn"
local helper = require "helper"
local F = require "nn.torch_fixtures"
local gru = require "attn.nn.gru"
local R = require "nn.rnn_reference"
local nn = attn.nn

-- ---------------------------------------------------------------- naive references (Lua numbers)
-- PyTorch 1.13 (torch/nn/modules/rnn.py), gate order r, z, n, for an input x and state h:
--   GRU:  r  = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
--         z  = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
--         n  = tanh(W_in x + b_in + r * (W_hn h + b_hn))
--         h' = (1 - z) * n + z * h
--   RNN:  h' = act(W_ih x + b_ih + W_hh h + b_hh), act = tanh or relu
-- Layer k, direction d (0 forward, 1 reverse: steps T .. 1) starts from h0[k * D + d] (zeros
-- without h0); the output at step t is the forward state then the reverse state at t (2h
-- wide), which is the input of layer k + 1; h_n[k * D + d] is the direction's last state.

local tanh, relu, affine, gru_step = R.tanh, R.relu, R.affine, R.gru_step

local function rnn_step(act)
  return function(p, x, h, H)
    local a, b, new = affine(p.w_ih, p.b_ih, x, 0, H), affine(p.w_hh, p.b_hh, h, 0, H), {}
    for j = 1, H do new[j] = act(a[j] + b[j]) end
    return new
  end
end

local naive_layers, swap12, randomize = R.naive_layers, R.swap12, helper.randomize

local TOL = { float32 = 2e-5, float64 = 1e-12 }

-- ---------------------------------------------------------------- specs

describe("PyTorch's recurrent classes", function()
  before_each(function() attn.manual_seed(19) end)
  after_each(function()
    attn.set_num_threads(1)
    nn.set_fused(true)
  end)

  describe("PyTorch 1.13 fixtures (float64 to 1e-10, float32 to 1e-5)", function()
    for _, name in ipairs(F.recurrent_cases) do
      it(name, function()
        for _, threads in ipairs { 1, 2 } do
          attn.set_num_threads(threads)
          for _, fused in ipairs { true, false } do
            nn.set_fused(fused)
            F.check(name, { min_n = 3, whats = { "output", "grad_input", "grad_state", "after" },
              where = string.format(" (%d threads, fused %s)", threads, tostring(fused)) })
          end
        end
        F.check(name, { dtype = "float32", tol = 1e-5, whats = { "output", "grad_input", "grad_state", "after" },
          where = " in float32" })
      end)
    end
  end)

  local configs = {
    { "GRU, 2 layers, bidirectional", nn.GRU, gru_step, 3, 4, 2, { bidirectional = true } },
    { "GRU, batch_first, bidirectional, no bias", nn.GRU, gru_step, 3, 4, 2,
      { bidirectional = true, batch_first = true, bias = false } },
    { "RNN tanh, 2 layers", nn.RNN, rnn_step(tanh), 3, 4, 2, {} },
    { "RNN relu, bidirectional, batch_first", nn.RNN, rnn_step(relu), 3, 4, 2,
      { nonlinearity = "relu", bidirectional = true, batch_first = true } },
    { "RNN tanh, no bias, 1 layer bidirectional", nn.RNN, rnn_step(tanh), 2, 3, 1, { bias = false, bidirectional = true } },
  }

  describe("against naive step loops", function()
    for _, c in ipairs(configs) do
      local label, cls, step, I, H, L, opts = table.unpack(c)
      for _, dtype in ipairs { "float32", "float64" } do
        it(label .. ", " .. dtype .. ", batched and unbatched, zero and given h0", function()
          local o = { dtype = dtype }
          for k, v in pairs(opts) do o[k] = v end
          local m = randomize(cls(I, H, L, o), 0.5)
          local D = m.bidirectional and 2 or 1
          local T, B = 5, 2
          local X = attn.randn(opts.batch_first and { B, T, I } or { T, B, I }, dtype)
          local h0 = attn.randn({ D * L, B, H }, dtype)
          for _, threads in ipairs { 1, 2 } do
            attn.set_num_threads(threads)
            for _, given in ipairs { false, true } do
              local out, hn = m(X, given and h0 or nil)
              local xt = X:totable()
              if opts.batch_first then xt = swap12(xt) end
              local eo, eh = naive_layers(m, step, xt, given and h0:totable() or nil)
              if opts.batch_first then eo = swap12(eo) end
              assert.close(out, eo, { atol = TOL[dtype], rtol = TOL[dtype] })
              assert.close(hn, eh, { atol = TOL[dtype], rtol = TOL[dtype] })
              -- unbatched: sample 1 alone, (T, in) and (D L, h)
              local x1 = X:select(opts.batch_first and 1 or 2, 1)
              local uo, uh = m(x1, given and h0:select(2, 1) or nil)
              assert.same({ T, D * H }, uo:shape())
              assert.close(uo, (opts.batch_first and out:select(1, 1) or out:select(2, 1)):totable(),
                { atol = TOL[dtype], rtol = TOL[dtype] })
              assert.close(uh, hn:select(2, 1):totable(), { atol = TOL[dtype], rtol = TOL[dtype] })
            end
          end
        end)
      end
      it(label .. ": finite differences for the input, h0 and every parameter", function()
        local m = randomize(cls(I, H, L, { dtype = "float64", bidirectional = opts.bidirectional,
          batch_first = opts.batch_first, bias = opts.bias, nonlinearity = opts.nonlinearity }), 0.5)
        local D = m.bidirectional and 2 or 1
        local X = helper.param(opts.batch_first and { 2, 3, I } or { 3, 2, I })
        local h0 = helper.param({ D * L, 2, H })
        local inputs = { X, h0 }
        for _, p in ipairs(m:parameters()) do inputs[#inputs + 1] = p end
        helper.gradcheck(function(x, h)
          local out, hn = m(x, h)
          return attn.cat({ out:reshape({ -1 }), hn:reshape({ -1 }) }, 1)
        end, inputs)
      end)
    end
  end)

  describe("cells", function()
    for _, c in ipairs {
      { "GRUCell", function(o) return nn.GRUCell(3, 4, o) end, gru_step },
      { "RNNCell tanh", function(o) return nn.RNNCell(3, 4, o) end, rnn_step(tanh) },
      { "RNNCell relu, no bias", function(o)
        o.nonlinearity, o.bias = "relu", false
        return nn.RNNCell(3, 4, o)
      end, rnn_step(relu) },
    } do
      local label, build, step = table.unpack(c)
      it(label .. " against the naive step, batched and unbatched, float32 and float64, both paths", function()
        for _, dtype in ipairs { "float32", "float64" } do
          local m = randomize(build({ dtype = dtype }), 0.5)
          local x, h = attn.randn({ 2, 3 }, dtype), attn.randn({ 2, 4 }, dtype)
          local p = { w_ih = m.weight_ih:totable(), w_hh = m.weight_hh:totable(),
            b_ih = m.bias_ih and m.bias_ih:totable(), b_hh = m.bias_hh and m.bias_hh:totable() }
          for _, fused in ipairs { true, false } do
            nn.set_fused(fused)
            local out = m(x, h)
            local want = { step(p, x:totable()[1], h:totable()[1], 4), step(p, x:totable()[2], h:totable()[2], 4) }
            assert.close(out, want, { atol = TOL[dtype], rtol = TOL[dtype] })
            assert.close(m(x:select(1, 2), h:select(1, 2)), want[2], { atol = TOL[dtype], rtol = TOL[dtype] })
            assert.close(m(x), { step(p, x:totable()[1], { 0, 0, 0, 0 }, 4), step(p, x:totable()[2], { 0, 0, 0, 0 }, 4) },
              { atol = TOL[dtype], rtol = TOL[dtype] })
          end
        end
      end)
      it(label .. ": finite differences for x, h and every parameter", function()
        local m = randomize(build({ dtype = "float64" }), 0.5)
        local inputs = { helper.param({ 2, 3 }), helper.param({ 2, 4 }) }
        for _, q in ipairs(m:parameters()) do inputs[#inputs + 1] = q end
        for _, fused in ipairs { true, false } do
          nn.set_fused(fused)
          helper.gradcheck(function(x, h) return m(x, h) end, inputs)
        end
      end)
    end

    it("have PyTorch's keys, shapes and init bound", function()
      local g = nn.GRUCell(3, 4)
      assert.same({ "weight_ih", "weight_hh", "bias_ih", "bias_hh" }, g:parameter_names())
      assert.same({ 12, 3 }, g.weight_ih:shape())
      assert.same({ 4 }, nn.RNNCell(3, 4).bias_hh:shape())
      assert.same({ "weight_ih", "weight_hh" }, nn.RNNCell(3, 4, { bias = false }):parameter_names())
      for _, q in ipairs(g:parameters()) do assert.is_true(q:abs():max():item() <= 0.5) end
      assert.equal("GRUCell(3, 4)", tostring(g))
      assert.equal("RNNCell(3, 4, bias=False, nonlinearity='relu')",
        tostring(nn.RNNCell(3, 4, { bias = false, nonlinearity = "relu" })))
    end)
  end)

  it("GRU and RNN have PyTorch's keys and order, the _reverse direction after the forward one", function()
    local m = nn.RNN(3, 4, 2, { bidirectional = true, bias = false })
    assert.same({ "weight_ih_l0", "weight_hh_l0", "weight_ih_l0_reverse", "weight_hh_l0_reverse", "weight_ih_l1",
      "weight_hh_l1", "weight_ih_l1_reverse", "weight_hh_l1_reverse" }, m:parameter_names())
    assert.same({ 4, 8 }, m.weight_ih_l1:shape())
    local g = nn.GRU(3, 4, 2, { bidirectional = true })
    assert.same({ 12, 8 }, g.weight_ih_l1_reverse:shape())
    assert.equal(16, #g:parameter_names())
    assert.equal("GRU(3, 4, num_layers=2, bidirectional=True)", tostring(g))
    assert.equal("RNN(3, 4, nonlinearity='relu', batch_first=True)",
      tostring(nn.RNN(3, 4, 1, { nonlinearity = "relu", batch_first = true })))
    -- the book's positional dropout stays
    assert.equal(0.2, nn.GRU(3, 4, 2, 0.2).dropout)
  end)

  it("the bidirectional fused path runs the kernel per layer and direction, equal to the composed path", function()
    local m = randomize(nn.GRU(3, 4, 2, { bidirectional = true, dtype = "float64" }), 0.5)
    local X, h0 = attn.randn({ 4, 2, 3 }, "float64"), attn.randn({ 4, 2, 4 }, "float64")
    local seen = {}
    local before = nn.fused.set_trace(function(_, path) seen[#seen + 1] = path end)
    local a, ha = m(X, h0)
    nn.fused.set_trace(before)
    assert.same({ "fused" }, seen)
    local b, hb = m:composed_forward(X, h0)
    helper.assert_close(a, b, { atol = 1e-13 })
    helper.assert_close(ha, hb, { atol = 1e-13 })
    -- training with dropout between layers: a fixed seed drops the same entries on both paths
    m:train()
    m.dropout = 0.4
    local fa, fh = m:fused_forward(X, h0, 77)
    local ca, ch = m:composed_forward(X, h0, 77)
    helper.assert_close(fa, ca, { atol = 1e-13 })
    helper.assert_close(fh, ch, { atol = 1e-13 })
  end)

  it("bad input names the argument and the shapes", function()
    local m = nn.GRU(3, 4, 2, { bidirectional = true })
    assert.error_matches(function() m(attn.ones({ 2, 5, 4 })) end,
      "GRU: input %[2x5x4%] must be %(T, B, 3%) or unbatched %(T, 3%)")
    assert.error_matches(function() m(attn.ones({ 5, 3 }), attn.zeros({ 4, 2, 4 })) end,
      "GRU: h0 %[4x2x4%] must be %(2 %* num_layers, h%) = %[4x4%] for the unbatched input %[5x3%]")
    assert.error_matches(function() m(attn.ones({ 5, 2, 3 }), attn.zeros({ 2, 2, 4 })) end,
      "GRU: h0 %[2x2x4%] must be %(2 %* num_layers, B, h%) = %[4x2x4%]")
    assert.error_matches(function() nn.GRU(3, 4, 1, { batch_first = true })(attn.ones({ 2 })) end,
      "GRU: input %[2%] must be %(B, T, 3%)")
    assert.error_matches(function() nn.GRU(3, 4, 1, { bidirectonal = true }) end, "GRU: unknown option 'bidirectonal'")
    assert.error_matches(function() nn.GRU(3, 4, 1, { num_layers = 2 }) end,
      "GRU: num_layers is a positional argument, not an option")
    assert.error_matches(function() nn.GRU(3, 4, 1, { bias = 0 }) end, "GRU: bias must be a boolean, got a number")
    assert.error_matches(function() nn.RNN(3, 4, 1, { nonlinearity = "sigmoid" }) end,
      "RNN: nonlinearity must be 'tanh' or 'relu', got sigmoid")
    assert.error_matches(function() nn.RNN(3, 4, 1, { fused = false }) end, "RNN: unknown option 'fused'")
    assert.error_matches(function() nn.RNN(3, 0) end, "RNN: num_hiddens must be an integer >= 1, got 0")
    assert.error_matches(function() nn.RNN(3, 4)(attn.ones({ 2, 2, 2, 3 })) end,
      "RNN: input %[2x2x2x3%] must be %(T, B, 3%) or unbatched %(T, 3%)")
    assert.error_matches(function() nn.GRUCell(3, 4, { nonlinearity = "relu" }) end,
      "GRUCell: unknown option 'nonlinearity'")
    assert.error_matches(function() nn.GRUCell(3, 4)(attn.ones({ 2, 3 }), attn.ones({ 3, 4 })) end,
      "GRUCell: h %[3x4%] must be %[2x4%] for the input %[2x3%]")
    assert.error_matches(function() nn.RNNCell(3, 4)(attn.ones({ 2, 2, 3 })) end,
      "RNNCell: input %[2x2x3%] must be %(B, 3%) or unbatched %(3%)")
  end)

  it("gru_cell accepts unbatched input and names the caller's arguments and shapes", function()
    local w_ih, w_hh = attn.randn({ 12, 3 }, "float64"), attn.randn({ 12, 4 }, "float64")
    local b_ih, b_hh = attn.randn({ 12 }, "float64"), attn.randn({ 12 }, "float64")
    local x, h = attn.randn({ 3 }, "float64"), attn.randn({ 4 }, "float64")
    local out = gru.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
    local p = { w_ih = w_ih:totable(), w_hh = w_hh:totable(), b_ih = b_ih:totable(), b_hh = b_hh:totable() }
    assert.close(out, gru_step(p, x:totable(), h:totable(), 4), { atol = 1e-14 })
    assert.close(gru.gru_cell(x, nil, w_ih, w_hh), gru_step({ w_ih = p.w_ih, w_hh = p.w_hh }, x:totable(),
      { 0, 0, 0, 0 }, 4), { atol = 1e-14 })
    assert.error_matches(function() gru.gru_cell(attn.randn({ 5 }, "float64"), h, w_ih, w_hh) end,
      "gru_cell: input %[5%] must be %(B, 3%) or unbatched %(3%)")
    assert.error_matches(function() gru.gru_cell(x, attn.randn({ 2, 4 }, "float64"), w_ih, w_hh) end,
      "gru_cell: h %[2x4%] must be %[4%] for the input %[3%]")
    assert.error_matches(function() gru.gru_cell(x, h, w_ih, attn.randn({ 9, 4 }, "float64")) end,
      "gru_cell: w_ih %[12x3%] and w_hh %[9x4%] must be %(3 h, input%) and %(3 h, h%) with h = 4")
    assert.error_matches(function() gru.gru_cell(x, h, w_ih:reshape({ -1 }), w_hh) end,
      "gru_cell: w_ih must be %(3 %* hidden, input%), got %[36%]")
  end)
end)
