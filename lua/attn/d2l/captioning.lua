--- Decoding and evaluating image captioners (attn.nn.captioning's ShowAttendTell) without
-- teacher forcing: greedy and beam decoding, corpus BLEU-1..4, exact-caption accuracy, and
-- attention correctness on scenes whose items' boxes are known (`attn.data.scenes`).
--
-- **Attention correctness** (after Liu et al. 2017, arXiv:1605.09553). A word counts when the
-- decoder emits, at step t, the caption's own word at position t (so it names item
-- `word_item[t]` of the scene, the same item the reference names there). Its score is the
-- share of that step's attention mass inside the item's box: sum_i alpha_ti * |cell_i and box|
-- / |cell_i| over the L cells tiling the canvas (row by row). Uniform attention would put
-- sum_i |cell_i and box| / (L |cell_i|) there, the box's share of the canvas (1/9 for one cell
-- of a 3 x 3 grid). Both are averaged over every counted word of every scene.
-- @module attn.d2l.captioning
-- @usage
-- local cap = require "attn.d2l.captioning"
-- local out = cap.greedy(decoder, feats, { bos = bos, eos = eos, max_len = 5 })
-- local m = cap.evaluate(out, scenes)  -- m.bleu[4], m.exact, m.attention, m.uniform
local attn = require "attn"
local check = require "attn.check"
local metrics = require "attn.d2l.metrics"

local M = {}

local function decode_options(who, opts)
  opts = check.options(who, opts, { bos = true, eos = true, max_len = true, beam = true, length_penalty = true })
  check.positive_int(who, "bos", opts.bos)
  check.positive_int(who, "eos", opts.eos)
  check.positive_int(who, "max_len", opts.max_len)
  return opts
end

--- Greedy decoding of a batch: feats (B, L, D) -> for each sample the emitted ids (without
-- `<eos>`) and the attention weights of every emitted step, `<eos>` included (lists of L
-- numbers; none in the baseline). Runs in eval mode without gradients.
-- @tparam Module decoder an nn.ShowAttendTell
-- @tparam Tensor feats (B, L, D)
-- @tparam table opts `bos`, `eos` (ids), `max_len` (steps, `<eos>` included)
-- @treturn table `{ids = {{...}, ...}, alphas = {{{...}, ...}, ...}}`
function M.greedy(decoder, feats, opts)
  opts = decode_options("captioning.greedy", opts)
  decoder:eval()
  local B = feats:size(1)
  local ids, alphas, done = {}, {}, {}
  for b = 1, B do ids[b], alphas[b] = {}, {} end
  attn.no_grad(function()
    local state = decoder:start(feats)
    local tokens = attn.full({ B }, opts.bos, "int64")
    for _ = 1, opts.max_len do
      local logits, alpha
      logits, state, alpha = decoder:step(state, tokens)
      tokens = logits:argmax(2)
      local tok, a = tokens:totable(), alpha and alpha:totable()
      local live = false
      for b = 1, B do
        if not done[b] then
          if a then alphas[b][#alphas[b] + 1] = a[b] end
          if tok[b] == opts.eos then done[b] = true else ids[b][#ids[b] + 1] = tok[b] end
          live = live or not done[b]
        end
      end
      if not live then break end
    end
  end)
  return { ids = ids, alphas = alphas }
end

-- The fields of a decoder state with one row per sample (the others, such as w_v, are shared).
local ROWS = { "h", "c", "feats", "mean", "keys" }

-- The state with each per-sample field replaced by fn(field).
local function map_rows(state, fn)
  local s = {}
  for k, v in pairs(state) do s[k] = v end
  for _, k in ipairs(ROWS) do
    if s[k] then s[k] = fn(s[k]) end
  end
  return s
end

--- Beam search, one sample at a time: keeps the `beam` best partial captions by summed log
-- probability (the hypotheses of a sample run as one batch); a candidate that emits `<eos>`
-- is finished; the best finished or last live one by log P / length^length_penalty (as
-- attn.d2l.train's beam_search, `<eos>` counted in the length) is kept. Width 1 is greedy
-- decoding. Eval mode, no gradients.
-- @tparam Module decoder an nn.ShowAttendTell
-- @tparam Tensor feats (B, L, D)
-- @tparam table opts as `greedy`, plus `beam` (default 3) and `length_penalty` (0.75)
-- @treturn table `{ids = ..., alphas = ...}` as `greedy`
function M.beam(decoder, feats, opts)
  opts = decode_options("captioning.beam", opts)
  local k = check.positive_int("captioning.beam", "beam", opts.beam or 3)
  local penalty = opts.length_penalty or 0.75
  decoder:eval()
  local out = { ids = {}, alphas = {} }
  attn.no_grad(function()
    local all = decoder:start(feats)
    for b = 1, feats:size(1) do
      local live = { { ids = {}, alphas = {}, logp = 0, row = 1 } }
      local state, finished = map_rows(all, function(v) return v:narrow(1, b, 1) end), {}
      local tokens = { opts.bos }
      for step = 1, opts.max_len do
        local logits, next_state, alpha = decoder:step(state, attn.tensor(tokens, "int64"))
        local logp, a = logits:log_softmax(2):totable(), alpha and alpha:totable()
        local cands = {}
        for h, hyp in ipairs(live) do
          local order = {}
          for v = 1, #logp[h] do order[v] = v end
          table.sort(order, function(x, y)
            if logp[h][x] ~= logp[h][y] then return logp[h][x] > logp[h][y] end
            return x < y
          end)
          for r = 1, math.min(k, #order) do
            cands[#cands + 1] = { hyp = hyp, h = h, r = r, tok = order[r], logp = hyp.logp + logp[h][order[r]] }
          end
        end
        table.sort(cands, function(x, y)
          if x.logp ~= y.logp then return x.logp > y.logp end
          if x.h ~= y.h then return x.h < y.h end
          return x.r < y.r
        end)
        local rows, next_live = {}, {}
        for i = 1, math.min(k, #cands) do
          local c = cands[i]
          local ids, als = table.move(c.hyp.ids, 1, #c.hyp.ids, 1, {}), table.move(c.hyp.alphas, 1, #c.hyp.alphas, 1, {})
          if a then als[#als + 1] = a[c.h] end
          if c.tok == opts.eos then
            finished[#finished + 1] = { ids = ids, alphas = als, score = c.logp / step ^ penalty }
          else
            ids[#ids + 1] = c.tok
            next_live[#next_live + 1] = { ids = ids, alphas = als, logp = c.logp }
            rows[#rows + 1] = c.h
          end
        end
        if #next_live == 0 then live = {} break end
        live, tokens = next_live, {}
        state = map_rows(next_state, function(v) return attn.core.index_select(v, 1, rows) end)
        for i, hyp in ipairs(live) do tokens[i] = hyp.ids[#hyp.ids] end
      end
      for _, hyp in ipairs(live) do
        finished[#finished + 1] = { ids = hyp.ids, alphas = hyp.alphas, score = hyp.logp / math.max(#hyp.ids, 1) ^ penalty }
      end
      table.sort(finished, function(x, y) return x.score > y.score end)
      out.ids[b], out.alphas[b] = finished[1].ids, finished[1].alphas
    end
  end)
  return out
end

-- The caption words of scene i of `scenes` (without `<eos>` and `<pad>`) as ids.
local function reference(scenes, i, captions)
  local n = math.tointeger(scenes.valid_len[i]) - 1
  return table.move(captions[i], 1, n, 1, {})
end

--- The share of each cell of an (H, W) canvas tiled by a gh x gw grid (row by row) that lies
-- inside a box `{top, bottom, left, right}` (1-based inclusive pixels).
-- @tparam table box
-- @tparam integer H
-- @tparam integer W
-- @tparam integer gh
-- @tparam integer gw
-- @treturn {number,...} L = gh gw shares in [0, 1]
function M.cell_overlap(box, H, W, gh, gw)
  local out = {}
  local ch, cw = H / gh, W / gw
  for r = 0, gh - 1 do
    for c = 0, gw - 1 do
      local y = math.max(0, math.min(box[2], (r + 1) * ch) - math.max(box[1] - 1, r * ch))
      local x = math.max(0, math.min(box[4], (c + 1) * cw) - math.max(box[3] - 1, c * cw))
      out[#out + 1] = y * x / (ch * cw)
    end
  end
  return out
end

--- Attention correctness of decoded captions (see the module comment).
-- @tparam table decoded `{ids =, alphas =}` from `greedy` or `beam`
-- @tparam table scenes from `attn.data.scenes`: `captions`, `valid_len`, `boxes`,
--   `word_item`, `canvases`
-- @tparam[opt] integer grid cells per side (default: sqrt of the weights' length)
-- @treturn number the mean share of attention inside the named item's box (nil without weights)
-- @treturn number the mean share uniform attention would put there
-- @treturn integer the number of words counted
function M.attention_correctness(decoded, scenes, grid)
  local captions = scenes.captions:totable()
  local H, W = scenes.canvases:size(3), scenes.canvases:size(4)
  local share, uniform, count = 0, 0, 0
  for i, ids in ipairs(decoded.ids) do
    local ref, als = reference(scenes, i, captions), decoded.alphas[i]
    if #als == 0 then return nil, nil, 0 end
    local g = grid or math.tointeger(math.sqrt(#als[1]))
    for t = 1, math.min(#ids, #ref) do
      if ids[t] == ref[t] then
        local overlap = M.cell_overlap(scenes.boxes[i][scenes.word_item[i][t]], H, W, g, #als[1] // g)
        local s, u = 0, 0
        for l, f in ipairs(overlap) do
          s, u = s + als[t][l] * f, u + f / #overlap
        end
        share, uniform, count = share + s, uniform + u, count + 1
      end
    end
  end
  if count == 0 then return 0, 0, 0 end
  return share / count, uniform / count, count
end

--- Corpus BLEU-1..4 and exact-caption accuracy of decoded captions against the scenes'.
-- @tparam table decoded `{ids =}` from `greedy` or `beam`
-- @tparam table scenes from `attn.data.scenes`
-- @treturn table `{bleu = {b1, b2, b3, b4}, exact =, preds = {strings}, refs = {strings}}`
function M.caption_scores(decoded, scenes)
  local captions, vocab = scenes.captions:totable(), scenes.vocab
  local preds, refs, exact = {}, {}, 0
  for i, ids in ipairs(decoded.ids) do
    local ref = reference(scenes, i, captions)
    preds[i] = table.concat(vocab:tokens(ids), " ")
    refs[i] = table.concat(vocab:tokens(ref), " ")
    if preds[i] == refs[i] then exact = exact + 1 end
  end
  local bleu = {}
  for n = 1, 4 do bleu[n] = (metrics.corpus_bleu(preds, refs, n)) end
  return { bleu = bleu, exact = exact / math.max(#preds, 1), preds = preds, refs = refs }
end

--- Every test number at once: `caption_scores` plus `attention`, `uniform` and `counted`
-- from `attention_correctness`.
-- @tparam table decoded from `greedy` or `beam`
-- @tparam table scenes from `attn.data.scenes`
-- @treturn table
function M.evaluate(decoded, scenes)
  local m = M.caption_scores(decoded, scenes)
  m.attention, m.uniform, m.counted = M.attention_correctness(decoded, scenes)
  return m
end

return M
