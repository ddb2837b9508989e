-- @include release_executing_many
-- @include requeue_entries
-- @include ledger
-- @include call_batched
-- @include payloads
--[[
end_attempts: executing -> ready (or dead at max_attempts) for a batch of attempts of one worker that
the caller has already checked (receipts, or the worker found silent), all ending with one terminal
and reason. Records are {id, attempt}; sets e.where on each and returns (requeued, dead).
Uses: K.src, K.counters, K.ready, K.history, K.dlq, K.ledger, K.wake_work.
Why: fail, abort, malformed, lost and a worker's close all end an attempt the same way: release its
executing capacity, count its terminal, requeue the pristine entry and write the ledger in the same
script. Counter deltas are summed, so a batch pays one HINCRBY per counter, not per entry; each
entry's n (its executing samples) comes from the fields the requeue's XCLAIM returns, so no entry is
read on its own unless it dies (its dead letter carries the pristine fields). Each attempt's payload
key is deleted: an executing attempt has one only when its worker staged a completion whose script
did not adopt it (it raised on a bad argument, or the server had forgotten it and the worker died
before resending), and nothing else would ever name it (payloads.lua).
]]
local function entry_samples(kv)
  if not kv then return 0 end  -- gone from the stream (see claim_counted): nothing left to release
  local n = nil
  for i = 1, #kv, 2 do
    if kv[i] == 'n' then n = kv[i + 1] end
  end
  return tonumber(n) or 0
end

local function end_attempts(worker, entries, terminal, reason, counted, cfg, now)
  if #entries == 0 then return 0, 0 end
  redis.call('HINCRBY', K.counters, terminal, #entries)
  local requeued, dead = requeue_entries(entries, worker, terminal, reason, counted, cfg, now, true)
  local samples, lines = 0, {}
  for _, e in ipairs(entries) do
    samples = samples + entry_samples(e.kv)
    if e.where == 'ready' then
      table.insert(lines, e.id)
      table.insert(lines, ledger_attempt(e.attempt, worker, terminal))
    end
  end
  release_executing_many(#entries, samples)
  if #lines > 0 then call_batched({'HSET', K.ledger}, lines) end
  drop_payloads(entries)
  return requeued, dead
end
