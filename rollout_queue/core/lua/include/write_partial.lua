-- @include partial_keys
--[[
write_partial: store the progress record of the attempt (id, attempt, worker) the caller checked
owns its entry, replacing any earlier one, with its head (partial_keys.lua), and move the byte
counter by the difference and partial_saved by one. Returns true, or false when the stored record
is already this one (the same head, then the same bytes): then nothing is written or counted.
Arguments were checked by check_partial.
Uses: K.meta (partial_keys), K.counters (partial_bytes, partial_saved).
Why: fencing comes from the caller's receipt check: only the PEL owner at this delivery count
writes, and delivery counts only grow, so an older attempt never overwrites a newer one's record.
A resend after a lost reply carries the same attempt and progress: rule 5, a replay writes and
counts nothing, so partial_saved counts each record once. The stored record is read only when its
head already matches (in practice a resend): a copy no larger than the one ARGV holds.
]]
local function write_partial(id, attempt, worker, tokens, min_version, record)
  local head = attempt .. '|' .. tokens .. '|' .. min_version .. '|' .. #record .. '|' .. worker
  local stored = redis.call('HGET', PARTIAL_HEAD_KEY, id)
  if stored == head and redis.call('HGET', PARTIAL_KEY, id) == record then return false end
  local old = partial_head(stored)
  redis.call('HSET', PARTIAL_KEY, id, record)
  redis.call('HSET', PARTIAL_HEAD_KEY, id, head)
  redis.call('HINCRBY', K.counters, 'partial_bytes', #record - (old and old.bytes or 0))
  redis.call('HINCRBY', K.counters, 'partial_saved', 1)
  return true
end
