-- @include now_ms
-- @include pending_entries
-- @include end_attempts
-- @include end_attempt
--[[
reap_worker_entries: executing -> ready (terminal lost, counted) for up to `budget` entries of a worker
the caller has found silent past worker_timeout (or one whose close() was cut short: then with
that close's terminal and reason); deregisters it once it owns nothing. Returns (requeued, dead,
done). Its consumer in the group is left for the reaper (reap_worker.lua) to delete: the worker ACL
role, whose reserve reaps inline, gets no XGROUP DELCONSUMER (issue 12 item 10).
Uses: K.src, K.meta, K.ready, K.history, K.dlq, K.ledger, K.workers, K.reserves, K.wake_work.
Why: bounded work per call keeps every script short even when a worker held thousands of entries;
the batch is ended at once (end_attempts), so a call costs a few commands plus one entry read per
entry and one dead letter per entry that dies.
Also includes end_attempt for the scripts that reach it through this file.
]]
local function reap_worker_entries(worker, budget, cfg, now, counted)
  -- A worker that began close() and died between its batches is finished with its own terminal.
  local mark = redis.call('HGET', K.reserves, worker) or ''
  local terminal, reason = string.match(mark, '^closing|([%a]+)|(.*)$')
  if terminal == 'aborted' or terminal == 'lost' then
    counted = terminal == 'lost'
  else
    terminal = 'lost'
    reason = counted and 'worker silent past worker_timeout'
      or 'worker did not come back after a Redis outage (not counted)'
  end
  local entries = pending_entries(worker, budget)
  local requeued, dead = end_attempts(worker, entries, terminal, reason, counted, cfg, now)
  local done = #entries < budget
  if done then
    redis.call('ZREM', K.workers, worker)
    redis.call('HDEL', K.reserves, worker)
  end
  return requeued, dead, done
end
