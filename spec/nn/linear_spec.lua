-- Linear, Embedding, Dropout, LayerNorm, ReLU, Sequential and nn.init.
-- Expected values come from naive Lua loops over nested tables (the PyTorch
-- formulas), never from the code under test.
local attn = require "attn"
local helper = require "helper"
local nn = attn.nn

local function naive_linear(x, W, b)
  -- x: list of rows (N x in), W: out x in, b: out or nil
  local out = {}
  for n = 1, #x do
    out[n] = {}
    for o = 1, #W do
      local s = b and b[o] or 0
      for i = 1, #W[o] do s = s + x[n][i] * W[o][i] end
      out[n][o] = s
    end
  end
  return out
end

local function naive_layernorm(rows, eps, w, b)
  local out = {}
  for r, row in ipairs(rows) do
    local n, mean, var = #row, 0, 0
    for _, v in ipairs(row) do mean = mean + v end
    mean = mean / n
    for _, v in ipairs(row) do var = var + (v - mean) ^ 2 end
    var = var / n -- biased, as PyTorch
    out[r] = {}
    for i, v in ipairs(row) do out[r][i] = (v - mean) / math.sqrt(var + eps) * (w and w[i] or 1) + (b and b[i] or 0) end
  end
  return out
end

local function flat(t)
  local out = {}
  local function go(v)
    if type(v) == "table" then
      for _, x in ipairs(v) do go(x) end
    else
      out[#out + 1] = v
    end
  end
  go(t)
  return out
end

describe("nn.Linear", function()
  before_each(function() attn.manual_seed(7) end)

  it("has PyTorch's names, layouts and default init bounds", function()
    local m = nn.Linear(50, 3)
    assert.same({ 3, 50 }, m.weight:shape())
    assert.same({ 3 }, m.bias:shape())
    local bound = 1 / math.sqrt(50)
    assert.is_true(m.weight:abs():max():item() <= bound)
    assert.is_true(m.bias:abs():max():item() <= bound)
    -- spread out over the interval, not a constant
    assert.is_true(m.weight:abs():max():item() > 0.8 * bound)
    local names = m:parameter_names()
    assert.same({ "weight", "bias" }, names)
    assert.same({ "weight" }, nn.Linear(2, 2, { bias = false }):parameter_names())
    assert.is_nil(nn.Linear(2, 2, { bias = false }).bias)
  end)

  it("is seeded through attn.manual_seed", function()
    attn.manual_seed(3)
    local a = nn.Linear(4, 5)
    attn.manual_seed(3)
    local b = nn.Linear(4, 5)
    assert.close(a.weight, b.weight, { atol = 0 })
    assert.close(a.bias, b.bias, { atol = 0 })
  end)

  it("maps (..., in) to (..., out) like a naive loop", function()
    local m = nn.Linear(3, 4)
    local x = attn.randn({ 2, 5, 3 })
    local y = m(x)
    assert.same({ 2, 5, 4 }, y:shape())
    local rows = {}
    for _, batch in ipairs(x:totable()) do
      for _, r in ipairs(batch) do rows[#rows + 1] = r end
    end
    local expected = naive_linear(rows, m.weight:totable(), m.bias:totable())
    assert.close(y:reshape({ 10, 4 }), expected, { atol = 1e-5 })
    -- 1-D and 2-D inputs
    assert.close(m(x:select(1, 1):select(1, 1)), expected[1], { atol = 1e-5 })
    assert.same({ 5, 4 }, m(x:select(1, 2)):shape())
    -- no bias
    local nb = nn.Linear(3, 4, { bias = false })
    assert.close(nb(x):reshape({ 10, 4 }), naive_linear(rows, nb.weight:totable()), { atol = 1e-5 })
  end)

  it("passes gradcheck for input, weight and bias (float64)", function()
    local m = nn.Linear(3, 2):to("float64")
    local x = helper.param({ 2, 4, 3 })
    helper.gradcheck(function(xx) return m(xx) end, { x, m.weight, m.bias })
  end)

  it("names the shapes when the input does not fit", function()
    local m = nn.Linear(3, 2)
    assert.error_matches(function() m(attn.ones({ 4, 5 })) end, "Linear: input %[4x5%] has last dim 5, expected in_features = 3")
    assert.error_matches(function() m("x") end, "Linear: input must be a tensor")
    assert.error_matches(function() nn.Linear(0, 2) end, "in_features must be a positive integer")
    assert.error_matches(function() nn.Linear(2, 2, { biass = false }) end, "unknown option 'biass'")
  end)
end)

describe("nn.Embedding", function()
  before_each(function() attn.manual_seed(11) end)

  it("has weight (n, d) drawn from N(0, 1)", function()
    local m = nn.Embedding(200, 50)
    assert.same({ 200, 50 }, m.weight:shape())
    local w = m.weight
    local mean = w:mean():item()
    local std = math.sqrt(((w - mean):square()):mean():item())
    -- 10,000 draws: the mean's standard error is 0.01, the std's 0.007; 4.5 and 4.2 of them
    assert.is_true(math.abs(mean) < 0.045, "mean " .. mean)
    assert.is_true(math.abs(std - 1) < 0.03, "std " .. std)
  end)

  it("looks up rows for ids of any shape, from tensors or tables", function()
    local m = nn.Embedding(5, 3)
    local W = m.weight:totable()
    local ids = { { 1, 5, 2 }, { 3, 3, 4 } }
    local y = m(ids)
    assert.same({ 2, 3, 3 }, y:shape())
    local expected = {}
    for i, row in ipairs(ids) do
      expected[i] = {}
      for j, id in ipairs(row) do expected[i][j] = W[id] end
    end
    assert.close(y, expected, { atol = 0 })
    assert.close(m(attn.tensor(ids)), expected, { atol = 0 })
    assert.same({ 4, 3 }, m({ 1, 2, 3, 4 }):shape())
  end)

  it("takes int64 ids (exactly as float ids) and validates them in the core", function()
    local m = nn.Embedding(5, 3)
    local ids = { { 1, 5 }, { 2, 2 } }
    assert.close(m(attn.tensor(ids, "int64")), m(attn.tensor(ids)), { atol = 0 })
    assert.same({ 2, 2, 3 }, m(attn.tensor(ids, "int64")):shape())
    assert.error_matches(function() m(attn.tensor({ { 1 }, { 9 } }, "int64")) end,
      "Embedding: token id 9 at position 2 is out of range 1..5 %(ids %[2x1%]%)")
    helper.gradcheck(function(w)
      m.weight = w
      return (m(attn.tensor({ 2, 2, 4 }, "int64")) ^ 2):sum()
    end, { helper.param({ 5, 3 }) })
  end)

  it("validates ids", function()
    local m = nn.Embedding(5, 3)
    assert.error_matches(function() m({ 1, 6 }) end, "Embedding: token id 6 at position 2 is out of range 1..5 %(ids %[2%]%)")
    assert.error_matches(function() m({ { 0 } }) end, "token id 0 at position 1 is out of range 1..5 %(ids %[1x1%]%)")
    assert.error_matches(function() m({ 1.5 }) end, "token id 1.5 at position 1 is not an integer %(ids %[1%]%)")
  end)

  it("reads ids of every dtype, contiguous or a strided view, in row-major order", function()
    local m = nn.Embedding(6, 3)
    for _, dtype in ipairs { "float32", "float64", "int64" } do
      local ids = attn.tensor({ { 1, 2 }, { 5, 3 } }, dtype):transpose(1, 2) -- { { 1, 5 }, { 2, 3 } }, strided
      local want = attn.stack({ attn.stack({ m.weight[1], m.weight[5] }), attn.stack({ m.weight[2], m.weight[3] }) })
      assert.close(m(ids), want, { atol = 0 })
      assert.close(m(ids:contiguous()), want, { atol = 0 })
      local bad = attn.tensor({ { 1, 2 }, { 7, 3 } }, dtype)
      assert.error_matches(function() m(bad:transpose(1, 2)) end, "token id 7 at position 2 is out of range 1..6")
      assert.error_matches(function() m(bad) end, "token id 7 at position 3 is out of range 1..6")
    end
  end)

  it("sends gradients to the rows used (repeated ids accumulate)", function()
    local m = nn.Embedding(4, 2):to("float64")
    local y = m({ { 1, 3, 3 } })
    y:sum():backward()
    assert.close(m.weight.grad, { { 1, 1 }, { 0, 0 }, { 2, 2 }, { 0, 0 } }, { atol = 0 })
    helper.gradcheck(function() return m({ { 2, 4 }, { 4, 1 } }) end, { m.weight })
  end)

  -- PyTorch's padding_idx with attn's 1-based ids: the row starts as zeros, is looked up as
  -- it is, and its gradient is zero; the other rows get sum over positions of the output
  -- gradient, as without padding_idx.
  it("padding_idx (1-based, or negative from the end): a zero row that receives no gradient", function()
    for _, dtype in ipairs { "float32", "float64" } do
      for _, c in ipairs { { 2, 2 }, { -1, 5 }, { -5, 1 } } do
        local m = nn.Embedding(5, 3, { padding_idx = c[1], dtype = dtype })
        assert.equal(c[2], m.padding_idx)
        assert.close(m.weight[c[2]], { 0, 0, 0 }, { atol = 0 })
        assert.equal(string.format("Embedding(5, 3, padding_idx=%d)", c[2]), tostring(m))
        attn.no_grad(function() m.weight:copy_(attn.randn({ 5, 3 }, dtype)) end) -- a loaded, nonzero row
        local ids = { { 1, c[2], 3 }, { c[2], 3, 5 } }
        local y = m(ids)
        local W = m.weight:totable()
        local probe = attn.randn({ 2, 3, 3 }, dtype)
        local want, grad = {}, {}
        for r = 1, 5 do grad[r] = { 0, 0, 0 } end
        local P = probe:totable()
        for i, row in ipairs(ids) do
          want[i] = {}
          for j, id in ipairs(row) do
            want[i][j] = W[id]
            if id ~= c[2] then
              for k = 1, 3 do grad[id][k] = grad[id][k] + P[i][j][k] end
            end
          end
        end
        assert.close(y, want, { atol = 0 })
        m.weight.grad = nil
        (y * probe):sum():backward()
        assert.close(m.weight.grad, grad, { atol = 1e-6 })
      end
    end
  end)

  -- PyTorch's embedding_renorm_: each distinct row the ids name with ||row||_p > max_norm is
  -- scaled in place by max_norm / (||row||_p + 1e-7) before the lookup, outside autograd.
  it("max_norm renormalises the rows looked up, in place, with norm_type p", function()
    for _, dtype in ipairs { "float32", "float64" } do
      for _, p in ipairs { 2, 1, 3.5 } do
        local m = nn.Embedding(6, 4, { max_norm = 1.5, norm_type = p, dtype = dtype })
        attn.no_grad(function() m.weight:mul_(2) end)
        local W = m.weight:totable()
        local ids = { { 2, 4, 2 }, { 6, 1, 4 } }
        local want = {}
        for r, row in ipairs(W) do
          local used = r ~= 3 and r ~= 5
          local norm = 0
          for _, v in ipairs(row) do norm = norm + math.abs(v) ^ p end
          norm = norm ^ (1 / p)
          want[r] = {}
          for k, v in ipairs(row) do want[r][k] = (used and norm > 1.5) and v * (1.5 / (norm + 1e-7)) or v end
        end
        local y = m(ids)
        local tol = dtype == "float32" and 1e-6 or 1e-14
        assert.close(m.weight, want, { atol = tol })
        assert.close(y, { { want[2], want[4], want[2] }, { want[6], want[1], want[4] } }, { atol = tol })
        y:sum():backward() -- the renorm is outside autograd: the lookup's gradient only
        assert.close(m.weight.grad, { { 1, 1, 1, 1 }, { 2, 2, 2, 2 }, { 0, 0, 0, 0 }, { 2, 2, 2, 2 }, { 0, 0, 0, 0 },
          { 1, 1, 1, 1 } }, { atol = 0 })
      end
    end
  end)

  it("refuses options that do not exist and bad padding_idx, max_norm or norm_type", function()
    assert.error_matches(function() nn.Embedding(5, 3, { padding = 1 }) end, "Embedding: unknown option 'padding'")
    for _, v in ipairs { 0, 6, -6, 1.5 } do
      assert.error_matches(function() nn.Embedding(5, 3, { padding_idx = v }) end,
        "Embedding: padding_idx must be a 1%-based id in 1..5 or %-5..%-1 %(from the end%), got "
        .. (tostring(v):gsub("%-", "%%-")))
    end
    assert.error_matches(function() nn.Embedding(5, 3, { max_norm = 0 }) end,
      "Embedding: max_norm must be a positive number, got 0")
    assert.error_matches(function() nn.Embedding(5, 3, { norm_type = "l2" }) end,
      "Embedding: norm_type must be a positive number, got l2")
    local m = nn.Embedding(5, 3, { padding_idx = 1, max_norm = 1 })
    assert.error_matches(function() m({ 1, 6 }) end, "Embedding: token id 6 at position 2 is out of range 1..5")
  end)
end)

describe("nn.Dropout", function()
  it("is the identity in eval mode and with p = 0", function()
    local x = attn.randn({ 4, 5 })
    local d = nn.Dropout(0.5)
    d:eval()
    assert.equal(x, d(x))
    assert.equal(x, nn.Dropout(0)(x))
    assert.is_false(d.training)
  end)

  it("zeroes a fraction p in training and scales the rest by 1/(1-p)", function()
    attn.manual_seed(5)
    local d = nn.Dropout(0.5)
    local x = attn.ones({ 200, 100 })
    local y = d(x)
    local zeros = y:eq(0):sum():item() / 20000
    assert.is_true(math.abs(zeros - 0.5) < 0.02, "fraction dropped " .. zeros)
    local kept = y:gt(0)
    assert.close((y * kept):sum():item() / kept:sum():item(), 2, { atol = 1e-6 })
    assert.is_true(math.abs(y:mean():item() - 1) < 0.03, "mean " .. y:mean():item())
    -- a second call draws a new mask
    assert.is_false(helper.compare(d(x), y))
    assert.close(nn.Dropout(1)(x), attn.zeros({ 200, 100 }))
  end)

  it("passes gradcheck with a fixed mask", function()
    local d = nn.Dropout(0.3)
    local x = helper.param({ 3, 4 })
    helper.gradcheck(function(xx)
      attn.manual_seed(9)
      return d(xx)
    end, { x })
  end)

  it("rejects a bad p", function()
    assert.error_matches(function() nn.Dropout(1.5) end, "p must be a probability")
  end)
end)

describe("nn.dropout: the engine's one dropout (src/attn_dropout.h)", function()
  local core = attn.core

  -- The rule, written again from its definition in Lua's 64-bit integers:
  -- entry i of stream seed is dropped when the top 53 bits of splitmix64's
  -- finaliser of seed + (i + 1) * golden are below p * 2^53.
  local function dropped(seed, i, p)
    local z = seed + (i + 1) * 0x9e3779b97f4a7c15
    z = (z ~ (z >> 30)) * 0xbf58476d1ce4e5b9
    z = (z ~ (z >> 27)) * 0x94d049bb133111eb
    z = z ~ (z >> 31)
    return (z >> 11) < math.floor(p * 2 ^ 53)
  end

  local isas = helper.isa_paths()

  it("drops exactly the entries the hash rule names and scales the rest by 1/(1-p), on every path", function()
    local saved = core.isa()
    local p, scale = 0.3, 1 / 0.7
    for _, isa in ipairs(isas) do
      core.isa(isa)
      for _, dtype in ipairs { "float32", "float64" } do
        local x = attn.randn({ 37, 29 }, dtype) + 5 -- no zeros of its own
        local y, seed = core.dropout(x, p)
        local xs, ys, wrong = x:totable(), y:totable(), 0
        for r = 1, 37 do
          for c = 1, 29 do
            local want = dropped(seed, (r - 1) * 29 + (c - 1), p) and 0 or xs[r][c] * scale
            if dtype == "float32" then want = string.unpack("f", string.pack("f", want)) end
            if ys[r][c] ~= want then wrong = wrong + 1 end
          end
        end
        assert.equal(0, wrong, isa .. " " .. dtype .. ": entries that differ from the rule")
      end
    end
    core.isa(saved)
  end)

  it("gives 0 for a dropped NaN or inf (the mask clears bits, it does not multiply), on every path", function()
    local saved = core.isa()
    for k = 1, 2 * #isas do
      local dtype = k % 2 == 1 and "float32" or "float64"
      core.isa(isas[(k + 1) // 2])
      local values = {}
      for i = 1, 60 do values[i] = ({ 0 / 0, math.huge, -math.huge })[i % 3 + 1] end
      local x = attn.tensor(values, dtype)
      local y, seed = core.dropout(x, 0.5)
      local ys, xs, seen = y:totable(), x:totable(), 0
      for i = 1, 60 do
        if dropped(seed, i - 1, 0.5) then
          assert.equal(0, ys[i])
          seen = seen + 1
        elseif xs[i] ~= xs[i] then
          assert.is_true(ys[i] ~= ys[i])
        else
          assert.equal(xs[i], ys[i])
        end
      end
      assert.is_true(seen > 0) -- (all 60 kept has probability 2^-60)
    end
    core.isa(saved)
  end)

  it("has the statistics of independent Bernoulli(1 - p) draws", function()
    attn.manual_seed(11)
    local n, p = 40000, 0.3
    local y = nn.dropout(attn.ones({ n }, "float64"), p, true):totable()
    local drops, pairs_both = 0, 0
    for i = 1, n do
      local d = y[i] == 0
      if d then drops = drops + 1 end
      if d and i > 1 and y[i - 1] == 0 then pairs_both = pairs_both + 1 end
      assert.is_true(d or y[i] == 1 / (1 - p))
    end
    local sd = math.sqrt(p * (1 - p) / n)
    assert.is_true(math.abs(drops / n - p) < 5 * sd, "fraction dropped " .. drops / n)
    -- neighbours are independent: both dropped with probability p^2
    local sd2 = math.sqrt(p * p * (1 - p * p) / (n - 1))
    assert.is_true(math.abs(pairs_both / (n - 1) - p * p) < 5 * sd2, "neighbours both dropped " .. pairs_both / (n - 1))
  end)

  it("is reproducible from attn.manual_seed and the same bits on 1 and 2 threads", function()
    local x = attn.randn({ 300, 300 }) -- past one chunk of the worker pool
    local threads = attn.get_num_threads()
    local runs = {}
    for k, t in ipairs { 1, 2, 1 } do
      attn.set_num_threads(t)
      attn.manual_seed(7)
      runs[k] = { nn.dropout(x, 0.5, true), nn.dropout(x, 0.5, true) }
    end
    attn.set_num_threads(threads)
    helper.assert_identical(runs[2][1], runs[1][1])
    helper.assert_identical(runs[3][2], runs[1][2])
    assert.is_false(helper.compare(runs[1][2], runs[1][1]), "the second call draws a new mask")
  end)

  it("indexes a strided view in its own row-major order, and backward reuses the mask", function()
    local base = attn.randn({ 6, 5 }, { dtype = "float64" }) + 3
    local x = base:transpose(1, 2):detach():requires_grad_()
    attn.manual_seed(3)
    local y = nn.dropout(x, 0.4, true)
    attn.manual_seed(3)
    local y2 = nn.dropout(x:contiguous(), 0.4, true)
    helper.assert_identical(y:detach(), y2:detach())
    local w = attn.randn({ 5, 6 }, "float64")
    local loss = (y * w):sum()
    loss:backward()
    assert.close(x.grad, y:detach() / x:detach() * w, { atol = 1e-12 })
  end)

  it("is the mask the attention kernels apply to their weights (index (b*Nq + i)*Nk + j)", function()
    local B, Nq, Nk, p = 2, 3, 5, 0.4
    for _, dtype in ipairs { "float32", "float64" } do
      -- equal scores give weights 1/Nk, and identity values read the dropped weights out
      local Q, K = attn.zeros({ B, Nq, 4 }, dtype), attn.zeros({ B, Nk, 4 }, dtype)
      local V = attn.eye(Nk, dtype):unsqueeze(1):expand(B, Nk, Nk):contiguous()
      local out, _, seed = core.sdpa_forward(Q, K, V, { dropout = p, need_weights = false })
      local mask = core.dropout(attn.ones({ B, Nq, Nk }, dtype), p, seed)
      assert.close(out * Nk, mask, { atol = 1e-6 })
    end
  end)

  it("p = 1 gives zeros even for infinite inputs; bad p and int64 raise", function()
    local x = attn.tensor({ 1, math.huge, -math.huge })
    assert.same({ 0, 0, 0 }, nn.dropout(x, 1, true):totable())
    assert.error_matches(function() core.dropout(x, 1.5) end, "dropout: p must be a probability in [0, 1], got 1.5",
      nil, true)
    assert.error_matches(function() core.dropout(attn.tensor({ 1 }, "int64"), 0.5) end, "dropout", nil, true)
  end)
end)

describe("nn.LayerNorm", function()
  it("gives d2l's [[-1, 1], [-1, 1]] on [[1, 2], [2, 3]] (eps visible at 1e-4)", function()
    local ln = nn.LayerNorm(2)
    local y = ln(attn.tensor({ { 1, 2 }, { 2, 3 } }))
    assert.close(y, { { -1, 1 }, { -1, 1 } }, { atol = 1e-4 })
    -- the eps term: 0.5 / sqrt(0.25 + 1e-5) = 0.99998
    assert.close(y, { { -0.99998, 0.99998 }, { -0.99998, 0.99998 } }, { atol = 2e-6 })
  end)

  it("normalises over the trailing dims given, like a naive loop", function()
    attn.manual_seed(2)
    local ln = nn.LayerNorm({ 3, 4 }, { eps = 1e-3 })
    ln.weight = attn.randn({ 3, 4 }):requires_grad_()
    ln.bias = attn.randn({ 3, 4 }):requires_grad_()
    local x = attn.randn({ 2, 3, 4 }) * 3 + 1
    local rows = {}
    for b, sample in ipairs(x:totable()) do rows[b] = flat(sample) end
    local expected = naive_layernorm(rows, 1e-3, flat(ln.weight:totable()), flat(ln.bias:totable()))
    assert.close(ln(x):reshape({ 2, 12 }), expected, { atol = 1e-5 })
    assert.same({ "weight", "bias" }, ln:parameter_names())
  end)

  it("starts with weight ones and bias zeros", function()
    local ln = nn.LayerNorm(3)
    assert.close(ln.weight, { 1, 1, 1 }, { atol = 0 })
    assert.close(ln.bias, { 0, 0, 0 }, { atol = 0 })
    assert.equal("LayerNorm((3,), eps=1e-05, elementwise_affine=True)", tostring(ln))
    assert.equal("LayerNorm((100, 24), eps=1e-05, elementwise_affine=True)", tostring(nn.LayerNorm({ 100, 24 })))
  end)

  it("passes gradcheck for input, weight and bias (float64)", function()
    local ln = nn.LayerNorm({ 2, 3 }):to("float64")
    attn.no_grad(function()
      ln.weight:copy_(attn.randn({ 2, 3 }))
      ln.bias:copy_(attn.randn({ 2, 3 }))
    end)
    helper.gradcheck(function(x) return ln(x) end, { helper.param({ 2, 2, 3 }), ln.weight, ln.bias })
  end)

  it("the fused node equals the composed ops (float32 values and gradients); no-affine passes gradcheck", function()
    local ln = nn.LayerNorm({ 3, 4 })
    attn.no_grad(function()
      ln.weight:copy_(attn.randn({ 3, 4 }))
      ln.bias:copy_(attn.randn({ 3, 4 }))
    end)
    local x = attn.randn({ 5, 3, 4 }, { requires_grad = true })
    local g = attn.randn({ 5, 3, 4 })
    local y1 = ln(x)
    y1:backward(g)
    local gx, gw, gb = x.grad, ln.weight.grad, ln.bias.grad
    x.grad, ln.weight.grad, ln.bias.grad = nil, nil, nil
    local x2 = x:reshape({ 5, 12 })
    local c = x2 - x2:mean(-1, true)
    local y2 = (c / (c:square():mean(-1, true) + 1e-5):sqrt()):reshape({ 5, 3, 4 }) * ln.weight + ln.bias
    y2:backward(g)
    local tol = { rtol = 1e-5, atol = 1e-5 }
    assert.close(y1, y2, tol)
    assert.close(gx, x.grad, tol)
    assert.close(gw, ln.weight.grad, tol)
    assert.close(gb, ln.bias.grad, tol)
    local plain = nn.LayerNorm(4, { elementwise_affine = false, dtype = "float64" })
    helper.gradcheck(function(a) return plain(a) end, { helper.param({ 3, 4 }) })
  end)

  it("names the shapes on a mismatch", function()
    assert.error_matches(function() nn.LayerNorm(4)(attn.ones({ 2, 3 })) end,
      "LayerNorm: input %[2x3%] does not end with normalized_shape %[4%]")
  end)
end)

describe("layer_norm kernel", function()
  local linear = require "attn.nn.linear"

  -- Output and every gradient of fn(x, w, b) under the upstream gradient g.
  local function run(fn, x, w, b, n, g)
    local xs, ws, bs = x:clone():requires_grad_(), w and w:clone():requires_grad_(), b and b:clone():requires_grad_()
    local y = fn(xs, n, ws, bs, 1e-5)
    y:backward(g)
    return y, xs.grad, ws and ws.grad, bs and bs.grad
  end

  local cases = {
    { x = { 7, 5 }, ns = { 5 } },
    { x = { 2, 100, 24 }, ns = { 100, 24 } }, -- the book's LayerNorm([100, 24])
    { x = { 3, 5, 7 }, ns = { 7 } },
    { x = { 3, 5, 7 }, ns = { 5, 7 } },
    { x = { 4, 1 }, ns = { 1 } }, -- one entry per row: xhat = 0, y = bias
    { x = { 0, 3 }, ns = { 3 } }, -- no rows: zero parameter gradients
  }
  for _, dtype in ipairs { "float32", "float64" } do
    local tol = dtype == "float32" and { rtol = 1e-5, atol = 1e-5 } or { rtol = 1e-12, atol = 1e-12 }
    for _, c in ipairs(cases) do
      for _, affine in ipairs { true, false } do
        local name = string.format("equals the composed ops, %s %s over %s, affine %s", dtype,
          attn.core.shape_str(c.x), attn.core.shape_str(c.ns),
          tostring(affine))
        it(name, function()
          attn.manual_seed(11)
          local n = 1
          for _, d in ipairs(c.ns) do n = n * d end
          local x = attn.randn(c.x, dtype) * 3 + 1
          local w = affine and attn.randn(c.ns, dtype) or nil
          local b = affine and attn.randn(c.ns, dtype) or nil
          local g = attn.randn(c.x, dtype)
          local k = { run(linear.layer_norm, x, w, b, n, g) }
          local r = { run(linear.layer_norm_composed, x, w, b, n, g) }
          assert.same(c.x, k[1]:shape())
          for i = 1, affine and 4 or 2 do
            assert.equal(dtype, k[i]:dtype())
            assert.same(r[i]:shape(), k[i]:shape())
            assert.close(k[i], r[i], tol)
          end
        end)
      end
    end
  end

  it("takes non-contiguous input and weight with only a bias", function()
    attn.manual_seed(5)
    local x = attn.randn({ 6, 4 }, "float64"):transpose(1, 2) -- (4, 6), strided
    local b = attn.randn({ 6 }, "float64")
    local g = attn.randn({ 4, 6 }, "float64")
    local k = { run(linear.layer_norm, x, nil, b, 6, g) }
    local r = { run(linear.layer_norm_composed, x, nil, b, 6, g) }
    for i = 1, 2 do assert.close(k[i], r[i], { rtol = 1e-12, atol = 1e-12 }) end
    assert.close(k[4], r[4], { rtol = 1e-12, atol = 1e-12 })
  end)

  it("passes gradcheck (float64, two normalised dims)", function()
    local w, b = helper.param({ 3, 2 }), helper.param({ 3, 2 })
    helper.gradcheck(function(x, ww, bb) return linear.layer_norm(x, 6, ww, bb, 1e-5) end,
      { helper.param({ 4, 3, 2 }), w, b })
  end)

  it("gives the same bits on 1 and 2 threads", function()
    attn.manual_seed(3)
    local x, w, b = attn.randn { 3000, 33 }, attn.randn { 33 }, attn.randn { 33 }
    local g = attn.randn { 3000, 33 }
    local before = attn.get_num_threads()
    local res = {}
    for _, t in ipairs { 1, 2 } do
      attn.set_num_threads(t)
      res[t] = { run(linear.layer_norm, x, w, b, 33, g) }
    end
    attn.set_num_threads(before)
    for i = 1, 4 do helper.assert_identical(res[2][i], res[1][i]) end
  end)

  it("names the shapes when the rows do not fit", function()
    assert.error_matches(function() attn.core.layer_norm_forward(attn.ones({ 2, 3 }), 4, nil, nil, 1e-5) end,
      "layer_norm: input %[2x3%] does not split into rows of 4 entries")
    assert.error_matches(function()
      attn.core.layer_norm_forward(attn.ones({ 2, 3 }), 3, attn.ones({ 4 }), nil, 1e-5)
    end, "layer_norm: weight %[4%] must have 3 entries")
    assert.error_matches(function()
      attn.core.layer_norm_forward(attn.ones({ 2, 3 }), 3, attn.ones({ 3 }, "float64"), nil, 1e-5)
    end, "layer_norm: weight %[3%] is float64, expected float32")
  end)
end)

describe("nn.ReLU and nn.Sequential", function()
  it("ReLU clamps at zero and passes gradcheck", function()
    assert.close(nn.ReLU()(attn.tensor({ -1, 0, 2 })), { 0, 0, 2 }, { atol = 0 })
    local x = attn.tensor({ { -1.3, 0.4 }, { 2.1, -0.2 } }, { dtype = "float64", requires_grad = true })
    helper.gradcheck(function(xx) return nn.ReLU()(xx) end, { x })
  end)

  it("FFN Sequential(Linear(4,4), ReLU, Linear(4,8)) on ones(2,3,4) -> (2,3,8) with identical rows", function()
    attn.manual_seed(1)
    local ffn = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 8))
    local y = ffn(attn.ones({ 2, 3, 4 }))
    assert.same({ 2, 3, 8 }, y:shape())
    local t = y:totable()
    for b = 1, 2 do
      for r = 1, 3 do assert.close(t[b][r], t[1][1], { atol = 0 }) end
    end
    -- against a naive composition
    local h = naive_linear({ { 1, 1, 1, 1 } }, ffn[1].weight:totable(), ffn[1].bias:totable())
    for i, v in ipairs(h[1]) do h[1][i] = math.max(v, 0) end
    assert.close(t[1][1], naive_linear(h, ffn[3].weight:totable(), ffn[3].bias:totable())[1], { atol = 1e-5 })
  end)

  it("names children 0, 1, ... (PyTorch) and indexes them 1-based in Lua", function()
    local ffn = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 8))
    assert.equal(3, #ffn)
    local names = ffn:parameter_names()
    assert.same({ "0.weight", "0.bias", "2.weight", "2.bias" }, names)
    assert.same({ "2.weight", ffn[3].weight }, ffn:named_parameters()[3])
    ffn:append(nn.ReLU())
    assert.equal(4, #ffn)
    local MySeq = nn.Sequential:extend("MySeq") -- subclasses keep #
    assert.equal(2, #MySeq(nn.ReLU(), nn.ReLU()))
    assert.error_matches(function() nn.Sequential(nn.ReLU(), 3) end, "element 2 must be a module")
  end)

  it("passes gradcheck through every layer", function()
    local ffn = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)):to("float64")
    local inputs = { helper.param({ 2, 3 }) }
    for _, p in ipairs(ffn:parameters()) do inputs[#inputs + 1] = p end
    helper.gradcheck(function(x) return ffn(x) end, inputs)
  end)
end)

describe("nn.init", function()
  it("is the module attn.nn.init (the file nn/init.lua holds the initialisers; the package is nn.lua)", function()
    assert.equal(nn.init, require "attn.nn.init")
    assert.equal(nn, require "attn.nn")
    assert.is_function(require("attn.nn.init").xavier_uniform_)
    assert.is_nil(require("attn.nn.init").Linear)
  end)

  it("xavier_uniform_ stays within gain * sqrt(6 / (fan_in + fan_out))", function()
    attn.manual_seed(4)
    local t = attn.empty({ 30, 20 })
    assert.equal(t, nn.init.xavier_uniform_(t))
    local bound = math.sqrt(6 / 50)
    assert.is_true(t:abs():max():item() <= bound)
    assert.is_true(t:abs():max():item() > 0.9 * bound)
    nn.init.xavier_uniform_(t, 2)
    assert.is_true(t:abs():max():item() > bound)
    assert.error_matches(function() nn.init.xavier_uniform_(attn.empty({ 3 })) end, "at least 2 dims")
  end)

  it("works on parameters that require grad, outside autograd", function()
    local m = nn.Linear(3, 3)
    nn.init.zeros_(m.weight)
    assert.close(m.weight, attn.zeros({ 3, 3 }), { atol = 0 })
    nn.init.uniform_(m.bias, 2, 3)
    assert.is_true(m.bias:min():item() >= 2 and m.bias:max():item() <= 3)
    attn.manual_seed(8)
    local big = nn.init.normal_(attn.empty({ 100, 100 }), 1, 2)
    assert.is_true(math.abs(big:mean():item() - 1) < 0.06)
    assert.is_true(m.weight:is_leaf() and m.weight.requires_grad)
  end)

  it("the fused linear node equals matmul + add (values and gradients, 1-D to 3-D, with and without bias)", function()
    local linear = require "attn.nn.linear"
    for _, dtype in ipairs { "float32", "float64" } do
      local tol = dtype == "float32" and { rtol = 1e-5, atol = 1e-6 } or { rtol = 1e-12, atol = 1e-13 }
      for _, shape in ipairs { { 5 }, { 3, 5 }, { 2, 3, 5 } } do
        for _, with_bias in ipairs { true, false } do
          local opts = { dtype = dtype, requires_grad = true }
          local x, w = attn.randn(shape, opts), attn.randn({ 4, 5 }, opts)
          local b = with_bias and attn.randn({ 4 }, opts) or nil
          local out_shape = { table.unpack(shape) }
          out_shape[#out_shape] = 4
          local g = attn.randn(out_shape, dtype)
          local function grads(y)
            x.grad, w.grad = nil, nil
            if b then b.grad = nil end
            y:backward(g)
            return x.grad, w.grad, b and b.grad
          end
          local y1 = linear.linear(x, w, b)
          local gx1, gw1, gb1 = grads(y1)
          local y2 = x:matmul(w:t())
          if b then y2 = y2 + b end
          local gx2, gw2, gb2 = grads(y2)
          assert.same(out_shape, y1:shape())
          assert.close(y1, y2, tol)
          assert.close(gx1, gx2, tol)
          assert.close(gw1, gw2, tol)
          if b then assert.close(gb1, gb2, tol) end
        end
      end
    end
    local x, w, b = helper.param({ 2, 3, 5 }), helper.param({ 4, 5 }), helper.param({ 4 })
    helper.gradcheck(function(a, c, d) return linear.linear(a, c, d) end, { x, w, b })
  end)
end)

describe("fused nodes: linear_relu and add_layer_norm", function()
  local linear = require "attn.nn.linear"

  -- Runs fn on fresh copies of the inputs (requiring grad), backward with g;
  -- returns the output and the inputs' gradients.
  local function run(fn, inputs, g)
    local copies = {}
    for i, t in ipairs(inputs) do copies[i] = t:detach():clone():requires_grad_() end
    local out = fn(table.unpack(copies))
    out:backward(g)
    local grads = {}
    for i, t in ipairs(copies) do grads[i] = t.grad end
    return out, grads
  end

  it("linear_relu gives the bits of linear then relu, forward and backward, and passes gradcheck", function()
    attn.manual_seed(3)
    for _, dtype in ipairs { "float32", "float64" } do
      local x, w, b = attn.randn({ 2, 5, 4 }, dtype), attn.randn({ 6, 4 }, dtype), attn.randn({ 6 }, dtype)
      local g = attn.randn({ 2, 5, 6 }, dtype)
      local y1, g1 = run(linear.linear_relu, { x, w, b }, g)
      local y2, g2 = run(function(a, c, d) return linear.linear(a, c, d):relu() end, { x, w, b }, g)
      assert.are.equal("linear_relu", y1.grad_fn.name)
      helper.assert_identical(y1, y2)
      for i = 1, 3 do helper.assert_identical(g1[i], g2[i]) end
    end
    helper.gradcheck(linear.linear_relu, { helper.param({ 3, 4 }), helper.param({ 5, 4 }), helper.param({ 5 }) })
    helper.gradcheck(function(a, c) return linear.linear_relu(a, c) end, { helper.param({ 3, 4 }), helper.param({ 2, 4 }) })
  end)

  it("add_layer_norm gives the bits of dropout, add and layer_norm, forward and backward, and passes gradcheck",
    function()
      for _, training in ipairs { false, true } do
        local x, y = attn.randn({ 4, 3, 8 }), attn.randn({ 4, 3, 8 })
        local w, b = attn.randn({ 8 }), attn.randn({ 8 })
        local g = attn.randn({ 4, 3, 8 })
        attn.manual_seed(11) -- both draw the dropout seed from the generator
        local z1, g1 = run(function(a, c, d, e) return linear.add_layer_norm(a, c, 0.3, training, 8, d, e, 1e-5) end,
          { x, y, w, b }, g)
        attn.manual_seed(11)
        local z2, g2 = run(function(a, c, d, e)
          return linear.layer_norm(linear.dropout(c, 0.3, training) + a, 8, d, e, 1e-5)
        end, { x, y, w, b }, g)
        helper.assert_identical(z1, z2)
        for i = 1, 4 do helper.assert_identical(g1[i], g2[i]) end
      end
      -- with a fixed dropout seed the node is a function: finite differences agree
      helper.gradcheck(function(a, c, d, e) return linear.add_layer_norm(a, c, 0.25, true, 4, d, e, 1e-5, 99) end,
        { helper.param({ 3, 4 }), helper.param({ 3, 4 }), helper.param({ 4 }), helper.param({ 4 }) })
      helper.gradcheck(function(a, c) return linear.add_layer_norm(a, c, 0, false, 6, nil, nil, 1e-5) end,
        { helper.param({ 2, 6 }), helper.param({ 1, 6 }) })
    end)

  it("the stock PositionWiseFFN and AddNorm use them; replaced layers keep their own path", function()
    local transformer = require "attn.nn.transformer"
    local ffn = transformer.PositionWiseFFN(4, 8, 4)
    local addnorm = transformer.AddNorm(4, 0.2)
    local x = attn.randn({ 2, 3, 4 }, { requires_grad = true })
    assert.are.equal("linear_relu", ffn.dense1:forward_relu(x).grad_fn.name)
    assert.are.equal("add_layer_norm", addnorm(x, ffn(x)).grad_fn.name)
    local h = ffn.dense1(x)
    assert.are.equal("linear_relu", ffn(x).grad_fn.inputs[1].grad_fn.name)
    ffn.relu = nn.GELU()
    helper.assert_identical(ffn(x), ffn.dense2(nn.GELU()(h)))
    addnorm.dropout = nn.Identity()
    assert.are.equal("layer_norm", addnorm(x, x).grad_fn.name)
    assert.has_error(function() addnorm.ln:forward_add(x, x:narrow(2, 1, 2), 0, false) end,
      "LayerNorm: the two inputs of forward_add differ in shape: [2x3x4] and [2x2x4]")
  end)
end)
