--[[
expire_lease: leased -> ready for a lease past its deadline (the reaper's rollback), or for the
members of an @lease consumer that has no active lease record (orphaned by hand).
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  leases     lease ids by deadline
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
  count      at most this many members per call
Returns:
  {'ok', 'expired', groups requeued by this call, done 0|1}   call again until done
  {'not_due', 0}              the lease is alive, or closed with nothing left to requeue
Invariant:
  a lease is rolled back by the reaper only after its deadline, judged by the server clock inside
  this script, so a commit racing the reaper either lands first or gets LeaseLost: never both.
]]
-- @include now_ms
-- @include load_config
-- @include settle_parked_entries
-- @include requeue_lease
local now = now_ms()
local cfg = load_config()
local n, done = reap_lease(A.lease_id, tonumber(A.count), cfg, now)
-- A lease closed with nothing left to requeue (or an unknown id) gives the reaper nothing to do.
if n == nil or (n == 0 and done) then return {'not_due', 0} end
settle_parked_now(cfg)
return {'ok', 'expired', n, done and 1 or 0}
