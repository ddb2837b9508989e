-- @include wake
--[[
reserve_answer: end one reserve call: record it for replay (K.reserves: '<request id>|<entry IDs>')
and build its reply. `r` is the spent budget (nil when the call was refused before either path ran:
'held', 'backpressure'); `stop` the paths' stop reason or nil ('full' means served).
Returns reserve.lua's reply: 'ok' with the grants, else the status and a wake ID.
Uses: K.counters, K.reserves, K.wake_work. Why: a call that granted nothing still records its request id
(with no entries), so its resend replays 'empty' instead of granting what the first call refused.
]]
local function reserve_status(stop, r)
  if stop == 'full' then stop = nil end
  -- Dead-lettering garbage used this call's budget: tell the client to call again at once.
  if stop == nil and r.dead > 0 then stop = 'retry' end
  -- Only groups too large for this caller were left: they wait for a caller that can take them.
  if stop == nil and r.skipped > 0 then stop = 'oversized' end
  return stop or 'empty'
end

local function reserve_answer(worker, request_id, stop, r, version, published)
  if not r then
    redis.call('HSET', K.reserves, worker, request_id .. '|')
    return {stop, version, published, wake_id(K.wake_work), 0, {}}
  end
  if r.skipped > 0 then redis.call('HINCRBY', K.counters, 'oversize_skipped', r.skipped) end
  if r.oversized > 0 then redis.call('HINCRBY', K.counters, 'oversize_granted', r.oversized) end
  if #r.grants == 0 then
    redis.call('HSET', K.reserves, worker, request_id .. '|')
    return {reserve_status(stop, r), version, published, wake_id(K.wake_work), r.dead, {}}
  end
  local ids = {}
  for i, g in ipairs(r.grants) do ids[i] = g[1] end
  redis.call('HINCRBY', K.counters, 'executing_groups', #r.grants)
  redis.call('HINCRBY', K.counters, 'executing_samples', r.taken)
  redis.call('HSET', K.reserves, worker, request_id .. '|' .. table.concat(ids, ','))
  return {'ok', version, published, '', r.dead, r.grants}
end
