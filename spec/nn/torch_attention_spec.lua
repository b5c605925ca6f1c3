-- nn.MultiheadAttention (PyTorch's): PyTorch 1.13 fixtures, a naive reference of PyTorch's
-- formula, finite-difference gradients, PyTorch's keys and initialisation, and bad input.
local attn = require "attn"
local helper = require "helper"
local F = require "nn.torch_fixtures"
local nn = attn.nn

-- ---------------------------------------------------------------- the naive reference
-- PyTorch's multi_head_attention_forward (1.13, torch/nn/functional.py), batch-first, per sample b,
-- head h (rows b*H + h of a 3-D attn_mask), query i, key j, head width hd = E / H:
--   q = query W_q^T + b_q, k = key W_k^T + b_k, v = value W_v^T + b_v   (W_* rows of in_proj_weight)
--   s[b,h,i,j] = sum_d q[b,i,h*hd+d] k[b,j,h*hd+d] / sqrt(hd) + (float attn_mask)[.,i,j] + (float kpm)[b,j]
--   key j is removed when a boolean mask holds 1 there (attn_mask or key_padding_mask) or s = -inf
--   w[b,h,i,:] = softmax of s over the kept keys (0 on removed ones; all removed: a zero row, where
--   PyTorch 1.13 gives NaN)
--   out[b,i,h*hd+d] = sum_j w[b,h,i,j] v[b,j,h*hd+d];  output = out W_o^T + b_o
--   weights: w averaged over h (sum / H) or per head.

local function affine(x, W, b) -- x (n, in) rows, W (out, in), b (out) or nil
  local y = {}
  for r = 1, #x do
    y[r] = {}
    for o = 1, #W do
      local s = b and b[o] or 0
      for c = 1, #W[o] do s = s + x[r][c] * W[o][c] end
      y[r][o] = s
    end
  end
  return y
end

local function rows_of(t) return t and t:totable() end

-- m: the module; q (N, L, E), k (N, S, kdim), v (N, S, vdim) as tensors; masks as tensors in
-- PyTorch's form (int64: boolean, float: additive) with shapes for batched input.
local function reference(m, q, k, v, masks)
  local E, H = m.embed_dim, m.num_heads
  local hd = E // H
  local Wq, Wk, Wv
  if m.in_proj_weight then
    local W = m.in_proj_weight
    Wq, Wk, Wv = rows_of(W:narrow(1, 1, E)), rows_of(W:narrow(1, E + 1, E)), rows_of(W:narrow(1, 2 * E + 1, E))
  else
    Wq, Wk, Wv = rows_of(m.q_proj_weight), rows_of(m.k_proj_weight), rows_of(m.v_proj_weight)
  end
  local b = m.in_proj_bias
  local bq, bk, bv = b and b:narrow(1, 1, E):totable(), b and b:narrow(1, E + 1, E):totable(),
    b and b:narrow(1, 2 * E + 1, E):totable()
  local Wo, bo = rows_of(m.out_proj.weight), m.out_proj.bias and m.out_proj.bias:totable()
  local N, L, S = q:size(1), q:size(2), k:size(2)
  local am, kpm = masks.attn_mask, masks.key_padding_mask
  local am_t, kpm_t = am and am:totable(), kpm and kpm:totable()
  local am_bool, kpm_bool = am and am:dtype() == "int64", kpm and kpm:dtype() == "int64"
  local out, weights = {}, {}
  for n = 1, N do
    local qp = affine(q:select(1, n):totable(), Wq, bq)
    local kp = affine(k:select(1, n):totable(), Wk, bk)
    local vp = affine(v:select(1, n):totable(), Wv, bv)
    local ctx = {}
    for i = 1, L do ctx[i] = {} end
    weights[n] = {}
    for h = 1, H do
      weights[n][h] = {}
      for i = 1, L do
        local s, kept = {}, {}
        for j = 1, S do
          local x = 0
          for d = 1, hd do x = x + qp[i][(h - 1) * hd + d] * kp[j][(h - 1) * hd + d] end
          x = x / math.sqrt(hd)
          local keep = true
          if am then
            local a = am:dim() == 2 and am_t[i][j] or am_t[(n - 1) * H + h][i][j]
            if am_bool then keep = keep and a == 0 else x = x + a end
          end
          if kpm then
            local a = kpm_t[n][j]
            if kpm_bool then keep = keep and a == 0 else x = x + a end
          end
          if x == -math.huge then keep = false end
          s[j], kept[j] = x, keep
        end
        local mx = -math.huge
        for j = 1, S do if kept[j] and s[j] > mx then mx = s[j] end end
        local total = 0
        for j = 1, S do
          s[j] = kept[j] and math.exp(s[j] - mx) or 0
          total = total + s[j]
        end
        for j = 1, S do s[j] = total > 0 and s[j] / total or 0 end
        weights[n][h][i] = s
        for d = 1, hd do
          local acc = 0
          for j = 1, S do acc = acc + s[j] * vp[j][(h - 1) * hd + d] end
          ctx[i][(h - 1) * hd + d] = acc
        end
      end
    end
    out[n] = affine(ctx, Wo, bo)
  end
  local avg = {}
  for n = 1, N do
    avg[n] = {}
    for i = 1, L do
      avg[n][i] = {}
      for j = 1, S do
        local s = 0
        for h = 1, H do s = s + weights[n][h][i][j] end
        avg[n][i][j] = s / H
      end
    end
  end
  return attn.tensor(out, "float64"), attn.tensor(weights, "float64"), attn.tensor(avg, "float64")
end

local function bool_mask(rows) return attn.tensor(rows, "int64") end

-- The module's call in its layout for batch-first tensors q, k, v; the outputs back batch-first.
local function call(m, q, k, v, opts)
  local function lay(x) return m.batch_first and x or x:transpose(1, 2) end
  local out, w = m(lay(q), rawequal(k, q) and lay(q) or lay(k), rawequal(v, q) and lay(q) or lay(v), opts)
  return lay(out), w
end

local with = helper.with

describe("nn.MultiheadAttention", function()
  after_each(function() attn.set_num_threads(1) end)

  describe("PyTorch 1.13 fixtures (float64, to 1e-10)", function()
    for _, threads in ipairs { 1, 2 } do
      for _, name in ipairs(F.mha_cases) do
        it(name .. ", " .. threads .. " thread(s): outputs, input and parameter gradients", function()
          attn.set_num_threads(threads)
          F.check(name, { min_n = 7 })
        end)
      end
    end
  end)

  describe("against the naive reference", function()
    local N, L, S, E, H = 2, 3, 5, 6, 2
    local kpm_bool = bool_mask({ { 0, 0, 1, 0, 1 }, { 0, 0, 0, 0, 0 } })
    local am_bool = bool_mask({ { 0, 1, 0, 0, 0 }, { 0, 0, 0, 0, 1 }, { 1, 0, 0, 0, 0 } })
    local cases = {
      { "no mask", {} },
      { "boolean key_padding_mask", { key_padding_mask = kpm_bool } },
      { "boolean attn_mask (L, S)", { attn_mask = am_bool } },
      { "both boolean", { attn_mask = am_bool, key_padding_mask = kpm_bool } },
      { "float attn_mask (L, S)", { attn_mask = "float2" } },
      { "float attn_mask (N*H, L, S) and boolean padding", { attn_mask = "float3", key_padding_mask = kpm_bool } },
      { "boolean attn_mask (N*H, L, S)", { attn_mask = "bool3" } },
      { "float padding with -inf and finite entries", { key_padding_mask = "floatpad" } },
      { "0/-inf float masks (the fused path)", { attn_mask = "neginf", key_padding_mask = "neginfpad" } },
    }
    local function materialise(o, dtype)
      local r = {}
      for key, x in pairs(o) do
        if x == "float2" then x = attn.randn({ L, S }, dtype)
        elseif x == "float3" then x = attn.randn({ N * H, L, S }, dtype)
        elseif x == "bool3" then x = attn.lt(attn.rand({ N * H, L, S }), 0.4):to("int64")
        elseif x == "floatpad" then x = attn.tensor({ { 0, -0.5, -math.huge, 1 / 3, 0 }, { 2, 0, 0, 0, -math.huge } }, dtype)
        elseif x == "neginf" then x = attn.tensor({ { 0, -math.huge, 0, 0, 0 }, { 0, 0, 0, 0, 0 },
            { 0, 0, -math.huge, 0, 0 } }, dtype)
        elseif x == "neginfpad" then x = attn.tensor({ { 0, 0, 0, -math.huge, 0 }, { 0, 0, 0, 0, 0 } }, dtype)
        end
        r[key] = x
      end
      return r
    end
    for _, dtype in ipairs { "float64", "float32" } do
      local tol = dtype == "float64" and 1e-12 or 2e-5
      for _, batch_first in ipairs { false, true } do
        for _, case in ipairs(cases) do
          it(string.format("%s, %s, batch_first = %s, both thread counts", case[1], dtype, tostring(batch_first)),
            function()
              attn.manual_seed(7)
              local m = nn.MultiheadAttention(E, H, { batch_first = batch_first, dtype = dtype }):eval()
              attn.no_grad(function()
                m.in_proj_bias:copy_(attn.randn({ 3 * E }, dtype))
                m.out_proj.bias:copy_(attn.randn({ E }, dtype))
              end)
              local masks = materialise(case[2], dtype)
              local q, k, v = attn.randn({ N, L, E }, dtype), attn.randn({ N, S, E }, dtype), attn.randn({ N, S, E }, dtype)
              local m64 = nn.MultiheadAttention(E, H):to("float64")
              m64:load_state_dict(m:state_dict())
              local want_out, want_heads, want_avg = reference(m64, q:to("float64"), k:to("float64"), v:to("float64"),
                masks)
              for _, threads in ipairs { 1, 2 } do
                attn.set_num_threads(threads)
                local out, w = call(m, q, k, v, masks)
                assert.close(out, want_out, { atol = tol, rtol = tol })
                assert.close(w, want_avg, { atol = tol, rtol = tol })
                local _, wh = call(m, q, k, v, with(masks, { average_attn_weights = false }))
                assert.close(wh, want_heads, { atol = tol, rtol = tol })
                local out2, none = call(m, q, k, v, with(masks, { need_weights = false }))
                assert.is_nil(none)
                assert.close(out2, want_out, { atol = tol, rtol = tol })
              end
            end)
        end
      end
    end

    it("kdim and vdim: q/k/v_proj_weight, to 1e-12", function()
      attn.manual_seed(3)
      local m = nn.MultiheadAttention(4, 2, { kdim = 3, vdim = 5, batch_first = true, dtype = "float64" })
      local q, k, v = attn.randn({ 2, 3, 4 }, "float64"), attn.randn({ 2, 4, 3 }, "float64"), attn.randn({ 2, 4, 5 },
        "float64")
      local masks = { key_padding_mask = bool_mask({ { 0, 1, 0, 0 }, { 0, 0, 0, 1 } }) }
      local want_out, _, want_avg = reference(m, q, k, v, masks)
      local out, w = m(q, k, v, masks)
      assert.close(out, want_out, { atol = 1e-12, rtol = 1e-12 })
      assert.close(w, want_avg, { atol = 1e-12, rtol = 1e-12 })
    end)

    it("self-attention with is_causal and the causal mask: the kernel's causal option, PyTorch's numbers", function()
      attn.manual_seed(4)
      local m = nn.MultiheadAttention(4, 2, { dtype = "float64" })
      local x = attn.randn({ 4, 2, 4 }, "float64")
      local mask = nn.Transformer.generate_square_subsequent_mask(4, "float64")
      local want = reference(m, x:transpose(1, 2), x:transpose(1, 2), x:transpose(1, 2), { attn_mask = mask })
      local out = m(x, x, x, { attn_mask = mask, is_causal = true })
      assert.close(out:transpose(1, 2), want, { atol = 1e-12, rtol = 1e-12 })
      -- the boolean form of the same mask gives the same numbers
      local out2 = m(x, x, x, { attn_mask = attn.gt(attn.arange(0, 4):reshape({ 1, 4 }),
        attn.arange(0, 4):reshape({ 4, 1 })):to("int64"), is_causal = true })
      assert.close(out2, out, { atol = 1e-15, rtol = 0 })
    end)

    it("unbatched (L, E) inputs with (S) padding and (H, L, S) masks", function()
      attn.manual_seed(5)
      local m = nn.MultiheadAttention(4, 2, { dtype = "float64" })
      local q, k = attn.randn({ 3, 4 }, "float64"), attn.randn({ 5, 4 }, "float64")
      local kpm, am = bool_mask({ 0, 0, 1, 0, 0 }), attn.randn({ 2, 3, 5 }, "float64")
      local want_out, want_heads = reference(m, q:unsqueeze(1), k:unsqueeze(1), k:unsqueeze(1),
        { key_padding_mask = kpm:reshape({ 1, 5 }), attn_mask = am })
      local out, w = m(q, k, k, { key_padding_mask = kpm, attn_mask = am, average_attn_weights = false })
      assert.same({ 3, 4 }, out:shape())
      assert.same({ 2, 3, 5 }, w:shape())
      assert.close(out, want_out:squeeze(1), { atol = 1e-12, rtol = 1e-12 })
      assert.close(w, want_heads:squeeze(1), { atol = 1e-12, rtol = 1e-12 })
    end)

    it("a fully masked row: zero weights, output = out_proj.bias, zero gradients (PyTorch 1.13: NaN)", function()
      attn.manual_seed(6)
      local m = nn.MultiheadAttention(4, 2, { batch_first = true, dtype = "float64" })
      attn.no_grad(function() m.out_proj.bias:copy_(attn.tensor({ 1, 2, 3, 4 }, "float64")) end)
      local q = attn.randn({ 1, 2, 4 }, "float64"):requires_grad_()
      local k = attn.randn({ 1, 3, 4 }, "float64"):requires_grad_()
      for _, am in ipairs { bool_mask({ { 1, 1, 1 }, { 0, 1, 0 } }),
        attn.tensor({ { -math.huge, -math.huge, -math.huge }, { 0, 0.5, 0 } }, "float64") } do
        q.grad, k.grad = nil, nil
        local out, w = m(q, k, k, { attn_mask = am })
        assert.close(out:select(2, 1):reshape({ 4 }), attn.tensor({ 1, 2, 3, 4 }, "float64"), { atol = 0, rtol = 0 })
        assert.close(w:select(2, 1), attn.zeros({ 1, 3 }, "float64"), { atol = 0, rtol = 0 })
        out:select(2, 1):sum():backward()
        assert.close(q.grad, attn.zeros({ 1, 2, 4 }, "float64"), { atol = 0, rtol = 0 })
      end
    end)
  end)

  describe("gradients (finite differences, float64)", function()
    local function params_of(m)
      local list = {}
      for _, e in ipairs(m:named_parameters()) do list[#list + 1] = e[2] end
      return list
    end
    local setups = {
      { "fused, boolean masks, self-attention", {}, function() return { attn_mask = bool_mask({ { 0, 1, 0 },
        { 0, 0, 0 }, { 0, 0, 1 } }), key_padding_mask = bool_mask({ { 0, 0, 1 }, { 0, 0, 0 } }) } end, true },
      { "composed, float masks", {}, function() return { attn_mask = attn.randn({ 3, 3 }, "float64"),
        key_padding_mask = attn.tensor({ { 0, -math.huge, 0.5 }, { 0, 0, 0 } }, "float64") } end },
      { "kdim/vdim, batch_first", { kdim = 2, vdim = 5, batch_first = true }, function() return {} end },
    }
    for _, s in ipairs(setups) do
      it(s[1] .. ": inputs, every parameter and the weights", function()
        attn.manual_seed(11)
        local o = with({ dtype = "float64" }, s[2])
        local m = nn.MultiheadAttention(4, 2, o)
        attn.no_grad(function()
          if m.in_proj_bias then m.in_proj_bias:copy_(attn.randn({ 12 }, "float64") * 0.3) end
        end)
        local masks = s[3]()
        local kd, vd = o.kdim or 4, o.vdim or 4
        local shape = function(d) return o.batch_first and { 2, 3, d } or { 3, 2, d } end
        local q = helper.param(shape(4))
        local k, v = s[4] and q or helper.param(shape(kd)), s[4] and q or helper.param(shape(vd))
        local inputs = s[4] and { q } or { q, k, v }
        for _, p in ipairs(params_of(m)) do inputs[#inputs + 1] = p end
        helper.gradcheck(function()
          return (m(q, k, v, masks))
        end, inputs, { atol = 1e-7, rtol = 1e-6 })
        helper.gradcheck(function()
          local _, w = m(q, k, v, with(masks, { average_attn_weights = false }))
          return w
        end, inputs, { atol = 1e-7, rtol = 1e-6 })
      end)
    end

    it("in_proj_weight is one leaf: the q, k and v rows all get their gradients", function()
      local m = nn.MultiheadAttention(4, 2, { dtype = "float64" })
      local q, k, v = attn.randn({ 2, 1, 4 }, "float64"), attn.randn({ 3, 1, 4 }, "float64"), attn.randn({ 3, 1, 4 },
        "float64")
      local out = m(q, k, v)
      out:sum():backward()
      local g = m.in_proj_weight.grad
      assert.same({ 12, 4 }, g:shape())
      for part = 0, 2 do assert.is_true(g:narrow(1, part * 4 + 1, 4):abs():sum():item() > 0) end
      assert.same({ 12 }, m.in_proj_bias.grad:shape())
    end)
  end)

  describe("PyTorch's parameters", function()
    it("keys and shapes, packed and separate", function()
      local m = nn.MultiheadAttention(6, 3)
      assert.same({ "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias" }, m:state_dict_keys())
      assert.same({ 18, 6 }, m.in_proj_weight:shape())
      local s = nn.MultiheadAttention(6, 3, { kdim = 4, vdim = 5, bias = false })
      assert.same({ "q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight" }, s:state_dict_keys())
      assert.same({ 6, 4 }, s.k_proj_weight:shape())
      assert.same({ 6, 5 }, s.v_proj_weight:shape())
      assert.is_nil(s.in_proj_weight)
    end)

    it("initialisation: xavier_uniform_ projections, zero biases, Linear's out_proj.weight", function()
      attn.manual_seed(1)
      local m = nn.MultiheadAttention(16, 4)
      local bound = math.sqrt(6 / (16 + 48))
      local w = m.in_proj_weight
      assert.is_true(w:abs():max():item() <= bound)
      assert.is_true(w:abs():max():item() > 0.8 * bound) -- spread over the range, not a narrower init
      assert.equal(0, m.in_proj_bias:abs():sum():item())
      assert.equal(0, m.out_proj.bias:abs():sum():item())
      assert.is_true(m.out_proj.weight:abs():max():item() <= 1 / 4)
    end)
  end)

  describe("bad input raises naming the argument", function()
    local m = nn.MultiheadAttention(4, 2)
    local x = attn.randn({ 3, 2, 4 })
    it("constructor", function()
      local ok, err = pcall(nn.MultiheadAttention, 4, 2, { heads = 2 })
      assert.is_false(ok)
      assert.matches("unknown option 'heads'", err)
      ok, err = pcall(nn.MultiheadAttention, 6, 4)
      assert.is_false(ok)
      assert.matches("embed_dim 6 must be divisible by num_heads 4", err)
      ok, err = pcall(nn.MultiheadAttention, 4, 2, { add_bias_kv = true })
      assert.is_false(ok)
      assert.matches("add_bias_kv", err)
    end)
    it("forward", function()
      local cases = {
        { "unknown option 'mask'", { mask = attn.zeros({ 3, 3 }) } },
        { "key_padding_mask is %[3x2%], expected %[2x3%]", { key_padding_mask = attn.zeros({ 3, 2 }, "int64") } },
        { "attn_mask is %[2x3%], expected %[3x3%] or %[4x3x3%]", { attn_mask = attn.zeros({ 2, 3 }) } },
        { "attn_mask %[3x3%] is int64, a boolean mask, and must hold only 0 and 1",
          { attn_mask = attn.full({ 3, 3 }, 2, "int64") } },
        { "key_padding_mask must be a tensor", { key_padding_mask = { { true, false, false }, { false, false, false } } } },
        { "needs attn_mask", { is_causal = true } },
        { "is_causal is set but attn_mask is not the causal mask", { is_causal = true, attn_mask = attn.zeros({ 3, 3 }) } },
      }
      for _, c in ipairs(cases) do
        local ok, err = pcall(m, x, x, x, c[2])
        assert.is_false(ok)
        assert.matches(c[1], tostring(err))
      end
      local ok, err = pcall(m, x, x, attn.randn({ 3, 2, 5 }))
      assert.is_false(ok)
      assert.matches("last dims must be embed_dim, kdim and vdim; got query %[3x2x4%], key %[3x2x4%], value %[3x2x5%]",
        tostring(err))
      ok, err = pcall(m, x, x, x, attn.zeros({ 2, 3 }, "int64"))
      assert.is_false(ok)
      assert.matches("fourth argument is the options table", tostring(err))
      ok, err = pcall(m, x, attn.randn({ 3, 3, 4 }), attn.randn({ 3, 3, 4 }))
      assert.is_false(ok)
      assert.matches("one batch size", tostring(err))
      ok, err = pcall(m, attn.randn({ 4 }), attn.randn({ 4 }), attn.randn({ 4 }))
      assert.is_false(ok)
      assert.matches("query must be 2%-D", tostring(err))
    end)
  end)
end)
