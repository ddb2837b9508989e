-- @include bug
--[[
load_config: the queue's stored config and policy version, from K.meta.
Uses: K.meta. Invariant: every script reads limits from Redis, never from ARGV, so `config set`
takes effect for every client at once and two clients can never enforce different bounds.
]]
local function load_config()
  local v = redis.call('HMGET', K.meta, 'library', 'max_executing_samples', 'max_retained_groups',
    'max_completed_groups', 'max_staleness', 'batch_groups', 'buffer_order', 'lease_timeout_ms',
    'worker_timeout_ms', 'max_attempts', 'max_payload_bytes', 'hold_timeout_ms', 'commits_maxlen',
    'version', 'lease_record_ttl_ms', 'checkpoint')
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
  }
  c.has_version = c.version ~= nil
  c.version_eff = c.version or 0
  c.staleness_bound = c.max_staleness
  if c.staleness_bound < 0 then c.staleness_bound = 0 end
  return c
end
