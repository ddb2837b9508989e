-- @include read_entry
-- @include release_executing
-- @include requeue_entry
-- @include ledger
--[[
end_attempt: executing -> ready (or dead at max_attempts) for the attempt named by a receipt that the
caller has already checked. Returns 'ready' or 'dead'.
Uses: K.src, K.meta, K.ready, K.history, K.dlq, K.ledger, K.wake_work.
Why: fail, abort, malformed, lost and a worker's close all end an attempt the same way: release its
executing capacity, write its terminal, requeue the pristine entry in the same script.
]]
local function end_attempt(id, attempt, worker, terminal, reason, counted, cfg, now)
  local f = read_entry(id)
  local n = 0
  if f then n = tonumber(f.n) or 0 end
  release_executing(n)
  redis.call('HINCRBY', K.meta, terminal, 1)
  local where = requeue_entry(id, attempt, worker, terminal, reason, counted, cfg, now)
  if where == 'ready' then ledger_set(id, ledger_attempt(attempt, worker, terminal)) end
  return where
end
