--- Naive recurrent references on Lua numbers and nested tables, from PyTorch 1.13's equations
-- (torch/nn/modules/rnn.py), shared by the GRU, LSTM and RNN specs. Gate orders: GRU r, z, n;
-- LSTM i, f, g, o.
local R = {}

function R.sigmoid(v) return 1 / (1 + math.exp(-v)) end

-- math.tanh is only there with LUA_COMPAT_MATHLIB: a plain, stable version.
function R.tanh(v)
  local e = math.exp(-2 * math.abs(v))
  local t = (1 - e) / (1 + e)
  return v < 0 and -t or t
end

function R.relu(v) return v > 0 and v or 0 end

-- Rows g*H+1 .. g*H+H of W times x, plus b (nil: no bias).
function R.affine(W, b, x, g, H)
  local out = {}
  for j = 1, H do
    local row, s = W[g * H + j], b and b[g * H + j] or 0
    for i = 1, #x do s = s + row[i] * x[i] end
    out[j] = s
  end
  return out
end

-- One GRU step of p = {w_ih, w_hh, b_ih, b_hh} (biases may be nil) -> the new state.
function R.gru_step(p, x, h, H)
  local affine = R.affine
  local ir, iz, inn = affine(p.w_ih, p.b_ih, x, 0, H), affine(p.w_ih, p.b_ih, x, 1, H), affine(p.w_ih, p.b_ih, x, 2, H)
  local hr, hz, hn = affine(p.w_hh, p.b_hh, h, 0, H), affine(p.w_hh, p.b_hh, h, 1, H), affine(p.w_hh, p.b_hh, h, 2, H)
  local new = {}
  for j = 1, H do
    local r, z = R.sigmoid(ir[j] + hr[j]), R.sigmoid(iz[j] + hz[j])
    local n = R.tanh(inn[j] + r * hn[j])
    new[j] = (1 - z) * n + z * h[j]
  end
  return new
end

-- The parameters of m's layer k, direction d (1: reverse) as Lua tables (nil without biases).
function R.layer_params(m, k, d)
  local sfx = k .. (d == 1 and "_reverse" or "")
  local function t(name) local v = m[name .. sfx]; return v and v:totable() end
  return { w_ih = t("weight_ih_l"), w_hh = t("weight_hh_l"), b_ih = t("bias_ih_l"), b_hh = t("bias_hh_l") }
end

-- m's layers over X nested (T, B, in) time-major: layer k, direction d (0 forward, 1 reverse:
-- steps T .. 1) starts from h0[k * D + d] (and c0's, with_cell) or zeros; the output at step t is
-- the forward then the reverse state (D H wide), the input of layer k + 1. step(p, x, h, H) -> h,
-- or with_cell step(p, x, h, c, H) -> h, c. Returns out (T, B, D H), hn (and cn) (D L, B, H).
function R.naive_layers(m, step, X, h0, c0, with_cell)
  local T, B, H, D = #X, #X[1], m.hidden_size, m.bidirectional and 2 or 1
  local input, hn, cn = X, {}, {}
  for k = 0, m.num_layers - 1 do
    local out = {}
    for t = 1, T do
      out[t] = {}
      for b = 1, B do out[t][b] = {} end
    end
    for d = 0, D - 1 do
      local p, s = R.layer_params(m, k, d), k * D + d + 1
      hn[s], cn[s] = {}, {}
      for b = 1, B do
        local h, c = {}, {}
        for j = 1, H do h[j], c[j] = h0 and h0[s][b][j] or 0, c0 and c0[s][b][j] or 0 end
        for i = 1, T do
          local t = d == 0 and i or T + 1 - i
          if with_cell then
            h, c = step(p, input[t][b], h, c, H)
          else
            h = step(p, input[t][b], h, H)
          end
          for j = 1, H do out[t][b][d * H + j] = h[j] end
        end
        hn[s][b], cn[s][b] = h, c
      end
    end
    input = out
  end
  if with_cell then return input, hn, cn end
  return input, hn
end

-- (B, T, ...) <-> (T, B, ...) of nested tables
function R.swap12(x)
  local y = {}
  for i = 1, #x[1] do
    y[i] = {}
    for j = 1, #x do y[i][j] = x[j][i] end
  end
  return y
end

return R
