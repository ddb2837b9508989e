--[[
abort: executing -> ready (terminal aborted, not counted toward max_attempts).
KEYS:
  src        the reservations stream
  ready      requeued entry IDs
  history    counted failures and attempt reasons
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
  reason     text kept in the attempt history (e.g. 'weight update', 'drain')
  tokens       count, the tokens of `progress` ('' or 0 with no progress)
  min_version  integer, the oldest policy version of those tokens ('' or 0 with no progress)
  progress     bytes, the attempt's progress record (codec.encode_partial), '' for none: stored as
               save_partial stores it (built keys partial and partial_head), in this same call
  discarded    count, the tokens the attempt generated that no record keeps (0: none, or not known):
               added to counters.tokens_generated and tokens_aborted (DESIGN, Token accounting)
Returns:
  {'ok', 'ready' | 'replay'}
  {'stale_receipt', owner, delivery_count}   nothing written
  {'partial_too_large', size, limit}         nothing written: abort again without progress
  a ROLLOUTQ error for a bad receipt, progress or discarded, before anything is written
Invariant:
  the entry is owned by @ready and indexed in ready; its counted failures are unchanged (an abort is
  not the group's fault: weight updates, drains); with progress, the entry's progress record is
  this attempt's (save_partial's invariant), so the next attempt continues from it.
]]
-- @include now_ms
-- @include load_config
-- @include parse_receipt
-- @include receipt_refusal
-- @include replayed
-- @include end_attempt
-- @include check_partial
-- @include write_partial
-- @include parse_tokens
local now = now_ms()
local cfg = load_config()
local id, attempt, worker = parse_receipt(A.entry_id, A.attempt, A.worker_id)
local discarded = parse_tokens(A.discarded)
local refused = receipt_refusal(id, attempt, worker, function(last)
  return replayed(id, attempt, worker, 'aborted', last)
end)
if refused then return refused end
if A.progress ~= '' then
  local too_large = check_partial(A.tokens, A.min_version, A.progress, cfg)
  if too_large then return too_large end
  -- false when this record is already stored (saved before the abort): kept, not counted again
  write_partial(id, attempt, worker, A.tokens, A.min_version, A.progress)
end
-- Generated and thrown away in one step (not on a replay: refused above), as filter counts them.
if discarded > 0 then
  redis.call('HINCRBY', K.counters, 'tokens_generated', discarded)
  redis.call('HINCRBY', K.counters, 'tokens_aborted', discarded)
end
return {'ok', end_attempt(id, attempt, worker, 'aborted', A.reason, false, cfg, now)}
