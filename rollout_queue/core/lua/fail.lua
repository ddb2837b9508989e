--[[
fail: executing -> ready (terminal failed or malformed, counted toward max_attempts), or -> dead.
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
  terminal   'failed' or 'malformed'
  reason     text kept in the attempt history and the dead letter
Returns:
  {'ok', 'ready' | 'dead' | 'replay'}
  {'stale_receipt', owner, delivery_count}   nothing written
Invariant:
  the entry is owned by @ready and indexed in ready, or it is settled dead with every attempt's
  reason once the counted failures reach max_attempts (a prompt that kills engines cannot loop).
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include parse_receipt
-- @include receipt_refusal
-- @include replayed
-- @include end_attempt
local now = now_ms()
local cfg = load_config()
local id, attempt, worker = parse_receipt(A.entry_id, A.attempt, A.worker_id)
if A.terminal ~= 'failed' and A.terminal ~= 'malformed' then bug('bad terminal: ' .. A.terminal) end
local refused = receipt_refusal(id, attempt, worker, function(last)
  return replayed(id, attempt, worker, A.terminal, last)
end)
if refused then return refused end
return {'ok', end_attempt(id, attempt, worker, A.terminal, A.reason, true, cfg, now)}
