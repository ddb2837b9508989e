-- @include bug
-- @include text_fields
--[[
load_config: the queue's stored config and policy version, from K.meta; checks that the counters
(K.counters) are integers, so garbage there is a named error before any script moves one.
Uses: K.meta, K.counters. Invariant: every script reads limits from Redis, never from ARGV, so `config set`
takes effect for every client at once and two clients can never enforce different bounds.
]]
-- Every counter the scripts HINCRBY in K.counters (the per-reason filtered_reason:* counters aside).
local COUNTERS = {'arrivals', 'committed', 'completed_total', 'config_changes', 'dead', 'dead_purged',
  'dead_requeued', 'evicted_stale', 'evicted_overflow', 'executing_groups', 'executing_samples', 'filtered',
  'ghosts', 'kept', 'leased', 'leases_total', 'restored', 'retained', 'failed', 'malformed',
  'aborted', 'lost', 'expired', 'rolled_back', 'pruned', 'oversize_skipped', 'oversize_granted', 'reindexed',
  'filtered_reasons', 'workers_reaped', 'partial_bytes', 'partial_saved', 'partial_continued', 'partial_stale',
  'parked', 'leased_reclaimed', 'counters_repaired', 'tokens_generated', 'tokens_trained', 'tokens_stale',
  'tokens_overflow', 'tokens_rolled_back', 'tokens_expired', 'tokens_trainer_error', 'tokens_dead', 'tokens_filtered',
  'tokens_aborted', 'admission_waits'}
local COUNTER_SET = {}
for _, name in ipairs(COUNTERS) do COUNTER_SET[name] = true end
local function is_integer(raw)
  -- Absent (HMGET gives false) is the caller's call; anything present must be a decimal integer.
  return not raw or string.match(raw, '^%-?%d+$') ~= nil
end
local function load_config()
  local v = redis.call('HMGET', K.meta, 'library', 'max_executing_samples', 'max_retained_groups',
    'max_completed_groups', 'max_staleness', 'batch_groups', 'buffer_order', 'lease_timeout_ms',
    'worker_timeout_ms', 'max_attempts', 'max_payload_bytes', 'hold_timeout_ms', 'commits_maxlen',
    'version', 'lease_record_ttl_ms', 'checkpoint', 'settled_retention_ms', 'max_partial_bytes',
    'trainer_silence_ms', 'staleness_mode', 'max_stale_evictions')
  if not v[1] then
    bug('queue not initialised: open it with RolloutQueue.from_url first')
  end
  local c = {
    library = v[1],
    max_executing_samples = tonumber(v[2]),
    max_retained_groups = tonumber(v[3]),
    max_completed_groups = tonumber(v[4]),
    max_staleness = tonumber(v[5]),          -- -1 means None: strictly on-policy
    batch_groups = tonumber(v[6]),           -- 0 means None: no admission control
    buffer_order = v[7],
    lease_timeout_ms = tonumber(v[8]),
    worker_timeout_ms = tonumber(v[9]),
    max_attempts = tonumber(v[10]),
    max_payload_bytes = tonumber(v[11]),
    hold_timeout_ms = tonumber(v[12]),
    commits_maxlen = tonumber(v[13]),
    version = tonumber(v[14]),               -- nil until the first publish_version
    lease_record_ttl_ms = tonumber(v[15]),
    checkpoint = tonumber(v[16]),            -- nil until the first checkpoint
    settled_retention_ms = tonumber(v[17]),  -- 0 means None: settled lines are kept forever
    max_partial_bytes = tonumber(v[18]),     -- 0: no progress record is kept (partial rollouts off)
    trainer_silence_ms = tonumber(v[19]),    -- 0 means None: a beating lease's silence is not judged
    staleness_mode = v[20],                  -- 'drop', 'continue' or 'pace' (DESIGN: Staleness modes)
    max_stale_evictions = tonumber(v[21]),   -- 0: no fairness rule
  }
  -- Garbage written into meta must surface as a ROLLOUTQ error naming the field, never as a Lua
  -- runtime error deep in a script (or a HINCRBY refusal) that says nothing about the cause.
  local names = {'max_executing_samples', 'max_retained_groups', 'max_completed_groups', 'max_staleness',
    'batch_groups', 'lease_timeout_ms', 'worker_timeout_ms', 'max_attempts', 'max_payload_bytes',
    'hold_timeout_ms', 'commits_maxlen', 'version', 'lease_record_ttl_ms', 'checkpoint', 'settled_retention_ms',
    'max_partial_bytes', 'trainer_silence_ms', 'max_stale_evictions'}
  for i, name in ipairs(names) do
    -- v[1] is library, v[7] buffer_order, v[20] staleness_mode
    local raw = v[i < 6 and i + 1 or i < 18 and i + 2 or i + 3]
    local optional = name == 'version' or name == 'checkpoint'
    if (not raw and not optional) or not is_integer(raw) then
      bug('corrupt config in meta: ' .. name .. ' = ' .. tostring(raw) .. ' (see `rollout-queue config show`; repair it with `config set`)')
    end
  end
  for name, allowed in pairs(TEXT_FIELDS) do
    if not allowed[c[name]] then
      bug('corrupt config in meta: ' .. name .. ' = ' .. tostring(c[name])
        .. ' (see `rollout-queue config show`; repair it with `config set`)')
    end
  end
  -- The worker role writes K.counters, so a credential can put garbage there. A counter that is no
  -- integer would fail the first HINCRBY of it, midway through some script (its earlier writes
  -- kept); failing every script here instead would let one HSET stop the queue. So it is reset to 0
  -- and counted in counters_repaired (redis.pcall: a read-only role's refusal leaves it for the next
  -- writer): a skewed count, as a forged integer would be, never a stopped queue.
  local counters = redis.call('HMGET', K.counters, unpack(COUNTERS))
  local repaired = 0
  for i, name in ipairs(COUNTERS) do
    if counters[i] and not is_integer(counters[i]) then
      local ok = redis.pcall('HSET', K.counters, name, 0)
      if type(ok) ~= 'table' or not ok.err then repaired = repaired + 1 end
    end
  end
  if repaired > 0 then redis.pcall('HINCRBY', K.counters, 'counters_repaired', repaired) end
  -- nil when settled lines are kept forever: then no settlement is recorded for pruning at all.
  if c.settled_retention_ms <= 0 then c.settled_retention_ms = nil end
  if c.trainer_silence_ms <= 0 then c.trainer_silence_ms = nil end
  c.has_version = c.version ~= nil
  c.version_eff = c.version or 0
  c.staleness_bound = c.max_staleness
  if c.staleness_bound < 0 then
    -- Strictly on-policy (None): no token of an older version is ever trained, so whatever the
    -- stored mode, a group is judged by its oldest token, no prefix is kept past a publish and the
    -- fairness rule widens nothing (DESIGN: Staleness modes).
    c.staleness_bound, c.staleness_mode, c.max_stale_evictions = 0, 'drop', 0
  end
  return c
end
