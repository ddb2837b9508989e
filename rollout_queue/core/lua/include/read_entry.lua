--[[
read_entry: the pristine fields of a stream entry as a table, plus the raw field list; nil if gone.
Uses: K.src. Why: DESIGN rule 2, every attempt starts from the unmodified stream entry. A string that
is not a stream ID names no entry: nil (see pel_entry).
]]
local function read_entry(id)
  if not string.match(id, '^%d+%-%d+$') then return nil, nil end
  local r = redis.call('XRANGE', K.src, id, id)
  local e = r[1]
  if not e then return nil, nil end
  local kv = e[2]
  local f = {}
  for i = 1, #kv, 2 do f[kv[i]] = kv[i + 1] end
  return f, kv
end
