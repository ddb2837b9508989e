-- @include pel_entry
-- @include requeue_entries
-- @include call_batched
-- @include wake
-- @include payloads
-- @include leased_guard
--[[
evict_buffered_many: completed -> ready for a batch of buffered groups (reason 'stale' or 'overflow').
Returns how many of `ids` were owned by @done and requeued; the others are ghosts (dropped from the
buffer indexes and counted in counters.ghosts).
Uses: K.buffer, K.bufver, K.counters and what requeue_entries, drop_payloads use. A ghost's payload
(its attempt is unknown) is not found: the garbage that made it is the operator's to remove.
Why: stale and overflow evictions are not the group's fault: not counted toward max_attempts; the
completion is dropped and the pristine reservation is generated again on fresher weights. The
owner check (one XPENDING per id: buffered ids are not contiguous in the PEL) stays per entry; the
index removals, the counters and the requeue are one command each for the batch.
]]
local function evict_buffered_many(ids, reason, cfg, now)
  if #ids == 0 then return 0 end
  local done, ghosts = {}, 0
  for _, id in ipairs(ids) do
    local owner, count = pel_entry(id)
    if owner == '@done' then
      table.insert(done, {id = id, attempt = count})
    else
      ghosts = ghosts + 1
    end
  end
  call_batched({'ZREM', K.buffer}, ids)
  call_batched({'ZREM', K.bufver}, ids)
  done = unleased(done)  -- a leased group's payload is its trainer's: handed back whole (leased_guard)
  drop_payloads(done, reason)  -- counters.tokens_stale / tokens_overflow
  redis.call('HINCRBY', K.counters, 'evicted_' .. reason, #ids)
  if ghosts > 0 then redis.call('HINCRBY', K.counters, 'ghosts', ghosts) end
  requeue_entries(done, '@done', reason, reason, false, cfg, now)
  wake(K.wake_work)
  return #done
end
