--[[
dlq_purge: settled(dead) -> gone: delete dead letters for good, with their reasons and pristine payload.
KEYS:
  meta       config and policy version
  dlq        dead letters
  settled    settle times of settled groups (entry ID -> source_id), for prune
  counters   counters (apart from meta: the worker role writes these, never the config or version)
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
  Each purged dead letter's entry is recorded in settled for prune: it left the DLQ, so its ledger
  line and source_id mapping are kept only for the retention from now on.
]]
-- @include bug
-- @include load_config
-- @include fields_of
-- @include record_settled
local cfg = load_config()
local count = tonumber(A.count)
if not count or count < 1 then bug('bad count: ' .. tostring(A.count)) end
local ids, record, seen = {}, {}, {}
local function take(e)
  if seen[e[1]] then return end  -- an id listed twice is purged (and counted) once
  seen[e[1]] = true
  local f = fields_of(e[2])
  table.insert(ids, e[1])
  if f.entry_id then
    table.insert(record, f.entry_id)
    table.insert(record, f.source_id or '')
  end
end
if A.until_id == '' then
  if #A.dlq_ids > count then bug('more ids than count') end
  for _, id in ipairs(A.dlq_ids) do
    local e = redis.call('XRANGE', K.dlq, id, id)[1]
    if e then take(e) end
  end
else
  for _, e in ipairs(redis.call('XRANGE', K.dlq, '-', A.until_id, 'COUNT', count)) do take(e) end
end
record_settled(cfg, record)  -- the first write: a bad settled key fails the call before any other
for _, id in ipairs(ids) do redis.call('XDEL', K.dlq, id) end
-- Guarded: Lua writes -0 as '-0', which HINCRBY refuses as not an integer.
if #ids > 0 then
  redis.call('HINCRBY', K.counters, 'dead', -#ids)
  redis.call('HINCRBY', K.counters, 'dead_purged', #ids)
end
local done = 1
if A.until_id ~= '' and #ids == count then done = 0 end
return {'ok', #ids, done}
