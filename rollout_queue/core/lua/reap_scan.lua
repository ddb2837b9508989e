--[[
reap_scan: read-only: what the reaper should look at now (it changes nothing itself).
KEYS:
  meta       config, policy version
  workers    worker ids by last heartbeat
  leases     lease ids by deadline
  holds      admission hold ids by deadline
  bufver     completed entry IDs by (min_version, arrival)
  settled    settle times of settled groups (entry ID -> source_id), for prune
  kept       committed entry IDs kept for restore, scored by step
  retired    worker ids deregistered while their consumer may remain, by when
READS:
  counters   counters (read only: load_config checks they are integers)
ARGV:
  count      at most this many ids of each kind
Returns:
  {'ok', {silent worker ids}, {expired lease ids}, {expired hold ids}, stale groups,
   prune due 0|1 (groups settled longer ago than settled_retention_s),
   interrupted 0|1 (a restore unfinished, or kept entries a recorded checkpoint covers),
   {retired worker ids: consumers that may be left, for reap_worker to delete}}
Invariant:
  none; every id it returns is re-checked by the transition script that acts on it. O(count log N)
  whatever the number of consumers, entries or leases: PEL consumers nobody registered (orphans)
  are found by sweep_owners, a bounded cursor over the PEL, not here.
]]
-- @include now_ms
-- @include load_config
-- @include stale_floor
-- @include buffer_score
local now = now_ms(true)
local cfg = load_config()
local due = due_now(cfg, now)
local count = tonumber(A.count)
local silent = {}
local cutoff = '(' .. (due - cfg.worker_timeout_ms)
for _, w in ipairs(redis.call('ZRANGEBYSCORE', K.workers, '-inf', cutoff, 'LIMIT', 0, count)) do
  -- '' and '@' names are never a worker ('@' names the queue's own owners): garbage, which reserve's
  -- reap_some drops; reap_worker would refuse them as bad worker ids.
  if w ~= '' and string.sub(w, 1, 1) ~= '@' then table.insert(silent, w) end
end
local expired = redis.call('ZRANGEBYSCORE', K.leases, '-inf', '(' .. due, 'LIMIT', 0, count)
local holds = redis.call('ZRANGEBYSCORE', K.holds, '-inf', due, 'LIMIT', 0, count)
local floor = stale_floor(cfg)
local stale = 0
if floor then
  stale = redis.call('ZCOUNT', K.bufver, '-inf', '(' .. fmt_score(buffer_version_score(floor, 0)))
end
-- Consumers left behind by a close or an inline reaping (their registration ended, the worker role may
-- not delete consumers): an index read, not XINFO CONSUMERS, so the scan costs the same whatever the
-- fleet's size (issue 17). A name registered again is passed on too: reap_worker finds it alive and
-- only drops its retired mark.
local empty = redis.call('ZRANGE', K.retired, 0, count - 1)
local prune_due = 0
if cfg.settled_retention_ms then
  local head = redis.call('XRANGE', K.settled, '-', tostring(stream_ms() - cfg.settled_retention_ms), 'COUNT', 1)
  if head[1] then prune_due = 1 end
end
local interrupted = 0
if redis.call('HEXISTS', K.meta, 'restoring') == 1
    or (cfg.checkpoint and redis.call('ZCOUNT', K.kept, '-inf', cfg.checkpoint) > 0) then
  interrupted = 1
end
return {'ok', silent, expired, holds, stale, prune_due, interrupted, empty}
