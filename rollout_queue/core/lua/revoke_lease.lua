--[[
revoke_lease: leased -> ready, by an operator, for a lease named by id alone (its holder is dead or
stuck, and nobody else has its token): the same plain rollback the trainer's own rollback() makes.
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  leases     lease ids by when they fall due
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  parked     entry ID -> settlement record (park_many); what this call parks it settles at once
  settled    prune records (settle_parked_entries writes them for filtered groups, never parked here)
  wake_work  wake stream for blocked reservers
  The lease record rollout:{q}:lease:<lease_id> is built from meta's prefix (same hash tag).
  counters   counters (apart from meta: the worker role writes these, never the config or version)
  leased     entry ID -> '<lease_id>|<attempt>' of each leased group (leased_guard)
ARGV:
  lease_id   the lease
  reason     why the operator rolls it back (kept in the record as `revoked`)
  count      at most this many members per call
Returns:
  {'ok', 'rolled_back' | 'replay', groups requeued by this call, done 0|1}   call again until done
  {'lease_lost', state}   state: 'unknown' (no such lease), 'committed', 'expired'; nothing written
Invariant:
  from the first call on the record says rolled_back (with `revoked` = the reason), so the holder's
  later commit, extend or beat is refused (LeaseLost 'rolled_back') and nothing it trained is
  committed; once done every member is owned by @ready, indexed in ready with its pristine payload
  and entry ID, not counted toward max_attempts (an operator's rollback is not the group's fault).
  A rollback already under way (the holder's own, or an earlier revoke) is finished plain.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include settle_parked_entries
-- @include lease_record
-- @include requeue_lease
local now = now_ms()
local cfg = load_config()
if not string.match(A.lease_id, '^[%w%-_%.]+$') then bug('bad lease id: ' .. A.lease_id) end
local count = tonumber(A.count)
if not count or count < 1 then bug('count must be >= 1') end
local lease_key = string.sub(K.meta, 1, -5) .. 'lease:' .. A.lease_id
local L = lease_record(lease_key)
if not L then return {'lease_lost', 'unknown'} end
local word = 'rolled_back'
if L.state == 'rolled_back' then
  word = 'replay'
elseif L.state == 'active' then
  close_lease(lease_key, A.lease_id, 'rolled_back', now)
  redis.call('HSET', lease_key, 'revoked', A.reason)
else
  return {'lease_lost', L.state}
end
local n, done = requeue_lease_members(lease_key, A.lease_id, 'rolled_back', count, cfg, now)
settle_parked_now(cfg)
return {'ok', word, n, done and 1 or 0}
