-- @include now_ms
-- @include reap_worker_entries
-- @include requeue_lease
--[[
reap_some_worker / reap_some_lease: opportunistic reaping inside reserve (workers only) and lease
(leases, then workers): the oldest silent worker, or the earliest due lease, bounded by `budget`
entries. Each returns the number of entries it ended.
Uses: K.workers, K.leases, K.meta and what reap_worker_entries / requeue_lease use.
Why: a queue with no reaper process must still recover (issue 3); two O(log n) reads make this
nearly free when nothing is due. Reserve runs under the worker's ACL role, which has no business
with lease records, so only the trainer's lease reaps leases (issue 12 item 10).
]]
local function reap_some_worker(cfg, now, budget)
  local w = redis.call('ZRANGE', K.workers, 0, 0, 'WITHSCORES')
  if w[1] and (w[1] == '' or string.sub(w[1], 1, 1) == '@') then
    -- No worker has an empty name or one starting with '@' (the queue's own PEL owners @ready, @done,
    -- @lease:), so the member was written by hand. Reaping an '@' owner would count failures against
    -- the groups it holds.
    redis.call('ZREM', K.workers, w[1])
    redis.call('HINCRBY', K.meta, 'ghosts', 1)
  elseif w[1] and tonumber(w[2]) < due_now(cfg, now) - cfg.worker_timeout_ms then
    local requeued, dead = reap_worker_entries(w[1], budget, cfg, now, silent_counted(cfg, tonumber(w[2])))
    return requeued + dead
  end
  return 0
end

local function reap_some_lease(cfg, now, budget)
  local l = redis.call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
  if l[1] and tonumber(l[2]) < due_now(cfg, now) then
    return reap_lease(l[1], budget, cfg, now) or 0
  end
  return 0
end
