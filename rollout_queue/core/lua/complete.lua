--[[
complete: executing -> completed: the attempt's samples enter the buffer.
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
  entry_id     the receipt's entry ID
  attempt      the receipt's attempt (PEL delivery count)
  worker_id    the receipt's worker
  size         the payload's length in bytes ('' : no outputs, nothing staged); the payload itself
               (codec.py) was SET at rollout:{q}:payload:<entry_id>:<attempt> in this call's MULTI
  min_version  'oldest' or 'oldest:newest': the oldest policy version any sample was generated with,
               and the newest version any sample's tokens were generated with (its last segment); the group is
               judged by oldest, or by newest in staleness_mode 'continue' (parse_min_version)
  slots        comma-separated parent slot of every output, in payload order ('' : no outputs)
  tokens       count, the tokens of every output (sum of their token ids; 0 with no outputs):
               counters.tokens_generated once adopted, kept in the `tokens` hash beside the payload
Returns:
  {'ok', 'buffered' | 'replay' | 'evicted_self', evicted entry ID or ''}
  {'stale_receipt', owner, delivery_count}             nothing written (the staged payload deleted)
  {'payload_too_large', bytes, limit}                   nothing kept, the attempt stays executing
  {'malformed', detail, 'ready' | 'dead'}               the attempt ended malformed and was requeued
  (slots '': ended as fail(terminal='malformed') ends it, and a repeat answers 'malformed' again)
  a ROLLOUTQ error for a bad receipt, min_version or tokens, before anything is written
Invariant:
  the entry is owned by @done and is in buffer and bufver, its payload kept at its payload key, or
  (overflow) the stalest of the buffered + arriving groups went back to ready; buffer size <=
  max_completed_groups; a payload key is kept only for a buffered (or, later, leased) attempt.
]]
-- @include load_config
-- @include parse_receipt
-- @include parse_min_version
-- @include parse_size
-- @include parse_tokens
-- @include completion_batch
-- @include complete_attempt
-- @include finish_completions
-- @include payloads
-- Cost: ~14 commands (receipt check, the entry's n, one counters read and write, the buffer's size,
-- the three writes, two wakes), plus the staging SET and MULTI/EXEC around it; TIME only on a
-- requeue path. complete_many shares all of it per batch.
local cfg = load_config()
local id, attempt, worker, min_version, size, tokens
parse_staged(function()
  id, attempt, worker = parse_receipt(A.entry_id, A.attempt, A.worker_id)
  min_version = parse_min_version(A.min_version, cfg)
  size = parse_size(A.size, A.slots)
  tokens = parse_tokens(A.tokens)
end, {{A.entry_id, A.attempt}})
local b = completion_batch()
local reply = complete_attempt(b, cfg, id, attempt, worker, size, min_version, A.slots, tokens)
finish_completions(b)
return reply
