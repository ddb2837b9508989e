--[[
push_seal: end the join window of a round once enough live workers joined (or it passed); fix the world.
KEYS:
  workers       worker ids by last heartbeat (the live ones are those expected to join)
  meta          config (worker_timeout_ms)
  push          the current round (push_open.lua)
  push_members  worker id -> rank in the current round
READS:
  counters      counters (read only: load_config checks they are integers)
ARGV:
  epoch    the round
  expect   seal as soon as this many live workers joined; 0: as many as are alive now
Returns:
  {'waiting', joined, expected}       still joinable: call again (the window has not passed);
                                      joined: the members, or the live ones once there are at
                                      least expected members
  {'ok', world, worker, rank, ...}    sealed: world = members + 1 (the trainer is rank 0)
  {'closed', epoch}                   the round is not this one's any more (superseded, or closed)
Invariant:
  once sealed the members never change; sealing again answers the same members. Only members live
  now count toward expect (one that went silent after joining is still a member, but never seals
  the round early in a live worker's place). Past its join window a round seals whatever joined,
  so the trainer's wait for it ends. Bounded: O(1) while fewer than expected joined (the trainer's
  polls), else one ZMSCORE per 1,000 members (at most 4,096).
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
if r[2] ~= 'open' and r[2] ~= 'sealed' then return {'closed', tonumber(r[1])} end
local window_open = now < (tonumber(r[3]) or 0)
local live_since = now - cfg.worker_timeout_ms
if r[2] == 'open' and window_open then
  if expect == 0 then expect = redis.call('ZCOUNT', K.workers, live_since, '+inf') end
  -- Fewer members than expected, live or not: waiting, without reading them.
  local n = redis.call('HLEN', K.push_members)
  if n < expect then return {'waiting', n, expect} end
end
local members = redis.call('HGETALL', K.push_members)
if r[2] == 'open' then
  local joined, ids = 0, {}
  for i = 1, #members, 2 do
    ids[#ids + 1] = members[i]
    if #ids == 1000 or i + 1 == #members then
      for _, seen in ipairs(redis.call('ZMSCORE', K.workers, unpack(ids))) do
        if seen and tonumber(seen) >= live_since then joined = joined + 1 end
      end
      ids = {}
    end
  end
  if joined < expect and window_open then return {'waiting', joined, expect} end
  redis.call('HSET', K.push, 'state', 'sealed', 'world', #members / 2 + 1)
end
local out = {'ok', #members / 2 + 1}
for _, v in ipairs(members) do out[#out + 1] = v end
return out
