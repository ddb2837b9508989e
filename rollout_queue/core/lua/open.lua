--[[
open: create a queue (stream, consumer group, stored config) or check a client against an existing one.
KEYS:
  src       the reservations stream (consumer group `rollout`)
READS:
  meta      config, policy version and counters (written only when this call creates the queue: a
            producer, whose role may only read meta, cannot create one)
ARGV:
  library   string, the script library version of the client
  mode      'check' (the client brought a config: it must equal the stored one) or 'adopt'
  *config   name, value pairs of the client's config (stored when the queue is new); batch_groups
            '-1' (left to the trainer, QueueConfig's DERIVED) is stored on a new queue but never
            compared: whatever a trainer derived, set or turned off since stands
Returns:
  {'ok', created 0|1, name, value, ...}     the stored config
  {'config_mismatch', field, stored, given}
Invariant:
  a queue has exactly one stored config and library version; every script reads its bounds from it.
]]
-- @include bug
-- @include load_config
local created = 0
if redis.call('HEXISTS', K.meta, 'library') == 0 then
  local args = {'HSET', K.meta, 'library', A.library}
  for i = 1, #A.config, 2 do
    table.insert(args, A.config[i])
    table.insert(args, A.config[i + 1])
  end
  redis.call(unpack(args))
  created = 1
else
  local stored = redis.call('HGET', K.meta, 'library')
  if stored ~= A.library then
    return {'config_mismatch', 'library', stored, A.library}
  end
  if A.mode == 'check' then
    for i = 1, #A.config, 2 do
      local have = redis.call('HGET', K.meta, A.config[i])
      local unset = A.config[i] == 'batch_groups' and A.config[i + 1] == '-1'
      if have ~= A.config[i + 1] and not unset then
        return {'config_mismatch', A.config[i], have or '', A.config[i + 1]}
      end
    end
  end
end
-- The group may be missing on a new queue, or if someone deleted the stream: recreate it; BUSYGROUP
-- (it exists) is the normal case and is not an error.
local ok = redis.pcall('XGROUP', 'CREATE', K.src, 'rollout', '0', 'MKSTREAM')
if type(ok) == 'table' and ok.err and not string.find(ok.err, 'BUSYGROUP', 1, true) then
  bug('cannot create consumer group: ' .. ok.err)
end
local out = {'ok', created}
local all = redis.call('HGETALL', K.meta)
for i = 1, #all, 2 do
  table.insert(out, all[i])
  table.insert(out, all[i + 1])
end
return out
