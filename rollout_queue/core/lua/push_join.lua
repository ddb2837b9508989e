--[[
push_join: a worker joins the joinable round of a weights push, and learns its rank and rendezvous.
KEYS:
  meta          the queue clock's home (now_ms)
  push          the current round (push_open.lua)
  push_members  worker id -> rank in the current round
ARGV:
  epoch      the round announced, or '0' for whichever round is joinable now (a worker starting late)
  worker_id  the worker
  newer_than join only a round whose version is newer than this (the version the worker holds)
Returns:
  {'ok', epoch, rank, version, uri, addr, backend, remaining_ms}   rank >= 1 (the trainer is 0);
      joining twice answers the same rank
  {'closed', epoch}   no such round is joinable (sealed, superseded, past its join window, full,
                      or of a version the worker has)
Invariant:
  ranks of a round are 1..n without gaps, and none is given after push_seal (the world is fixed
  then); at most MAX_MEMBERS workers join one round.
]]
-- @include bug
-- @include now_ms
local MAX_MEMBERS = 4096
local now = now_ms()
if A.worker_id == '' or string.sub(A.worker_id, 1, 1) == '@' then bug('bad worker id') end
local r = redis.call('HMGET', K.push, 'epoch', 'state', 'join_until_ms', 'version', 'uri', 'addr', 'backend',
  'deadline_ms')
local epoch = tonumber(r[1]) or 0
if epoch == 0 or (A.epoch ~= '0' and A.epoch ~= tostring(epoch)) then return {'closed', epoch} end
local held = tonumber(A.newer_than)
if not held then bug('bad newer_than: ' .. tostring(A.newer_than)) end
if (tonumber(r[4]) or 0) <= held then return {'closed', epoch} end
local rank = tonumber(redis.call('HGET', K.push_members, A.worker_id))
if not rank then
  if r[2] ~= 'open' or now >= (tonumber(r[3]) or 0) then return {'closed', epoch} end
  local n = redis.call('HLEN', K.push_members)
  if n >= MAX_MEMBERS then return {'closed', epoch} end
  rank = n + 1
  redis.call('HSET', K.push_members, A.worker_id, rank)
elseif r[2] ~= 'open' and r[2] ~= 'sealed' then
  return {'closed', epoch}
end
return {'ok', epoch, rank, r[4], r[5], r[6], r[7], math.max(0, (tonumber(r[8]) or now) - now)}
