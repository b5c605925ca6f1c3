-- nn.CaptionCNN and nn.ShowAttendTell (attn.nn.captioning): shapes, locality of the grid,
-- the regulariser and the loss against hand computations, attention weights summing to 1,
-- gradients against finite differences, and the baseline ignoring the grid's layout.
local attn = require "attn"
local helper = require "helper"
local captioning = require "attn.nn.captioning"
local nn = attn.nn

local function tiny(opts)
  local o = { vocab_size = 7, feature_size = 5, num_cells = 4, embed_size = 3, num_hiddens = 6, attention_size = 4 }
  for k, v in pairs(opts or {}) do o[k] = v end
  return nn.ShowAttendTell(o)
end

local captions = attn.tensor({ { 5, 6, 4, 2 }, { 7, 4, 2, 2 }, { 5, 5, 6, 4 } }, "int64")
local valid_len = attn.tensor({ 3, 2, 4 }, "int64")

describe("nn.CaptionCNN", function()
  it("classifies items and gives one feature vector per 28 x 28 cell, row by row", function()
    attn.manual_seed(1)
    local cnn = nn.CaptionCNN({ channels = { 4, 6, 8 } }):eval()
    assert.same({ 2, 10 }, cnn(attn.rand(2, 1, 28, 28)):shape())
    local x = attn.rand(2, 1, 84, 56)
    local g = cnn:grid(x)
    assert.same({ 2, 6, 8 }, g:shape())
    -- cell (r, c) is the cell layer on its 7 x 7 block of the feature map, as an item's
    local f = cnn.features(x)
    for r = 1, 3 do
      for c = 1, 2 do
        local block = cnn.cell(f:narrow(3, (r - 1) * 7 + 1, 7):narrow(4, (c - 1) * 7 + 1, 7)):reshape({ 2, 8 })
        assert.close(g:select(2, (r - 1) * 2 + c), block, { atol = 1e-5 })
      end
    end
    -- an item alone on a canvas of one cell: the grid's vector is what fc classifies
    local item = attn.rand(2, 1, 28, 28)
    assert.close(cnn.fc(cnn:grid(item):select(2, 1)), cnn(item), { atol = 1e-5 })
    assert.has_error(function() cnn:grid(attn.rand(1, 1, 84, 80)) end,
      "CaptionCNN:grid: canvases [1x1x84x80] are not made of 28 x 28 cells")
  end)

  it("keeps cells apart: changing the top-left cell leaves the far cells as they were", function()
    attn.manual_seed(2)
    local cnn = nn.CaptionCNN({ channels = { 4, 6, 8 } }):eval()
    local x = attn.rand(1, 1, 84, 84)
    local y = x:clone()
    y:narrow(3, 1, 28):narrow(4, 1, 28):fill_(0.5)
    local gx, gy = cnn:grid(x), cnn:grid(y)
    assert.is_true((gx:select(2, 1) - gy:select(2, 1)):abs():max():item() > 1e-3)
    for _, cell in ipairs { 3, 6, 7, 8, 9 } do
      assert.close(gy:select(2, cell), gx:select(2, cell), { atol = 0 })
    end
  end)
end)

describe("nn.ShowAttendTell", function()
  it("gives logits, attention weights that sum to 1 over the cells, and gates in (0, 1)", function()
    attn.manual_seed(3)
    local dec = tiny()
    local feats = attn.rand(3, 4, 5)
    local logits, alphas, betas = dec(feats, captioning.teacher_inputs(captions, 3))
    assert.same({ 3, 4, 7 }, logits:shape())
    assert.same({ 3, 4, 4 }, alphas:shape())
    assert.same({ 3, 4 }, betas:shape())
    assert.close(alphas:sum(3), attn.ones(3, 4), { atol = 1e-6 })
    assert.is_true(betas:min():item() > 0 and betas:max():item() < 1)
  end)

  it("scores cells as w_v^T tanh(W_k (a_i + l_i) + p_i + W_q h_0) at the first step", function()
    attn.manual_seed(4)
    local dec = tiny():to("float64")
    attn.no_grad(function() dec.location:copy_(attn.rand({ 4, 5 }, "float64")) end) -- it starts at zeros
    local feats = attn.rand({ 2, 4, 5 }, "float64")
    local _, alphas = dec(feats, attn.tensor({ { 3 }, { 3 } }, "int64"))
    local Wk, Wq, wv = dec.attention.W_k.weight:totable(), dec.attention.W_q.weight:totable(),
      dec.attention.w_v.weight:totable()[1]
    local P, f, loc = dec.position:totable(), feats:totable(), dec.location:totable()
    local mean = feats:mean(2)
    local h0 = dec.init_h(mean):tanh():totable()
    for b = 1, 2 do
      local e, z = {}, 0
      for i = 1, 4 do
        e[i] = 0
        for a = 1, 4 do
          local u = P[i][a]
          for d = 1, 5 do u = u + Wk[a][d] * (f[b][i][d] + loc[i][d]) end
          for j = 1, 6 do u = u + Wq[a][j] * h0[b][j] end
          e[i] = e[i] + wv[a] * (1 - 2 / (math.exp(2 * u) + 1)) -- tanh u
        end
        z = z + math.exp(e[i])
      end
      for i = 1, 4 do assert.near(math.exp(e[i]) / z, alphas:totable()[b][1][i], 1e-12) end
    end
  end)

  -- The annotation vectors carry their cell's location l_i: the context says where the decoder
  -- looked, so it can tell which item comes next in reading order. Without l_i, cells that
  -- hold the same vector give the same context wherever the attention goes.
  it("puts the location term in the context: z_1 = beta_1 sum_i alpha_1i (a_i + l_i)", function()
    attn.manual_seed(9)
    local dec = tiny():to("float64")
    attn.no_grad(function() dec.location:copy_(attn.rand({ 4, 5 }, "float64")) end)
    local item = attn.rand({ 1, 1, 5 }, "float64")
    local feats = item:expand({ 1, 4, 5 }):contiguous() -- the same vector in every cell
    local tok = attn.tensor({ 3 }, "int64")
    -- scores saturated by the location term of the keys: +-sum |w_v| on the favoured cell or not
    local function favour(cell)
      local sign = dec.attention.w_v.weight:reshape({ 4 }):sign():totable()
      local p = {}
      for i = 1, 4 do
        p[i] = {}
        for k = 1, 4 do p[i][k] = (i == cell and 20 or -20) * sign[k] end
      end
      attn.no_grad(function() dec.position:copy_(attn.tensor(p, "float64")) end)
    end
    favour(1)
    local logits, state, alpha, beta = dec:step(dec:start(feats), tok)
    local a, l, bt = alpha:totable()[1], dec.location:totable(), beta:item()
    local z = {}
    for d = 1, 5 do
      z[d] = 0
      for i = 1, 4 do z[d] = z[d] + a[i] * (item:totable()[1][1][d] + l[i][d]) end
      z[d] = bt * z[d]
    end
    assert.close(dec.fc(attn.cat({ state.h, attn.tensor({ z }, "float64") }, 2)), logits, { atol = 1e-12 })
    -- attention on another cell of the same vector changes the context, hence the words
    favour(4)
    local moved, _, alpha2 = dec:step(dec:start(feats), tok)
    assert.same({ 1, 4 }, { alpha:argmax(2):item(), alpha2:argmax(2):item() })
    assert.is_true((moved - logits):abs():max():item() > 1e-3)
  end)

  it("computes the doubly stochastic regulariser over the real steps only", function()
    local alphas = attn.tensor({ { { 0.5, 0.5 }, { 0.2, 0.8 }, { 0.9, 0.1 } }, { { 1, 0 }, { 0.3, 0.7 }, { 0, 1 } } },
      "float64")
    local mask = captioning.step_mask(attn.tensor({ 2, 3 }, "int64"), 3, "float64")
    assert.close(mask, attn.tensor({ { 1, 1, 0 }, { 1, 1, 1 } }, "float64"))
    -- sample 1: cells 0.7, 1.3 -> 0.09 + 0.09; sample 2: 1.3, 1.7 -> 0.09 + 0.49
    local expected = ((1 - 0.7) ^ 2 + (1 - 1.3) ^ 2 + (1 - 1.3) ^ 2 + (1 - 1.7) ^ 2) / 2
    assert.near(expected, captioning.doubly_stochastic(alphas, mask):item(), 1e-12)
  end)

  it("adds lambda times the regulariser to the mean cross-entropy per real token", function()
    attn.manual_seed(5)
    local dec = tiny():to("float64")
    local feats = attn.rand({ 3, 4, 5 }, "float64")
    local loss, ce, reg = dec:loss(feats, captions, valid_len, { bos = 3, lambda = 0.5 })
    local logits, alphas = dec(feats, captioning.teacher_inputs(captions, 3))
    local lp, a, y = logits:log_softmax(3):totable(), alphas:totable(), captions:totable()
    local lens = { 3, 2, 4 }
    local nll, count, r = 0, 0, 0
    for b = 1, 3 do
      local s = { 0, 0, 0, 0 }
      for t = 1, lens[b] do
        nll, count = nll - lp[b][t][y[b][t]], count + 1
        for i = 1, 4 do s[i] = s[i] + a[b][t][i] end
      end
      for i = 1, 4 do r = r + (1 - s[i]) ^ 2 end
    end
    assert.near(nll / count, ce, 1e-10)
    assert.near(r / 3, reg, 1e-10)
    assert.near(nll / count + 0.5 * r / 3, loss:item(), 1e-10)
  end)

  for _, kind in ipairs { "lstm", "gru" } do
    it("has gradients that match finite differences (" .. kind .. ", float64)", function()
      attn.manual_seed(6)
      local dec = tiny({ rnn = kind }):to("float64")
      local feats = attn.rand({ 3, 4, 5 }, "float64")
      helper.gradcheck(function(f) return dec:loss(f, captions, valid_len, { bos = 3 }) end, { feats })
      -- parameters: a few entries of each, by central differences of the loss
      dec:zero_grad()
      dec:loss(feats, captions, valid_len, { bos = 3 }):backward()
      for name, p in dec:named_parameters() do
        local flat, g = p:reshape({ -1 }), p.grad:reshape({ -1 })
        for _, k in ipairs { 1, flat:size(1) } do
          local v = flat:get(k)
          local function at(x)
            attn.no_grad(function() flat:set(x, k) end)
            return (dec:loss(feats, captions, valid_len, { bos = 3 })):item()
          end
          local numeric = (at(v + 1e-6) - at(v - 1e-6)) / 2e-6
          at(v)
          assert(math.abs(numeric - g:get(k)) < 1e-6 + 1e-5 * math.abs(numeric),
            string.format("%s[%d]: analytic %g, numeric %g", name, k, g:get(k), numeric))
        end
      end
    end)
  end

  for _, biases in ipairs { true, false } do
    it("as one fused node (show_attend_tell), has gradients of every operand that match finite differences"
      .. (biases and "" or " (no biases)") .. " (float64)", function()
      attn.manual_seed(8)
      local B, T, L, D, A, E, H = 2, 3, 4, 3, 5, 2, 4
      local function r(...) return (attn.rand({ ... }, "float64") - 0.5):requires_grad_() end
      local xs = { r(B, L, D), r(B, L, A), r(A), r(T, B, E), r(B, H), r(B, H), r(A, H), r(1, H), r(1), r(4 * H, E + D),
        r(4 * H, H), r(4 * H), r(4 * H) }
      if not biases then xs[9], xs[12], xs[13] = nil, nil, nil end
      -- every output takes part, each entry weighted differently
      local p1, p2, p3 = attn.randn({ B, T, H + D }, "float64"), attn.randn({ B, T, L }, "float64"),
        attn.randn({ B, T }, "float64")
      local used = {}
      for i = 1, 13 do
        if xs[i] then used[#used + 1] = xs[i] end
      end
      helper.gradcheck(function(...)
        local args, k = {}, 0
        for i = 1, 13 do
          if xs[i] then
            k = k + 1
            args[i] = select(k, ...)
          end
        end
        local out, alphas, betas = captioning.show_attend_tell(table.unpack(args, 1, 13))
        return (out * p1):sum() + (alphas * p2):sum() + (betas * p3):sum()
      end, used)
    end)
  end

  it("as one fused node, gives the same bits as the step-by-step composition over the fused cell (float32)",
    function()
      attn.manual_seed(9)
      local dec = nn.ShowAttendTell { vocab_size = 9, feature_size = 16, num_cells = 9, embed_size = 8,
        num_hiddens = 24, attention_size = 12 }
      local feats = attn.rand(6, 9, 16)
      local inputs = attn.tensor({ { 3, 4, 5, 6 }, { 3, 7, 8, 9 }, { 3, 5, 5, 4 }, { 3, 9, 2, 1 }, { 3, 6, 4, 2 },
        { 3, 8, 7, 6 } }, "int64")
      local trace = {}
      local before = require("attn.nn.fused").set_trace(function(who, path)
        if who == dec then trace[#trace + 1] = path end
      end)
      local fused_out = { dec(feats, inputs) }
      dec.fused = false -- the composition; the LSTM cell and the attention keep their own kernels
      local composed_out = { dec(feats, inputs) }
      require("attn.nn.fused").set_trace(before)
      assert.are.same({ "fused", "composed" }, trace)
      for i = 1, 3 do helper.assert_identical(fused_out[i], composed_out[i]) end
    end)

  it("as one fused node, raises naming the operand and the shapes", function()
    local f = attn.rand(2, 4, 3)
    local function call(keys)
      return captioning.show_attend_tell(f, keys, attn.rand(5), attn.rand(3, 2, 2), attn.rand(2, 4), attn.rand(2, 4),
        attn.rand(5, 4), attn.rand(1, 4), nil, attn.rand(16, 5), attn.rand(16, 4))
    end
    call(attn.rand(2, 4, 5))
    assert.error_matches(function() call(attn.rand(2, 3, 5)) end,
      "show_attend_tell: keys is [2x3x5], expected [2x4x5]", nil, true)
  end)

  it("as the baseline, ignores where the features are (and the attention model does not)", function()
    attn.manual_seed(7)
    local feats = attn.rand(3, 4, 5)
    local perm = attn.core.index_select(feats, 2, { 4, 2, 1, 3 })
    local inputs = captioning.teacher_inputs(captions, 3)
    local base = tiny({ attention = false })
    local logits, alphas = base(feats, inputs)
    assert.is_nil(alphas)
    assert.close(base(perm, inputs), logits, { atol = 1e-6 })
    assert.is_nil(base.attention)
    local dec = tiny()
    assert.is_true((dec(perm, inputs) - dec(feats, inputs)):abs():max():item() > 1e-4)
  end)

  it("raises naming the shapes and options", function()
    local dec = tiny()
    assert.error_matches(function() dec(attn.rand(2, 3, 5), attn.tensor({ { 3 }, { 3 } }, "int64")) end,
      "ShowAttendTell: feats [2x3x5] must be (B, 4, 5) (num_cells, feature_size)", nil, true)
    assert.has_error(function() tiny({ rnn = "rnn" }) end, "ShowAttendTell: rnn must be 'lstm' or 'gru', got rnn")
  end)
end)
