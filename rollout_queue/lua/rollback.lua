--[[
rollback: leased -> ready for every member (the trainer gave up; not counted toward max_attempts).
KEYS:
  src        the reservations stream
  meta       config and counters
  ready      requeued entry IDs
  results    entry ID -> completion payload
  leases     lease ids by deadline
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  wake_work  wake stream for blocked reservers
  The lease record rollout:{q}:lease:<lease_id> is built from meta's prefix (same hash tag).
ARGV:
  lease_id   the lease
  token      its fencing token
Returns:
  {'ok', 'rolled_back' | 'replay', groups}
  {'lease_lost', state}   state: 'unknown', 'token', 'committed', 'expired'; nothing written
Invariant:
  every member is owned by @ready and indexed in ready, with its pristine payload and the same entry
  ID; the lease record says rolled_back.
]]
-- @include now_ms
-- @include load_config
-- @include lease_record
-- @include requeue_lease
local now = now_ms()
local cfg = load_config()
local lease_key = string.sub(K.meta, 1, -5) .. 'lease:' .. A.lease_id
local L = lease_record(lease_key)
if not L then return {'lease_lost', 'unknown'} end
if L.token ~= A.token then return {'lease_lost', 'token'} end
if L.state == 'rolled_back' then return {'ok', 'replay', 0} end
if L.state ~= 'active' then return {'lease_lost', L.state} end
return {'ok', 'rolled_back', requeue_lease(lease_key, A.lease_id, L.members, 'rolled_back', cfg, now)}
