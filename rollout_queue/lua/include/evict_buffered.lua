-- @include pel_entry
-- @include requeue_entry
--[[
evict_buffered: completed -> ready for one buffered group (reason 'stale' or 'overflow').
Uses: K.buffer, K.bufver, K.results, K.meta and what requeue_entry uses.
Why: stale and overflow evictions are not the group's fault: not counted toward max_attempts; the
completion is dropped and the pristine reservation is generated again on fresher weights.
]]
local function evict_buffered(id, reason, cfg, now)
  local owner, count = pel_entry(id)
  redis.call('ZREM', K.buffer, id)
  redis.call('ZREM', K.bufver, id)
  redis.call('HDEL', K.results, id)
  redis.call('HINCRBY', K.meta, 'evicted_' .. reason, 1)
  if owner == '@done' then
    requeue_entry(id, count, owner, reason, reason, false, cfg, now)
  else
    redis.call('HINCRBY', K.meta, 'ghosts', 1)
  end
  wake(K.wake_work)
end
