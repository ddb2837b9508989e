--[[
config_set: replace the queue's stored config; every client's scripts read it on their next call.
KEYS:
  meta       config, policy version and counters
ARGV:
  library    the caller's script library version (must equal the stored one)
  *fields    triples: config name, the stored value the caller read, the new value (stored form,
             every field of QueueConfig.to_meta, already validated by QueueConfig)
Returns:
  {'ok', fields changed}
  {'config_mismatch', 'library', stored, given}          another library version owns the queue
  {'config_changed', field, stored now, expected}        the config changed since the caller read
                                                         it; nothing written (read again, retry)
Invariant:
  the stored config is exactly the validated one the caller built from the config it read: a
  concurrent change is never overwritten and a partly written config never exists.
]]
-- @include load_config
local cfg = load_config()
local f = A.fields
if #f % 3 ~= 0 or #f == 0 then bug('config_set takes name, expected, new triples, got ' .. #f .. ' values') end
if cfg.library ~= A.library then return {'config_mismatch', 'library', cfg.library, A.library} end
for i = 1, #f, 3 do
  local stored = redis.call('HGET', K.meta, f[i])
  if stored == false then bug('unknown config field: ' .. f[i]) end
  if stored ~= f[i + 1] then return {'config_changed', f[i], stored, f[i + 1]} end
end
local changed = 0
for i = 1, #f, 3 do
  if f[i + 1] ~= f[i + 2] then
    redis.call('HSET', K.meta, f[i], f[i + 2])
    changed = changed + 1
  end
end
if changed > 0 then redis.call('HINCRBY', K.meta, 'config_changes', 1) end
return {'ok', changed}
