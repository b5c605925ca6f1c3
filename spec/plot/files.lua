--- Readers for the plot specs: PNG header fields and SVG elements (through
-- lua-expat, a real XML parser, so "parses as XML" means what it says).
local lxp = require "lxp"

local files = {}

files.PNG_SIGNATURE = "\137PNG\r\n\26\n"

--- Width and height from the IHDR chunk of PNG bytes (nil if not a PNG).
function files.png_size(bytes)
  if bytes:sub(1, 8) ~= files.PNG_SIGNATURE or bytes:sub(13, 16) ~= "IHDR" then return nil end
  local w, h = string.unpack(">I4I4", bytes, 17)
  return w, h
end

--- Every element of an SVG document in document order, as {name, attrs, text},
-- or nil and the parser's message.
function files.svg_elements(text)
  local elems, stack = {}, {}
  local parser = lxp.new {
    StartElement = function(_, name, attrs)
      local e = { name = name, attrs = attrs, text = "" }
      elems[#elems + 1] = e
      stack[#stack + 1] = e
    end,
    EndElement = function() stack[#stack] = nil end,
    CharacterData = function(_, s)
      if #stack > 0 then stack[#stack].text = stack[#stack].text .. s end
    end,
  }
  local ok, msg, line = parser:parse(text)
  if ok then ok, msg, line = parser:parse() end
  parser:close()
  if not ok then return nil, string.format("%s at line %s", msg, tostring(line)) end
  return elems
end

--- The elements with a given name and class attribute.
function files.select(elems, name, class)
  local out = {}
  for _, e in ipairs(elems) do
    if e.name == name and (class == nil or e.attrs.class == class) then out[#out + 1] = e end
  end
  return out
end

--- "#rrggbb" as three integers.
function files.rgb(s)
  return tonumber(s:sub(2, 3), 16), tonumber(s:sub(4, 5), 16), tonumber(s:sub(6, 7), 16)
end

return files
