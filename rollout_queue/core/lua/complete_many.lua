--[[
complete_many: executing -> completed for a batch of one worker's attempts, each settled in order
exactly as its own complete call would settle it.
KEYS:
  src        the reservations stream
  ready      requeued entry IDs
  buffer     completed entry IDs by arrival
  bufver     completed entry IDs by (min_version, arrival)
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  parked     entry ID -> settlement record of a group this call dead-letters (park_many: the
             worker role holds no XACK; settle_parked finishes it)
  wake_work  wake stream for blocked reservers
  wake_done  wake stream for blocked trainers
  counters   counters (apart from meta: the worker role writes these, never the config or version)
  The token records rollout:{q}:tokens ('<entry>:<attempt>' -> tokens) are built from meta's prefix.
READS:
  meta       config and policy version (read only: the worker role may not write meta)
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  worker_id  the worker every receipt names
  *items     6 values per completion: entry_id, attempt (PEL delivery count), size (the payload's
             bytes; the payload itself, codec.py, was SET at rollout:{q}:payload:<entry_id>:<attempt>
             in this call's MULTI), min_version ('oldest' or 'oldest:newest', as complete takes it), slots
             (comma-separated parent slot of every output, in payload order; '' for a completion
             with no outputs, for which nothing was staged), tokens (count: the outputs' token ids,
             summed; 0 with no outputs)
Returns:
  {'ok', reply, ...}   one reply per item, in order; each is what complete answers for it alone:
    {'ok', 'buffered' | 'replay' | 'evicted_self', evicted entry ID or ''}
    {'stale_receipt', owner, delivery_count}   nothing written for this item (its staged payload deleted)
    {'payload_too_large', bytes, limit}        nothing kept for this item, it stays executing
    {'malformed', detail, 'ready' | 'dead'}    the attempt ended malformed and was requeued
  a ROLLOUTQ error for a bad receipt, min_version, tokens or item count, before anything is written
Invariant:
  the state equals that of N complete calls in item order: each settled entry is owned by @done and
  is in buffer and bufver with its payload kept, or (overflow) the stalest of the buffered + arriving groups went
  back to ready; buffer size <= max_completed_groups; refused items changed nothing.
]]
-- @include bug
-- @include load_config
-- @include parse_receipt
-- @include parse_min_version
-- @include parse_size
-- @include parse_tokens
-- @include completion_batch
-- @include complete_attempt
-- @include finish_completions
-- @include payloads
-- Per item only the receipt check (XPENDING) and the entry's n (XRANGE) run; the config, the
-- counters, the buffer's size, the writes and the wakes are shared by the batch (~13 commands).
local cfg = load_config()
local items = A.items
local parsed, named = {}, {}
for i = 1, #items, 6 do table.insert(named, {items[i], items[i + 1]}) end
parse_staged(function()
  if #items % 6 ~= 0 then bug('complete_many takes 6 values per item, got ' .. #items) end
  for i = 1, #items, 6 do
    local id, attempt = parse_receipt(items[i], items[i + 1], A.worker_id)
    table.insert(parsed, {id, attempt, parse_size(items[i + 2], items[i + 4]), parse_min_version(items[i + 3], cfg),
      items[i + 4], parse_tokens(items[i + 5])})
  end
end, named)
local b = completion_batch()
local out = {'ok'}
for _, it in ipairs(parsed) do
  table.insert(out, complete_attempt(b, cfg, it[1], it[2], A.worker_id, it[3], it[4], it[5], it[6]))
end
finish_completions(b)
return out
