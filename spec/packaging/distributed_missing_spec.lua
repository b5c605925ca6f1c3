-- attn.distributed without its MPI binding (the default suite needs no MPI): requiring it
-- raises a message that says how to get attn.mpi, whether lua/attn/mpi.so is built or not.
describe("attn.distributed without attn.mpi", function()
  local saved_preload, saved_loaded, saved_dist
  before_each(function()
    saved_preload, saved_loaded, saved_dist = package.preload["attn.mpi"], package.loaded["attn.mpi"],
      package.loaded["attn.distributed"]
    package.loaded["attn.mpi"], package.loaded["attn.distributed"] = nil, nil
    package.preload["attn.mpi"] = function() error("module 'attn.mpi' not found (simulated)") end
  end)
  after_each(function()
    package.preload["attn.mpi"], package.loaded["attn.mpi"], package.loaded["attn.distributed"] =
      saved_preload, saved_loaded, saved_dist
  end)

  it("raises naming the packages, the make target and the cause", function()
    local ok, err = pcall(require, "attn.distributed")
    assert.is_false(ok)
    err = tostring(err)
    for _, part in ipairs { "attn.mpi", "openmpi-bin", "libopenmpi-dev", "make mpi", "mpirun", "(simulated)" } do
      assert.truthy(err:find(part, 1, true), "missing '" .. part .. "' in: " .. err)
    end
  end)

  it("leaves the rest of attn working", function()
    pcall(require, "attn.distributed")
    local attn = require "attn"
    assert.are.equal(6, attn.tensor({ 1, 2, 3 }):sum():item())
  end)
end)
