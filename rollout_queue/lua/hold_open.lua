--[[
hold_open: close admission (no new reservations, no new leases) and snapshot the executing attempts.
KEYS:
  src        the reservations stream
  meta       config
  holds      admission hold ids by deadline
  The snapshot set rollout:{q}:hold:<hold_id> is built from meta's prefix (same hash tag).
ARGV:
  hold_id    string, chosen by the client
  timeout_ms the hold expires after this long (0: the queue's hold_timeout), so a trainer that dies
             holding it cannot close admission forever
Returns:
  {'ok', executing attempts in the snapshot, deadline_ms}
Invariant:
  while the hold is unexpired, reserve grants nothing and lease hands out nothing; the snapshot
  holds 'entry_id|attempt|worker' for every attempt executing at this instant.
]]
-- @include now_ms
-- @include load_config
local now = now_ms()
local cfg = load_config()
if not string.match(A.hold_id, '^[%w%-_%.]+$') then bug('bad hold id') end
local timeout = tonumber(A.timeout_ms)
if not timeout or timeout <= 0 then timeout = cfg.hold_timeout_ms end
local deadline = now + timeout
local snap = string.sub(K.meta, 1, -5) .. 'hold:' .. A.hold_id
if redis.call('ZSCORE', K.holds, A.hold_id) then
  return {'ok', redis.call('SCARD', snap), deadline}   -- a retry of the same open: keep the snapshot
end
redis.call('ZADD', K.holds, deadline, A.hold_id)
local n = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', K.src, 'rollout')) do
  local name, pending = nil, 0
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1] end
    if c[i] == 'pending' then pending = tonumber(c[i + 1]) end
  end
  if pending > 0 and string.sub(name, 1, 1) ~= '@' then
    for _, p in ipairs(redis.call('XPENDING', K.src, 'rollout', '-', '+', pending, name)) do
      redis.call('SADD', snap, p[1] .. '|' .. p[4] .. '|' .. name)
      n = n + 1
    end
  end
end
if n > 0 then redis.call('PEXPIRE', snap, timeout) end
return {'ok', n, deadline}
