--[[
hold_open: close admission (no new reservations, no new leases) until the hold is released or expires.
KEYS:
  meta       config and policy version
  holds      admission hold ids by deadline
  holders    hold id -> who opened it: holder|since_ms|reason (hold_release deletes it)
READS:
  counters   the counters (read only)
ARGV:
  hold_id    string, chosen by the client (opening the same id again is a replay)
  timeout_ms the hold expires after this long (0: the queue's hold_timeout), so a trainer that dies
             holding it cannot close admission forever
  holder     who holds it (a trainer id), for operators
  reason     why (a weight update, ...), free text capped by the client
Returns:
  {'ok', attempts executing now, deadline_ms}
Invariant:
  while any hold is unexpired, reserve grants nothing (no attempt starts) and lease hands out
  nothing. Hence the attempts executing at any later instant of the hold are a subset of those
  executing when it opened, and executing_groups counts exactly the ones still to wait for: no
  snapshot is needed, so opening a hold costs O(1) whatever the number of executing attempts.
]]
-- @include bug
-- @include now_ms
-- @include load_config
local now = now_ms()
local cfg = load_config()
if not string.match(A.hold_id, '^[%w%-_%.]+$') then bug('bad hold id') end
local timeout = tonumber(A.timeout_ms)
if not timeout or timeout <= 0 then timeout = cfg.hold_timeout_ms end
local deadline = tonumber(redis.call('ZSCORE', K.holds, A.hold_id))
if not deadline then
  deadline = now + timeout
  redis.call('ZADD', K.holds, deadline, A.hold_id)
  redis.call('HSET', K.holders, A.hold_id, A.holder .. '|' .. now .. '|' .. A.reason)
end
return {'ok', tonumber(redis.call('HGET', K.counters, 'executing_groups') or '0'), deadline}
