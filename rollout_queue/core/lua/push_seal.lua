--[[
push_seal: end the join window of a round once enough workers joined (or it passed); fix the world.
KEYS:
  workers       worker ids by last heartbeat (the live ones are those expected to join)
  meta          config (worker_timeout_ms)
  push          the current round (push_open.lua)
  push_members  worker id -> rank in the current round
ARGV:
  epoch    the round
  expect   seal as soon as this many workers joined; 0: as many as are alive now
Returns:
  {'waiting', joined, expected}       still joinable: call again (the window has not passed)
  {'ok', world, worker, rank, ...}    sealed: world = members + 1 (the trainer is rank 0)
  {'closed', epoch}                   the round is not this one's any more (superseded)
Invariant:
  once sealed the members never change; sealing again answers the same members.
]]
-- @include bug
-- @include now_ms
-- @include load_config
local now = now_ms()
local cfg = load_config()
local r = redis.call('HMGET', K.push, 'epoch', 'state', 'join_until_ms')
if tostring(tonumber(r[1]) or 0) ~= A.epoch then return {'closed', tonumber(r[1]) or 0} end
local expect = tonumber(A.expect)
if not expect or expect < 0 then bug('bad expect: ' .. tostring(A.expect)) end
if r[2] == 'open' then
  local joined = redis.call('HLEN', K.push_members)
  if expect == 0 then expect = redis.call('ZCOUNT', K.workers, now - cfg.worker_timeout_ms, '+inf') end
  if joined < expect and now < (tonumber(r[3]) or 0) then return {'waiting', joined, expect} end
  redis.call('HSET', K.push, 'state', 'sealed', 'world', joined + 1)
elseif r[2] ~= 'sealed' then
  return {'closed', tonumber(r[1])}
end
local out = {'ok', redis.call('HLEN', K.push_members) + 1}
for _, v in ipairs(redis.call('HGETALL', K.push_members)) do out[#out + 1] = v end
return out
