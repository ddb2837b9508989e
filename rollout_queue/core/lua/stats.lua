--[[
stats: read-only snapshot of the queue's counters and index sizes, consistent at one instant.
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  buffer     completed entry IDs by arrival
  bufver     completed entry IDs by (min_version, arrival)
  workers    worker ids by last heartbeat
  leases     lease ids by deadline
  holds      admission hold ids by deadline
  dlq        dead letters
  commits    one line per committed lease
  ledger     entry ID -> last terminal or settlement
  ids        hash source_id -> entry ID
  intake     counters of what was submitted
  counters   counters (apart from meta: the worker role writes these, never the config or version)
ARGV:
  (none)
Returns:
  {'ok', {meta and counters name, value, ...}, server_ms, stream length, ready, buffer, workers alive, workers
   silent, active leases, active holds, dlq length, commits length,
   buffered groups per min version {v, count, ...} (oldest first), ledger lines, source_ids, outages
   seen by the queue clock, submitted, progress records (partial rollouts)}
Invariant:
  none (read-only); counts come from one atomic script so they agree with each other. Bounded
  whatever the queue's size: every call is O(1) or O(log N), and the buffer's versions are read one
  distinct version at a time (a first member and a ZCOUNT each), at most MAX_VERSIONS of them; the
  groups newer than the last one listed are counted at the version after it (only a buffer holding
  more than MAX_VERSIONS distinct versions, max_staleness >= 64, has any).
]]
-- @include now_ms
-- @include load_config
-- @include buffer_score
-- @include partial_keys
local MAX_VERSIONS = 64
-- COUNTERS plus 33 filtered_reason:* fields, with room: past it the reasons are left out of stats.
local MAX_COUNTER_FIELDS = 256

-- {v, count, ...} of the buffered groups, oldest version first (see the invariant). A member whose
-- score is no version (negative or beyond 2^21, written by hand) is a ghost: not counted.
local function buffer_versions()
  local out, low = {}, 0
  for _ = 1, MAX_VERSIONS do
    local first = redis.call('ZRANGEBYSCORE', K.bufver, fmt_score(low), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if #first == 0 then return out end
    local v = score_min_version(first[2])
    if not (v >= 0 and v < 2097152) then return out end
    local high = (v + 1) * VERSION_SHIFT
    out[#out + 1] = v
    out[#out + 1] = redis.call('ZCOUNT', K.bufver, fmt_score(low), '(' .. fmt_score(high))
    low = high
  end
  local rest = redis.call('ZCOUNT', K.bufver, fmt_score(low), '(' .. fmt_score(2097152 * VERSION_SHIFT))
  if rest > 0 then
    out[#out + 1] = score_min_version(low)
    out[#out + 1] = rest
  end
  return out
end

local now = now_ms(true)
local cfg = load_config()
local due = due_now(cfg, now)
local cutoff = due - cfg.worker_timeout_ms
local versions = buffer_versions()
-- One name/value list, as when the counters lived in meta: the config, then the counters. The worker
-- role writes K.counters, so only the counters the scripts keep are read from it (load_config's
-- COUNTERS and filtered_reason:*): a field a credential made up there (`version`, say) never shadows
-- meta's, and a hash it swelled costs one HMGET, not an HGETALL of everything it wrote.
local fields = redis.call('HGETALL', K.meta)
local known = redis.call('HMGET', K.counters, unpack(COUNTERS))
for i, name in ipairs(COUNTERS) do
  if known[i] then
    fields[#fields + 1] = name
    fields[#fields + 1] = known[i]
  end
end
if redis.call('HLEN', K.counters) <= MAX_COUNTER_FIELDS then
  local all = redis.call('HGETALL', K.counters)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 16) == 'filtered_reason:' then
      fields[#fields + 1] = all[i]
      fields[#fields + 1] = all[i + 1]
    end
  end
end
return {'ok', fields, now, redis.call('XLEN', K.src), redis.call('ZCARD', K.ready),
  redis.call('ZCARD', K.buffer), redis.call('ZCOUNT', K.workers, cutoff, '+inf'),
  redis.call('ZCOUNT', K.workers, '-inf', '(' .. cutoff), redis.call('ZCOUNT', K.leases, 1, '+inf'),
  redis.call('ZCOUNT', K.holds, '(' .. due, '+inf'), redis.call('XLEN', K.dlq), redis.call('XLEN', K.commits),
  versions, redis.call('HLEN', K.ledger), redis.call('HLEN', K.ids),
  tonumber(redis.call('HGET', clock_key(), 'outages')) or 0,
  tonumber(redis.call('HGET', K.intake, 'submitted')) or 0, redis.call('HLEN', PARTIAL_HEAD_KEY)}
