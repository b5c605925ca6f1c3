local report = require "attn.d2l.report"

describe("attn.d2l.report", function()
  it("escapes text in every element", function()
    assert.are.equal("&lt;eos&gt; &amp; j&#39;ai &quot;x&quot;", report.escape([[<eos> & j'ai "x"]]))
    local r = report.new("a <b> title")
    r:heading("<h>"):paragraph("p & q"):pre("x < y"):table({ "<src>" }, { { "<eos>" }, { 3 } })
    local html = r:html()
    assert.truthy(html:find("<title>a &lt;b&gt; title</title>", 1, true))
    for _, needle in ipairs { "<h2>&lt;h&gt;</h2>", "<p>p &amp; q</p>", "<pre>x &lt; y</pre>", "<th>&lt;src&gt;</th>",
      "<td>&lt;eos&gt;</td>", "<td>3</td>" } do
      assert.truthy(html:find(needle, 1, true), needle)
    end
    assert.falsy(html:find("<eos>", 1, true))
  end)

  it("inlines SVG figures without their XML declaration and refuses non-SVG", function()
    local r = report.new("t")
    r:figure('<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"><rect/></svg>', "weights")
    local html = r:html()
    assert.truthy(html:find('<figure><svg xmlns="http://www.w3.org/2000/svg"><rect/></svg><figcaption>weights', 1, true))
    assert.falsy(html:find("<?xml", 1, true))
    assert.has_error(function() r:figure("not a picture") end, "report:figure: expected SVG text, got a string without <svg")
  end)

  it("writes the page whole and returns nil, message for an unwritable path", function()
    local path = os.tmpname()
    local r = report.new("t"):paragraph("hello")
    assert.are.equal(path, r:write(path))
    local f = assert(io.open(path))
    local text = f:read("a")
    f:close()
    os.remove(path)
    assert.are.equal(r:html(), text)
    local ok, msg = r:write("/nonexistent-dir/report.html")
    assert.is_nil(ok)
    assert.truthy(msg:find("cannot write /nonexistent-dir/report.html", 1, true))
  end)
end)

describe("attn.d2l.report plot", function()
  it("calls the plot function once for the PNG and once for SVG, options intact", function()
    local calls = {}
    local function fake_plot(x, opts)
      calls[#calls + 1] = { x = x, path = opts.path, format = opts.format, title = opts.title }
      if opts.format == "svg" then return "<svg><text>" .. opts.title .. "</text></svg>" end
      return opts.path
    end
    local r = report.new("t")
    local opts = { title = "w" }
    assert.are.equal(r, r:plot("cap", "/tmp/a.png", fake_plot, 42, opts))
    assert.are.same({ { x = 42, path = "/tmp/a.png", title = "w" }, { x = 42, format = "svg", title = "w" } }, calls)
    assert.are.same({ title = "w" }, opts)
    assert.truthy(r:html():find("<figure><svg><text>w</text></svg><figcaption>cap</figcaption></figure>", 1, true))
    local ok, msg = r:plot("cap", "/x.png", function() return nil, "cannot write /x.png" end, {})
    assert.is_nil(ok)
    assert.are.equal("cannot write /x.png", msg)
  end)
end)
