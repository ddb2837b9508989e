--[[
save_partial: executing -> executing: records the progress of the attempt a receipt names (partial
rollouts: the samples so far), so that the next attempt continues from it instead of restarting.
KEYS:
  src        the reservations stream (the receipt's PEL entry)
  ledger     entry ID -> last terminal or settlement (read on the refusal path only)
  counters   counters (partial_bytes, partial_saved)
  (built from meta's prefix, same hash tag, partial_keys.lua: partial, entry ID -> the progress
   record, codec.encode_partial; partial:head, entry ID -> 'attempt|tokens|min_version|bytes|worker')
READS:
  meta       config (max_partial_bytes) and policy version
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  entry_id     the receipt's entry ID
  attempt      the receipt's attempt (PEL delivery count)
  worker_id    the receipt's worker
  tokens       count, the tokens the record holds over all its samples (>= 1)
  min_version  integer, the oldest policy version of those tokens
  record       bytes, the record (at most max_partial_bytes)
Returns:
  {'ok', 'saved'}       the record replaced any earlier one of this entry (partial_saved + 1)
  {'ok', 'replay'}      a resent call, nothing written or counted: the attempt has ended and the
                        stored record is its own, or it still owns the entry and the stored record
                        is this very one (the same head and bytes)
  {'stale_receipt', owner, delivery_count}   nothing written: another attempt owns the entry now
  {'partial_too_large', size, limit}         nothing written
Invariant:
  an entry has at most one progress record, written by the attempt that owned it at the time; an
  older attempt never replaces a newer one's (receipt check); partial_bytes counts the bytes of
  every record stored, partial_saved each record written once (a replay moves neither). The entry's
  state, its PEL owner and its pristine reservation are unchanged.
]]
-- @include load_config
-- @include parse_receipt
-- @include receipt_refusal
-- @include partial_keys
-- @include check_partial
-- @include write_partial
local cfg = load_config()
local id, attempt, worker = parse_receipt(A.entry_id, A.attempt, A.worker_id)
local too_large = check_partial(A.tokens, A.min_version, A.record, cfg)
local refused = receipt_refusal(id, attempt, worker, function(_)
  local h = partial_head(redis.call('HGET', PARTIAL_HEAD_KEY, id))
  return h ~= nil and h.attempt == attempt and h.worker == worker
end)
if refused then return refused end
if too_large then return too_large end
if not write_partial(id, attempt, worker, A.tokens, A.min_version, A.record) then return {'ok', 'replay'} end
return {'ok', 'saved'}
