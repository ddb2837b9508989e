-- @include end_attempt
--[[
reap_worker_entries: executing -> ready (terminal lost, counted) for up to `budget` entries of a worker
the caller has found silent past worker_timeout; deregisters it once it owns nothing.
Returns (requeued, dead, done).
Uses: K.src, K.meta, K.ready, K.history, K.dlq, K.ledger, K.workers, K.reserves, K.wake_work.
Why: bounded work per call keeps every script short even when a worker held thousands of entries.
]]
local function reap_worker_entries(worker, budget, cfg, now)
  local pending = redis.call('XPENDING', K.src, 'rollout', '-', '+', budget, worker)
  local requeued, dead = 0, 0
  for i = 1, #pending do
    local id, count = pending[i][1], tonumber(pending[i][4])
    local where = end_attempt(id, count, worker, 'lost', 'worker silent past worker_timeout', true, cfg, now)
    if where == 'dead' then dead = dead + 1 else requeued = requeued + 1 end
  end
  local done = #pending < budget
  if done then
    redis.call('ZREM', K.workers, worker)
    redis.call('HDEL', K.reserves, worker)
    redis.call('XGROUP', 'DELCONSUMER', K.src, 'rollout', worker)
  end
  return requeued, dead, done
end
