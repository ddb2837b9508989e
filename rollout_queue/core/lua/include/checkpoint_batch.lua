-- @include kept_entry
-- @include fields_of
-- @include record_settled
-- @include last_delivered
--[[
checkpoint_batch: settled(committed, kept) -> gone for up to `count` kept entries committed at or
before `step`. Returns (dropped, done): done when none is left.
Uses: K.src, K.counters, K.kept, K.settled. The caller has recorded the checkpoint (checkpoint.lua) or
is finishing one a dead caller recorded (finish_interrupted.lua).
Why: only a committed entry that nobody owns may lose its payload: a kept member that is anything
else was written by hand (a ghost) and is removed from kept without touching the stream.
]]
local function checkpoint_batch(cfg, step, count)
  local cursor = last_delivered()
  local ids = redis.call('ZRANGEBYSCORE', K.kept, '-inf', step, 'LIMIT', 0, count)
  local drop, record = {}, {}
  for _, id in ipairs(ids) do
    local kv = kept_entry(id, cursor)
    drop[id] = kv
    if kv then
      table.insert(record, id)
      table.insert(record, fields_of(kv).sid or '')
    end
  end
  -- All reads first, then the record (the first write, so a bad settled key fails before any other).
  record_settled(cfg, record)
  local dropped = 0
  for _, id in ipairs(ids) do
    if drop[id] then
      redis.call('XDEL', K.src, id)
      dropped = dropped + 1
    else
      redis.call('HINCRBY', K.counters, 'ghosts', 1)
    end
    redis.call('ZREM', K.kept, id)
  end
  -- Guarded: Lua writes -0 as '-0', which HINCRBY refuses as not an integer.
  if dropped > 0 then redis.call('HINCRBY', K.counters, 'kept', -dropped) end
  return dropped, #ids < count
end
