--[[
finish_interrupted: the reaper's step for a restore or a checkpoint whose caller died between its
batches: it continues the one the queue recorded, never starts one.
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  kept       committed entry IDs kept for restore, scored by step
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  wake_work  wake stream for blocked reservers
  settled    settle times of settled groups (entry ID -> source_id), for prune
  counters   counters (apart from meta: the worker role writes these, never the config or version)
ARGV:
  count      at most this many entries per call
Returns:
  {'ok', 'restore' | 'checkpoint' | 'none', step, entries moved, done 0|1}   call again until done
Invariant:
  exactly what restore(step) / checkpoint(step) would do next with the step the queue recorded
  (`restoring`, `checkpoint`): a dead trainer's restore is finished (and its fence lifted) and a dead
  trainer's checkpoint drops the rest of what it covers, so neither waits for that trainer to come
  back. The reaper role gets this script, not restore or checkpoint: it cannot start either.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include restore_batch
-- @include checkpoint_batch
local now = now_ms()
local cfg = load_config()
local count = tonumber(A.count)
if not count or count < 1 then bug('bad count: ' .. tostring(A.count)) end
local restoring = tonumber(redis.call('HGET', K.meta, 'restoring'))
if restoring then
  local n, done = restore_batch(cfg, restoring, count, now)
  return {'ok', 'restore', restoring, n, done and 1 or 0}
end
if cfg.checkpoint and redis.call('ZCOUNT', K.kept, '-inf', cfg.checkpoint) > 0 then
  local n, done = checkpoint_batch(cfg, cfg.checkpoint, count)
  return {'ok', 'checkpoint', cfg.checkpoint, n, done and 1 or 0}
end
return {'ok', 'none', -1, 0, 1}
