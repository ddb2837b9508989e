--[[
reap_stale: completed -> ready for buffered groups that became stale (the reaper, ahead of lease).
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  buffer     completed entry IDs by arrival
  bufver     completed entry IDs by (min_version, arrival)
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
  count      at most this many groups per call
Returns:
  {'ok', evicted, done 0|1}
Invariant:
  after done, no buffered group has version - min_version > max_staleness (None: 0).
]]
-- @include now_ms
-- @include load_config
-- @include settle_parked_entries
-- @include evict_stale_some
local now = now_ms()
local cfg = load_config()
local evicted, more = evict_stale_some(cfg, now, tonumber(A.count))
settle_parked_now(cfg)
return {'ok', evicted, 1 - more}
