--[[
pel_entry: the PEL owner and delivery count of one entry, or nil when it is not pending.
Uses: K.src. Why: the PEL is the truth of ownership; the delivery count is the attempt number.
A string that is not a stream ID (garbage written into an index by hand) is pending nowhere: nil,
instead of the XPENDING error that would make every later call trip over the same index member.
]]
local function pel_entry(id)
  if not string.match(id, '^%d+%-%d+$') then return nil, nil end
  local r = redis.call('XPENDING', K.src, 'rollout', id, id, 1)
  local e = r[1]
  if not e then return nil, nil end
  return e[2], tonumber(e[4])
end
