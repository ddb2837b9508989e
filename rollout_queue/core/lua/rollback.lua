--[[
rollback: leased -> ready for every member (the trainer gave up: not counted), or, with a reason (the
trainer raised on this data), leased -> completed at the head of the buffer, each member counted in
suspects and dead-lettered once max_attempts such leases held it.
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  buffer     completed entry IDs by arrival
  bufver     completed entry IDs by (min_version, arrival)
  leases     lease ids by deadline
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  parked     entry ID -> settlement record (park_many); what this call parks it settles at once
  settled    prune records (settle_parked_entries writes them for filtered groups, never parked here)
  suspects   entry ID -> leases rolled back on a trainer error that held it
  wake_work  wake stream for blocked reservers
  wake_done  wake stream for blocked trainers
  The lease record rollout:{q}:lease:<lease_id> is built from meta's prefix (same hash tag).
  counters   counters (apart from meta: the worker role writes these, never the config or version)
  leased     entry ID -> '<lease_id>|<attempt>' of each leased group (leased_guard)
ARGV:
  lease_id   the lease
  token      its fencing token
  reason     '' (a plain rollback), or why the trainer failed on this data (an errored rollback)
  count      at most this many members per call
Returns:
  {'ok', 'rolled_back' | 'replay', groups handed back by this call, dead-lettered by it, done 0|1}
                          call again until done
  {'lease_lost', state}   state: 'unknown', 'token', 'committed', 'expired'; nothing written
Invariant:
  from the first call on, the lease record says rolled_back (a later commit is refused) and keeps the
  first call's reason as `error`, which every later call follows whatever its own ARGV; once done,
  every member is owned by @ready and indexed in ready with its pristine payload and entry ID (plain),
  or (errored) owned by @done with its completion, at the head of the buffer, marked in suspects, or
  settled dead with reason 'trainer_error: <reason>' at max_attempts marks (a buffer without room
  sends the batch to ready instead). A reaper that finishes a rollback whose caller died finishes it
  plain (expire_lease).
]]
-- @include now_ms
-- @include load_config
-- @include settle_parked_entries
-- @include lease_record
-- @include requeue_lease
-- @include requeue_errored
local now = now_ms()
local cfg = load_config()
local lease_key = string.sub(K.meta, 1, -5) .. 'lease:' .. A.lease_id
local L, refusal = lease_fenced(lease_key, A.token)
if not L then return refusal end
local word = 'rolled_back'
if L.state == 'rolled_back' then
  word = 'replay'
elseif L.state == 'active' then
  close_lease(lease_key, A.lease_id, 'rolled_back', now)
  if A.reason ~= '' then redis.call('HSET', lease_key, 'error', A.reason) end
else
  return {'lease_lost', L.state}
end
local count = tonumber(A.count)
local reason = redis.call('HGET', lease_key, 'error')
if reason then
  local n, dead, done = requeue_errored_members(lease_key, A.lease_id, reason, count, cfg, now)
  settle_parked_now(cfg)
  return {'ok', word, n, dead, done and 1 or 0}
end
local n, done = requeue_lease_members(lease_key, A.lease_id, 'rolled_back', count, cfg, now)
settle_parked_now(cfg)
return {'ok', word, n, 0, done and 1 or 0}
