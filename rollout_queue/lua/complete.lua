--[[
complete: executing -> completed: the attempt's samples enter the buffer.
KEYS:
  src        the reservations stream
  meta       config and counters
  ready      requeued entry IDs
  buffer     completed entry IDs by arrival
  bufver     completed entry IDs by (min_version, arrival)
  results    entry ID -> completion payload
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  wake_work  wake stream for blocked reservers
  wake_done  wake stream for blocked trainers
ARGV:
  entry_id     the receipt's entry ID
  attempt      the receipt's attempt (PEL delivery count)
  worker_id    the receipt's worker
  payload      the encoded completion (codec.py), stored as is
  min_version  integer, the oldest policy version any sample was generated with
  slots        comma-separated parent slot of every output, in payload order
Returns:
  {'ok', 'buffered' | 'replay' | 'evicted_self', evicted entry ID or ''}
  {'stale_receipt', owner, delivery_count}             nothing written
  {'payload_too_large', bytes, limit}                   nothing written, the attempt stays executing
  {'malformed', detail, 'ready' | 'dead'}               the attempt ended malformed and was requeued
Invariant:
  the entry is owned by @done and is in buffer, bufver and results, or (overflow) the stalest of the
  buffered + arriving groups went back to ready; buffer size <= max_completed_groups.
]]
-- @include now_ms
-- @include load_config
-- @include parse_receipt
-- @include check_receipt
-- @include ledger
-- @include read_entry
-- @include release_executing
-- @include end_attempt
-- @include evict_buffered
-- @include buffer_score
-- @include wake
local now = now_ms()
local cfg = load_config()
local id, attempt, worker = parse_receipt(A.entry_id, A.attempt, A.worker_id)
local owns, owner, count = check_receipt(id, attempt, worker)
if not owns then
  local last = redis.call('HGET', K.ledger, id) or ''
  if last == ledger_attempt(attempt, worker, 'completed')
      or string.sub(last, 1, #('s|committed|' .. attempt .. '|' .. worker .. '|')) == 's|committed|' .. attempt .. '|' .. worker .. '|' then
    return {'ok', 'replay', ''}
  end
  return {'stale_receipt', owner, count}
end
if #A.payload > cfg.max_payload_bytes then
  return {'payload_too_large', #A.payload, cfg.max_payload_bytes}
end
local min_version = tonumber(A.min_version)
-- Versions are < 2^21 (DESIGN_NOTES; the bufver score packs them exactly): anything else is bad ARGV.
if not min_version or min_version < 0 or min_version >= 2097152 or min_version ~= math.floor(min_version) then
  bug('bad min_version: ' .. tostring(A.min_version))
end
local f = read_entry(id)
local n = tonumber(f and f.n) or 0

-- DESIGN rule 3: every output names a parent slot of this group and every slot has an output.
local seen, covered, detail = {}, 0, nil
for s in string.gmatch(A.slots, '[^,]+') do
  local slot = tonumber(s)
  if not slot or slot < 0 or slot >= n or slot ~= math.floor(slot) then
    detail = 'output names slot ' .. s .. ' outside 0..' .. (n - 1)
    break
  end
  if not seen[slot] then seen[slot] = true covered = covered + 1 end
end
if not detail and covered < n then detail = (n - covered) .. ' of ' .. n .. ' slots have no output' end
if detail then
  local where = end_attempt(id, attempt, worker, 'malformed', detail, true, cfg, now)
  return {'malformed', detail, where}
end

release_executing(n)
local arrival = redis.call('HINCRBY', K.meta, 'arrivals', 1)
local score = buffer_version_score(min_version, arrival)
local evicted = ''
if redis.call('ZCARD', K.buffer) >= cfg.max_completed_groups then
  -- Overflow: the stalest of the buffered groups and the arriving one goes back to ready.
  local victim = redis.call('ZRANGE', K.bufver, 0, 0, 'WITHSCORES')
  if victim[1] and tonumber(victim[2]) < score then
    evict_buffered(victim[1], 'overflow', cfg, now)
    evicted = victim[1]
  else
    redis.call('HINCRBY', K.meta, 'evicted_overflow', 1)
    requeue_entry(id, attempt, worker, 'overflow', 'overflow', false, cfg, now)
    ledger_set(id, ledger_attempt(attempt, worker, 'completed'))
    return {'ok', 'evicted_self', id}
  end
end
redis.call('XCLAIM', K.src, 'rollout', '@done', 0, id, 'RETRYCOUNT', attempt, 'JUSTID')
redis.call('ZADD', K.buffer, arrival, id)
redis.call('ZADD', K.bufver, fmt_score(score), id)
redis.call('HSET', K.results, id, A.payload)
redis.call('HINCRBY', K.meta, 'completed_total', 1)
ledger_set(id, ledger_attempt(attempt, worker, 'completed'))
wake(K.wake_done)
return {'ok', 'buffered', evicted}
