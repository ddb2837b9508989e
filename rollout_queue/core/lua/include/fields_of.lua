--[[
fields_of: a stream entry's flat field list as a table.
Why: XRANGE and XREADGROUP replies give field/value pairs; validation reads them by name.
]]
local function fields_of(kv)
  local f = {}
  for i = 1, #kv, 2 do f[kv[i]] = kv[i + 1] end
  return f
end
