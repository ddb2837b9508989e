--[[
requeue: executing -> ready for one attempt, by an operator (`rollout-queue requeue ENTRY_ID`): the
attempt is named by the exact receipt (entry_id, attempt, worker_id) the operator's view showed.
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  workers    worker ids by last heartbeat
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  parked     entry ID -> settlement record (park_many); what this call parks it settles at once
  settled    prune records (settle_parked_entries writes them for filtered groups, never parked here)
  wake_work  wake stream for blocked reservers
  counters   counters (apart from meta: the worker role writes these, never the config or version)
READS:
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  entry_id   the entry
  attempt    the delivery count the operator saw: the attempt to end
  worker_id  the worker the operator saw owning it
  mode       'silent': only when the worker has been silent past worker_timeout (or never
             registered); 'force': whatever the worker's heartbeat says
  terminal   'lost' or 'failed' (counted toward max_attempts) or 'aborted' (not counted)
  reason     text kept in the attempt history (and the dead letter at max_attempts)
Returns:
  {'ok', 'ready' | 'dead' | 'replay'}
  {'stale_receipt', owner, delivery_count}   the attempt already ended or moved on; nothing written
  {'alive', last_heartbeat_ms}               mode 'silent' and the worker still heartbeats; nothing written
Invariant:
  exactly the named attempt ends and the entry is owned by @ready and indexed in ready (or settled
  dead at max_attempts), in this one script; the worker's later complete/fail of that receipt gets
  stale_receipt, so its output can never reach the buffer.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include settle_parked_entries
-- @include parse_receipt
-- @include receipt_refusal
-- @include replayed
-- @include end_attempt
local now = now_ms()
local cfg = load_config()
local id, attempt, worker = parse_receipt(A.entry_id, A.attempt, A.worker_id)
if A.mode ~= 'silent' and A.mode ~= 'force' then bug('bad mode: ' .. tostring(A.mode)) end
if A.terminal ~= 'lost' and A.terminal ~= 'failed' and A.terminal ~= 'aborted' then
  bug('bad terminal: ' .. tostring(A.terminal))
end
local refused = receipt_refusal(id, attempt, worker, function(last)
  return replayed(id, attempt, worker, A.terminal, last)
end)
if refused then return refused end
if A.mode == 'silent' then
  local seen = tonumber(redis.call('ZSCORE', K.workers, worker))
  if seen and seen >= now - cfg.worker_timeout_ms then return {'alive', seen} end
end
local counted = A.terminal ~= 'aborted'
local where = end_attempt(id, attempt, worker, A.terminal, A.reason, counted, cfg, now)
settle_parked_now(cfg)
return {'ok', where}
