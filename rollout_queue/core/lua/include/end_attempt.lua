-- @include requeue_entry
-- @include release_executing
-- @include end_attempts
--[[
end_attempt: executing -> ready (or dead at max_attempts) for the attempt named by a receipt that the
caller has already checked. Returns 'ready' or 'dead'.
Uses: K.src, K.meta, K.ready, K.history, K.dlq, K.ledger, K.wake_work.
Why: fail, abort, requeue and complete's malformed path end one attempt: a batch of one of
end_attempts, so the single and the batched paths cannot drift apart.
Also includes requeue_entry and release_executing for the scripts that reach them through this file.
]]
local function end_attempt(id, attempt, worker, terminal, reason, counted, cfg, now)
  local e = {id = id, attempt = attempt}
  end_attempts(worker, {e}, terminal, reason, counted, cfg, now)
  return e.where
end
