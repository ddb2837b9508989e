-- @include kept_entry
-- @include history
-- @include ready_score
-- @include ledger
-- @include ledger_settled
-- @include wake
-- @include last_delivered
--[[
restore_batch: settled(committed, kept) -> ready for up to `count` kept entries committed after
`step`; clears the `restoring` fence once none is left. Returns (restored, done).
Uses: K.src, K.meta, K.counters, K.ready, K.kept, K.history, K.ledger, K.wake_work. The caller has set the
fence (restore.lua) or is finishing a restore a dead caller began (finish_interrupted.lua).
Why: each restored entry is pending again (XCLAIM FORCE), owned by @ready with the attempt it was
committed at; committed + retained is unchanged, so admission control stays right. A kept member
that is not a committed entry nobody owns (a ghost written by hand) is never stolen from its owner.
]]
local function restore_batch(cfg, step, count, now)
  local cursor = last_delivered()
  local ids = redis.call('ZRANGEBYSCORE', K.kept, '(' .. step, '+inf', 'LIMIT', 0, count)
  local n = 0
  for _, id in ipairs(ids) do
    redis.call('ZREM', K.kept, id)
    if kept_entry(id, cursor) then
      local last = redis.call('HGET', K.ledger, id) or ''
      local settlement, a, completer = ledger_settled_of(last)
      if settlement ~= 'committed' then a, completer = nil, nil end
      local attempt = tonumber(a) or 1
      redis.call('XCLAIM', K.src, 'rollout', '@ready', 0, id, 'FORCE', 'RETRYCOUNT', attempt, 'JUSTID')
      redis.call('ZADD', K.ready, ready_score(id), id)
      append_history(id, attempt, '@restore', 'restored', 'restored to checkpoint ' .. step, false, now,
        completer ~= '' and completer or nil)
      ledger_set(id, ledger_attempt(attempt, '@restore', 'restored'))
      n = n + 1
    else
      -- Not a committed entry nobody owns (a ghost written by hand): never steal it from its owner.
      redis.call('HINCRBY', K.counters, 'ghosts', 1)
    end
  end
  if n > 0 then
    redis.call('HINCRBY', K.counters, 'kept', -n)
    redis.call('HINCRBY', K.counters, 'committed', -n)
    redis.call('HINCRBY', K.counters, 'retained', n)
    redis.call('HINCRBY', K.counters, 'restored', n)
    wake(K.wake_work)
  end
  local done = #ids < count
  if done then redis.call('HDEL', K.meta, 'restoring') end
  return n, done
end
