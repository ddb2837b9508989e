--[[
prune: settled -> forgotten: the ledger line and source_id mapping of groups settled longer ago than
settled_retention_s are deleted (the reaper runs this; bounded like its other scripts).
KEYS:
  meta       config and policy version
  ledger     entry ID -> last terminal or settlement
  history    entry ID -> counted failures and attempt reasons (kept until pruned, with the ledger line)
  ids        hash source_id -> entry ID
  settled    settle times of settled groups (entry ID -> source_id), for prune
  suspects   entry ID -> leases rolled back on a trainer error that held it (forgotten with the line)
  counters   counters (apart from meta: the worker role writes these, never the config or version)
ARGV:
  count      at most this many groups per call (at least 32: record_settled's chunk)
Returns:
  {'ok', pruned, done 0|1}   pruned: ledger lines deleted; call again until done = 1. With
                             settled_retention_s = None nothing is ever due: {'ok', 0, 1}
Invariant:
  only groups recorded in settled at least the retention ago lose their ledger line (and only a
  settlement line 's|...', with its attempt history: a line that says the entry is owned again is
  kept, and counted in ghosts);
  a source_id mapping is deleted only while it still names the pruned entry (a requeued dead letter's
  source_id maps to its new entry and stays). Owned, kept and dead-lettered groups are never in settled.
  After pruning, a settlement retried with the receipt is refused (stale_receipt, never a replay) and
  a submit of the source_id adds a new entry.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include hmget_many
-- @include call_batched
-- @include record_settled
-- @include due_settled
-- @include ledger_settled
local now = now_ms()
local cfg = load_config()
local count = tonumber(A.count)
if not count or count < SETTLED_CHUNK or count ~= math.floor(count) then bug('bad count: ' .. tostring(A.count)) end
if not cfg.settled_retention_ms then return {'ok', 0, 1} end
-- An ms-only end ID covers every sequence number of that millisecond: settled at or before the cutoff.
-- Whole records only, at most `count` groups: a record holds at most SETTLED_CHUNK <= count groups.
local records, ids, sids, done = due_settled(tostring(stream_ms() - cfg.settled_retention_ms), count)
local lines = hmget_many(K.ledger, ids)
local forget, mapped, unmap, ghosts, seen = {}, {}, {}, 0, {}
for i, id in ipairs(ids) do
  local line = not seen[id] and lines[i]  -- an id named twice (by hand) is forgotten once
  if line and is_settled(line) then
    seen[id] = true
    table.insert(forget, id)
    if sids[i] ~= '' then mapped[#forget] = sids[i] end
  elseif line then
    ghosts = ghosts + 1  -- recorded, yet the ledger says it is owned: no transition does that
  end
end
local sid_list = {}
for j = 1, #forget do if mapped[j] then table.insert(sid_list, mapped[j]) end end
local current = hmget_many(K.ids, sid_list)
local c = 0
for j, id in ipairs(forget) do
  if mapped[j] then
    c = c + 1
    if current[c] == id then table.insert(unmap, mapped[j]) end
  end
end
call_batched({'HDEL', K.ledger}, forget)
call_batched({'HDEL', K.history}, forget)
call_batched({'ZREM', K.suspects}, forget)
call_batched({'HDEL', K.ids}, unmap)
call_batched({'XDEL', K.settled}, records)
-- Guarded: Lua writes -0 as '-0', which HINCRBY refuses as not an integer.
if #forget > 0 then redis.call('HINCRBY', K.counters, 'pruned', #forget) end
if ghosts > 0 then redis.call('HINCRBY', K.counters, 'ghosts', ghosts) end
return {'ok', #forget, done and 1 or 0}
