--[[
push_open: open a round of a weights push (torch.distributed): workers may join until join_ms.
KEYS:
  meta          config, policy version
  push          the current round: epoch, version, uri, addr, backend, state, opened_ms, join_until_ms, deadline_ms
  push_members  worker id -> rank in the current round
ARGV:
  version      the version pushed; newer than the policy version
  uri          where the version's folder will be (what publish_version will record)
  addr         host:port of the trainer's rendezvous store (TCPStore)
  backend      gloo | nccl
  join_ms      how long workers may join, from now
  deadline_ms  how long the round may last, from now (the trainer's deadline; members time out on it)
Returns:
  {'ok', epoch}
  {'version_regression', current}   the version is not newer than the policy's; nothing written
Invariant:
  epochs only grow; opening a round ends the one before (its members are forgotten), so at most
  one round is joinable and push_members is bounded by the fleet (push_join caps it).
  Announces 'push|<epoch>|<version>' on the versions channel so workers join within milliseconds.
]]
-- @include bug
-- @include now_ms
-- @include load_config
local now = now_ms()
local cfg = load_config()
local v = tonumber(A.version)
if not v or v < 0 or v >= 2097152 or v ~= math.floor(v) then bug('bad version: ' .. tostring(A.version)) end
if cfg.has_version and v <= cfg.version then return {'version_regression', cfg.version} end
local join_ms, deadline_ms = tonumber(A.join_ms), tonumber(A.deadline_ms)
if not join_ms or join_ms < 0 or not deadline_ms or deadline_ms < join_ms then bug('bad push windows') end
if A.backend ~= 'gloo' and A.backend ~= 'nccl' then bug('bad push backend: ' .. string.sub(A.backend, 1, 40)) end
if #A.addr == 0 or #A.addr > 300 or #A.uri > 4096 then bug('bad push address or uri') end
local epoch = redis.call('HINCRBY', K.push, 'epoch', 1)
redis.call('DEL', K.push_members)
redis.call('HSET', K.push, 'version', v, 'uri', A.uri, 'addr', A.addr, 'backend', A.backend, 'state', 'open',
  'opened_ms', now, 'join_until_ms', now + join_ms, 'deadline_ms', now + deadline_ms, 'world', 1,
  'acked', 0, 'dropped', 0)
redis.call('PUBLISH', string.sub(K.meta, 1, -5) .. 'versions', 'push|' .. epoch .. '|' .. v)
return {'ok', epoch}
