-- The translation experiment end to end on the shipped sample, kept short:
-- a tiny model, two epochs; then --load reproduces the same translations.
local attn = require "attn"
local translation = require "attn.d2l.translation"
local metrics = require "attn.d2l.metrics"
local nn = attn.nn

local cli = require "attn.d2l.cli"

local function build(src_vocab, tgt_vocab, opts)
  return nn.EncoderDecoder(nn.Seq2SeqEncoder(#src_vocab, 8, 8, 1, 0),
    nn.Seq2SeqAttentionDecoder(#tgt_vocab, 8, 8, 1, 0, { scoring = opts.scoring }))
end

-- translation.run with its printing captured: ok, result or error, printed text.
local function try(argv)
  local printed = {}
  local real_print = _G.print
  _G.print = function(...) printed[#printed + 1] = table.concat({ ... }, " ") end
  local ok, res = pcall(translation.run, { name = "tiny", title = "tiny", description = "d", epochs = 2, book = "b",
    build = build, argv = argv, extra_options = { { "scoring", "string", "additive", "scoring" } },
    model_options = function(opts) return { scoring = opts.scoring } end })
  _G.print = real_print
  return ok, res, table.concat(printed, "\n")
end

local function run(argv)
  local ok, res, printed = try(argv)
  assert(ok, res)
  return res, printed
end

describe("attn.d2l.translation", function()
  local dir = os.tmpname()
  os.remove(dir)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("trains, saves, scores the book's four sentences, and --load gives the same translations", function()
    local trained, log = run { "--out", dir, "--quiet", "--seed", "3", "--batch_size", "128" }
    assert.are.equal(2, #trained.history)
    assert.truthy(log:find("vocabularies 184 (English) and 201 (French)", 1, true))
    for i, row in ipairs(trained.rows) do
      assert.are.equal(translation.ENGLISH[i], row.source)
      assert.are.equal(metrics.bleu(row.translation, translation.FRENCH[i], 2), row.bleu)
      assert.truthy(log:find(row.source .. " => " .. row.translation, 1, true))
    end
    for _, f in ipairs { "report.html", "loss.png", "tiny.safetensors" } do
      local h = io.open(dir .. "/" .. f, "rb")
      assert(h, f .. " missing")
      h:close()
    end
    local loaded = run { "--out", dir .. "/again", "--load", dir .. "/tiny.safetensors" }
    assert.is_nil(loaded.history)
    for i, row in ipairs(loaded.rows) do assert.are.equal(trained.rows[i].translation, row.translation) end
    local html = assert(io.open(dir .. "/again/report.html")):read("a")
    assert.truthy(html:find("Weights loaded from", 1, true))
  end)

  it("refuses a checkpoint trained on other vocabularies", function()
    local _ = run { "--out", dir .. "/small", "--quiet", "--num_examples", "100", "--epochs", "1" }
    local ok, err = try { "--out", dir .. "/x", "--load", dir .. "/small/tiny.safetensors" }
    assert.is_false(ok)
    assert.is_true(cli.is_failure(err))
    assert.truthy(tostring(err):find("vocabulary of", 1, true), tostring(err))
  end)

  it("names the option a checkpoint was trained with, and a missing file in one line", function()
    local _ = run { "--out", dir .. "/dot", "--quiet", "--epochs", "1", "--scoring", "dot" }
    local ok, err = try { "--out", dir .. "/y", "--load", dir .. "/dot/tiny.safetensors" }
    assert.is_false(ok)
    assert.are.equal("tiny: " .. dir .. "/dot/tiny.safetensors was trained with --scoring dot (this run has additive)",
      tostring(err))
    ok, err = try { "--out", dir .. "/z", "--data", dir .. "/no-such-file.txt" }
    assert.is_false(ok)
    assert.is_true(cli.is_failure(err))
    assert.truthy(tostring(err):find("^tiny: .*no%-such%-file%.txt"), tostring(err))
  end)
end)

describe("attn.d2l.translation options", function()
  it("declares --dropout once, with the book's 0.1, beside the run options and --distributed", function()
    local seen = {}
    local all = translation.options(10)
    for _, o in ipairs(translation.RUN_OPTIONS) do all[#all + 1] = o end
    for _, o in ipairs(all) do
      assert.is_nil(seen[o[1]], "--" .. o[1] .. " twice")
      seen[o[1]] = o
    end
    assert.are.equal(0.1, seen.dropout[3])
    assert.are.equal("boolean", seen.distributed[2])
    assert.are.equal(0, seen.test[3])
  end)
end)

describe("attn.d2l.translation real runs", function()
  local dir = os.tmpname()
  os.remove(dir)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("ends a --test run with the held-out BLEU line, resumes, and refuses other settings", function()
    local base = { "--out", dir, "--quiet", "--seed", "2", "--num_examples", "300", "--batch_size", "32",
      "--dropout", "0.2" }
    local function with(extra)
      local t = table.move(base, 1, #base, 1, {})
      return table.move(extra, 1, #extra, #t + 1, t)
    end
    local res, log = run(with { "--epochs", "2", "--test", "40", "--max_steps", "3" })
    assert.is_true(res.result.stopped)
    -- the summary counts the tokens of the steps run, though no epoch finished
    local rate = log:match("tiny: 3 steps in [^\n]-, ([%d.]+) tokens/sec on")
    assert(rate and tonumber(rate) > 0, log)
    assert.are.equal(0, #res.result.epochs)
    assert.truthy(log:find("stopped after step 3; resume with --resume " .. dir .. "/tiny-last.safetensors", 1, true))
    res, log = run(with { "--epochs", "2", "--test", "40", "--resume", dir .. "/tiny-last.safetensors" })
    assert.truthy(log:find("resuming " .. dir .. "/tiny-last.safetensors at epoch 1, batch 3, step 3", 1, true))
    local last = log:match("[^\n]*$")
    local score = last:match("^tiny: test corpus BLEU%-4 (%d+%.%d%d) on 40 held%-out sentences %(greedy%)$")
    assert(score, last)
    assert.are.equal(string.format("%.2f", 100 * res.bleu), score)
    -- --load of the final checkpoint scores the same held-out sentences the same way
    local loaded, llog = run(with { "--test", "40", "--load", dir .. "/tiny.safetensors" })
    assert.are.equal(res.bleu, loaded.bleu)
    assert.are.equal(last, llog:match("[^\n]*$"))
    -- other data settings or another model are refused, naming the difference
    local ok, err = try(with { "--test", "41", "--resume", dir .. "/tiny-last.safetensors" })
    assert.is_false(ok)
    assert.is_true(cli.is_failure(err))
    assert.matches("refusing .*tiny%-last%.safetensors: it was made with test = 40, this run has test = 41", err.message)
    ok, err = try(with { "--test", "40", "--scoring", "dot", "--resume", dir .. "/tiny-last.safetensors" })
    assert.is_false(ok)
    assert.matches("it was made with model.scoring = additive, this run has model.scoring = dot", err.message)
  end)
end)
