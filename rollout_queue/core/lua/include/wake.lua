--[[
wake: append one event to a wake stream so blocked reserve/lease callers re-run their script.
Why: scripts cannot block; a blocked caller waits with XREAD BLOCK from the wake ID its last script
reply gave it, so an event written after that reply can never be missed. Trimmed to ~64 entries.
]]
local woken = {}
local function wake(key)
  if woken[key] then return end
  woken[key] = true
  redis.call('XADD', key, 'MAXLEN', '~', '64', '*', 'w', '1')
end
local function wake_id(key)
  local r = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  if r[1] then return r[1][1] end
  return '0-0'
end
