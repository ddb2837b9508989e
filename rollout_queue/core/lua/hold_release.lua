--[[
hold_release: remove one admission hold; admission reopens when the last unexpired hold goes.
KEYS:
  meta       config
  holds      admission hold ids by deadline
  holders    hold id -> who opened it (deleted with the hold)
  wake_work  wake stream for blocked reservers
  wake_done  wake stream for blocked trainers
READS:
  counters   counters (read only: load_config checks they are integers)
ARGV:
  hold_id    the hold
Returns:
  {'ok', holds still active}
Invariant:
  releasing is idempotent; blocked reservers and trainers are woken when admission reopens. A
  holders line lives exactly as long as its hold (expired holds swept here lose theirs too).
]]
-- @include now_ms
-- @include load_config
-- @include hold_active
-- @include wake
local now = now_ms()
local cfg = load_config()
redis.call('ZREM', K.holds, A.hold_id)
redis.call('HDEL', K.holders, A.hold_id)
-- Expired holds go too, their holders lines with them (bounded: the reaper releases the rest by id).
local expired = redis.call('ZRANGEBYSCORE', K.holds, '-inf', due_now(cfg, now), 'LIMIT', 0, 100)
if #expired > 0 then
  redis.call('ZREM', K.holds, unpack(expired))
  redis.call('HDEL', K.holders, unpack(expired))
end
local left = redis.call('ZCARD', K.holds)
if left == 0 then
  wake(K.wake_work)
  wake(K.wake_done)
end
return {'ok', left}
