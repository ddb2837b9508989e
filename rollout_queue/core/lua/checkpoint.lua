--[[
checkpoint: settled(committed, kept) -> gone: a model checkpoint now covers `step`, so the pristine
entries committed at or before it are no longer needed for restore.
KEYS:
  src        the reservations stream
  meta       config and policy version
  kept       committed entry IDs kept for restore, scored by step
  settled    settle times of settled groups (entry ID -> source_id), for prune
  counters   counters (apart from meta: the worker role writes these, never the config or version)
ARGV:
  step       integer, the checkpointed trainer step
  count      at most this many entries per call
Returns:
  {'ok', pruned, done 0|1}   call again until done = 1; kept members that are not committed
                             entries are dropped, not pruned
  {'checkpoint_regression', checkpoint}   step is below the last checkpoint; nothing written
  {'leases_open', leased groups}          a new checkpoint while groups are leased; nothing written
  {'restore_in_progress', step}           a restore is unfinished; nothing written
Invariant:
  the checkpoint is recorded (the fence) by the first call, before any payload is dropped, so from
  then on restore refuses to go below it, even if the caller dies between batches: a restore never
  replays fewer groups than were committed after its step. Once done, no kept entry has step <=
  checkpoint; any caller (or the reaper) finishes an interrupted one by calling it again with the
  same step. Only payloads of committed entries that nobody owns are ever deleted. A new checkpoint
  is refused while any group is leased (its weights may include a batch whose lease then expires,
  which would be trained twice after a resume) or while a restore is unfinished. Each dropped entry
  is recorded in settled (its retention starts now: until here restore needed its ledger line).
]]
-- @include bug
-- @include load_config
-- @include checkpoint_batch
local cfg = load_config()
local step, count = tonumber(A.step), tonumber(A.count)
if not step or step < 0 or step ~= math.floor(step) then bug('bad step: ' .. tostring(A.step)) end
if cfg.checkpoint ~= nil and step < cfg.checkpoint then return {'checkpoint_regression', cfg.checkpoint} end
if cfg.checkpoint ~= step then
  local restoring = redis.call('HGET', K.meta, 'restoring')
  if restoring then return {'restore_in_progress', tonumber(restoring) or -1} end
  local leased = tonumber(redis.call('HGET', K.counters, 'leased')) or 0
  if leased > 0 then return {'leases_open', leased} end
  -- The fence is this call's first write: a settled key of the wrong type must fail it before it.
  if cfg.settled_retention_ms then redis.call('XLEN', K.settled) end
  redis.call('HSET', K.meta, 'checkpoint', step)
end
local dropped, done = checkpoint_batch(cfg, step, count)
return {'ok', dropped, done and 1 or 0}
