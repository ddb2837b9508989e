--[[
hold_release: remove one admission hold; admission reopens when the last unexpired hold goes.
KEYS:
  meta       config
  holds      admission hold ids by deadline
  wake_work  wake stream for blocked reservers
  wake_done  wake stream for blocked trainers
ARGV:
  hold_id    the hold
Returns:
  {'ok', holds still active}
Invariant:
  releasing is idempotent; blocked reservers and trainers are woken when admission reopens.
]]
-- @include now_ms
-- @include load_config
-- @include hold_active
-- @include wake
local now = now_ms()
local cfg = load_config()
redis.call('ZREM', K.holds, A.hold_id)
redis.call('ZREMRANGEBYSCORE', K.holds, '-inf', due_now(cfg, now))
local left = redis.call('ZCARD', K.holds)
if left == 0 then
  wake(K.wake_work)
  wake(K.wake_done)
end
return {'ok', left}
