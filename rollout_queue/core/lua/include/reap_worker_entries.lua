-- @include now_ms
-- @include pending_entries
-- @include end_attempts
-- @include end_attempt
--[[
reap_worker_entries: executing -> ready (terminal lost, counted) for up to `budget` entries of a worker
the caller has found silent past worker_timeout (or one whose close() was cut short: then with
that close's terminal and reason); deregisters it once it owns nothing. Returns (requeued, dead,
done). Its consumer in the group is left for the reaper (reap_worker.lua) to delete, marked in
`retired` so the reaper finds it without listing every consumer: the worker ACL role, whose reserve reaps inline, gets no XGROUP DELCONSUMER (issue 12 item 10).
Uses: K.src, K.counters, K.ready, K.history, K.dlq, K.ledger, K.workers, K.reserves, K.wake_work,
K.progress, K.reaped, K.retired.
Why: bounded work per call keeps every script short even when a worker held thousands of entries;
the batch is ended at once (end_attempts), so a call costs a few commands plus one entry read per
entry and one dead letter per entry that dies.
Each call appends one line to the capped `reaped` stream (worker, its last heartbeat, terminal,
reason, what this call requeued and dead-lettered, the entry IDs, and its last progress line once
done): which workers died, when, holding what, answered after the fact (issue 18).
Also includes end_attempt for the scripts that reach it through this file.
]]
--: reaped lines kept (approximately: XADD MAXLEN ~ trims whole stream nodes, O(1) amortised).
local REAPED_KEEP = 1000
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
  local seen = redis.call('ZSCORE', K.workers, worker) or ''
  local requeued, dead = end_attempts(worker, entries, terminal, reason, counted, cfg, now)
  local done = #entries < budget
  local progress = ''
  if done then
    progress = redis.call('HGET', K.progress, worker) or ''
    redis.call('ZREM', K.workers, worker)
    redis.call('HDEL', K.reserves, worker)
    redis.call('HDEL', K.progress, worker)
    redis.call('ZADD', K.retired, now, worker)  -- for reap_worker to delete its consumer
  end
  -- A consumer left behind by a clean close owns nothing and is registered nowhere: deleting it
  -- (reap_worker) is housekeeping, not a death, and is not recorded.
  if seen == '' and #entries == 0 then return requeued, dead, done end
  if done then redis.call('HINCRBY', K.counters, 'workers_reaped', 1) end
  local ids = {}
  for i, e in ipairs(entries) do ids[i] = e.id end
  redis.call('XADD', K.reaped, 'MAXLEN', '~', REAPED_KEEP, '*', 'worker', worker, 'heartbeat_ms', seen,
    'terminal', terminal, 'reason', reason, 'requeued', requeued, 'dead', dead, 'ids', table.concat(ids, ','),
    'done', done and 1 or 0, 'progress', progress)
  return requeued, dead, done
end
