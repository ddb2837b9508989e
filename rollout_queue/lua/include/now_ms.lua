--[[
now_ms: the server clock in milliseconds.
Why: DESIGN rule 6, time never comes from client clocks; every deadline and heartbeat is compared
against this one clock, so two hosts with skewed clocks still agree.
]]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
