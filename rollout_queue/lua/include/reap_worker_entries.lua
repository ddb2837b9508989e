-- @include now_ms
-- @include pending_entries
-- @include end_attempts
-- @include end_attempt
--[[
reap_worker_entries: executing -> ready (terminal lost, counted) for up to `budget` entries of a worker
the caller has found silent past worker_timeout; deregisters it once it owns nothing.
Returns (requeued, dead, done).
Uses: K.src, K.meta, K.ready, K.history, K.dlq, K.ledger, K.workers, K.reserves, K.wake_work.
Why: bounded work per call keeps every script short even when a worker held thousands of entries;
the batch is ended at once (end_attempts), so a call costs a few commands plus one entry read per
entry and one dead letter per entry that dies.
Also includes end_attempt for the scripts that reach it through this file.
]]
local function reap_worker_entries(worker, budget, cfg, now, counted)
  local entries = pending_entries(worker, budget)
  local reason = counted and 'worker silent past worker_timeout'
    or 'worker did not come back after a Redis outage (not counted)'
  local requeued, dead = end_attempts(worker, entries, 'lost', reason, counted, cfg, now)
  local done = #entries < budget
  if done then
    redis.call('ZREM', K.workers, worker)
    redis.call('HDEL', K.reserves, worker)
    redis.call('XGROUP', 'DELCONSUMER', K.src, 'rollout', worker)
  end
  return requeued, dead, done
end
