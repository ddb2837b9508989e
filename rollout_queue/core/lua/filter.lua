--[[
filter: executing -> settled(filtered), parked: consumed, never trained, never replayed; the entry
is claimed by @filtered with its record (park_many) and settle_parked (a role that holds XACK)
XACKs and XDELs it.
KEYS:
  src        the reservations stream
  ledger     entry ID -> last terminal or settlement
  wake_work  wake stream for blocked reservers
  parked     entry ID -> settlement record (park_many), until settle_parked finishes it
  counters   counters (apart from meta: the worker role writes these, never the config or version)
READS:
  meta       config and policy version (read only: the worker role may not write meta)
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  entry_id   the receipt's entry ID
  attempt    the receipt's attempt
  worker_id  the receipt's worker
  reason     free text (e.g. 'all rewards equal'), kept whole in the ledger line; counted under
             its token (reason_counter: at most 32 named counters, then 'other')
  tokens     count, the tokens the attempt generated for the group it filters (0: not known),
             added to counters.tokens_generated and tokens_filtered (DESIGN, Token accounting)
Returns:
  {'ok', 'filtered' | 'replay'}
  {'stale_receipt', owner, delivery_count}   nothing written
  a ROLLOUTQ error for a bad receipt or tokens, before anything is written
Invariant:
  the entry is parked (PEL owner @filtered, a record in parked), its executing and retained capacity
  released, and the ledger says s|filtered|<attempt>|<worker>|<reason> for this exact receipt;
  counters holds at most 32 named filtered_reason:* counters besides filtered_reason:other.
]]
-- @include now_ms
-- @include load_config
-- @include parse_receipt
-- @include receipt_refusal
-- @include ledger
-- @include ledger_settled
-- @include read_entry
-- @include release_executing
-- @include park_many
-- @include reason_counter
-- @include payloads
-- @include parse_tokens
local now = now_ms()
local cfg = load_config()
local id, attempt, worker = parse_receipt(A.entry_id, A.attempt, A.worker_id)
local tokens = parse_tokens(A.tokens)
local settled = ledger_settled('filtered', attempt, worker, A.reason)
local refused = receipt_refusal(id, attempt, worker, settled)
if refused then return refused end
local f = read_entry(id)
release_executing(tonumber(f and f.n) or 0)
park_many({{id = id, attempt = attempt}}, 'filtered', A.reason, worker, now)
redis.call('HINCRBY', K.counters, reason_counter(A.reason), 1)
-- Generated and thrown away in one step: counted in both, so generated = trained + discarded + held.
if tokens > 0 then
  redis.call('HINCRBY', K.counters, 'tokens_generated', tokens)
  redis.call('HINCRBY', K.counters, 'tokens_filtered', tokens)
end
drop_payloads({{id = id, attempt = attempt}})  -- a completion staged for it but never adopted
return {'ok', 'filtered'}
