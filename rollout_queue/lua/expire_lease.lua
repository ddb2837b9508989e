--[[
expire_lease: leased -> ready for a lease past its deadline (the reaper's rollback), or for the
members of an @lease consumer that has no active lease record (orphaned by hand).
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
Returns:
  {'ok', 'expired', groups}
  {'not_due', deadline_ms}    the lease is alive (or already settled); nothing written
Invariant:
  a lease is rolled back by the reaper only after its deadline, judged by the server clock inside
  this script, so a commit racing the reaper either lands first or gets LeaseLost: never both.
]]
-- @include now_ms
-- @include load_config
-- @include lease_record
-- @include requeue_lease
-- @include pel_entry
local now = now_ms()
local cfg = load_config()
local lease_key = string.sub(K.meta, 1, -5) .. 'lease:' .. A.lease_id
local L = lease_record(lease_key)
if L and L.state == 'active' then
  if L.deadline >= now then return {'not_due', L.deadline} end
  return {'ok', 'expired', requeue_lease(lease_key, A.lease_id, L.members, 'expired', cfg, now)}
end
-- No active record: requeue whatever the @lease consumer still owns (bounded), if anything.
local pending = redis.call('XPENDING', K.src, 'rollout', '-', '+', 1000, '@lease:' .. A.lease_id)
if not pending[1] then return {'not_due', 0} end
local ids = {}
for _, p in ipairs(pending) do table.insert(ids, p[1]) end
local n = requeue_lease(lease_key, A.lease_id, table.concat(ids, ','), 'expired', cfg, now)
if not L then redis.call('DEL', lease_key) end
return {'ok', 'expired', n}
