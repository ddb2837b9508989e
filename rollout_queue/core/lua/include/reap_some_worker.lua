-- @include now_ms
-- @include reap_worker_entries
--[[
reap_some_worker: opportunistic reaping inside reserve and lease: the oldest silent worker, bounded by
`budget` entries. Returns the number of entries it ended.
Uses: K.workers, K.counters and what reap_worker_entries uses.
Why: a queue with no reaper process must still recover (issue 3); one O(log n) read makes this nearly
free when nothing is due. It touches no lease record: reserve runs under the worker's ACL role,
which has no business with leases (issue 12 item 10).
]]
local function reap_some_worker(cfg, now, budget)
  local w = redis.call('ZRANGE', K.workers, 0, 0, 'WITHSCORES')
  if w[1] and (w[1] == '' or string.sub(w[1], 1, 1) == '@') then
    -- No worker has an empty name or one starting with '@' (the queue's own PEL owners @ready, @done,
    -- @lease:), so the member was written by hand. Reaping an '@' owner would count failures against
    -- the groups it holds.
    redis.call('ZREM', K.workers, w[1])
    redis.call('HINCRBY', K.counters, 'ghosts', 1)
  elseif w[1] and tonumber(w[2]) < due_now(cfg, now) - cfg.worker_timeout_ms then
    local requeued, dead = reap_worker_entries(w[1], budget, cfg, now, silent_counted(cfg, tonumber(w[2])))
    return requeued + dead
  end
  return 0
end
