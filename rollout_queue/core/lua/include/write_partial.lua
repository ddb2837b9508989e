-- @include partial_keys
--[[
write_partial: store the progress record of the attempt (id, attempt, worker) the caller checked
owns its entry, replacing any earlier one, with its head (partial_keys.lua), and move the byte
counter by the difference. Arguments were checked by check_partial.
Uses: K.meta (partial_keys), K.counters (partial_bytes, partial_saved).
Why: fencing comes from the caller's receipt check: only the PEL owner at this delivery count
writes, and delivery counts only grow, so an older attempt never overwrites a newer one's record.
]]
local function write_partial(id, attempt, worker, tokens, min_version, record)
  local old = partial_head(redis.call('HGET', PARTIAL_HEAD_KEY, id))
  redis.call('HSET', PARTIAL_KEY, id, record)
  redis.call('HSET', PARTIAL_HEAD_KEY, id, attempt .. '|' .. tokens .. '|' .. min_version .. '|' .. #record .. '|' .. worker)
  redis.call('HINCRBY', K.counters, 'partial_bytes', #record - (old and old.bytes or 0))
  redis.call('HINCRBY', K.counters, 'partial_saved', 1)
end
