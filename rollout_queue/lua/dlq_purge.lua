--[[
dlq_purge: settled(dead) -> gone: delete dead letters for good, with their reasons and pristine payload.
KEYS:
  meta       config and counters
  dlq        dead letters
ARGV:
  count      at most this many dead letters per call
  until_id   '' to delete exactly the listed ids; else delete the oldest dead letters up to and
             including this dlq ID (the newest one the operator saw), `count` per call
  *dlq_ids   the dead letters to delete when until_id is ''
Returns:
  {'ok', purged, done 0|1}   done = 1 when nothing up to until_id is left (always 1 for listed ids)
Invariant:
  meta dead equals the number of dead letters in the dlq: each deleted one decrements it once
  (dead_purged counts them); an unknown or already purged id changes nothing, so a retry is safe.
]]
-- @include load_config
load_config()
local count = tonumber(A.count)
if not count or count < 1 then bug('bad count: ' .. tostring(A.count)) end
local ids = {}
if A.until_id == '' then
  if #A.dlq_ids > count then bug('more ids than count') end
  for _, id in ipairs(A.dlq_ids) do
    if redis.call('XRANGE', K.dlq, id, id)[1] then table.insert(ids, id) end
  end
else
  for _, e in ipairs(redis.call('XRANGE', K.dlq, '-', A.until_id, 'COUNT', count)) do table.insert(ids, e[1]) end
end
for _, id in ipairs(ids) do redis.call('XDEL', K.dlq, id) end
-- Guarded: Lua writes -0 as '-0', which HINCRBY refuses as not an integer.
if #ids > 0 then
  redis.call('HINCRBY', K.meta, 'dead', -#ids)
  redis.call('HINCRBY', K.meta, 'dead_purged', #ids)
end
local done = 1
if A.until_id ~= '' and #ids == count then done = 0 end
return {'ok', #ids, done}
