-- @include bug
--[[
parse_min_version: ARGV min_version as a number, or a ROLLOUTQ error.
Uses: nothing but its argument. Why: versions are integers < 2^21 (docs/DESIGN.md; the bufver score packs
them exactly), and Sample refuses anything else, so any other value is a client bug, refused before
the first write.
]]
local function parse_min_version(raw)
  local v = tonumber(raw)
  if not v or v < 0 or v >= 2097152 or v ~= math.floor(v) then bug('bad min_version: ' .. tostring(raw)) end
  return v
end
