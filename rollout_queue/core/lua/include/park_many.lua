-- @include call_batched
-- @include claim_entries
-- @include ledger
-- @include ledger_settled
-- @include drop_partials
-- @include leased_guard
--[[
park_many: PEL (any owner) -> parked, the first half of settled(dead) or settled(filtered): each
entry is claimed (XCLAIM ... JUSTID, delivery count kept) by the parking consumer of its settlement
(PARKING: @dead, @filtered) with a compact record in K.parked (entry ID ->
'<settlement>|<attempt>|<worker>|<ms>|<reason>'); its ledger line says the settlement and the
counters move as settlement moves them, now (and `parked` counts it: stats' backlog is the stream's
length less what is retained, kept or parked). settle_parked.lua (the reaper's tick; the trainer and
admin may run it) finishes each: the dead letter or the prune record, XACK and XDEL.
Uses: K.src, K.parked, K.ledger, K.counters, K.meta (drop_partials: a parked group is settled, so
no attempt will continue it and its progress record goes now). `entries` are {id =, attempt =} records ended by one
worker (or queue owner) for one reason. An entry whose stream entry is gone is dropped from the PEL by
the XCLAIM itself (Redis >= 7.0): nothing is left to settle, and no record is written for it.
Why: the worker role holds no XACK, XDEL or XADD to the dead letters (issue 29 item 7: a leaked worker
credential must not destroy a group), yet the worker's scripts are where most settlements are
decided. Parking needs only an XCLAIM and writes the worker role keeps; the ledger line written here
is what a replayed settlement compares (DESIGN rule 5), so replays answer as before, and the group
counts as settled everywhere (stats, verify, inspect: view_models.OWNER_KINDS) from this call on.
PARKED_NOW collects what one script call parked, for scripts whose role may settle at once
(settle_parked_now).
]]
local PARKING = {dead = '@dead', filtered = '@filtered'}
local PARKED_NOW = {}
local function park_many(entries, settlement, reason, worker, now)
  entries = unleased(entries)  -- a leased group is settled only by its lease (leased_guard)
  if #entries == 0 then return end
  local ids = {}
  for i, e in ipairs(entries) do ids[i] = e.id end
  local claimed = claim_entries(PARKING[settlement], ids)
  local records, lines, n = {}, {}, 0
  for _, e in ipairs(entries) do
    if claimed[e.id] then
      n = n + 1
      table.insert(records, e.id)
      table.insert(records, settlement .. '|' .. e.attempt .. '|' .. worker .. '|' .. now .. '|' .. reason)
      table.insert(PARKED_NOW, {id = e.id, settlement = settlement})
    end
    table.insert(lines, e.id)
    table.insert(lines, ledger_settled(settlement, e.attempt, worker, reason))
  end
  call_batched({'HSET', K.parked}, records)
  call_batched({'HSET', K.ledger}, lines)
  redis.call('HINCRBY', K.counters, 'retained', -#entries)
  redis.call('HINCRBY', K.counters, settlement, #entries)
  if n > 0 then redis.call('HINCRBY', K.counters, 'parked', n) end  -- still in the stream: not backlog
  drop_partials(ids)
end
