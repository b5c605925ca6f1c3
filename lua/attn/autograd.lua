--- Reverse-mode automatic differentiation.
-- Every differentiable operation runs its forward on the C core, then calls
-- `record`, which (only when grad mode is on and an input requires grad)
-- attaches a node holding the inputs and a backward closure to the output.
-- `backward` walks the nodes in reverse topological order, accumulates
-- gradients into leaves' `.grad`, and frees the graph as it goes, so a
-- training loop's memory stays flat. Backward closures run with grad mode
-- off, so they may use ordinary tensor methods.
local core = require "attn.core"

local autograd = {}

-- Grad mode belongs to the running coroutine (weak keys, so finished
-- coroutines are collected): a coroutine that yields inside no_grad leaves
-- grad mode off for itself only, never for the code that resumed it. Every
-- coroutine starts with grad mode on.
local modes = setmetatable({}, { __mode = "k" })
local running = coroutine.running

local function is_enabled() return modes[running()] ~= false end
autograd.is_enabled = is_enabled

--- Runs fn with grad mode set to `mode` in the running coroutine, restoring
-- it even when fn raises.
function autograd.with_mode(mode, fn, ...)
  local co = running()
  local previous = modes[co]
  modes[co] = mode and true or false
  local results = table.pack(pcall(fn, ...))
  modes[co] = previous
  if not results[1] then error(results[2], 0) end
  return table.unpack(results, 2, results.n)
end

function autograd.no_grad(fn, ...) return autograd.with_mode(false, fn, ...) end
function autograd.enable_grad(fn, ...) return autograd.with_mode(true, fn, ...) end

local TENSOR_MT = core.metatable
local function is_tensor(v) return getmetatable(v) == TENSOR_MT end
autograd.is_tensor = is_tensor

local function requires(t) return getmetatable(t) == TENSOR_MT and t._rg == true end
local same_shape = core.same_shape
-- The per-node bookkeeping in C (src/bind/lgraph.c), one call each instead of a
-- metatable test, a field read through __index and a version read per tensor.
local graph_requires, graph_requires_in = core.graph_requires, core.graph_requires_in
local graph_target, graph_versions, graph_link = core.graph_target, core.graph_versions, core.graph_link
local graph_order, graph_root = core.graph_order, core.graph_root

local function needs_grad(inputs)
  -- a tensor here would loop over its first size (# of a tensor), which can be 2^62
  if type(inputs) ~= "table" then error("needs_grad: inputs must be a table of values, got a " .. type(inputs), 2) end
  if modes[running()] == false then return false end
  return graph_requires_in(inputs)
end
autograd.needs_grad = needs_grad

-- Write versions of the storages a node's backward may read (its inputs and
-- outputs): an in-place write between forward and backward would make the
-- gradient silently wrong, so backward checks them (see run_nodes).
-- Versions only ever grow, so their sum is unchanged exactly when every one
-- of them is: a node keeps one number (vsum, set by graph_link), not a table.
local function version_error(node)
  error(string.format("backward: a tensor used by '%s' was modified in place after the forward pass, so its "
    .. "gradient would be wrong; modify a clone instead", node.name), 0)
end

--- True when an op on these operands (up to three; non-tensors ignored) must
-- be recorded: grad mode is on and one of them requires grad. Lets an op skip
-- building its backward closure and input list when nothing records.
function autograd.wants(a, b, c)
  if modes[running()] == false then return false end
  return graph_requires(a, b, c)
end

-- The node of record and record_wanted (see record).
local function link(name, out, inputs, backward)
  local single = is_tensor(out)
  if not single and type(out) ~= "table" then
    error("record: out must be a tensor or a table of tensors, got a " .. type(out), 2)
  end
  local node = single and { name = name, inputs = inputs, backward = backward, out = out, vsum = 0 }
    or { name = name, inputs = inputs, backward = backward, outputs = out, vsum = 0 }
  -- each output's grad_fn (and _oi when several) and the version sum; false (nothing linked) when
  -- the op returned an input unchanged (to() of the same dtype, contiguous() of a contiguous
  -- tensor): it is the identity, and the input already carries its history
  node.vsum = graph_link(node, inputs, out)
  return out
end

--- Records a finished forward computation; see the module comment.
-- out: tensor or array of tensors; inputs: array (non-tensors ignored, false for holes);
-- backward(g1, ...) returns the inputs' gradients in order. A gradient it makes (not a view,
-- given to one input only) may become a leaf's `grad` without a copy: a backward function
-- that also keeps the tensor it returns must return a clone of it.
-- A node is one table: name, inputs, backward, the output (`out`) or outputs
-- (`outputs`, when there are several; each output's `_oi` is its position)
-- and the version sum. A one-output node is the common case and gets no
-- further table: its pending gradient is the tensor itself (see run_nodes).
function autograd.record(name, out, inputs, backward)
  if not needs_grad(inputs) then return out end
  return link(name, out, inputs, backward) -- (a tail call: its errors point at record's caller)
end

--- `record` for an op that has just found `wants` true for the operands it lists in `inputs`:
-- the same node, without repeating the grad-mode and requires-grad tests (a tenth of a small
-- op's recording).
function autograd.record_wanted(name, out, inputs, backward)
  if type(inputs) ~= "table" then error("record: inputs must be a table of values, got a " .. type(inputs), 2) end
  return link(name, out, inputs, backward)
end

--- Gradient `g` summed down to `shape` (undoes broadcasting).
function autograd.sum_to(g, shape)
  local gshape = core.shape(g)
  -- checked before the loops: a tensor's # is its first size (2^40 iterations)
  if type(shape) ~= "table" or #shape > #gshape then
    error(string.format("sum_to: shape must be a table of at most %d sizes (the gradient is %s), got %s", #gshape,
      core.shape_str(g), type(shape) == "table" and #shape .. " sizes" or "a " .. type(shape)), 2)
  end
  local lead = #gshape - #shape
  local same = lead == 0
  for d = 1, #shape do
    if gshape[d + lead] ~= shape[d] then same = false end
  end
  if same then return g end
  for _ = 1, lead do g = core.sum(g, 1) end
  for d = 1, #shape do
    if shape[d] == 1 and core.size(g, d) ~= 1 then g = core.sum(g, d, true) end
  end
  return g
end

local function check_grad_shape(node, i, input, g)
  if not same_shape(input, g) then
    error(string.format("backward of %s: gradient for input %d has shape %s, input has %s", node.name, i,
      core.shape_str(g), core.shape_str(input)), 0)
  end
end

local add, add_ = core.add, core.add_

-- The tensors backward made some leaf's grad (weak keys): such a tensor, even if made during a
-- later pass (a backward function that runs a backward of its own and returns a leaf's grad),
-- is held by that leaf, so another leaf gets a copy of it.
local given = setmetatable({}, { __mode = "k" })

-- The node whose backward function is running (see autograd.backward).
local failing

-- Sums contribution g into the pending gradient held in tbl[key]. The first
-- contribution is kept as is (it may be a view of another tensor, or the
-- same tensor another input received); the second makes a new sum that only
-- this slot holds (`owned[tbl][key]`), and later ones are added into it in
-- place instead of allocating a new sum each (the decoder's weights get one
-- contribution per step). The sums are the same, in the same order.
local function accumulate(tbl, key, g, owned)
  local prev = tbl[key]
  if prev == nil then
    tbl[key] = g
  elseif owned[key] then
    add_(prev, g)
  else
    tbl[key] = add(prev, g)
    owned[key] = true
  end
end

-- Sends gradient g of `input` (one of the outputs of `child`, a node with
-- several) to child's pending gradients, a table by output position.
-- Repeated contributions are summed in arrival order. (A one-output node's
-- pending gradient is the tensor itself: see accumulate.)
local function send_output(node_grads, child, input, g)
  local slot = node_grads[child]
  if not slot then
    slot = {}
    node_grads[child] = slot
  end
  local k = input._oi
  local prev = slot[k]
  slot[k] = prev == nil and g or add(prev, g)
end

-- Runs the nodes in reverse topological order, sending each input's gradient
-- to the node that produced it or, for a leaf, to leaf_grads. Up to three
-- input gradients come back in locals, more in a table.
local function run_nodes(order, node_grads, leaf_grads, leaf_order, retain, owned, leaf_hits)
  for k = #order, 1, -1 do
    local node = order[k]
    local gs = node_grads[node]
    node_grads[node] = nil
    local inputs = node.inputs
    local nin = #inputs
    -- a node no gradient reached (e.g. the condition of a where) contributes nothing
    if gs then
      local outputs = node.outputs
      if graph_versions(inputs, outputs or node.out) ~= node.vsum then version_error(node) end
      failing = node
      -- up to six input gradients come back in locals (a linear node has 3, the fused layers 6-7)
      local g1, g2, g3, g4, g5, g6, more
      local backward = node.backward
      if outputs then
        if nin <= 6 then
          g1, g2, g3, g4, g5, g6 = backward(table.unpack(gs, 1, #outputs))
        else
          more = table.pack(backward(table.unpack(gs, 1, #outputs)))
        end
      elseif nin <= 6 then
        g1, g2, g3, g4, g5, g6 = backward(gs)
      else
        more = table.pack(backward(gs))
      end
      failing = nil
      for i = 1, nin do
        local g
        if more then
          g = more[i]
        elseif i == 1 then
          g = g1
        elseif i == 2 then
          g = g2
        elseif i == 3 then
          g = g3
        elseif i == 4 then
          g = g4
        elseif i == 5 then
          g = g5
        else
          g = g6
        end
        local input = inputs[i]
        -- the node that made input, true for a leaf that requires grad, or false
        local target, same = false, false
        if g ~= nil then target, same = graph_target(input, g) end
        if target then
          if not same then check_grad_shape(node, i, input, g) end
          if target == true then
            if leaf_grads[input] == nil then leaf_order[#leaf_order + 1] = input end
            leaf_hits[g] = (leaf_hits[g] or 0) + 1
            accumulate(leaf_grads, input, g, owned)
          elseif target.outputs then
            send_output(node_grads, target, input, g)
          else
            accumulate(node_grads, target, g, owned)
          end
        end
      end
    end
    if not retain then
      node.inputs, node.backward, node.out, node.outputs = nil, nil, nil, nil
    end
  end
end

local NO_OPTS = {}

-- The tables a backward pass works in. The last pass's are kept, emptied, for
-- the next (a pass over a one-op graph otherwise made eight tables); a pass
-- that starts while another runs (from inside a backward function), or after
-- one that raised, makes its own.
local spare_work
local function take_work()
  local w = spare_work
  spare_work = nil
  return w or { order = {}, visited = {}, stack_node = {}, stack_pos = {}, node_grads = {}, owned = {},
    leaf_grads = {}, leaf_order = {}, leaf_hits = {} }
end

-- Empties w through its lists (every visited node is in order once the walk
-- has finished, every leaf in leaf_order) and keeps it for the next pass.
local function give_work(w)
  local order, visited, node_grads, owned = w.order, w.visited, w.node_grads, w.owned
  for i = #order, 1, -1 do
    local node = order[i]
    visited[node], node_grads[node], owned[node], order[i] = nil, nil, nil, nil
  end
  local stack_node, stack_pos = w.stack_node, w.stack_pos
  for i = #stack_node, 1, -1 do stack_node[i], stack_pos[i] = nil, nil end
  local leaf_grads, leaf_order = w.leaf_grads, w.leaf_order
  for i = #leaf_order, 1, -1 do
    local leaf = leaf_order[i]
    leaf_grads[leaf], owned[leaf], leaf_order[i] = nil, nil, nil
  end
  local leaf_hits = w.leaf_hits
  for g in next, leaf_hits do leaf_hits[g] = nil end
  spare_work = w
end

--- Back-propagates from `root` (grad defaults to 1 for a one-element root;
-- backward(root, opts) is accepted too).
-- opts.retain_graph keeps the graph for another backward pass.
function autograd.backward(root, grad, opts)
  local first_serial = core.storage_serial() -- storages made after this are the pass's own
  if type(grad) == "table" and not is_tensor(grad) and opts == nil then grad, opts = nil, grad end
  opts = opts or NO_OPTS
  if type(opts) ~= "table" then error("backward: options must be a table, got a " .. type(opts), 2) end
  -- root's node (true for a leaf, false when it needs no grad) and whether grad fits it, in one call
  local root_fn, fits = graph_root(root, grad)
  if not root_fn then
    error("backward: tensor does not require grad (no input of its computation had requires_grad)", 2)
  end
  if grad ~= nil then
    if not fits then
      error(string.format("backward: grad must be a %s tensor of the output's shape %s, got %s", core.dtype(root),
        core.shape_str(root), is_tensor(grad) and string.format("%s %s", core.dtype(grad), core.shape_str(grad))
          or type(grad)), 2)
    end
  else
    if core.numel(root) ~= 1 then
      error(string.format("backward: grad can be omitted only for a one-element tensor, got %s",
        core.shape_str(root)), 2)
    end
    grad = core.full(core.shape(root), 1, core.dtype(root))
  end
  if root_fn == true then root_fn = nil end
  -- Topological order of nodes (graph_order: an iterative walk in C over the
  -- work lists, so deep graphs do not overflow the C stack and no table is
  -- made per node).
  local w = take_work()
  local order = w.order
  if root_fn then
    local freed = graph_order(root_fn, order, w.visited, w.stack_node, w.stack_pos)
    if freed then
      error("backward: the graph through '" .. freed.name .. "' was already freed by an earlier backward; "
        .. "pass {retain_graph = true} to the first one", 2)
    end
  end

  local node_grads, owned, leaf_grads, leaf_order = w.node_grads, w.owned, w.leaf_grads, w.leaf_order
  if root_fn and root_fn.outputs then
    send_output(node_grads, root_fn, root, grad)
  elseif root_fn then
    accumulate(node_grads, root_fn, grad, owned)
  else
    leaf_grads[root] = grad
    leaf_order[1] = root
  end
  -- Backward functions run with grad mode off; on failure the error names the
  -- node whose backward function raised, so a failure deep in a graph says
  -- which operation's gradient broke.
  local co = running()
  local previous = modes[co]
  modes[co] = false
  failing = nil
  local leaf_hits = w.leaf_hits
  local ok, err = pcall(run_nodes, order, node_grads, leaf_grads, leaf_order, opts.retain_graph, owned, leaf_hits)
  modes[co] = previous
  if not ok then
    local node = failing
    failing = nil
    if node then error(string.format("backward of '%s' failed: %s", node.name, tostring(err)), 2) end
    error(err, 0)
  end
  for i = 1, #leaf_order do
    local leaf = leaf_order[i]
    local g = leaf_grads[leaf]
    if leaf.grad == nil then
      -- A leaf keeps its gradient as is when nothing else can see it: a sum this pass made, or a
      -- tensor made during the pass, over all of its storage, that came to this leaf alone and
      -- is no leaf's grad already (a conv's dx, a matmul's dW). Anything else is copied: the
      -- caller's seed, a gradient passed through to several inputs, a view of another tensor.
      -- (Copying every gradient cost a tenth of a small conv's training step, through the extra
      -- memory it wrote.)
      if not (owned[leaf] or leaf_hits[g] == 1 and not given[g] and core.owns_new_storage(g, first_serial)) then
        g = core.clone(g)
      end
      leaf.grad = g
      given[g] = true
    else
      core.add_(leaf.grad, g)
    end
  end
  give_work(w)
end

--- Compares analytic gradients with central finite differences.
-- fn(inputs...) returns a tensor; inputs are tensors (float64 recommended) with
-- requires_grad set. The output is reduced with a fixed random projection so
-- every output entry takes part. Returns ok, report where report has
-- max_abs_err, max_rel_err and worst = {input = i, index = k, analytic =, numeric =}.
function autograd.gradcheck(fn, inputs, opts)
  local check = require "attn.check"
  check.lua_type("gradcheck", "inputs", inputs, "table")
  opts = check.lua_type("gradcheck", "options", opts or {}, "table")
  local eps = opts.eps or 1e-6
  local atol = opts.atol or 1e-5
  local rtol = opts.rtol or 1e-3
  local out0 = autograd.no_grad(fn, table.unpack(inputs))
  local state = core.rng_state()
  core.manual_seed(12345)
  local proj = core.randn(core.shape(out0), core.dtype(out0))
  core.rng_state(state)
  local function objective()
    local out = fn(table.unpack(inputs))
    return core.sum(core.mul(out, proj)):item(), out
  end
  for _, x in ipairs(inputs) do
    if is_tensor(x) then x.grad = nil end
  end
  local _, out = objective()
  if not requires(out) then return false, { message = "gradcheck: output does not require grad" } end
  autograd.backward(out, proj)
  local report = { max_abs_err = 0, max_rel_err = 0 }
  local ok = true
  for i, x in ipairs(inputs) do
    if requires(x) then
      local n = core.numel(x)
      local flat = core.view(x, n) -- shares storage: perturbing it perturbs x
      assert(core.is_contiguous(x), "gradcheck: inputs must be contiguous")
      local analytic = x.grad and core.reshape(x.grad, n) or nil
      for k = 1, n do
        local v = core.get(flat, k)
        core.set(flat, v + eps, k)
        local fp = autograd.no_grad(objective)
        core.set(flat, v - eps, k)
        local fm = autograd.no_grad(objective)
        core.set(flat, v, k)
        local numeric = (fp - fm) / (2 * eps)
        local a = analytic and core.get(analytic, k) or 0
        local err = math.abs(a - numeric)
        local rel = err / math.max(math.abs(numeric), 1e-12)
        if err > atol + rtol * math.abs(numeric) then ok = false end
        if report.worst == nil or err > report.max_abs_err then
          report.max_abs_err = err
          report.worst = { input = i, index = k, analytic = a, numeric = numeric }
        end
        if rel > report.max_rel_err and err > atol then report.max_rel_err = rel end
      end
    end
  end
  if not ok then
    local w = report.worst
    report.message = string.format("gradcheck: input %d entry %d: analytic %.6g vs numeric %.6g (abs err %.3g)",
      w.input, w.index, w.analytic, w.numeric, report.max_abs_err)
  end
  return ok, report
end

return autograd
