--[[
settle_parked: parked -> settled(dead) or settled(filtered): finishes what a worker's script parked.
KEYS:
  src        the reservations stream
  parked     entry ID -> the settlement record park_many wrote
  dlq        dead letters
  settled    settle times of settled groups (entry ID -> source_id), for prune
  ledger     entry ID -> last terminal or settlement
  history    counted failures and attempt reasons (the dead letter carries them)
  ready      requeued entry IDs (an entry claimed to a parking consumer without a record)
  wake_work  wake stream for blocked reservers
  counters   counters (apart from meta)
READS:
  meta       config and policy version
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  count      at most this many entries per call (1..256: a call holds Redis well under a ms)
Returns:
  {'ok', settled, requeued, done 0|1}   done: no parked entry is left past this call's batch
Invariant:
  every entry settled here was parked: its PEL owner is its settlement's parking consumer (@dead,
  @filtered) and K.parked holds its record; it is XACKed and XDELed, its record deleted, and it has
  its dead letter or its prune record; the ledger says its settlement and the counters count it once.
  An entry a parking consumer owns without a record was not parked (claimed there by hand or by a
  hostile credential): it goes back to ready, not counted. Replaying a call settles nothing twice:
  a settled entry is no longer in the PEL.
]]
-- @include now_ms
-- @include load_config
-- @include pending_entries
-- @include park_many
-- @include settle_parked_entries
-- @include requeue_entries
local MAX_COUNT = 256
local n = math.floor(math.max(1, math.min(tonumber(A.count) or 1, MAX_COUNT)))
local now = now_ms()
local cfg = load_config()
local settled, requeued, more = 0, 0, false
for _, settlement in ipairs({'dead', 'filtered'}) do
  local budget = n - settled - requeued
  if budget < 1 then
    more = true
    break
  end
  local entries = pending_entries(PARKING[settlement], budget)
  if #entries >= budget then more = true end
  local rows = {}
  for i, e in ipairs(entries) do rows[i] = {id = e.id, settlement = settlement, attempt = e.attempt} end
  local moved, unparked = settle_parked_entries(rows, cfg)
  settled = settled + moved
  if #unparked > 0 then
    local back = {}
    for i, u in ipairs(unparked) do back[i] = {id = u.id, attempt = u.attempt} end
    requeued = requeued + requeue_entries(back, PARKING[settlement], 'unparked', 'unparked', false, cfg, now)
  end
end
return {'ok', settled, requeued, more and 0 or 1}
