-- @include bug
--[[
parse_size: a completion's declared payload size (ARGV) as a number, or a ROLLOUTQ error.
Uses: nothing but its arguments. Why: the size a client declares is what max_payload_bytes is checked
against (the bytes were staged beside the script: payloads.lua); a completion with outputs declares
a whole number of bytes >= 1, one with none (slots '') declares '' (nothing staged); anything else
is a client bug, refused before the first write.
]]
local function parse_size(raw, slots)
  if slots == '' then
    if raw ~= '' then bug('a completion with no outputs stages nothing: size must be empty, got ' .. tostring(raw)) end
    return 0
  end
  local n = tonumber(raw)
  if not n or n < 1 or n ~= math.floor(n) then bug('bad size: ' .. tostring(raw)) end
  return n
end
