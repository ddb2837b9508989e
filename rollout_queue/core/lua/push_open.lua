--[[
push_open: open a round of a weights push (torch.distributed): workers may join until join_ms.
KEYS:
  meta          config, policy version
  push          the current round: epoch, round, version, uri, addr, backend, state, opened_ms,
                join_until_ms, deadline_ms, world, acked, dropped, unreached:<worker id>
  push_members  worker id -> rank in the current round
READS:
  counters      counters (read only: load_config checks they are integers)
ARGV:
  round_id     chosen by the trainer, new for each round it opens (opening the same id again is a replay)
  version      the version pushed; newer than the policy version
  uri          where the version's folder will be (what publish_version will record)
  addr         host:port of the trainer's rendezvous store (TCPStore)
  backend      gloo | nccl
  join_ms      how long workers may join, from now
  deadline_ms  how long the round may last, from now (the trainer's deadline; members time out on it)
  *unreached   workers not admitted to this round: members of this version's earlier round that
               never reached the rendezvous store (at most MAX_MEMBERS)
Returns:
  {'ok', epoch}                     a resend of the current round's round_id answers its epoch again
                                    and writes nothing (DESIGN rule 5)
  {'version_regression', current}   the version is not newer than the policy's; nothing written
Invariant:
  epochs only grow; opening a round ends the one before (its record and members are replaced), so at
  most one round is joinable and push_members is bounded by the fleet (push_join caps it). One open
  makes one round whatever the resends. Announces 'push|<epoch>|<version>' on the versions channel so
  workers join within milliseconds.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include call_batched
local MAX_MEMBERS = 4096
local now = now_ms()
local cfg = load_config()
if #A.round_id == 0 or #A.round_id > 64 or not string.match(A.round_id, '^[%w%-_%.]+$') then
  bug('bad push round id: ' .. string.sub(A.round_id, 1, 40))
end
local v = tonumber(A.version)
if not v or v < 0 or v >= 2097152 or v ~= math.floor(v) then bug('bad version: ' .. tostring(A.version)) end
local join_ms, deadline_ms = tonumber(A.join_ms), tonumber(A.deadline_ms)
if not join_ms or join_ms < 0 or not deadline_ms or deadline_ms < join_ms then bug('bad push windows') end
if A.backend ~= 'gloo' and A.backend ~= 'nccl' then bug('bad push backend: ' .. string.sub(A.backend, 1, 40)) end
if #A.addr == 0 or #A.addr > 300 or #A.uri > 4096 then bug('bad push address or uri') end
if #A.unreached > MAX_MEMBERS then bug('more than ' .. MAX_MEMBERS .. ' unreached workers') end
local marks = {}
for _, worker in ipairs(A.unreached) do
  if worker == '' or string.sub(worker, 1, 1) == '@' or #worker > 200 then bug('bad worker id') end
  marks[#marks + 1] = 'unreached:' .. worker
  marks[#marks + 1] = 1
end
local r = redis.call('HMGET', K.push, 'epoch', 'round')
if r[2] == A.round_id then return {'ok', tonumber(r[1])} end
if cfg.has_version and v <= cfg.version then return {'version_regression', cfg.version} end
local epoch = (tonumber(r[1]) or 0) + 1
redis.call('DEL', K.push, K.push_members)
redis.call('HSET', K.push, 'epoch', epoch, 'round', A.round_id, 'version', v, 'uri', A.uri, 'addr', A.addr,
  'backend', A.backend, 'state', 'open', 'opened_ms', now, 'join_until_ms', now + join_ms,
  'deadline_ms', now + deadline_ms, 'world', 1, 'acked', 0, 'dropped', 0)
call_batched({'HSET', K.push}, marks)
redis.call('PUBLISH', string.sub(K.meta, 1, -5) .. 'versions', 'push|' .. epoch .. '|' .. v)
return {'ok', epoch}
