--- Convolution and pooling layers of `attn.nn`: Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d
-- and Flatten, with PyTorch's names, options, weight layout and output sizes, on the C kernels
-- of src/nn/attn_conv.h and attn_pool.h (BatchNorm2d is in attn.nn.layers).
--
-- Images are (N, C, H, W); a 3-D input (C, H, W) is one image. Sizes (kernel, stride, padding,
-- dilation, output size) are a number or a table `{h, w}`. `Conv2d.weight` is
-- (out_channels, in_channels / groups, kh, kw), so a PyTorch CNN's state dict loads unchanged.
-- The functional forms (`conv2d`, `max_pool2d`, ...) take the same options; `conv2d`'s option
-- `kernel` (or a module's field `kernel`) picks the C path: "auto", "im2col", "winograd" or
-- "winograd4" (3x3, stride 1, dilation 1, groups 1) or "reference", the plain loops
-- the specs compare the others with.
-- @module attn.nn.conv
local attn = require "attn"
local module = require "attn.nn.module"
local init = require "attn.nn.init"
local autograd = require "attn.autograd"
local check = require "attn.check"

local Module = module.Module
local core = attn.core
local shape_str = core.shape_str

local M = {}

-- {h, w} from a number or a table of two integers, each >= min (raises naming fn and what).
local function pair(fn, what, v, min, level)
  local t = type(v) == "table" and v or { v, v }
  local ok = #t == 2
  for i = 1, 2 do ok = ok and math.type(t[i]) == "integer" and t[i] >= min end
  if not ok then
    error(string.format("%s: %s must be an integer >= %d or a table {h, w} of them, got %s", fn, what, min,
      type(v) == "table" and "{" .. table.concat(v, ", ") .. "}" or tostring(v)), level or 4)
  end
  return { t[1], t[2] }
end
M.pair = pair

-- x as 4-D (a 3-D image gets a batch of one) and whether it was 3-D; raises naming fn otherwise.
local function as_batch(fn, x, level)
  check.tensor(fn, "input", x, nil, nil, level)
  local nd = core.dim(x)
  if nd == 3 then return x:unsqueeze(1), true end
  if nd ~= 4 then error(string.format("%s: input %s must be (N, C, H, W) or (C, H, W)", fn, shape_str(x)), level) end
  return x, false
end

local function unbatch(y, was3) return was3 and y:squeeze(1) or y end

-- ---------------------------------------------------------------- conv2d

-- The kernel's params table from checked options.
local function conv_params(o) return { o.stride[1], o.stride[2], o.padding[1], o.padding[2], o.dilation[1],
  o.dilation[2], o.groups } end

local KERNELS = { auto = true, im2col = true, winograd = true, winograd4 = true, reference = true }

-- Checked conv options (stride, padding, dilation: pairs; groups; kernel) of fn.
local function conv_options(fn, opts, level)
  opts = check.options(fn, opts, { stride = true, padding = true, dilation = true, groups = true, kernel = true },
    level)
  local o = {
    stride = pair(fn, "stride", opts.stride or 1, 1, level),
    padding = pair(fn, "padding", opts.padding or 0, 0, level),
    dilation = pair(fn, "dilation", opts.dilation or 1, 1, level),
    groups = check.positive_int(fn, "groups", opts.groups or 1, level),
    kernel = opts.kernel or "auto",
  }
  if not KERNELS[o.kernel] then
    error(string.format("%s: kernel must be 'auto', 'im2col', 'winograd', 'winograd4' or 'reference', got %s", fn,
      tostring(o.kernel)), level)
  end
  return o
end

-- The conv2d node on checked options o (4-D x).
local function conv2d_node(x, weight, bias, o)
  local params, kernel = conv_params(o), o.kernel
  local xc, wc = core.contiguous(x), core.contiguous(weight)
  local y = core.conv2d_forward(xc, wc, bias and core.contiguous(bias), params, kernel)
  return autograd.record("conv2d", y, { x, weight, bias or false }, function(g)
    local req = core.graph_requires -- (a tensor a node made requires grad too)
    return core.conv2d_backward(xc, wc, core.contiguous(g), params, req(x), req(weight), bias ~= nil and req(bias),
      kernel)
  end)
end

--- 2-D convolution (cross-correlation, as PyTorch's `conv2d`): x (N, C, H, W) or (C, H, W),
-- weight (O, C / groups, kh, kw), bias (O) or nil -> (N, O, Ho, Wo) with
-- Ho = floor((H + 2 padding - dilation (kh - 1) - 1) / stride) + 1. One autograd node. Paths
-- (`kernel`): "im2col" unfolds each image and runs the engine's GEMM; "winograd" (3x3 kernels at
-- stride 1, dilation 1, groups 1) runs Winograd F(2x2, 3x3), 16 GEMMs over
-- channels per block of 2x2 output tiles, with 2.25 times fewer multiply-adds and a float32
-- rounding bound about 7 times the direct sum's; "winograd4" runs F(4x4, 3x3), 36 GEMMs per
-- block of 4x4 tiles, 4 times fewer multiply-adds, a bound about 45 times F(2x2)'s; "auto"
-- takes Winograd where it applies with at least 8 input and 8 output channels and outputs of
-- at least 12x12 (where it measured faster), "winograd4" in float32 on AVX-512 (which has its
-- own F(4x4) transforms), "winograd" otherwise, else "im2col"; "reference" runs plain loops.
-- @tparam Tensor x
-- @tparam Tensor weight
-- @tparam[opt] Tensor bias
-- @tparam[opt] table opts `stride` (1), `padding` (0), `dilation` (1), `groups` (1),
--   `kernel` ("auto", "im2col", "winograd", "winograd4" or "reference")
-- @treturn Tensor
-- @raise naming the shapes or values: wrong ranks, channel counts, groups, zero strides, a
--   kernel larger than the padded input
-- @usage local y = conv.conv2d(x, w, b, { padding = 1 })
function M.conv2d(x, weight, bias, opts)
  local o = conv_options("conv2d", opts, 4)
  local xb, was3 = as_batch("conv2d", x, 3)
  check.tensor("conv2d", "weight", weight)
  if bias ~= nil then check.tensor("conv2d", "bias", bias) end
  return unbatch(conv2d_node(xb, weight, bias, o), was3)
end

--- `nn.Conv2d(in_channels, out_channels, kernel_size [, {stride = 1, padding = 0, dilation = 1,
-- groups = 1, bias = true, padding_mode = "zeros"}])`: `conv2d` with parameters weight
-- (out, in / groups, kh, kw) and bias (out), both initialised as PyTorch's (weight kaiming-uniform
-- with a = sqrt(5), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))). Only zero padding. The field
-- `kernel` ("auto", "im2col", "winograd", "winograd4", or "reference" for the plain loops) picks
-- the C path.
-- @type Conv2d
local Conv2d = Module:extend("Conv2d")
M.Conv2d = Conv2d

function Conv2d:init(in_channels, out_channels, kernel_size, opts)
  local fn = "Conv2d"
  check.positive_int(fn, "in_channels", in_channels, 4)
  check.positive_int(fn, "out_channels", out_channels, 4)
  opts = check.options(fn, opts, { stride = true, padding = true, dilation = true, groups = true, bias = true,
    padding_mode = true, dtype = true }, 4)
  if opts.padding_mode ~= nil and opts.padding_mode ~= "zeros" then
    error(string.format("Conv2d: padding_mode '%s' is not supported (only 'zeros')", tostring(opts.padding_mode)), 3)
  end
  local k = pair(fn, "kernel_size", kernel_size, 1, 4)
  local o = conv_options(fn, { stride = opts.stride, padding = opts.padding, dilation = opts.dilation,
    groups = opts.groups }, 5)
  local g = o.groups
  if in_channels % g ~= 0 or out_channels % g ~= 0 then
    error(string.format("Conv2d: groups %d must divide in_channels %d and out_channels %d", g, in_channels,
      out_channels), 3)
  end
  self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
  self.stride, self.padding, self.dilation, self.groups = o.stride, o.padding, o.dilation, g
  self.padding_mode = "zeros"
  local dtype = opts.dtype or "float32"
  self:register_parameter("weight", attn.empty({ out_channels, in_channels // g, k[1], k[2] }, dtype))
  init.kaiming_uniform_(self.weight, math.sqrt(5))
  if opts.bias ~= false then
    local bound = 1 / math.sqrt((in_channels // g) * k[1] * k[2])
    self:register_parameter("bias", init.uniform_(attn.empty({ out_channels }, dtype), -bound, bound))
  else
    self:register_parameter("bias", nil)
  end
end

function Conv2d:forward(x)
  local xb, was3 = as_batch("Conv2d", x, 3)
  local o = { stride = self.stride, padding = self.padding, dilation = self.dilation, groups = self.groups,
    kernel = self.kernel or "auto" }
  return unbatch(conv2d_node(xb, self.weight, self.bias, o), was3)
end

local function tuple(p) return "(" .. p[1] .. ", " .. p[2] .. ")" end

function Conv2d:extra_repr()
  local s = string.format("%d, %d, kernel_size=%s, stride=%s", self.in_channels, self.out_channels,
    tuple(self.kernel_size), tuple(self.stride))
  if self.padding[1] ~= 0 or self.padding[2] ~= 0 then s = s .. ", padding=" .. tuple(self.padding) end
  if self.dilation[1] ~= 1 or self.dilation[2] ~= 1 then s = s .. ", dilation=" .. tuple(self.dilation) end
  if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
  if self.bias == nil then s = s .. ", bias=False" end
  return s
end

-- ---------------------------------------------------------------- pooling

-- Checked pool options of fn: the kernel's params table and count_include_pad.
local function pool_options(fn, kernel_size, opts, extra, level)
  local allowed = { stride = true, padding = true }
  for k in pairs(extra or {}) do allowed[k] = true end
  opts = check.options(fn, opts, allowed, level)
  local k = pair(fn, "kernel_size", kernel_size, 1, level)
  local s = opts.stride ~= nil and pair(fn, "stride", opts.stride, 1, level) or k
  local p = pair(fn, "padding", opts.padding or 0, 0, level)
  if 2 * p[1] > k[1] or 2 * p[2] > k[2] then
    error(string.format("%s: padding %s must be at most half of kernel_size %s", fn, tuple(p), tuple(k)), level)
  end
  return { k[1], k[2], s[1], s[2], p[1], p[2] }, opts.count_include_pad ~= false
end

local function max_pool_node(x, params)
  local xc = core.contiguous(x)
  local y, idx = core.max_pool2d_forward(xc, params)
  return autograd.record("max_pool2d", y, { x }, function(g)
    return core.max_pool2d_backward(xc, idx, core.contiguous(g))
  end), idx
end

local function avg_pool_node(x, params, include)
  local y = core.avg_pool2d_forward(core.contiguous(x), params, include)
  return autograd.record("avg_pool2d", y, { x }, function(g)
    return core.avg_pool2d_backward(x, params, include, core.contiguous(g))
  end)
end

--- 2-D max pooling: x (N, C, H, W) or (C, H, W) -> the largest entry of each kernel_size
-- window, windows `stride` apart (default: kernel_size), the input padded with -inf by `padding`
-- (at most half the kernel). Also returns the int64 indices of the maxima in their H x W plane
-- (0-based, as PyTorch's `return_indices`); backward routes the gradient there.
-- @tparam Tensor x
-- @param kernel_size a number or {h, w}
-- @tparam[opt] table opts `stride`, `padding`
-- @treturn Tensor y
-- @treturn Tensor indices
-- @usage local y = conv.max_pool2d(x, 2)
function M.max_pool2d(x, kernel_size, opts)
  local params = pool_options("max_pool2d", kernel_size, opts, nil, 4)
  local xb, was3 = as_batch("max_pool2d", x, 3)
  local y, idx = max_pool_node(xb, params)
  return unbatch(y, was3), unbatch(idx, was3)
end

--- 2-D average pooling: as `max_pool2d`, the window's mean; with `count_include_pad` (default
-- true) padded zeros count in the divisor, without it only the entries inside the input.
-- @tparam Tensor x
-- @param kernel_size a number or {h, w}
-- @tparam[opt] table opts `stride`, `padding`, `count_include_pad`
-- @treturn Tensor
-- @usage local y = conv.avg_pool2d(x, 3, { stride = 1, padding = 1 })
function M.avg_pool2d(x, kernel_size, opts)
  local params, include = pool_options("avg_pool2d", kernel_size, opts, { count_include_pad = true }, 4)
  local xb, was3 = as_batch("avg_pool2d", x, 3)
  return unbatch(avg_pool_node(xb, params, include), was3)
end

--- Adaptive average pooling to output_size (a number or {h, w}): output row i averages input
-- rows floor(i H / Ho) to ceil((i + 1) H / Ho) - 1 (PyTorch's windows), likewise columns.
-- @tparam Tensor x (N, C, H, W) or (C, H, W)
-- @param output_size a number or {h, w}
-- @treturn Tensor
-- @usage local y = conv.adaptive_avg_pool2d(x, 1)
function M.adaptive_avg_pool2d(x, output_size)
  local s = pair("adaptive_avg_pool2d", "output_size", output_size, 1, 3)
  local xb, was3 = as_batch("adaptive_avg_pool2d", x, 3)
  local xc = core.contiguous(xb)
  local y = core.adaptive_avg_pool2d_forward(xc, s[1], s[2])
  return unbatch(autograd.record("adaptive_avg_pool2d", y, { xb }, function(g)
    return core.adaptive_avg_pool2d_backward(xc, core.contiguous(g))
  end), was3)
end

--- `nn.MaxPool2d(kernel_size [, {stride = kernel_size, padding = 0}])`: `max_pool2d` as a layer
-- (returns the pooled tensor only).
-- @type MaxPool2d
local MaxPool2d = Module:extend("MaxPool2d")
M.MaxPool2d = MaxPool2d

function MaxPool2d:init(kernel_size, opts)
  self.params = pool_options("MaxPool2d", kernel_size, opts, nil, 5)
  local p = self.params
  self.kernel_size, self.stride, self.padding = { p[1], p[2] }, { p[3], p[4] }, { p[5], p[6] }
end

function MaxPool2d:forward(x)
  local xb, was3 = as_batch("MaxPool2d", x, 3)
  return unbatch((max_pool_node(xb, self.params)), was3)
end

function MaxPool2d:extra_repr()
  return string.format("kernel_size=%s, stride=%s, padding=%s", tuple(self.kernel_size), tuple(self.stride),
    tuple(self.padding))
end

--- `nn.AvgPool2d(kernel_size [, {stride = kernel_size, padding = 0, count_include_pad = true}])`:
-- `avg_pool2d` as a layer.
-- @type AvgPool2d
local AvgPool2d = Module:extend("AvgPool2d")
M.AvgPool2d = AvgPool2d

function AvgPool2d:init(kernel_size, opts)
  self.params, self.count_include_pad = pool_options("AvgPool2d", kernel_size, opts, { count_include_pad = true }, 5)
  local p = self.params
  self.kernel_size, self.stride, self.padding = { p[1], p[2] }, { p[3], p[4] }, { p[5], p[6] }
end

function AvgPool2d:forward(x)
  local xb, was3 = as_batch("AvgPool2d", x, 3)
  return unbatch(avg_pool_node(xb, self.params, self.count_include_pad), was3)
end

function AvgPool2d:extra_repr()
  return string.format("kernel_size=%s, stride=%s, padding=%s, count_include_pad=%s", tuple(self.kernel_size),
    tuple(self.stride), tuple(self.padding), self.count_include_pad and "True" or "False")
end

--- `nn.AdaptiveAvgPool2d(output_size)`: `adaptive_avg_pool2d` as a layer.
-- @type AdaptiveAvgPool2d
local AdaptiveAvgPool2d = Module:extend("AdaptiveAvgPool2d")
M.AdaptiveAvgPool2d = AdaptiveAvgPool2d

function AdaptiveAvgPool2d:init(output_size)
  self.output_size = pair("AdaptiveAvgPool2d", "output_size", output_size, 1, 5)
end

function AdaptiveAvgPool2d:forward(x) return M.adaptive_avg_pool2d(x, self.output_size) end

function AdaptiveAvgPool2d:extra_repr() return "output_size=" .. tuple(self.output_size) end

-- ---------------------------------------------------------------- Flatten

--- `nn.Flatten([start_dim = 2 [, end_dim = -1]])`: merges dims start_dim..end_dim into one.
-- Dims are 1-based as everywhere in attn (negative from the end), so PyTorch's default
-- `start_dim=1` (keep the batch dim) is attn's 2: (N, C, H, W) -> (N, C H W).
-- @type Flatten
local Flatten = Module:extend("Flatten")
M.Flatten = Flatten

function Flatten:init(start_dim, end_dim)
  start_dim, end_dim = start_dim or 2, end_dim or -1
  for _, d in ipairs { { "start_dim", start_dim }, { "end_dim", end_dim } } do
    if math.type(d[2]) ~= "integer" or d[2] == 0 then
      error(string.format("Flatten: %s must be a non-zero integer (1-based), got %s", d[1], tostring(d[2])), 3)
    end
  end
  self.start_dim, self.end_dim = start_dim, end_dim
end

function Flatten:forward(x)
  check.tensor("Flatten", "input", x)
  local s = core.shape(x)
  local n = #s
  local a = self.start_dim < 0 and self.start_dim + n + 1 or self.start_dim
  local b = self.end_dim < 0 and self.end_dim + n + 1 or self.end_dim
  if n == 0 then return x:reshape({ 1 }) end
  if a < 1 or a > n or b < 1 or b > n or a > b then
    error(string.format("Flatten: dims %d..%d do not fit input %s", self.start_dim, self.end_dim, shape_str(s)), 2)
  end
  local out, m = {}, 1
  for i = 1, a - 1 do out[#out + 1] = s[i] end
  for i = a, b do m = m * s[i] end
  out[#out + 1] = m
  for i = b + 1, n do out[#out + 1] = s[i] end
  return x:reshape(out)
end

function Flatten:extra_repr() return string.format("start_dim=%d, end_dim=%d", self.start_dim, self.end_dim) end

return M
