--[[
hold_poll: how many attempts a hold still waits for (those executing when it opened and not yet
terminal).
KEYS:
  meta       config and policy version
  holds      admission hold ids by deadline
  wake_work  wake stream (every terminal transition writes to it)
READS:
  counters   the counters (read only)
ARGV:
  hold_id    the hold
Returns:
  {'ok', still executing, wake_id}   wait on wake_id before polling again
  {'hold_lost'}                      the hold expired or was released
Invariant:
  read-only. While the hold is active no attempt starts (see hold_open), so executing_groups is
  exactly the number of its attempts not yet terminal.
]]
-- @include now_ms
-- @include load_config
-- @include wake
local now = now_ms(true)
local cfg = load_config()
local deadline = tonumber(redis.call('ZSCORE', K.holds, A.hold_id))
if not deadline or deadline < due_now(cfg, now) then return {'hold_lost'} end
return {'ok', tonumber(redis.call('HGET', K.counters, 'executing_groups') or '0'), wake_id(K.wake_work)}
