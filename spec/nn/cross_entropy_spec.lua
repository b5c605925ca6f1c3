-- nn.CrossEntropyLoss and nn.NLLLoss on PyTorch's layout and options, against
-- naive loops over plain Lua numbers written from PyTorch's formulas
-- (aten/src/ATen/native/LossNLL.cpp: nll_loss_nd, cross_entropy_loss_label_smoothing,
-- cross_entropy_loss_prob_target). For input (N, C, d...) the classes are dim 2;
-- with log p = log_softmax over the classes, row i (an (n, d...) position), its
-- 1-based class y_i, class weights w (all 1 when not given), keep_i = 0 when
-- y_i == ignore_index, eps = label_smoothing and C classes:
--     nll_i    = -w_{y_i} * log p[i, y_i] * keep_i
--     smooth_i = -(sum_c w_c * log p[i, c]) * keep_i
--     loss_i   = (1 - eps) * nll_i + eps / C * smooth_i
--     "mean"   = sum_i loss_i / sum_i (w_{y_i} * keep_i);  "sum" = sum_i loss_i;  "none" = loss_i
-- Probability targets t (the input's shape): t' = (1 - eps) t + eps / C,
--     loss_i = -sum_c w_c t'[i, c] log p[i, c];  "mean" divides by the number of rows (N * d...).
-- NLLLoss on log-probabilities x: loss_i = -w_{y_i} x[i, y_i] keep_i, the same mean.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn

-- The rows of an input (N, C, d...) as {values over c} lists in row-major
-- order of (n, d...), and the same positions' entries of a target of the
-- input's shape (or nil).
local function rows_of(x, class_dim)
  local shape, flat = x:shape(), helper.flatten({ x:totable() })
  local nd = #shape
  if class_dim == -1 or nd == 1 then
    local C = shape[nd]
    local out = {}
    for r = 0, #flat // C - 1 do
      local row = {}
      for c = 1, C do row[c] = flat[r * C + c] end
      out[#out + 1] = row
    end
    return out
  end
  local N, C, inner = shape[1], shape[2], 1
  for d = 3, nd do inner = inner * shape[d] end
  local out = {}
  for n = 0, N - 1 do
    for j = 0, inner - 1 do
      local row = {}
      for c = 0, C - 1 do row[c + 1] = flat[(n * C + c) * inner + j + 1] end
      out[#out + 1] = row
    end
  end
  return out
end

local function log_softmax(row)
  local m = -math.huge
  for _, v in ipairs(row) do m = math.max(m, v) end
  local s = 0
  for _, v in ipairs(row) do s = s + math.exp(v - m) end
  local lse = m + math.log(s)
  local out = {}
  for c, v in ipairs(row) do out[c] = v - lse end
  return out
end

-- PyTorch's cross-entropy by the formulas above; ids a flat list in row order.
local function naive_ce(rows, ids, o)
  local C = #rows[1]
  local w = o.weight or {}
  local eps, ii = o.label_smoothing or 0, o.ignore_index or -100
  local per, total, denom = {}, 0, 0
  for i, row in ipairs(rows) do
    local lp = log_softmax(row)
    local loss = 0
    if ids[i] ~= ii then
      local y = ids[i]
      local wy = w[y] or 1
      local smooth = 0
      for c = 1, C do smooth = smooth - (w[c] or 1) * lp[c] end
      loss = (1 - eps) * -wy * lp[y] + eps / C * smooth
      denom = denom + wy
    end
    per[i] = loss
    total = total + loss
  end
  if o.reduction == "none" then return per end
  if o.reduction == "sum" then return total end
  return total / denom
end

local function naive_prob_ce(rows, trows, o)
  local C = #rows[1]
  local w, eps = o.weight or {}, o.label_smoothing or 0
  local per, total = {}, 0
  for i, row in ipairs(rows) do
    local lp = log_softmax(row)
    local loss = 0
    for c = 1, C do loss = loss - (w[c] or 1) * ((1 - eps) * trows[i][c] + eps / C) * lp[c] end
    per[i] = loss
    total = total + loss
  end
  if o.reduction == "none" then return per end
  if o.reduction == "sum" then return total end
  return total / #rows
end

local function close(actual, expected, dtype, what)
  local tol = dtype == "float64" and 1e-12 or 2e-5
  if type(expected) == "number" then
    local a = actual:item()
    assert(math.abs(a - expected) <= tol * math.max(1, math.abs(expected)), string.format("%s: %.17g vs %.17g", what,
      a, expected))
  else
    local a = helper.flatten({ actual:totable() })
    assert.equal(#expected, #a)
    for i = 1, #a do
      assert(math.abs(a[i] - expected[i]) <= tol * math.max(1, math.abs(expected[i])),
        string.format("%s [%d]: %.17g vs %.17g", what, i, a[i], expected[i]))
    end
  end
end

-- Random 1-based ids of the rows' shape, a few replaced by `ignore`.
local function random_ids(shape, C, ignore)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local flat = {}
  for i = 1, n do flat[i] = (ignore and i % 4 == 2) and ignore or math.random(C) end
  return attn.tensor(flat, "int64"):reshape(shape), flat
end

local layouts = {
  { "(N, C)", { 5, 4 }, { 5 } },
  { "(N, C, d) with C == d", { 2, 3, 3 }, { 2, 3 } },
  { "(N, C, d1, d2)", { 2, 4, 3, 2 }, { 2, 3, 2 } },
}

local option_sets = {
  {},
  { weight = { 0.5, 2, 1.5, 0.25 } },
  { ignore_index = 2 },
  { ignore_index = -100, ignore = -100 },
  { label_smoothing = 0.1 },
  { weight = { 0.5, 2, 1.5, 0.25 }, ignore_index = 3, label_smoothing = 0.2 },
}

describe("nn.CrossEntropyLoss on PyTorch's layout", function()
  before_each(function()
    attn.manual_seed(3)
    math.randomseed(3)
  end)

  for _, dtype in ipairs { "float32", "float64" } do
    for _, layout in ipairs(layouts) do
      for _, opts in ipairs(option_sets) do
        for _, reduction in ipairs { "mean", "sum", "none" } do
          local label = string.format("%s %s %s %s", layout[1], require("cjson").encode(opts), reduction, dtype)
          it("equals PyTorch's formula: " .. label, function()
            local shape, rows_shape = layout[2], layout[3]
            local C = shape[2]
            local x = attn.randn(shape, dtype) * 2
            local ignore = opts.ignore or opts.ignore_index
            local ids, flat = random_ids(rows_shape, C, ignore and ignore ~= -100 and ignore or opts.ignore)
            local o = { reduction = reduction, ignore_index = opts.ignore_index, label_smoothing = opts.label_smoothing }
            if opts.weight then
              o.weight = {}
              for c = 1, C do o.weight[c] = opts.weight[c] end
            end
            local mod_opts = helper.with(o, {})
            if o.weight then mod_opts.weight = attn.tensor(o.weight, dtype) end
            local out = nn.CrossEntropyLoss(mod_opts)(x, ids)
            close(out, naive_ce(rows_of(x, 2), flat, o), dtype, label)
            if reduction == "none" then assert.same(rows_shape, out:shape()) end
          end)
        end
      end
    end
  end

  it("reads the classes from dim 2 when C == d (the defect: the last dim was taken)", function()
    local x = attn.randn({ 2, 3, 3 }, "float64")
    local ids, flat = random_ids({ 2, 3 }, 3)
    local pytorch = naive_ce(rows_of(x, 2), flat, { reduction = "none" })
    local last = naive_ce(rows_of(x, -1), flat, { reduction = "none" })
    close(nn.CrossEntropyLoss { reduction = "none" }(x, ids), pytorch, "float64", "class dim 2")
    close(nn.CrossEntropyLoss { reduction = "none", class_dim = -1 }(x, ids), last, "float64", "class_dim -1")
    local differ = false
    for i = 1, #pytorch do differ = differ or math.abs(pytorch[i] - last[i]) > 1e-6 end
    assert.is_true(differ)
  end)

  it("takes an unbatched input (C) with a number or 0-d target", function()
    local x = attn.tensor({ 0.5, -1, 2, 0.25 }, "float64")
    local expected = naive_ce({ x:totable() }, { 3 }, {})
    close(nn.CrossEntropyLoss()(x, 3), expected, "float64", "number target")
    local none = nn.CrossEntropyLoss { reduction = "none" }(x, attn.tensor({ 3 }, "int64"):reshape({}))
    assert.equal(0, none:dim())
    close(none, expected, "float64", "0-d target")
    local w = { 1, 2, 3, 4 }
    close(nn.CrossEntropyLoss { weight = attn.tensor(w, "float64") }(x, 3), naive_ce({ x:totable() }, { 3 },
      { weight = w }), "float64", "weighted")
  end)

  for _, dtype in ipairs { "float32", "float64" } do
    for _, opts in ipairs { {}, { label_smoothing = 0.3 }, { weight = { 2, 0.5, 1 } },
      { weight = { 2, 0.5, 1 }, label_smoothing = 0.1 } } do
      for _, reduction in ipairs { "mean", "sum", "none" } do
        it(string.format("takes probability targets: %s %s %s", require("cjson").encode(opts), reduction, dtype),
          function()
          local x = attn.randn({ 2, 3, 4 }, dtype)
          local t = attn.rand({ 2, 3, 4 }, dtype)
          t = t / t:sum(2, true)
          local o = helper.with(opts, { reduction = reduction })
          local mod_opts = helper.with(o, {})
          if o.weight then mod_opts.weight = attn.tensor(o.weight, dtype) end
          close(nn.CrossEntropyLoss(mod_opts)(x, t), naive_prob_ce(rows_of(x, 2), rows_of(t, 2), o), dtype, "probs")
        end)
      end
    end
  end

  it("gives gradients that agree with finite differences, every option", function()
    for _, o in ipairs {
      {},
      { weight = attn.tensor({ 0.5, 2, 1.5 }, "float64"), ignore_index = 2 },
      { label_smoothing = 0.2, ignore_index = 1, weight = attn.tensor({ 1, 3, 0.5 }, "float64") },
      { reduction = "sum", label_smoothing = 0.1 },
    } do
      local ids = attn.tensor({ { 1, 2, 3, 3 }, { 2, 2, 1, 3 } }, "int64")
      helper.gradcheck(function(x) return nn.CrossEntropyLoss(o)(x, ids) end, { helper.param({ 2, 3, 4 }) })
      helper.gradcheck(function(x) return nn.CrossEntropyLoss(o)(x, { 1, 3, 2 }) end, { helper.param({ 3, 3 }) })
    end
    local t = attn.rand({ 2, 3, 4 }, "float64")
    helper.gradcheck(function(x) return nn.CrossEntropyLoss { label_smoothing = 0.1 }(x, t) end,
      { helper.param({ 2, 3, 4 }) })
  end)

  it("runs the fused kernel for class ids (weights, ignore_index, label smoothing without weights)", function()
    local core = attn.core
    local real, calls = core.softmax_ce_forward, 0
    core.softmax_ce_forward = function(...)
      calls = calls + 1
      return real(...)
    end
    local ok, err = pcall(function()
      local x = attn.randn({ 4, 5, 3 })
      local ids = random_ids({ 4, 3 }, 5, 2)
      nn.CrossEntropyLoss()(x, ids)
      nn.CrossEntropyLoss { weight = attn.ones({ 5 }), ignore_index = 2 }(x, ids)
      assert.equal(2, calls)
      nn.CrossEntropyLoss { label_smoothing = 0.1 }(x, ids)
      assert.equal(3, calls)
      nn.CrossEntropyLoss { label_smoothing = 0.1, weight = attn.ones({ 5 }) }(x, ids) -- the composed path
      assert.equal(3, calls)
    end)
    core.softmax_ce_forward = real
    assert(ok, err)
  end)

  it("never guesses a layout: a class-last call raises naming the shapes and the option", function()
    local x = attn.randn({ 2, 3, 5 })
    assert.error_matches(function() nn.CrossEntropyLoss()(x, attn.ones({ 2, 3 }, "int64")) end,
      "CrossEntropyLoss: target [2x3] must be class ids [2x5] or probabilities [2x3x5] for input [2x3x5] "
      .. "(for class-last logits (..., C), pass {class_dim = -1})", nil, true)
    assert.error_matches(function() nn.CrossEntropyLoss()(x, attn.ones({ 2, 5 }, "int64") * 6) end,
      "CrossEntropyLoss: label 6", nil, true)
    assert.error_matches(function() nn.CrossEntropyLoss { class_dim = 3 } end, "class_dim must be 2")
    assert.error_matches(function() nn.CrossEntropyLoss { label_smoothing = 2 } end, "label_smoothing must be")
    assert.error_matches(function() nn.CrossEntropyLoss { ignore_index = 1.5 } end, "ignore_index must be an integer")
    assert.error_matches(function() nn.CrossEntropyLoss { smoothing = 0.1 } end, "unknown option 'smoothing'")
    assert.error_matches(function() nn.CrossEntropyLoss { weight = attn.ones({ 2, 2 }) } end, "weight must be")
  end)

  it("keeps weight as a buffer, under PyTorch's state-dict key", function()
    local m = nn.CrossEntropyLoss { weight = attn.tensor({ 1, 2 }) }
    assert.same({ "weight" }, m:state_dict_keys())
  end)
end)

describe("nn.NLLLoss", function()
  for _, dtype in ipairs { "float32", "float64" } do
    for _, o in ipairs { {}, { weight = { 0.5, 2, 1.5 } }, { ignore_index = 1, weight = { 0.5, 2, 1.5 } } } do
      for _, reduction in ipairs { "mean", "sum", "none" } do
        it(string.format("equals -w_y x[y] with PyTorch's mean: %s %s %s", require("cjson").encode(o), reduction,
          dtype), function()
          attn.manual_seed(4)
          math.randomseed(4)
          local x = attn.randn({ 3, 3, 2 }, dtype):log_softmax(2)
          local ids, flat = random_ids({ 3, 2 }, 3, o.ignore_index)
          local rows = rows_of(x, 2)
          local per, total, denom = {}, 0, 0
          for i, row in ipairs(rows) do
            per[i] = 0
            if flat[i] ~= o.ignore_index then
              local wy = o.weight and o.weight[flat[i]] or 1
              per[i] = -wy * row[flat[i]]
              denom = denom + wy
            end
            total = total + per[i]
          end
          local expected = reduction == "none" and per or reduction == "sum" and total or total / denom
          local mo = { reduction = reduction, ignore_index = o.ignore_index }
          if o.weight then mo.weight = attn.tensor(o.weight, dtype) end
          close(nn.NLLLoss(mo)(x, ids), expected, dtype, "nll")
        end)
      end
    end
  end

  it("composes with log_softmax into CrossEntropyLoss, gradients included", function()
    attn.manual_seed(5)
    local x = attn.randn({ 4, 3 }, "float64")
    local ids = { 1, 3, 2, 2 }
    local w = attn.tensor({ 0.2, 1, 3 }, "float64")
    close(nn.NLLLoss { weight = w }(x:log_softmax(2), ids), nn.CrossEntropyLoss { weight = w }(x, ids):item(), "float64",
      "nll(log_softmax)")
    helper.gradcheck(function(p) return nn.NLLLoss { weight = w, ignore_index = 3 }(p, ids) end, { helper.param({ 4, 3 }) })
    assert.error_matches(function() nn.NLLLoss()(x, { 1, 4, 1, 1 }) end, "NLLLoss: target 4")
  end)
end)

describe("nn.MaskedSoftmaxCELoss label_smoothing", function()
  it("per token (1 - eps) nll + eps * -mean_c log p, masked, summed over T / T; 0 is the fused result", function()
    attn.manual_seed(6)
    local pred = attn.randn({ 2, 4, 5 }, "float64")
    local label = { { 1, 5, 2, 3 }, { 4, 4, 1, 2 } }
    local lens = { 2, 4 }
    local eps = 0.1
    local rows = pred:totable()
    local expected = {}
    for b = 1, 2 do
      local total = 0
      for t = 1, lens[b] do
        local lp = log_softmax(rows[b][t])
        local mean = 0
        for c = 1, 5 do mean = mean + lp[c] / 5 end
        total = total + (1 - eps) * -lp[label[b][t]] + eps * -mean
      end
      expected[b] = total / 4
    end
    close(nn.MaskedSoftmaxCELoss { label_smoothing = eps }(pred, label, lens), expected, "float64", "smoothed")
    close(nn.MaskedSoftmaxCELoss { label_smoothing = 0 }(pred, label, lens), nn.MaskedSoftmaxCELoss()(pred, label, lens)
      :totable(), "float64", "eps 0")
    helper.gradcheck(function(p) return nn.MaskedSoftmaxCELoss { label_smoothing = 0.2 }(p, label, lens) end,
      { helper.param({ 2, 4, 5 }) })
    assert.error_matches(function() nn.MaskedSoftmaxCELoss { label_smoothing = -1 } end, "label_smoothing must be")
  end)
end)
