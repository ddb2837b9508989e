--[[
reserve: ready, then backlog -> executing for one worker; the attempt is the PEL delivery count.
KEYS:
  src        the reservations stream
  meta       config, policy version and counters
  ready      requeued entry IDs by submission order
  buffer     completed entry IDs by arrival (for backpressure)
  bufver     completed entry IDs by (min_version, arrival): stale ones are evicted first
  results    completion payloads
  workers    worker ids by last heartbeat
  reserves   worker id -> the last reserve's request id and entry IDs (for replay)
  holds      admission hold ids by deadline
  history    entry ID -> counted failures and recent attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  wake_work  wake stream for blocked reservers
ARGV:
  worker_id   string, the PEL consumer name; may not start with @
  max_groups  count, at most this many groups
  max_samples count, at most this many samples in all (0: only the queue's bound)
  request_id  string, the client's id for this call; a retry with the same id replays the answer
  overcommit  0 or 1: the caller queues samples internally, so the oldest group larger than
              max_samples may be the first grant of the call (DESIGN_NOTES: groups larger than a
              caller's slots); with 0 such groups are skipped for another caller
Returns:
  {status, version, version_published 0|1, wake_id, dead_lettered, {{entry_id, attempt, fields}, ...}}
  status 'ok' when something was granted (or a replay), else why not: 'held', 'backpressure',
  'capacity', 'admission', 'retained_full', 'empty', 'oversized' (only groups larger than
  max_samples were there, left for another caller), 'retry' (garbage was dead-lettered: call
  again now); wake_id is set when nothing was granted. At most RESERVE_MAX_GROUPS groups and about
  RESERVE_MAX_BYTES of reservations per call, whatever max_groups asks (bounded script time).
Invariant:
  every granted entry is owned by worker_id in the PEL with delivery count = attempt; executing
  samples <= max_executing_samples, retained <= max_retained_groups, admitted <= (version +
  max_staleness + 1) * batch_groups; granted samples <= max_samples unless overcommit (then one
  group beyond it at most); malformed reservations met on the way are settled dead; stale
  buffered groups are evicted first (bounded), so backpressure never waits on stale groups.
]]
-- @include now_ms
-- @include load_config
-- @include hold_active
-- @include reap_some_worker
-- @include evict_stale_some
-- @include pel_entry
-- @include read_entry
-- @include reserve_ready
-- @include reserve_backlog
-- @include wake
local RESERVE_MAX_GROUPS = 64
local now = now_ms()
local cfg = load_config()
local worker = A.worker_id
local max_groups = tonumber(A.max_groups)
local max_samples = tonumber(A.max_samples)
if worker == '' or string.sub(worker, 1, 1) == '@' or string.find(worker, '|', 1, true) then
  bug('bad worker id: ' .. worker)
end
if not max_groups or max_groups < 1 or max_groups ~= math.floor(max_groups) or not max_samples
    or max_samples < 0 or max_samples ~= math.floor(max_samples) then
  bug('bad max_groups/max_samples')
end
if A.overcommit ~= '0' and A.overcommit ~= '1' then bug('bad overcommit: ' .. tostring(A.overcommit)) end
local published = cfg.has_version and 1 or 0
redis.call('ZADD', K.workers, now, worker)

-- A retry of the same call (connection lost before the reply) replays the entries it granted that
-- the worker still owns, instead of granting more: a worker never holds work it is not executing.
if A.request_id ~= '' then
  local prev = redis.call('HGET', K.reserves, worker)
  local rid, rest = string.match(prev or '', '^([^|]*)|(.*)$')
  if rid == A.request_id then
    local grants = {}
    for id in string.gmatch(rest, '[^,]+') do
      local owner, count = pel_entry(id)
      local _, kv = read_entry(id)
      if owner == worker and kv then table.insert(grants, {id, count, kv}) end
    end
    if grants[1] then return {'ok', cfg.version_eff, published, '', 0, grants} end
    -- The replayed call granted nothing (or nothing is still owned): answer like a refusal, with a
    -- wake ID, so a blocking caller waits from here instead of missing a wake.
    return {'empty', cfg.version_eff, published, wake_id(K.wake_work), 0, {}}
  end
end

reap_some_worker(cfg, now, 16)
evict_stale_some(cfg, now, 32)

local function nothing(status, dead)
  redis.call('HSET', K.reserves, worker, A.request_id .. '|')
  return {status, cfg.version_eff, published, wake_id(K.wake_work), dead, {}}
end
if hold_active(due_now(cfg, now)) then return nothing('held', 0) end
if redis.call('ZCARD', K.buffer) >= cfg.max_completed_groups then return nothing('backpressure', 0) end

local counters = redis.call('HMGET', K.meta, 'executing_samples', 'retained', 'committed')
local r = {grants = {}, taken = 0, bytes = 0, dead = 0, skipped = 0, oversized = 0,
  groups = math.min(max_groups, RESERVE_MAX_GROUPS), overcommit = A.overcommit == '1',
  queue_free = cfg.max_executing_samples - (tonumber(counters[1]) or 0),
  call_cap = max_samples > 0 and max_samples or math.huge}

-- Requeued work first, in submission order; then the backlog.
local stop = reserve_ready(r, cfg, now, worker)
if stop == nil and not reserve_full(r) then stop = reserve_backlog(r, cfg, now, worker, counters) end
if stop == 'full' then stop = nil end
if r.skipped > 0 then redis.call('HINCRBY', K.meta, 'oversize_skipped', r.skipped) end
if r.oversized > 0 then redis.call('HINCRBY', K.meta, 'oversize_granted', r.oversized) end

if #r.grants == 0 then
  -- Dead-lettering garbage used this call's budget: tell the client to call again at once.
  if stop == nil and r.dead > 0 then stop = 'retry' end
  -- Only groups too large for this caller were left: they wait for a caller that can take them.
  if stop == nil and r.skipped > 0 then stop = 'oversized' end
  return nothing(stop or 'empty', r.dead)
end
local ids = {}
for i, g in ipairs(r.grants) do ids[i] = g[1] end
redis.call('HINCRBY', K.meta, 'executing_groups', #r.grants)
redis.call('HINCRBY', K.meta, 'executing_samples', r.taken)
redis.call('HSET', K.reserves, worker, A.request_id .. '|' .. table.concat(ids, ','))
return {'ok', cfg.version_eff, published, '', r.dead, r.grants}
