--[[
push_close: record how a round of a weights push ended (operators read it in the push hash).
KEYS:
  meta          the queue clock's home (now_ms)
  push      the current round (push_open.lua)
ARGV:
  epoch     the round
  outcome   done (every member received everything) | partial | failed | empty (nobody joined)
  acked     members that received everything
  dropped   members that did not (dead, stalled, or cut off with them)
Returns:
  {'ok'}
  {'closed', epoch}   the round is not the current one any more; nothing written
Invariant:
  a closed round is joined by nobody (push_join refuses it); closing twice keeps the last counts.
]]
-- @include bug
-- @include now_ms
local now = now_ms()
local epoch = tonumber(redis.call('HGET', K.push, 'epoch')) or 0
if tostring(epoch) ~= A.epoch then return {'closed', epoch} end
if A.outcome ~= 'done' and A.outcome ~= 'partial' and A.outcome ~= 'failed' and A.outcome ~= 'empty' then
  bug('bad push outcome: ' .. string.sub(A.outcome, 1, 40))
end
local acked, dropped = tonumber(A.acked), tonumber(A.dropped)
if not acked or not dropped or acked < 0 or dropped < 0 then bug('bad push counts') end
redis.call('HSET', K.push, 'state', A.outcome, 'acked', acked, 'dropped', dropped, 'closed_ms', now)
return {'ok'}
