--[[
extend: push an active lease's deadline to `ms` from now (a trainer whose step runs long).
KEYS:
  meta       config
  leases     lease ids by when they fall due (lease_due: the deadline, or sooner for a silent holder)
  The lease record rollout:{q}:lease:<lease_id> is built from meta's prefix (same hash tag).
READS:
  counters   counters (read only: load_config checks they are integers)
ARGV:
  lease_id   the lease
  token      its fencing token
  ms         the new deadline is now + ms
Returns:
  {'ok', deadline_ms}
  {'lease_lost', state}   also when the deadline has already passed; nothing written
Invariant:
  only the holder of an unexpired lease moves its deadline; an expired lease stays the reaper's. A
  lease that beats stays due trainer_silence after its last beat (lease_due), whatever the deadline.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include lease_record
-- @include lease_due
local now = now_ms()
local cfg = load_config()
local lease_key = string.sub(K.meta, 1, -5) .. 'lease:' .. A.lease_id
local L, refusal = lease_fenced(lease_key, A.token)
if not L then return refusal end
if L.state ~= 'active' then return {'lease_lost', L.state} end
if L.deadline < due_now(cfg, now) then return {'lease_lost', 'expired'} end
local ms = tonumber(A.ms)
if not ms or ms <= 0 then bug('bad extension: ' .. tostring(A.ms)) end
local deadline = now + ms
redis.call('HSET', lease_key, 'deadline', deadline)
local beat = tonumber(redis.call('HGET', lease_key, 'beat_ms'))
redis.call('ZADD', K.leases, lease_due(cfg, deadline, beat), A.lease_id)
return {'ok', deadline}
