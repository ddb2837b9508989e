--[[
reserve: ready, then backlog -> executing for one worker; the attempt is the PEL delivery count.
KEYS:
  src        the reservations stream
  meta       config, policy version and counters
  ready      requeued entry IDs by submission order
  buffer     completed entry IDs by arrival (for backpressure)
  results    completion payloads
  workers    worker ids by last heartbeat
  reserves   worker id -> the last reserve's request id and entry IDs (for replay)
  leases     lease ids by deadline
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
Returns:
  {status, version, version_published 0|1, wake_id, dead_lettered, {{entry_id, attempt, fields}, ...}}
  status 'ok' when something was granted (or a replay), else why not: 'held', 'backpressure',
  'capacity', 'admission', 'retained_full', 'empty', 'retry' (garbage was dead-lettered: call
  again now); wake_id is set when nothing was granted.
Invariant:
  every granted entry is owned by worker_id in the PEL with delivery count = attempt; executing
  samples <= max_executing_samples, retained <= max_retained_groups, admitted <= (version +
  max_staleness + 1) * batch_groups; malformed reservations met on the way are settled dead.
]]
-- @include now_ms
-- @include load_config
-- @include hold_active
-- @include reap_some
-- @include validate_reservation
-- @include pel_entry
-- @include read_entry
-- @include fields_of
-- @include last_delivered
-- @include settle_dead
-- @include wake
local now = now_ms()
local cfg = load_config()
local worker = A.worker_id
local max_groups = tonumber(A.max_groups)
local max_samples = tonumber(A.max_samples)
if worker == '' or string.sub(worker, 1, 1) == '@' or string.find(worker, '|', 1, true) then
  bug('bad worker id: ' .. worker)
end
if not max_groups or max_groups < 1 or not max_samples then bug('bad max_groups/max_samples') end
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

reap_some(cfg, now, 16)

local function nothing(status, dead)
  redis.call('HSET', K.reserves, worker, A.request_id .. '|')
  return {status, cfg.version_eff, published, wake_id(K.wake_work), dead, {}}
end
if hold_active(due_now(cfg, now)) then return nothing('held', 0) end
if redis.call('ZCARD', K.buffer) >= cfg.max_completed_groups then return nothing('backpressure', 0) end

local counters = redis.call('HMGET', K.meta, 'executing_samples', 'retained', 'committed')
local sample_cap = cfg.max_executing_samples - (tonumber(counters[1]) or 0)
if max_samples > 0 and max_samples < sample_cap then sample_cap = max_samples end
local grants, taken, dead, stop = {}, 0, 0, nil

-- 1. Requeued work first, in submission order.
local guard = max_groups + 64
while #grants < max_groups and guard > 0 do
  guard = guard - 1
  local head = redis.call('ZRANGE', K.ready, 0, 0)[1]
  if not head then break end
  local owner, count = pel_entry(head)
  local f, kv = read_entry(head)
  if owner ~= '@ready' then
    -- The index names an entry the PEL does not give to @ready (garbage written by hand): drop it.
    redis.call('ZREM', K.ready, head)
    redis.call('HINCRBY', K.meta, 'ghosts', 1)
  else
    local bad = validate_reservation(f, cfg)
    if bad then
      redis.call('ZREM', K.ready, head)
      settle_dead(head, kv, bad, redis.call('HGET', K.history, head), count, '@ready', now)
      dead = dead + 1
    else
      local n = tonumber(f.n)
      if taken + n > sample_cap then stop = 'capacity' break end
      redis.call('ZREM', K.ready, head)
      redis.call('XCLAIM', K.src, 'rollout', worker, 0, head, 'RETRYCOUNT', count + 1, 'JUSTID')
      taken = taken + n
      table.insert(grants, {head, count + 1, kv})
    end
  end
end

-- 2. Then the backlog, peeked first so that a refusal leaves the group's cursor where it was.
if stop == nil and #grants < max_groups then
  local retained = tonumber(counters[2]) or 0
  local allow = cfg.max_retained_groups - retained
  if allow <= 0 then stop = 'retained_full' end
  if cfg.batch_groups > 0 then
    local limit = (cfg.version_eff + cfg.staleness_bound + 1) * cfg.batch_groups
    local room = limit - retained - (tonumber(counters[3]) or 0)
    if room < allow then allow = room end
    if room <= 0 then stop = 'admission' end
  end
  local want = math.min(max_groups - #grants, allow)
  if want > 0 then
    local cands = redis.call('XRANGE', K.src, '(' .. last_delivered(), '+', 'COUNT', want + 16)
    local m, valid, invalid = 0, 0, {}
    for i, e in ipairs(cands) do
      local f = fields_of(e[2])
      local bad = validate_reservation(f, cfg)
      if bad then
        invalid[e[1]] = bad
      else
        if valid >= want then break end
        local n = tonumber(f.n)
        if taken + n > sample_cap then stop = 'capacity' break end
        valid = valid + 1
        taken = taken + n
      end
      m = i
    end
    if m > 0 then
      local read = redis.call('XREADGROUP', 'GROUP', 'rollout', worker, 'COUNT', m, 'STREAMS', K.src, '>')
      local entries = read[1][2]
      redis.call('HINCRBY', K.meta, 'retained', #entries)
      for _, e in ipairs(entries) do
        if invalid[e[1]] then
          settle_dead(e[1], e[2], invalid[e[1]], nil, 1, worker, now)
          dead = dead + 1
        else
          table.insert(grants, {e[1], 1, e[2]})
        end
      end
    end
  end
end

if #grants == 0 then
  -- Dead-lettering garbage used this call's budget: tell the client to call again at once.
  if stop == nil and dead > 0 then stop = 'retry' end
  return nothing(stop or 'empty', dead)
end
local ids = {}
for i, g in ipairs(grants) do ids[i] = g[1] end
redis.call('HINCRBY', K.meta, 'executing_groups', #grants)
redis.call('HINCRBY', K.meta, 'executing_samples', taken)
redis.call('HSET', K.reserves, worker, A.request_id .. '|' .. table.concat(ids, ','))
return {'ok', cfg.version_eff, published, '', dead, grants}
