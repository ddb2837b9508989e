-- @include now_ms
-- @include requeue_lease
--[[
reap_some_lease: opportunistic reaping inside lease: the earliest due lease, bounded by `budget`
members. Returns the number of members it requeued.
Uses: K.leases and what requeue_lease uses. Why: with no reaper process, the next trainer to lease
still finishes the leases a dead trainer left (only the trainer's lease script reaps leases).
]]
local function reap_some_lease(cfg, now, budget)
  local l = redis.call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
  if l[1] and tonumber(l[2]) < due_now(cfg, now) then
    return reap_lease(l[1], budget, cfg, now) or 0
  end
  return 0
end
