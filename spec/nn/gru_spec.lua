-- nn.GRU against a plain-Lua GRU on nested tables (PyTorch's equations and
-- gate order r, z, n), gradient checks, shapes from the book, dropout.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn
local R = require "nn.rnn_reference"

-- The naive multi-layer GRU: X nested (T, B, in), h0 nested (L, B, H) or nil.
local function naive_gru(m, X, h0) return R.naive_layers(m, R.gru_step, X, h0) end

-- The flat parameter list of the fused gru.gru: 4 entries per layer.
local function fused_params(m, L)
  local params = {}
  for k = 0, L - 1 do
    for _, name in ipairs { "weight_ih_l", "weight_hh_l", "bias_ih_l", "bias_hh_l" } do
      params[#params + 1] = m[name .. k]
    end
  end
  return params
end

describe("nn.GRU", function()
  it("refuses a number of layers whose weights cannot exist, at once", function()
    local ok, err = pcall(nn.GRU, 3, 2, 1 << 62, 0.5)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("GRU: 4611686018427387904 layers of 2 hidden units need", 1, true), tostring(err))
  end)

  before_each(function() attn.manual_seed(21) end)

  it("has PyTorch's parameter names, shapes, order and init bound", function()
    local m = nn.GRU{ input_size = 3, num_hiddens = 4, num_layers = 2 }
    local map, names = {}, m:parameter_names()
    for i, p in ipairs(m:named_parameters()) do
      assert.equal(names[i], p[1])
      map[p[1]] = p[2]
    end
    assert.same({ "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_ih_l1", "weight_hh_l1",
      "bias_ih_l1", "bias_hh_l1" }, names)
    assert.same({ 12, 3 }, map.weight_ih_l0:shape())
    assert.same({ 12, 4 }, map.weight_hh_l0:shape())
    assert.same({ 12 }, map.bias_ih_l0:shape())
    assert.same({ 12, 4 }, map.weight_ih_l1:shape())
    for _, p in ipairs(m:parameters()) do assert.is_true(p:abs():max():item() <= 0.5) end
    assert.equal("GRU(3, 4, num_layers=2)", tostring(m))
    -- positional form
    local p = nn.GRU(3, 4, 2, 0.1)
    assert.equal(2, p.num_layers)
    assert.equal(0.1, p.dropout)
    assert.equal("GRU(3, 4, num_layers=2, dropout=0.1)", tostring(p))
  end)

  it("matches a naive Lua GRU (2 layers, zero and given initial state)", function()
    local m = nn.GRU{ input_size = 3, num_hiddens = 4, num_layers = 2 }
    local X = attn.randn({ 5, 2, 3 })
    local out, state = m(X)
    assert.same({ 5, 2, 4 }, out:shape())
    assert.same({ 2, 2, 4 }, state:shape())
    local eo, es = naive_gru(m, X:totable(), nil)
    assert.close(out, eo, { atol = 1e-5 })
    assert.close(state, es, { atol = 1e-5 })
    local h0 = attn.randn({ 2, 2, 4 })
    out, state = m(X, h0)
    eo, es = naive_gru(m, X:totable(), h0:totable())
    assert.close(out, eo, { atol = 1e-5 })
    assert.close(state, es, { atol = 1e-5 })
  end)

  it("continues a sequence from the returned state", function()
    local m = nn.GRU(3, 4, 2)
    local X = attn.randn({ 6, 2, 3 })
    local full, fs = m(X)
    local a, sa = m(X:narrow(1, 1, 4))
    local b, sb = m(X:narrow(1, 5, 2), sa)
    assert.close(a, full:narrow(1, 1, 4), { atol = 1e-6 })
    assert.close(b, full:narrow(1, 5, 2), { atol = 1e-6 })
    assert.close(sb, fs, { atol = 1e-6 })
  end)

  it("passes gradcheck for X, h0 and every parameter (T=3, B=2, in=3, h=4, 2 layers)", function()
    local m = nn.GRU{ input_size = 3, num_hiddens = 4, num_layers = 2 }:to("float64")
    local X, h0 = helper.param({ 3, 2, 3 }), helper.param({ 2, 2, 4 })
    local inputs = { X, h0 }
    for _, p in ipairs(m:parameters()) do inputs[#inputs + 1] = p end
    helper.gradcheck(function(x, h)
      local out, state = m(x, h)
      return attn.cat({ out, state }, 1)
    end, inputs)
    -- also without h0 (zero initial state)
    inputs[2] = nil
    for i, p in ipairs(m:parameters()) do inputs[i + 1] = p end
    helper.gradcheck(function(x) return (m(x)) end, inputs)
  end)

  it("gives the book's encoder shapes: Embedding(10, 8) + GRU(8, 16, 2 layers) on zeros (4, 7)", function()
    local embedding = nn.Embedding(10, 8)
    local rnn = nn.GRU{ input_size = 8, num_hiddens = 16, num_layers = 2 }
    rnn:eval()
    local ids = attn.ones({ 4, 7 }) -- token id 0 in the book is id 1 here
    local X = embedding(ids):permute(2, 1, 3) -- time-major (7, 4, 8)
    local out, state = rnn(X)
    assert.same({ 7, 4, 16 }, out:shape())
    assert.same({ 2, 4, 16 }, state:shape())
    -- the last layer's final state is the last output
    assert.close(state:select(1, 2), out:select(1, 7), { atol = 0 })
  end)

  it("applies dropout between layers only in training", function()
    local m = nn.GRU{ input_size = 3, num_hiddens = 8, num_layers = 2, dropout = 0.5 }
    local X = attn.randn({ 4, 3, 3 })
    m:eval()
    local e1, es1 = m(X)
    local e2 = m(X)
    assert.close(e1, e2, { atol = 0 })
    m:train()
    local t1, ts1 = m(X)
    local t2 = m(X)
    assert.is_false(helper.compare(t1, e1))
    assert.is_false(helper.compare(t1, t2))
    -- the first layer's state is not affected (dropout acts on its outputs only)
    assert.close(ts1:select(1, 1), es1:select(1, 1), { atol = 0 })
    -- one layer: dropout has no effect (nothing between layers)
    local single = nn.GRU{ input_size = 3, num_hiddens = 8, dropout = 0.5 }
    local a = single(X)
    single:eval()
    assert.close(single(X), a, { atol = 0 })
  end)

  it("names the shapes on bad input", function()
    local m = nn.GRU(3, 4, 2)
    assert.error_matches(function() m(attn.ones({ 2, 5 })) end,
      "GRU: input %[2x5%] must be %(T, B, 3%) or unbatched %(T, 3%) %(time%-major%)")
    assert.error_matches(function() m(attn.ones({ 2, 5, 3 }), attn.zeros({ 1, 5, 4 })) end,
      "GRU: h0 %[1x5x4%] must be %(num_layers, B, h%) = %[2x5x4%]")
    assert.error_matches(function() nn.GRU{ input_size = 3 } end, "num_hiddens must be an integer")
    assert.error_matches(function() nn.GRU{ input_size = 3, num_hidden = 4 } end, "unknown option 'num_hidden'")
  end)

  -- The time of a step at the book's seq2seq sizes is bench/bench.lua's train_gru row, with
  -- the 0.5 s this spec once asserted as its budget.

  -- Outputs, final state and every gradient of one call of m under the given
  -- output gradients.
  local function run(m, X, h0, gout, gstate)
    for _, p in ipairs(m:parameters()) do p.grad = nil end
    X.grad = nil
    if h0 then h0.grad = nil end
    local out, state = m(X, h0)
    local loss = (out * gout):sum() + (state * gstate):sum()
    loss:backward()
    local grads = { X = X.grad, h0 = h0 and h0.grad }
    for _, e in ipairs(m:named_parameters()) do grads[e[1]] = e[2].grad end
    return out, state, grads
  end

  -- (fused against composed for 1-3 layers, zero and given h0, no biases, both dtypes:
  -- spec/nn/fused_paths_spec.lua)

  -- The float32 gate math runs per instruction-set path (attn_vmath): each path against the
  -- composed path, at H 32 (whole vectors) and 37 (vector tails, column sums past 16).
  it("fused equals the composed path on every instruction-set path (float32, H 32 and 37)", function()
    local core, saved = attn.core, attn.core.isa()
    finally(function() core.isa(saved) end)
    for _, H in ipairs { 32, 37 } do
      local T, B, I = 4, 5, 6
      local fused = nn.GRU { input_size = I, num_hiddens = H, num_layers = 2 }
      local ref = nn.GRU { input_size = I, num_hiddens = H, num_layers = 2, fused = false }
      ref:load_state_dict(fused:state_dict())
      local X, h0 = attn.randn({ T, B, I }, { requires_grad = true }), attn.randn({ 2, B, H }, { requires_grad = true })
      local gout, gstate = attn.randn({ T, B, H }), attn.randn({ 2, B, H })
      local o2, s2, g2 = run(ref, X, h0, gout, gstate)
      for _, isa in ipairs(helper.isa_paths()) do
        core.isa(isa)
        local o1, s1, g1 = run(fused, X, h0, gout, gstate)
        local tol = { rtol = 1e-5, atol = 1e-6 }
        assert.close(o1, o2, tol)
        assert.close(s1, s2, tol)
        for name, g in pairs(g2) do assert.close(g1[name], g, tol) end
      end
    end
  end)

  it("fused dropout drops what the composed path's nn.dropout drops for one seed (one mechanism)", function()
    local gru = require "attn.nn.gru"
    local ref = nn.GRU { input_size = 3, num_hiddens = 6, num_layers = 3, dropout = 0.4, dtype = "float64",
      fused = false }
    local params = fused_params(ref, 3)
    local X = attn.randn({ 4, 2, 3 }, { dtype = "float64", requires_grad = true })
    local gout, gstate = attn.randn({ 4, 2, 6 }, "float64"), attn.randn({ 3, 2, 6 }, "float64")
    local seed = 0x5eed
    local function grads(out, state)
      ref:zero_grad()
      X.grad = nil
      local loss = (out * gout):sum() + (state * gstate):sum()
      loss:backward()
      local g = { X = X.grad }
      for _, p in ipairs(ref:named_parameters()) do g[p[1]] = p[2].grad end
      return g
    end
    local o1, s1 = gru.gru(X, nil, params, 0.4, seed)
    local g1 = grads(o1, s1)
    local o2, s2 = ref:composed_forward(X, nil, seed)
    local g2 = grads(o2, s2)
    assert.close(o1, o2, { rtol = 1e-12 })
    assert.close(s1, s2, { rtol = 1e-12 })
    for name, g in pairs(g2) do assert.close(g1[name], g, { rtol = 1e-12, atol = 1e-13 }) end
    -- and the seed matters: another one drops other entries
    local o3 = ref:composed_forward(X, nil, seed + 100)
    assert.is_false(helper.compare(o3, o1))
  end)

  it("fused dropout passes gradcheck with a fixed seed and keeps about 1 - p of the entries", function()
    local gru = require "attn.nn.gru"
    local m = nn.GRU { input_size = 3, num_hiddens = 4, num_layers = 2, dtype = "float64" }
    local params = fused_params(m, 2)
    local X, h0 = helper.param({ 3, 2, 3 }), helper.param({ 2, 2, 4 })
    local inputs = { X, h0 }
    for _, p in ipairs(params) do inputs[#inputs + 1] = p end
    helper.gradcheck(function(x, h)
      local out, state = gru.gru(x, h, params, 0.4, 77)
      return attn.cat({ out, state }, 1)
    end, inputs)
    -- one step, one sample: column j of weight_ih_l1's gradient is (gate
    -- gradient) * (layer 1's input j), so it is zero exactly where dropout hit
    local H = 400
    local wide = nn.GRU { input_size = 2, num_hiddens = H, num_layers = 2, dropout = 0.25 }
    local out = wide(attn.randn({ 1, 1, 2 }))
    out:sum():backward()
    local dropped = wide.weight_ih_l1.grad:abs():sum(1):eq(0):sum():item()
    assert(dropped >= 70 and dropped <= 130, string.format("%d of %d dropped, expected about 100", dropped, H))
  end)

  it("fused dropout gives the same bits on 1 and 2 threads for one seed", function()
    local m = nn.GRU { input_size = 5, num_hiddens = 7, num_layers = 3, dropout = 0.3 }
    local X = attn.randn({ 6, 4, 5 }, { requires_grad = true })
    local function once(threads)
      attn.set_num_threads(threads)
      attn.manual_seed(3)
      m:zero_grad()
      X.grad = nil
      local out, state = m(X)
      ;(out:sum() + state:square():sum()):backward()
      return out, state, X.grad, m.weight_ih_l0.grad
    end
    local a = { once(1) }
    local b = { once(2) }
    attn.set_num_threads(1)
    for i = 1, 4 do helper.assert_identical(b[i], a[i]) end
  end)

  it("gru_cell is one fused step of layer 0 and matches the composed cell", function()
    local gru = require "attn.nn.gru"
    local m = nn.GRU { input_size = 3, num_hiddens = 5, dtype = "float64" }
    local x, h = helper.param({ 4, 3 }), helper.param({ 4, 5 })
    local got = gru.gru_cell(x, h, m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0)
    local gi = x:matmul(m.weight_ih_l0:t()) + m.bias_ih_l0
    local want = gru.composed_cell(gi, h, m.weight_hh_l0, m.bias_hh_l0)
    assert.close(got, want, { rtol = 1e-12 })
    helper.gradcheck(function(a, b)
      return gru.gru_cell(a, b, m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0)
    end, { x, h, m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0 })
  end)

  it("unbind gives select's or (keepdim) narrow's views as one node, gradients for used slices only", function()
    local gru = require "attn.nn.gru"
    local x = helper.param({ 3, 2, 4 })
    for _, keepdim in ipairs { false, true } do
      local parts = gru.unbind(x, keepdim)
      assert.are.equal(3, #parts)
      for t = 1, 3 do
        helper.assert_identical(parts[t], keepdim and x:narrow(1, t, 1) or x:select(1, t))
        assert.are.equal(parts[1].grad_fn, parts[t].grad_fn)
      end
      -- slice 2 takes no part: its gradient is zero (the buffer is not zero-filled first)
      helper.gradcheck(function(a)
        local p = gru.unbind(a, keepdim)
        return p[1] * 2 + p[3]:square()
      end, { x })
      x.grad = nil
      local p = gru.unbind(x, keepdim)
      ;(p[1] + p[3]):sum():backward()
      local want = attn.ones({ 3, 2, 4 }, "float64")
      want[2] = 0
      helper.assert_identical(x.grad, want)
      x.grad = nil
    end
  end)

  it("the fused kernel names the operand and shapes it refuses", function()
    local gru = require "attn.nn.gru"
    local w_ih, w_hh = attn.randn({ 12, 3 }), attn.randn({ 12, 4 })
    assert.error_matches(function() gru.gru(attn.ones({ 2, 5, 2 }), nil, { w_ih, w_hh, false, false }) end,
      "gru: weight_ih of layer 0 is %[12x3%], expected %[12x2%]")
    assert.error_matches(function() gru.gru(attn.ones({ 2, 5, 3 }), nil, { w_ih, w_hh, attn.ones({ 11 }), false }) end,
      "gru: bias_ih of layer 0 is %[11%], expected %[12%]")
    assert.error_matches(function()
      gru.gru(attn.ones({ 2, 5, 3 }, "float64"), nil, { w_ih, w_hh, false, false })
    end, "gru: weight_ih of layer 0 is float32, the input is float64")
  end)
end)
