--[[
close_worker: every attempt a worker owns: executing -> ready; then deregister the worker.
KEYS:
  src        the reservations stream
  ready      requeued entry IDs
  workers    worker ids by last heartbeat
  reserves   worker id -> last reserve (for replay)
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  parked     entry ID -> settlement record of a group this call dead-letters (park_many: the
             worker role holds no XACK; settle_parked finishes it)
  wake_work  wake stream for blocked reservers
  progress   worker id -> its last reported counts (deleted with the registration)
  retired    worker ids deregistered while their consumer may remain, by when
  counters   counters (apart from meta: the worker role writes these, never the config or version)
READS:
  meta       config and policy version (read only: the worker role may not write meta)
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  worker_id  the worker
  terminal   'aborted' (drain, clean close, a worker's fatal error: not counted) or 'lost' (counted)
  reason     text kept in each attempt's history
  count      at most this many entries per call
Returns:
  {'ok', requeued, dead_lettered, done 0|1}   call again until done = 1
Invariant:
  once done, the worker owns nothing in the PEL and is not registered; everything it owned is in
  ready (or dead at max_attempts): a worker never holds work it is not executing. The first call
  marks the close (reserves: closing|terminal|reason) and makes the worker due at once, so a caller
  that dies between batches leaves the rest to the reaper under the same terminal. The consumer
  itself is deleted by the reaper (the worker role has no XGROUP DELCONSUMER), which finds it in
  `retired`.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include pending_entries
-- @include end_attempts
local now = now_ms()
local cfg = load_config()
local worker = A.worker_id
if worker == '' or string.sub(worker, 1, 1) == '@' then bug('bad worker id') end
if A.terminal ~= 'aborted' and A.terminal ~= 'lost' then bug('bad terminal: ' .. A.terminal) end
local counted = A.terminal == 'lost'
-- The fence: a close cut short between its batches is finished by the reaper with this terminal
-- (reap_worker_entries reads it), at once (score 0: silent now), not as 'lost' a timeout later.
redis.call('HSET', K.reserves, worker, 'closing|' .. A.terminal .. '|' .. A.reason)
redis.call('ZADD', K.workers, 0, worker)
local entries = pending_entries(worker, tonumber(A.count))
local requeued, dead = end_attempts(worker, entries, A.terminal, A.reason, counted, cfg, now)
local done = 0
if #entries < tonumber(A.count) then
  redis.call('ZREM', K.workers, worker)
  redis.call('HDEL', K.reserves, worker)
  redis.call('HDEL', K.progress, worker)
  redis.call('ZADD', K.retired, now, worker)  -- its consumer is left for the reaper to delete
  done = 1
end
return {'ok', requeued, dead, done}
