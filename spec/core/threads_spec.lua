local attn = require "attn"

-- One worker pool for everything: OpenBLAS stays on one thread inside it, and
-- results do not depend on how many threads run.
describe("threads", function()
  after_each(function() attn.set_num_threads(2) end)

  it("keeps OpenBLAS at one thread whatever set_num_threads says", function()
    for _, n in ipairs { 1, 2, 4 } do
      attn.set_num_threads(n)
      assert.are.equal(n, attn.get_num_threads())
      assert.are.equal(1, attn.core.blas_threads())
    end
    assert.has_error(function() attn.set_num_threads(0) end, "set_num_threads: n = 0 must be in 1..64")
  end)

  it("gives the same seeded numbers and results on 1 and 2 threads", function()
    local function run(n)
      attn.set_num_threads(n)
      attn.manual_seed(99)
      local x = attn.randn({ 300, 200 }, "float64")
      local q = attn.randn({ 4, 70, 16 })
      local out = attn.dot_product_attention(q, q, q, { dropout = 0.3, training = true, need_weights = false })
      return { x:sum():item(), x:softmax(2):max():item(), x:matmul(x:t()):sum():item(), out:sum():item(),
        attn.bernoulli({ 1000 }, 0.5):sum():item() }
    end
    assert.are.same(run(1), run(2))
  end)
end)
