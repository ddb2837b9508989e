--[[
restore: settled(committed, kept) -> ready for every entry committed after `step`: the trainer resumed
from checkpoint `step`, so the groups it trained after that must be trained again.
KEYS:
  src        the reservations stream
  meta       config and counters
  ready      requeued entry IDs
  kept       committed entry IDs kept for restore, scored by step
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  wake_work  wake stream for blocked reservers
ARGV:
  step       integer, the checkpoint the trainer resumed from
  count      at most this many entries per call
Returns:
  {'ok', restored, done 0|1}   call again until done = 1
  {'checkpoint_pruned', checkpoint}   step is below a pruned checkpoint; nothing written
Invariant:
  each restored entry is pending again (XCLAIM FORCE), owned by @ready and indexed in ready, with the
  same entry ID and pristine payload; committed + retained is unchanged, so admission control stays
  right across the restart. A kept member that is not a committed entry nobody owns is dropped from
  kept and never re-owned.
]]
-- @include now_ms
-- @include load_config
-- @include kept_entry
-- @include history
-- @include ready_score
-- @include ledger
-- @include wake
local now = now_ms()
local cfg = load_config()
local step, count = tonumber(A.step), tonumber(A.count)
if not step or step < 0 or step ~= math.floor(step) then bug('bad step: ' .. tostring(A.step)) end
if cfg.checkpoint ~= nil and step < cfg.checkpoint then return {'checkpoint_pruned', cfg.checkpoint} end
local cursor = last_delivered()
local ids = redis.call('ZRANGEBYSCORE', K.kept, '(' .. step, '+inf', 'LIMIT', 0, count)
local n = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', K.kept, id)
  if kept_entry(id, cursor) then
    local last = redis.call('HGET', K.ledger, id) or ''
    local attempt = tonumber(string.match(last, '^s|committed|(%d+)|')) or 1
    redis.call('XCLAIM', K.src, 'rollout', '@ready', 0, id, 'FORCE', 'RETRYCOUNT', attempt, 'JUSTID')
    redis.call('ZADD', K.ready, ready_score(id), id)
    append_history(id, attempt, '@restore', 'restored', 'restored to checkpoint ' .. step, false, now)
    ledger_set(id, ledger_attempt(attempt, '@restore', 'restored'))
    n = n + 1
  else
    -- Not a committed entry nobody owns (a ghost written by hand): never steal it from its owner.
    redis.call('HINCRBY', K.meta, 'ghosts', 1)
  end
end
if n > 0 then
  redis.call('HINCRBY', K.meta, 'kept', -n)
  redis.call('HINCRBY', K.meta, 'committed', -n)
  redis.call('HINCRBY', K.meta, 'retained', n)
  redis.call('HINCRBY', K.meta, 'restored', n)
  wake(K.wake_work)
end
return {'ok', n, #ids < count and 1 or 0}
