-- @include bug
--[[
last_delivered: the consumer group's last-delivered ID, i.e. where the backlog starts.
Uses: K.src. Why: reserve peeks at the backlog (XRANGE after this ID) to check capacity and validity
before XREADGROUP delivers anything, so a refusal leaves the group's cursor untouched.
]]
local function last_delivered()
  local groups = redis.call('XINFO', 'GROUPS', K.src)
  for _, g in ipairs(groups) do
    local name, last = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] end
      if g[i] == 'last-delivered-id' then last = g[i + 1] end
    end
    if name == 'rollout' then return last end
  end
  bug('consumer group rollout is missing: reopen the queue')
end
