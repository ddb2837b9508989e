--[[
hold_active: true while at least one admission hold has not expired.
Uses: K.holds (hold ids scored by deadline). Why: an expired hold (its trainer died) must not close
admission forever, so expiry is read from the score, with no sweep needed for correctness. A member
hold_open cannot have written (an id outside [%w-_.], an infinite deadline) is garbage and holds
nothing, so garbage in K.holds never closes admission for good.
]]
local function hold_active(now)  -- now: due_now(cfg, now_ms())
  local r = redis.call('ZRANGEBYSCORE', K.holds, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 16)
  for i = 1, #r, 2 do
    local deadline = tonumber(r[i + 1])
    if deadline and deadline < math.huge and string.match(r[i], '^[%w%-_%.]+$') then return true end
  end
  return false
end
