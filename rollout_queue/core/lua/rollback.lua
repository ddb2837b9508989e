--[[
rollback: leased -> ready for every member (the trainer gave up; not counted toward max_attempts).
KEYS:
  src        the reservations stream
  meta       config and counters
  ready      requeued entry IDs
  leases     lease ids by deadline
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  wake_work  wake stream for blocked reservers
  The lease record rollout:{q}:lease:<lease_id> is built from meta's prefix (same hash tag).
ARGV:
  lease_id   the lease
  token      its fencing token
  count      at most this many members per call
Returns:
  {'ok', 'rolled_back' | 'replay', groups requeued by this call, done 0|1}   call again until done
  {'lease_lost', state}   state: 'unknown', 'token', 'committed', 'expired'; nothing written
Invariant:
  from the first call on, the lease record says rolled_back (a later commit is refused); once done,
  every member is owned by @ready and indexed in ready, with its pristine payload and entry ID.
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
local word = 'rolled_back'
if L.state == 'rolled_back' then
  word = 'replay'
elseif L.state == 'active' then
  close_lease(lease_key, A.lease_id, 'rolled_back', now)
else
  return {'lease_lost', L.state}
end
local n, done = requeue_lease_members(lease_key, A.lease_id, 'rolled_back', tonumber(A.count), cfg, now)
return {'ok', word, n, done and 1 or 0}
