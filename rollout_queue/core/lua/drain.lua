--[[
drain: start or stop the operator's maintenance hold (`rollout-queue drain`): a long admission hold
under the fixed id 'operator-drain', so nothing new starts while executing work finishes.
KEYS:
  meta       config and policy version (drain_reason, drain_since_ms while draining)
  holds      admission hold ids by deadline
  wake_work  wake stream for blocked reservers
  wake_done  wake stream for blocked trainers
READS:
  counters   the counters (read only)
ARGV:
  action      'start' or 'stop'
  timeout_ms  start: the drain expires this long from now (a forgotten drain cannot stop the queue
              forever; the reaper releases it then); starting again moves the deadline
  reason      start: text shown by `rollout-queue drain status` ('' keeps the one already stored)
Returns:
  {'ok', 'draining', deadline_ms, executing groups}   after start
  {'ok', 'stopped', holds still active}                after stop (idempotent)
Invariant:
  while the drain hold is unexpired, reserve grants nothing and lease hands out nothing (the rule of
  every admission hold), so executing groups can only shrink; stop wakes blocked reservers and
  trainers when no other hold is left.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include wake
local now = now_ms()
local cfg = load_config()
local HOLD = 'operator-drain'
if A.action == 'start' then
  local timeout = tonumber(A.timeout_ms)
  if not timeout or timeout <= 0 or timeout ~= math.floor(timeout) then bug('bad timeout_ms: ' .. tostring(A.timeout_ms)) end
  local deadline = now + timeout
  if not redis.call('ZSCORE', K.holds, HOLD) then redis.call('HSET', K.meta, 'drain_since_ms', now) end
  redis.call('ZADD', K.holds, deadline, HOLD)
  if A.reason ~= '' then redis.call('HSET', K.meta, 'drain_reason', A.reason) end
  return {'ok', 'draining', deadline, tonumber(redis.call('HGET', K.counters, 'executing_groups') or '0')}
elseif A.action == 'stop' then
  redis.call('ZREM', K.holds, HOLD)
  redis.call('HDEL', K.meta, 'drain_reason', 'drain_since_ms')
  local left = redis.call('ZCOUNT', K.holds, '(' .. due_now(cfg, now), '+inf')
  if left == 0 then
    wake(K.wake_work)
    wake(K.wake_done)
  end
  return {'ok', 'stopped', left}
end
bug('bad action: ' .. tostring(A.action))
