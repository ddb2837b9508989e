--[[
config_set: replace the queue's stored config; every client's scripts read it on their next call.
KEYS:
  meta       config and policy version
  counters   counters (apart from meta: the worker role writes these, never the config or version)
ARGV:
  library    the caller's script library version (must equal the stored one)
  *fields    triples: config name, the stored value the caller read ('' if absent), the new value
             (stored form, every field of QueueConfig.to_meta, already validated by QueueConfig)
Returns:
  {'ok', fields changed}
  {'config_mismatch', 'library', stored, given}          another library version owns the queue
  {'config_changed', field, stored now, expected}        the config changed since the caller read
                                                         it; nothing written (read again, retry)
Invariant:
  the stored config is exactly the validated one the caller built from the config it read: a
  concurrent change is never overwritten and a partly written config never exists. It does not
  load the config it replaces, so a field holding garbage (which fails every other script with
  "corrupt config") is repaired by setting it; every new value is a decimal integer (buffer_order
  fifo or lifo, staleness_mode drop, continue or pace), so the stored config decodes afterwards.
]]
-- @include bug
-- @include text_fields
local FIELDS = {max_executing_samples = 1, max_retained_groups = 1, max_completed_groups = 1, max_staleness = 1,
  batch_groups = 1, buffer_order = 1, lease_timeout_ms = 1, worker_timeout_ms = 1, max_attempts = 1,
  max_payload_bytes = 1, hold_timeout_ms = 1, commits_maxlen = 1, lease_record_ttl_ms = 1, settled_retention_ms = 1,
  max_partial_bytes = 1, trainer_silence_ms = 1, staleness_mode = 1, max_stale_evictions = 1}
local library = redis.call('HGET', K.meta, 'library')
if not library then bug('queue not initialised: open it with RolloutQueue.from_url first') end
local f = A.fields
if #f % 3 ~= 0 or #f == 0 then bug('config_set takes name, expected, new triples, got ' .. #f .. ' values') end
if library ~= A.library then return {'config_mismatch', 'library', library, A.library} end
for i = 1, #f, 3 do
  if not FIELDS[f[i]] then bug('unknown config field: ' .. f[i]) end
  local valid
  if TEXT_FIELDS[f[i]] then valid = TEXT_FIELDS[f[i]][f[i + 2]] else valid = string.match(f[i + 2], '^%-?%d+$') end
  if not valid then bug('bad value for ' .. f[i] .. ': ' .. f[i + 2]) end
  local stored = redis.call('HGET', K.meta, f[i]) or ''
  if stored ~= f[i + 1] then return {'config_changed', f[i], stored, f[i + 1]} end
end
local count = redis.call('HGET', K.counters, 'config_changes')
if count and not string.match(count, '^%-?%d+$') then bug('corrupt counter in counters: config_changes = ' .. count) end
local changed = 0
for i = 1, #f, 3 do
  if f[i + 1] ~= f[i + 2] then
    redis.call('HSET', K.meta, f[i], f[i + 2])
    changed = changed + 1
  end
end
if changed > 0 then redis.call('HINCRBY', K.counters, 'config_changes', 1) end
return {'ok', changed}
