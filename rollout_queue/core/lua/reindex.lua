--[[
reindex: owned entries an index lost are indexed again: one the PEL gives to @ready but that is not
in ready goes back into ready at its place; one the PEL gives to @done but that is not in the buffer
is requeued (its completion is regenerated: the buffer's order and version scores cannot be rebuilt
from the PEL). The reaper's step; bounded: `count` PEL entries of one owner per call. Its cursor
is kept beside the queue clock (rollout:{q}:clock field reindex: bookkeeping, not queue state).
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  buffer     completed entry IDs by arrival
  bufver     completed entry IDs by (min_version, arrival)
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  parked     entry ID -> settlement record (park_many); what this call parks it settles at once
  settled    prune records (settle_parked_entries writes them for filtered groups, never parked here)
  wake_work  wake stream for blocked reservers
  counters   counters (apart from meta: the worker role writes these, never the config or version)
READS:
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  count      PEL entries to look at in this call
Returns:
  {'ok', fixed, wrapped 0|1}   wrapped = 1 when this call finished a full pass over both owners
Invariant:
  after a full pass, every entry owned by @ready is indexed in ready and every entry owned by @done
  is in the buffer (issue 12 item 4: an owned entry missing from its index is otherwise stuck for
  ever, since reserve and lease only look at the indexes). Nothing indexed is touched.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include settle_parked_entries
-- @include ready_score
-- @include call_batched
-- @include evict_buffered_many
local now = now_ms()
local cfg = load_config()
local count = tonumber(A.count)
if not count or count < 1 then bug('bad count: ' .. tostring(A.count)) end
local cursor = redis.call('HGET', clock_key(), 'reindex') or ''  -- bookkeeping, not queue state
local owner, after = string.match(cursor, '^(@%a+)|(.*)$')
if owner ~= '@ready' and owner ~= '@done' then owner, after = '@ready', '' end
if after ~= '' and not string.match(after, '^%d+%-%d+$') then after = '' end
local start = after == '' and '-' or ('(' .. after)
local rows = redis.call('XPENDING', K.src, 'rollout', start, '+', count, owner)
local ids = {}
for i, row in ipairs(rows) do ids[i] = row[1] end
local fixed = 0
if ids[1] then
  local index = owner == '@ready' and K.ready or K.buffer
  local scores = redis.call('ZMSCORE', index, unpack(ids))
  local missing = {}
  for i, id in ipairs(ids) do
    if not scores[i] then table.insert(missing, id) end
  end
  if missing[1] and owner == '@ready' then
    local scored = {}
    for _, id in ipairs(missing) do
      table.insert(scored, ready_score(id))
      table.insert(scored, id)
    end
    call_batched({'ZADD', K.ready}, scored)
    redis.call('HINCRBY', K.counters, 'reindexed', #missing)
    fixed = #missing
  elseif missing[1] then
    fixed = evict_buffered_many(missing, 'unindexed', cfg, now)
    redis.call('HINCRBY', K.counters, 'reindexed', fixed)
  end
end
local wrapped = 0
if #ids < count then
  -- This owner is done: the other one next, from its start.
  if owner == '@done' then wrapped = 1 end
  redis.call('HSET', clock_key(), 'reindex', (owner == '@ready' and '@done' or '@ready') .. '|')
else
  redis.call('HSET', clock_key(), 'reindex', owner .. '|' .. ids[#ids])
end
settle_parked_now(cfg)
return {'ok', fixed, wrapped}
