-- @include park_many
-- @include call_batched
-- @include hmget_many
-- @include ledger
-- @include ledger_settled
-- @include read_entry
-- @include record_settled
-- @include leased_guard
--[[
settle_parked_entries: parked -> settled(dead) or settled(filtered) for a batch of `rows`
({id =, settlement =}: entries their parking consumer owns): the dead letter (reason, attempt, worker,
the attempt history and the pristine fields prefixed f:) or the prune record (record_settled), then
one XACK, XDEL and HDEL of K.parked for the batch. Returns the number settled and the rows that were
not parked (no record: claimed to a parking consumer by hand, or by a hostile credential).
Uses: K.src, K.parked, K.dlq, K.ledger, K.history, K.counters, K.settled (filtered rows only).
Why: the second half of park_many, run by a role that holds XACK. A record that does not parse (a
hand-written or hostile one) settles the entry all the same, its owner saying which settlement and
its ledger line (else 'garbage parked record') the rest, so no parked group is stuck. A park its
script did not account (the ledger line is not this settlement's: a forged one) moves the counters
here, as park_many would have, so every group is counted once.
]]
-- The dead letter's history: the list of attempts of the entry's history record (as the dead
-- letter always carried it), '[]' for none or for garbage.
local function attempt_list(raw)
  if not raw then return '[]' end
  local ok, h = pcall(cjson.decode, raw)
  if not ok or type(h) ~= 'table' or type(h.h) ~= 'table' then return '[]' end
  local ok2, encoded = pcall(cjson.encode, h.h)
  return ok2 and encoded or '[]'
end

local function settle_parked_entries(rows, cfg)
  local back
  rows, back = unleased(rows)  -- a leased group is settled only by its lease (leased_guard)
  if back[1] then
    local forged = {}
    for i, r in ipairs(back) do forged[i] = r.id end
    call_batched({'HDEL', K.parked}, forged)
  end
  if #rows == 0 then return 0, {} end
  local ids = {}
  for i, r in ipairs(rows) do ids[i] = r.id end
  local records, lines = hmget_many(K.parked, ids), hmget_many(K.ledger, ids)
  local done, unparked, dead_pairs, settled_pairs, ledger_pairs = {}, {}, {}, {}, {}
  local counted = 0  -- parks park_many counted in `parked` (a forged one is not)
  local fresh = {dead = 0, filtered = 0}
  for i, r in ipairs(rows) do
    local rec = records[i]
    if not rec then
      table.insert(unparked, r)
    else
      local s, attempt, worker, ms, reason = string.match(rec, '^(%a+)|(%d+)|([^|]*)|(%d+)|(.*)$')
      local ls, la, lw, ld = ledger_settled_of(lines[i] or '')
      if s ~= r.settlement then
        if ls == r.settlement then attempt, worker, reason = la, lw, ld
        else attempt, worker, reason = '0', PARKING[r.settlement], 'garbage parked record' end
        ms = '0'
      end
      if ls ~= r.settlement then
        fresh[r.settlement] = fresh[r.settlement] + 1
      else
        counted = counted + 1
      end
      if ls ~= r.settlement then
        table.insert(ledger_pairs, r.id)
        table.insert(ledger_pairs, ledger_settled(r.settlement, attempt, worker, reason))
      end
      local f, kv = read_entry(r.id)
      if r.settlement == 'dead' then
        table.insert(dead_pairs, {r.id, kv, reason, attempt, worker, ms})
      else
        table.insert(settled_pairs, r.id)
        table.insert(settled_pairs, f and f.sid or '')
      end
      table.insert(done, r.id)
    end
  end
  -- The prune record first: a settled key of the wrong type fails the call before anything changed.
  record_settled(cfg, settled_pairs)
  for _, d in ipairs(dead_pairs) do
    local sid = ''
    local args = {'XADD', K.dlq, '*', 'entry_id', d[1], 'reason', d[3], 'attempt', d[4], 'worker', d[5],
      'history', attempt_list(redis.call('HGET', K.history, d[1])), 'ms', d[6]}
    for i = 1, #(d[2] or {}), 2 do
      if d[2][i] == 'sid' then sid = d[2][i + 1] end
      table.insert(args, 'f:' .. d[2][i])
      table.insert(args, d[2][i + 1])
    end
    table.insert(args, 'source_id')
    table.insert(args, sid)
    redis.call(unpack(args))
  end
  call_batched({'XACK', K.src, 'rollout'}, done)
  call_batched({'XDEL', K.src}, done)
  call_batched({'HDEL', K.parked}, done)
  call_batched({'HSET', K.ledger}, ledger_pairs)
  if counted > 0 then redis.call('HINCRBY', K.counters, 'parked', -counted) end
  if fresh.dead + fresh.filtered > 0 then
    redis.call('HINCRBY', K.counters, 'retained', -(fresh.dead + fresh.filtered))
    if fresh.dead > 0 then redis.call('HINCRBY', K.counters, 'dead', fresh.dead) end
    if fresh.filtered > 0 then redis.call('HINCRBY', K.counters, 'filtered', fresh.filtered) end
  end
  -- A parking consumer left with nothing pending is deleted (it owns nothing: no entry is dropped),
  -- so XINFO CONSUMERS lists only the owners that own something (OPERATIONS, "who owns what").
  local touched = {}
  for _, r in ipairs(rows) do touched[r.settlement] = true end
  for settlement in pairs(touched) do
    local owner = PARKING[settlement]
    if not redis.call('XPENDING', K.src, 'rollout', '-', '+', 1, owner)[1] then
      redis.call('XGROUP', 'DELCONSUMER', K.src, 'rollout', owner)
    end
  end
  return #done, unparked
end

-- settle_parked_now: settle, in the same call, what this script call parked (park_many's
-- PARKED_NOW): for the scripts of roles that hold XACK (reaper, trainer, admin), whose dead letters
-- need not wait for the reaper's next tick. Only dead letters reach here (filter is the worker's).
local function settle_parked_now(cfg)
  local rows = PARKED_NOW
  PARKED_NOW = {}
  return settle_parked_entries(rows, cfg)
end
