-- @include now_ms
-- @include reap_worker_entries
-- @include requeue_lease
--[[
reap_some: opportunistic reaping from reserve and lease: the oldest silent worker and the earliest
expired lease, bounded by `budget` entries. Returns the number of entries requeued.
Uses: K.workers, K.leases, K.meta and what reap_worker_entries / requeue_lease use.
Why: a queue with no reaper process must still recover (issue 3); two O(log n) reads make this
nearly free when nothing is due.
]]
local function reap_some(cfg, now, budget)
  local n = 0
  local w = redis.call('ZRANGE', K.workers, 0, 0, 'WITHSCORES')
  if w[1] and (w[1] == '' or string.sub(w[1], 1, 1) == '@') then
    -- No worker has an empty name or one starting with '@' (the queue's own PEL owners @ready, @done,
    -- @lease:), so the member was written by hand. Reaping an '@' owner would count failures against
    -- the groups it holds.
    redis.call('ZREM', K.workers, w[1])
    redis.call('HINCRBY', K.meta, 'ghosts', 1)
  elseif w[1] and tonumber(w[2]) < due_now(cfg, now) - cfg.worker_timeout_ms then
    local requeued, dead = reap_worker_entries(w[1], budget, cfg, now, silent_counted(cfg, tonumber(w[2])))
    n = n + requeued + dead
  end
  local l = redis.call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
  if l[1] and tonumber(l[2]) < due_now(cfg, now) then
    local requeued = reap_lease(l[1], budget, cfg, now)
    n = n + (requeued or 0)
  end
  return n
end
