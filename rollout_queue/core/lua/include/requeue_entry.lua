-- @include history
-- @include park_many
-- @include requeue_entries
--[[
requeue_entry: PEL (any owner) -> ready, same entry ID, pristine payload; or -> settled(dead) when the
counted failures reach max_attempts. Returns 'ready' or 'dead'.
Uses: K.src, K.ready, K.history, K.dlq, K.ledger, K.meta, K.wake_work.
Why: DESIGN rule 4 for one entry (complete's overflow, evict_buffered, end_attempt): a batch of one
of requeue_entries, so the single and the batched paths cannot drift apart.
Also includes append_history and park_many for the scripts that reach them through this file.
]]
local function requeue_entry(id, attempt, worker, terminal, reason, counted, cfg, now)
  local e = {id = id, attempt = attempt}
  requeue_entries({e}, worker, terminal, reason, counted, cfg, now)
  return e.where
end
