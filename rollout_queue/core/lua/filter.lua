--[[
filter: executing -> settled(filtered): consumed, never trained, never replayed.
KEYS:
  src        the reservations stream
  ledger     entry ID -> last terminal or settlement
  wake_work  wake stream for blocked reservers
  settled    settle times of settled groups (entry ID -> source_id), for prune
  counters   counters (apart from meta: the worker role writes these, never the config or version)
READS:
  meta       config and policy version (read only: the worker role may not write meta)
ARGV:
  entry_id   the receipt's entry ID
  attempt    the receipt's attempt
  worker_id  the receipt's worker
  reason     free text (e.g. 'all rewards equal'), kept whole in the ledger line; counted under
             its token (reason_counter: at most 32 named counters, then 'other')
Returns:
  {'ok', 'filtered' | 'replay'}
  {'stale_receipt', owner, delivery_count}   nothing written
Invariant:
  the entry is XACKed and XDELed, its executing and retained capacity released, and the ledger says
  s|filtered|<attempt>|<worker>|<reason> for this exact receipt; the settlement is recorded in settled
  for prune; meta holds at most 32 named filtered_reason:* counters besides filtered_reason:other.
]]
-- @include now_ms
-- @include load_config
-- @include parse_receipt
-- @include receipt_refusal
-- @include ledger
-- @include ledger_settled
-- @include read_entry
-- @include release_executing
-- @include record_settled
-- @include reason_counter
-- @include payloads
-- @include drop_partials
local now = now_ms()
local cfg = load_config()
local id, attempt, worker = parse_receipt(A.entry_id, A.attempt, A.worker_id)
local settled = ledger_settled('filtered', attempt, worker, A.reason)
local refused = receipt_refusal(id, attempt, worker, settled)
if refused then return refused end
local f = read_entry(id)
-- First write: a settled key of the wrong type then fails the call before anything else changed.
record_settled(cfg, {id, f and f.sid or ''})
release_executing(tonumber(f and f.n) or 0)
redis.call('XACK', K.src, 'rollout', id)
redis.call('XDEL', K.src, id)
ledger_set(id, settled)
redis.call('HINCRBY', K.counters, 'retained', -1)
redis.call('HINCRBY', K.counters, 'filtered', 1)
redis.call('HINCRBY', K.counters, reason_counter(A.reason), 1)
drop_payloads({{id = id, attempt = attempt}})  -- a completion staged for it but never adopted
drop_partials({id})  -- settled: no attempt will continue it
return {'ok', 'filtered'}
