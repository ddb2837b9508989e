--[[
hold_poll: drop the snapshot's attempts that are terminal now; report how many are still executing.
KEYS:
  src        the reservations stream
  meta       config
  holds      admission hold ids by deadline
  wake_work  wake stream (every terminal transition writes to it)
  The snapshot set rollout:{q}:hold:<hold_id> is built from meta's prefix (same hash tag).
ARGV:
  hold_id    the hold
Returns:
  {'ok', still executing, wake_id}   wait on wake_id before polling again
  {'hold_lost'}             the hold expired or was released
Invariant:
  an attempt leaves the snapshot only once its receipt no longer owns the entry (it is terminal).
]]
-- @include now_ms
-- @include load_config
-- @include pel_entry
-- @include wake
local now = now_ms()
load_config()
local deadline = tonumber(redis.call('ZSCORE', K.holds, A.hold_id))
if not deadline or deadline < now then return {'hold_lost'} end
local snap = string.sub(K.meta, 1, -5) .. 'hold:' .. A.hold_id
for _, m in ipairs(redis.call('SMEMBERS', snap)) do
  local id, attempt, worker = string.match(m, '^([^|]+)|(%d+)|(.*)$')
  local owner, count = pel_entry(id)
  if owner ~= worker or count ~= tonumber(attempt) then redis.call('SREM', snap, m) end
end
return {'ok', redis.call('SCARD', snap), wake_id(K.wake_work)}
