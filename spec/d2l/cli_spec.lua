local cli = require "attn.d2l.cli"
local helper = require "helper"

-- Runs cli.parse with exit/print captured: returns opts or {exit = code, text = printed}.
local function run(argv, spec)
  local printed, code = {}, nil
  local ok, res = pcall(cli.parse, argv, spec, {
    exit = function(c) code = c; error("exit") end,
    print = function(s) printed[#printed + 1] = s end,
  })
  if ok then return res end
  assert(code, res)
  return { exit = code, text = table.concat(printed, "\n") }
end

local SPEC = {
  name = "toy", description = "a toy experiment",
  options = {
    { "epochs", "integer", 250, "training epochs" },
    { "lr", "number", 0.005, "learning rate" },
    { "scoring", "string", "additive", "additive or dot" },
    { "quiet", "boolean", false, "no progress" },
  },
}

describe("attn.d2l.cli", function()
  it("gives the defaults, the common options and out/<name>", function()
    local o = run({}, SPEC)
    assert.are.same({ 250, 0.005, "additive", false, 0, "out/toy" },
      { o.epochs, o.lr, o.scoring, o.quiet, o.seed, o.out })
    assert.is_nil(o.data)
  end)

  it("reads --name value, --name=value, flags and dashes in names", function()
    local o = run({ "--epochs", "3", "--lr=0.5", "--quiet", "--seed", "7", "--out", "/tmp/x", "--data=f.txt" }, SPEC)
    assert.are.same({ 3, 0.5, true, 7, "/tmp/x", "f.txt" }, { o.epochs, o.lr, o.quiet, o.seed, o.out, o.data })
    assert.are.equal("integer", math.type(o.epochs))
  end)

  it("stops with exit 2 and the usage on unknown options, bad values, missing values", function()
    for _, argv in ipairs { { "--nope" }, { "--epochs", "x" }, { "--epochs", "2.5" }, { "--lr" }, { "stray" } } do
      local r = run(argv, SPEC)
      assert.are.equal(2, r.exit, table.concat(argv, " "))
      assert.truthy(r.text:find("usage: lua5.4 examples/toy.lua", 1, true))
    end
  end)

  it("prints every option with its default on --help and exits 0", function()
    local r = run({ "--help" }, SPEC)
    assert.are.equal(0, r.exit)
    for _, needle in ipairs { "--epochs INTEGER", "(default 250)", "--seed INTEGER", "--out STRING", "--data STRING",
      "--quiet", "a toy experiment" } do
      assert.truthy(r.text:find(needle, 1, true), needle)
    end
  end)

  it("refuses an option declared twice, also against the common ones", function()
    local twice = { name = "toy", options = { { "dropout", "number", 0.1, "p" }, { "dropout", "number", nil, "p" } } }
    local ok, err = pcall(cli.parse, {}, twice)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("cli.parse: option --dropout is declared twice", 1, true), tostring(err))
    ok, err = pcall(cli.parse, {}, { name = "toy", options = { { "seed", "integer", 1, "s" } } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("option --seed is declared twice", 1, true), tostring(err))
  end)

  it("reads a count: a positive integer or all (math.huge), and shows all as a default", function()
    local spec = { name = "toy", options = { { "num_examples", "count", 600, "pairs" }, { "n", "count", math.huge, "n" } } }
    assert.are.equal(600, run({}, spec).num_examples)
    assert.are.equal(math.huge, run({}, spec).n)
    assert.are.equal(math.huge, run({ "--num_examples", "all" }, spec).num_examples)
    assert.are.equal(25, run({ "--num_examples=25" }, spec).num_examples)
    for _, bad in ipairs { "0", "-3", "2.5", "most" } do
      assert.are.equal(2, run({ "--num_examples", bad }, spec).exit, bad)
    end
    local r = run({ "--help" }, spec)
    assert.truthy(r.text:find("--num_examples COUNT", 1, true))
    assert.truthy(r.text:find("(default all)", 1, true))
  end)

  it("makes nested folders and reports failures", function()
    local base = os.tmpname()
    os.remove(base)
    assert.are.equal(base .. "/a/b", cli.mkdir(base .. "/a/b"))
    local f = assert(io.open(base .. "/a/b/x", "w"))
    f:close()
    assert.is_nil((cli.mkdir(base .. "/a/b/x/y")))
    os.execute("rm -rf '" .. base .. "'")
  end)

  it("ends a script on cli.fail with one line on stderr and status 1, and keeps tracebacks for bugs", function()
    local function script(body)
      local name = os.tmpname()
      local f = assert(io.open(name, "w"))
      f:write('local cli = require "attn.d2l.cli"\n', body)
      f:close()
      local p = io.popen(helper.lua_command(name) .. ' 2>&1; echo "status $?"')
      local text = p:read("a")
      p:close()
      os.remove(name)
      return text
    end
    assert.are.equal("demo: no such file\nstatus 1\n", script('cli.main(function() cli.fail("demo: no such file") end)'))
    local bug = script('cli.main(function() local t = nil; return t.x end)')
    assert.truthy(bug:find("attempt to index a nil value", 1, true))
    assert.truthy(bug:find("stack traceback", 1, true))
    assert.truthy(bug:find("status 1", 1, true))
    assert.are.equal("7\nstatus 0\n", script('print(cli.main(function(a) return a + 1 end, 6))'))
  end)

  it("start parses, makes the output folder and seeds the generator", function()
    local attn = require "attn"
    local dir = os.tmpname()
    os.remove(dir)
    local o = cli.start({ "--out", dir .. "/run", "--seed", "5" }, SPEC)
    local a = attn.rand({ 3 }):totable()
    attn.manual_seed(5)
    assert.are.same(attn.rand({ 3 }):totable(), a)
    local f = assert(io.open(o.out .. "/probe", "w"))
    f:close()
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)
