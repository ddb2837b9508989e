-- @include call_batched
-- @include ledger_settled
-- @include drop_partials
--[[
settle_dead_many: PEL (any owner) -> settled(dead) for a batch of entries ended by one worker for one
reason: one dlq entry each (the reason, the attempt history e.history and the pristine fields e.kv,
prefixed f:), then one XACK, XDEL and HSET ledger for the batch. The attempt history stays (as the
ledger line does) until prune, so a settlement replayed after the group died still answers 'replay'.
Uses: K.src, K.dlq, K.history, K.ledger, K.counters, K.meta (drop_partials). The caller has already released any executing or
buffer capacity the entries held; this releases their retained slots (DESIGN: settlement only).
Why: the dead letter is per entry; everything else is one command per batch.
]]
local function settle_dead_many(entries, reason, worker, now)
  if #entries == 0 then return end
  local ids, ledger_pairs = {}, {}
  for _, e in ipairs(entries) do
    local sid = ''
    local args = {'XADD', K.dlq, '*', 'entry_id', e.id, 'reason', reason, 'attempt', tostring(e.attempt),
      'worker', worker, 'history', e.history or '[]', 'ms', tostring(now)}
    if e.kv then
      for i = 1, #e.kv, 2 do
        if e.kv[i] == 'sid' then sid = e.kv[i + 1] end
        table.insert(args, 'f:' .. e.kv[i])
        table.insert(args, e.kv[i + 1])
      end
    end
    table.insert(args, 'source_id')
    table.insert(args, sid)
    redis.call(unpack(args))
    table.insert(ids, e.id)
    table.insert(ledger_pairs, e.id)
    table.insert(ledger_pairs, ledger_settled('dead', e.attempt, worker, reason))
  end
  call_batched({'XACK', K.src, 'rollout'}, ids)
  call_batched({'XDEL', K.src}, ids)
  call_batched({'HSET', K.ledger}, ledger_pairs)
  redis.call('HINCRBY', K.counters, 'retained', -#entries)
  redis.call('HINCRBY', K.counters, 'dead', #entries)
  drop_partials(ids)  -- settled: no attempt will continue them (drop_partials.lua)
end
