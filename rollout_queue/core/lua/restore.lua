--[[
restore: settled(committed, kept) -> ready for every entry committed after `step`: the trainer resumed
from checkpoint `step`, so the groups it trained after that must be trained again.
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  kept       committed entry IDs kept for restore, scored by step
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  wake_work  wake stream for blocked reservers
  counters   counters (apart from meta: the worker role writes these, never the config or version)
ARGV:
  step       integer, the checkpoint the trainer resumed from
  count      at most this many entries per call
Returns:
  {'ok', restored, done 0|1}   call again until done = 1
  {'checkpoint_pruned', checkpoint}   step is below a pruned checkpoint; nothing written
  {'restore_in_progress', step}       another restore (of `step`) is unfinished; nothing written
Invariant:
  the first call records `restoring` (the fence) and the last one clears it: while it is set,
  commit and checkpoint are refused, so a commit can never be requeued by the rest of an
  interrupted restore; any caller (or the reaper) finishes it by calling restore(step) again.
  each restored entry is pending again (XCLAIM FORCE), owned by @ready and indexed in ready, with the
  same entry ID and pristine payload; committed + retained is unchanged, so admission control stays
  right across the restart. A kept member that is not a committed entry nobody owns is dropped from
  kept and never re-owned.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include restore_batch
local now = now_ms()
local cfg = load_config()
local step, count = tonumber(A.step), tonumber(A.count)
if not step or step < 0 or step ~= math.floor(step) then bug('bad step: ' .. tostring(A.step)) end
if cfg.checkpoint ~= nil and step < cfg.checkpoint then return {'checkpoint_pruned', cfg.checkpoint} end
local restoring = redis.call('HGET', K.meta, 'restoring')
if restoring and restoring ~= tostring(step) then return {'restore_in_progress', tonumber(restoring) or -1} end
if not restoring then redis.call('HSET', K.meta, 'restoring', step) end
local n, done = restore_batch(cfg, step, count, now)
return {'ok', n, done and 1 or 0}
