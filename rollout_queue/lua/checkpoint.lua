--[[
checkpoint: settled(committed, kept) -> gone: a model checkpoint now covers `step`, so the pristine
entries committed at or before it are no longer needed for restore.
KEYS:
  src        the reservations stream
  meta       config and counters
  kept       committed entry IDs kept for restore, scored by step
  settled    settle times of settled groups (entry ID -> source_id), for prune
ARGV:
  step       integer, the checkpointed trainer step
  count      at most this many entries per call
Returns:
  {'ok', pruned, done 0|1}   call again until done = 1; `checkpoint` is recorded when done; kept
                             members that are not committed entries are dropped, not pruned
Invariant:
  once done, no kept entry has step <= checkpoint, and restore refuses to go below it; only payloads
  of committed entries that nobody owns are ever deleted. Each dropped entry is recorded in settled
  (its retention starts now: until here restore needed its ledger line).
]]
-- @include load_config
-- @include kept_entry
-- @include fields_of
-- @include record_settled
local cfg = load_config()
local step, count = tonumber(A.step), tonumber(A.count)
if not step or step < 0 or step ~= math.floor(step) then bug('bad step: ' .. tostring(A.step)) end
local cursor = last_delivered()
local ids = redis.call('ZRANGEBYSCORE', K.kept, '-inf', step, 'LIMIT', 0, count)
-- Only a committed entry that nobody owns may lose its payload: a kept member that is anything
-- else was written by hand (a ghost) and is removed from kept without touching the stream.
local drop, record = {}, {}
for _, id in ipairs(ids) do
  local kv = kept_entry(id, cursor)
  drop[id] = kv
  if kv then
    table.insert(record, id)
    table.insert(record, fields_of(kv).sid or '')
  end
end
-- All reads first, then the record (the first write, so a bad settled key fails before any other).
record_settled(cfg, record)
local dropped = 0
for _, id in ipairs(ids) do
  if drop[id] then
    redis.call('XDEL', K.src, id)
    dropped = dropped + 1
  else
    redis.call('HINCRBY', K.meta, 'ghosts', 1)
  end
  redis.call('ZREM', K.kept, id)
end
-- Guarded: Lua writes -0 as '-0', which HINCRBY refuses as not an integer.
if dropped > 0 then redis.call('HINCRBY', K.meta, 'kept', -dropped) end
local done = #ids < count
if done and (cfg.checkpoint == nil or step > cfg.checkpoint) then
  redis.call('HSET', K.meta, 'checkpoint', step)
end
return {'ok', dropped, done and 1 or 0}
