-- @include history
-- @include read_entry
-- @include settle_dead
-- @include ready_score
-- @include wake
--[[
requeue_entry: PEL (any owner) -> ready, same entry ID, pristine payload; or -> settled(dead) when the
counted failures reach max_attempts. Returns 'ready' or 'dead'.
Uses: K.src, K.ready, K.history, K.dlq, K.ledger, K.meta, K.wake_work.
Why: DESIGN rule 4, ownership is released only by settlement: work that ends without a completion
goes back to ready in the same script that ends it. The delivery count is kept (JUSTID), so the
next reserve makes it attempt + 1.
]]
local function requeue_entry(id, attempt, worker, terminal, reason, counted, cfg, now)
  local failures, history_json = append_history(id, attempt, worker, terminal, reason, counted, now)
  if counted and failures >= cfg.max_attempts then
    local _, kv = read_entry(id)
    settle_dead(id, kv, 'max_attempts', history_json, attempt, worker, now)
    return 'dead'
  end
  redis.call('XCLAIM', K.src, 'rollout', '@ready', 0, id, 'RETRYCOUNT', attempt, 'JUSTID')
  redis.call('ZADD', K.ready, ready_score(id), id)
  wake(K.wake_work)
  return 'ready'
end
