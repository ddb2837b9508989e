--[[
dlq_requeue: settled(dead) -> backlog: a dead letter's pristine group is submitted again (after a fix).
KEYS:
  src        the reservations stream
  meta       config and policy version
  ids        hash source_id -> entry ID
  intake     counters of what was submitted (the only key a producer writes besides ids and src)
  dlq        dead letters
  wake_work  wake stream for blocked reservers
  settled    settle times of settled groups (entry ID -> source_id), for prune
  history    entry ID -> counted failures and attempts: the old entry's gets "q": the new entry ID
  counters   counters (apart from meta: the worker role writes these, never the config or version)
ARGV:
  dlq_id     the dead letter's ID in the dlq stream
Returns:
  {'ok', new entry ID}
  {'not_found'}          no such dead letter; nothing written
Invariant:
  the dead letter leaves the dlq and its group is in the backlog exactly once, under a new entry ID
  that its source_id now maps to; attempts start again from 1. The old entry ID is recorded in
  settled for prune (prune leaves the source_id, which maps to the new entry, alone). The old
  entry's ledger line stays as its death wrote it (a retried settlement of that attempt still
  replays); its history says where the group went ("q"), so `inspect` of the old ID points there.
]]
-- @include load_config
-- @include wake
-- @include fields_of
-- @include record_settled
local cfg = load_config()
local r = redis.call('XRANGE', K.dlq, A.dlq_id, A.dlq_id)
if not r[1] then return {'not_found'} end
local kv = r[1][2]
local old = fields_of(kv)
-- The first write: a settled key of the wrong type then fails the call before anything else changed.
if old.entry_id then record_settled(cfg, {old.entry_id, old.source_id or old['f:sid'] or ''}) end
local args = {'XADD', K.src, '*'}
local sid = nil
for i = 1, #kv, 2 do
  if string.sub(kv[i], 1, 2) == 'f:' then
    table.insert(args, string.sub(kv[i], 3))
    table.insert(args, kv[i + 1])
    if kv[i] == 'f:sid' then sid = kv[i + 1] end
  end
end
if #args == 3 then table.insert(args, 'v') table.insert(args, 'missing') end
local id = redis.call(unpack(args))
if sid and sid ~= '' then redis.call('HSET', K.ids, sid, id) end
if old.entry_id then
  local ok, h = pcall(cjson.decode, redis.call('HGET', K.history, old.entry_id) or '{}')
  if not ok or type(h) ~= 'table' then h = {} end
  h.f, h.h, h.q = h.f or 0, h.h or {}, id
  if next(h.h) == nil then h.h = nil end  -- cjson writes an empty table as {}, no list: leave it out
  redis.call('HSET', K.history, old.entry_id, cjson.encode(h))
end
redis.call('XDEL', K.dlq, A.dlq_id)
redis.call('HINCRBY', K.counters, 'dead', -1)
redis.call('HINCRBY', K.counters, 'dead_requeued', 1)
redis.call('HINCRBY', K.intake, 'submitted', 1)
wake(K.wake_work)
return {'ok', id}
