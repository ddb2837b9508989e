--[[
open: create a queue (stream, consumer group, stored config) or check a client against an existing one.
KEYS:
  src       the reservations stream (consumer group `rollout`)
READS:
  meta      config and policy version (written only when this call creates or migrates the queue: a
            producer or worker, whose roles may only read meta, can do neither)
  counters  the counters (written only when this call migrates a queue of layout FROM_LAYOUT)
ARGV:
  library   string, the script library version of the client
  mode      'check' (the client brought a config: it must equal the stored one) or 'adopt'
  *config   name, value pairs of the client's config (stored when the queue is new); batch_groups
            '-1' (left to the trainer, QueueConfig's DERIVED) is stored on a new queue but never
            compared: whatever a trainer derived, set or turned off since stands
Returns:
  {'ok', created 0|1|2, name, value, ...}   the stored config (created 2: migrated from FROM_LAYOUT)
  {'config_mismatch', field, stored, given}
  {'create_refused'}                        no queue, and this caller may not write meta (ACL)
  {'migration_refused', stored, given}      a FROM_LAYOUT queue, and this caller may not write meta
Invariant:
  a queue has exactly one stored config and library version; every script reads its bounds from it.
  Migration (layout FROM_LAYOUT -> TO_LAYOUT: the counters moved out of meta into their own hash, so
  the worker role may write them without writing meta) happens whole in this one call: every counter
  field of meta is checked to be an integer, then added to counters and deleted from meta, the
  library set to the caller's, and a config field the stored config lacks (one added since, as
  trainer_silence_ms) set to the caller's value. Its first write is the library's HSET, so a role that may only read
  meta is refused before anything changes. Bounded: meta holds the config, the 29 counters of
  load_config and at most 33 filtered_reason:* fields.
]]
-- @include bug
-- @include load_config
local FROM_LAYOUT, TO_LAYOUT = '3', '4'

local function layout(library)
  return string.match(library, '^(%d+)%.')
end

-- A refused write (ACL: the caller's role may only read meta) is an answer, not a script error.
-- Inside a script Redis words it 'ERR ACL failure in script: No permissions to access a key', Valkey
-- 'ERR The user executing the script can't access at least one of the keys' (NOPERM outside one).
local ACL_WORDS = {'NOPERM', 'ACL failure', "can't access"}
local function refused(reply)
  local err = type(reply) == 'table' and reply.err
  if not err then return false end
  for _, word in ipairs(ACL_WORDS) do
    if string.find(err, word, 1, true) then return true end
  end
  return false
end

-- Layout 3 kept the counters in meta: move them to K.counters (see the invariant).
local function migrate(stored)
  local all = redis.call('HGETALL', K.meta)
  local moved = {}
  for i = 1, #all, 2 do
    local name = all[i]
    if COUNTER_SET[name] or string.sub(name, 1, 16) == 'filtered_reason:' then
      if not is_integer(all[i + 1]) then bug('corrupt counter in meta: ' .. name .. ' = ' .. all[i + 1]) end
      moved[#moved + 1] = name
      moved[#moved + 1] = all[i + 1]
    end
  end
  local ok = redis.pcall('HSET', K.meta, 'library', A.library)
  if refused(ok) then return {'migration_refused', stored, A.library} end
  if type(ok) == 'table' and ok.err then bug('cannot migrate: ' .. ok.err) end
  for i = 1, #moved, 2 do
    redis.call('HINCRBY', K.counters, moved[i], moved[i + 1])
    redis.call('HDEL', K.meta, moved[i])
  end
  -- A config field added since (trainer_silence_ms) takes the opening client's value; the rest stand.
  for i = 1, #A.config, 2 do redis.call('HSETNX', K.meta, A.config[i], A.config[i + 1]) end
  return nil
end

local created = 0
if redis.call('HEXISTS', K.meta, 'library') == 0 then
  local args = {'HSET', K.meta, 'library', A.library}
  for i = 1, #A.config, 2 do
    table.insert(args, A.config[i])
    table.insert(args, A.config[i + 1])
  end
  local ok = redis.pcall(unpack(args))
  if refused(ok) then return {'create_refused'} end
  if type(ok) == 'table' and ok.err then bug('cannot create the queue: ' .. ok.err) end
  created = 1
else
  local stored = redis.call('HGET', K.meta, 'library')
  if stored ~= A.library and layout(stored) == FROM_LAYOUT and layout(A.library) == TO_LAYOUT then
    local refusal = migrate(stored)
    if refusal then return refusal end
    created = 2
  elseif stored ~= A.library then
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
