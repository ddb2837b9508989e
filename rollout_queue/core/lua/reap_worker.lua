--[[
reap_worker: executing -> ready (terminal lost, counted) for a worker silent past worker_timeout.
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  workers    worker ids by last heartbeat
  reserves   worker id -> last reserve
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  parked     entry ID -> settlement record (park_many); what this call parks it settles at once
  settled    prune records (settle_parked_entries writes them for filtered groups, never parked here)
  wake_work  wake stream for blocked reservers
  progress   worker id -> its last reported counts (deleted with the registration)
  reaped     capped stream: one line per reaping call (who, last heartbeat, what it held)
  retired    worker ids deregistered while their consumer may remain, by when
  counters   counters (apart from meta: the worker role writes these, never the config or version)
READS:
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  worker_id  the worker (a registered one, or a PEL consumer with no registration at all, pending
             entries or none: its consumer is deleted once it owns nothing)
  count      at most this many entries per call
Returns:
  {'ok', requeued, dead_lettered, done 0|1}   call again until done = 1
  {'alive', last_heartbeat_ms}                nothing written but the worker's retired mark
Invariant:
  a worker is reaped only when the server clock says it has been silent past worker_timeout, judged
  inside this script, so a heartbeat that lands first always saves it.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include settle_parked_entries
-- @include reap_worker_entries
local now = now_ms()
local cfg = load_config()
local worker = A.worker_id
if worker == '' or string.sub(worker, 1, 1) == '@' then bug('bad worker id') end
local seen = tonumber(redis.call('ZSCORE', K.workers, worker))
if seen and seen >= due_now(cfg, now) - cfg.worker_timeout_ms then
  redis.call('ZREM', K.retired, worker)  -- registered again: its consumer is in use
  return {'alive', seen}
end
-- A consumer that is no registered worker (its registration removed by hand, or a name a credential
-- made up with XREADGROUP or XCLAIM) ran nothing of what it holds: requeued uncounted, so such a
-- credential cannot dead-letter an innocent group by claiming it to made-up names max_attempts times.
local counted = seen ~= nil and silent_counted(cfg, seen)
local requeued, dead, done = reap_worker_entries(worker, tonumber(A.count), cfg, now, counted)
if done then
  redis.call('XGROUP', 'DELCONSUMER', K.src, 'rollout', worker)
  redis.call('ZREM', K.retired, worker)
end
settle_parked_now(cfg)
return {'ok', requeued, dead, done and 1 or 0}
