--[[
reject: executing -> settled(dead): the worker found the reservation's body undecodable.
KEYS:
  src        the reservations stream
  ledger     entry ID -> last terminal or settlement
  parked     entry ID -> settlement record of a group this call dead-letters (park_many: the
             worker role holds no XACK; settle_parked finishes it)
  wake_work  wake stream for blocked reservers
  counters   counters (apart from meta: the worker role writes these, never the config or version)
READS:
  meta       config and policy version (read only: the worker role may not write meta)
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  entry_id   the receipt's entry ID
  attempt    the receipt's attempt
  worker_id  the receipt's worker
  reason     why it is malformed (starts with 'malformed_reservation')
Returns:
  {'ok', 'dead' | 'replay'}
  {'stale_receipt', owner, delivery_count}   nothing written
Invariant:
  DESIGN rule 3: a reservation that is not a well-formed group is settled dead with its reason and
  pristine payload; it never reaches generation and never blocks the entries behind it.
]]
-- @include now_ms
-- @include load_config
-- @include parse_receipt
-- @include receipt_refusal
-- @include ledger_settled
-- @include read_entry
-- @include release_executing
-- @include park_many
-- @include payloads
local now = now_ms()
load_config()
local id, attempt, worker = parse_receipt(A.entry_id, A.attempt, A.worker_id)
local refused = receipt_refusal(id, attempt, worker, ledger_settled('dead', attempt, worker, A.reason))
if refused then return refused end
local f, kv = read_entry(id)
release_executing(tonumber(f and f.n) or 0)
park_many({{id = id, attempt = attempt}}, 'dead', A.reason, worker, now)
drop_payloads({{id = id, attempt = attempt}})  -- a completion staged for it but never adopted
return {'ok', 'dead'}
