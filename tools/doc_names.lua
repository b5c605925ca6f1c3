-- LDoc filter (`ldoc --filter doc_names.filter`, run by tools/doc-check):
-- prints one line per documented item, "<module>\t<item>", for the check.
-- It runs inside ldoc (Debian's runs on Lua 5.1), so it uses nothing newer.
return {
  filter = function(modules)
    for _, m in ipairs(modules) do
      print("module\t" .. m.name)
      for _, item in ipairs(m.items) do print(m.name .. "\t" .. item.name) end
      -- classes documented with @type are sections, not items
      for _, section in ipairs(m.sections or {}) do
        if section.type == "type" then print(m.name .. "\t" .. section.name) end
      end
    end
  end,
}
