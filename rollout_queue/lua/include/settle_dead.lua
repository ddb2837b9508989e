-- @include ledger
--[[
settle_dead: PEL (any owner) -> settled(dead): XACK, XDEL, one dlq entry with the reason, the attempt
history and the pristine fields (prefixed f:).
Uses: K.src, K.dlq, K.history, K.ledger, K.meta. The caller has already released any executing or
buffer capacity the entry held; this releases the retained slot (DESIGN: settlement only).
]]
local function settle_dead(id, kv, reason, history_json, attempt, worker, now)
  local sid = ''
  local args = {'XADD', K.dlq, '*', 'entry_id', id, 'reason', reason, 'attempt', tostring(attempt),
    'worker', worker, 'history', history_json or '[]', 'ms', tostring(now)}
  if kv then
    for i = 1, #kv, 2 do
      if kv[i] == 'sid' then sid = kv[i + 1] end
      table.insert(args, 'f:' .. kv[i])
      table.insert(args, kv[i + 1])
    end
  end
  table.insert(args, 'source_id')
  table.insert(args, sid)
  redis.call(unpack(args))
  redis.call('XACK', K.src, 'rollout', id)
  redis.call('XDEL', K.src, id)
  redis.call('HDEL', K.history, id)
  ledger_set(id, 's|dead|' .. attempt .. '|' .. worker .. '|' .. reason)
  redis.call('HINCRBY', K.meta, 'retained', -1)
  redis.call('HINCRBY', K.meta, 'dead', 1)
end
