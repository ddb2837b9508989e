--[[
push_join: a live worker joins the joinable round of a weights push, and learns its rank and rendezvous.
KEYS:
  workers       worker ids by last heartbeat (only a live one takes a rank)
  push_members  worker id -> rank in the current round
READS:
  push          the current round (push_open.lua): its epoch, rendezvous address and deadline are
                what every member trusts, so only the trainer's scripts write it
  meta          the queue clock's home (now_ms), config (worker_timeout_ms)
  counters      counters (read only: load_config checks they are integers)
ARGV:
  epoch      the round announced, or '0' for whichever round is joinable now (a worker starting late)
  worker_id  the worker
  newer_than join only a round whose version is newer than this (the version the worker holds)
Returns:
  {'ok', epoch, rank, version, uri, addr, backend, remaining_ms}   rank >= 1 (the trainer is 0);
      joining twice answers the same rank
  {'closed', epoch}   no such round is joinable (sealed, superseded, past its join window, full,
                      of a version the worker has, or the worker is one push_open did not admit)
  {'not_live', epoch} the round is joinable but the worker is not a live registered worker (no
                      heartbeat within worker_timeout: never registered, silent, closed or reaped);
                      nothing written
Invariant:
  ranks of a round are 1..n without gaps, and none is given after push_seal (the world is fixed
  then); at most MAX_MEMBERS workers join one round; only a worker live at the instant it joins
  holds a rank, so an id that never heartbeat cannot fill a round that push_seal then seals.
  Writes only push_members (the worker role may only read push).
]]
-- @include bug
-- @include now_ms
-- @include load_config
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
  if redis.call('HEXISTS', K.push, 'unreached:' .. A.worker_id) == 1 then return {'closed', epoch} end
  local seen = tonumber(redis.call('ZSCORE', K.workers, A.worker_id))
  if not seen or seen < now - load_config().worker_timeout_ms then return {'not_live', epoch} end
  local n = redis.call('HLEN', K.push_members)
  if n >= MAX_MEMBERS then return {'closed', epoch} end
  rank = n + 1
  redis.call('HSET', K.push_members, A.worker_id, rank)
elseif r[2] ~= 'open' and r[2] ~= 'sealed' then
  return {'closed', epoch}
end
return {'ok', epoch, rank, r[4], r[5], r[6], r[7], math.max(0, (tonumber(r[8]) or now) - now)}
