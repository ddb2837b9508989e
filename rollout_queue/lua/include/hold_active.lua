--[[
hold_active: true while at least one admission hold has not expired.
Uses: K.holds (hold ids scored by deadline). Why: an expired hold (its trainer died) must not close
admission forever, so expiry is read from the score, with no sweep needed for correctness.
]]
local function hold_active(now)
  local r = redis.call('ZRANGEBYSCORE', K.holds, '(' .. now, '+inf', 'LIMIT', 0, 1)
  return r[1] ~= nil
end
