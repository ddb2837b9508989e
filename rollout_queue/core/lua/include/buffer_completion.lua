-- @include completion_batch
-- @include completion_counters
-- @include flush_completions
-- @include evict_buffered
-- @include requeue_entry
-- @include buffer_score
-- @include ledger
-- @include payloads
-- @include stale_protected
--[[
buffer_completion: executing -> completed for one attempt whose receipt and outputs were checked,
with complete's overflow rule. Returns complete's reply: {'ok', 'buffered', evicted ID or ''} or
{'ok', 'evicted_self', id}.
Uses: K.counters, K.buffer, K.bufver and what evict_buffered, requeue_entry, flush_completions use. The
payload is already at payload_key(id, attempt) (staged by the caller's MULTI): buffering only indexes
the entry; a group that evicts itself drops its payload.
Why: DESIGN, Capacity: a completion that overflows the buffer evicts the stalest of the buffered and
arriving groups (ties: earliest arrival) back to ready. `min_version` is the version the group is
judged by (parse_min_version), raised to the current one for a group the fairness rule protects
(stale_protected); bufver and the lease record keep it. The buffer's size is counted in Lua across a
batch (pending members included); before an eviction decision the pending writes are flushed, so the
victim is chosen among exactly the groups N separate complete calls would have buffered by then.
The attempt's executing capacity and the counters are released through the batch (one write per call).
]]
local function judged_version(cfg, id, judged)
  -- The fairness rule: a group evicted for staleness k times is judged at the version it completes
  -- under (its bound widens to fit). One HGET, only while the version is past the group's.
  if judged < cfg.version_eff and stale_protected({id}, cfg)[id] then return cfg.version_eff end
  return judged
end
local function buffer_completion(b, cfg, id, attempt, worker, min_version, n, tokens)
  min_version = judged_version(cfg, id, min_version)
  b.delta.executing_groups = b.delta.executing_groups - 1
  b.delta.executing_samples = b.delta.executing_samples - n
  b.released = true
  local base = b.base
  if not base or b.dirty then base = read_completion_counters(b) end
  b.delta.arrivals = b.delta.arrivals + 1
  b.delta.tokens_generated = b.delta.tokens_generated + tokens  -- adopted: generated, whatever follows
  local arrival = base.arrivals + b.delta.arrivals
  local score = buffer_version_score(min_version, arrival)
  local evicted = ''
  if not b.size then b.size = redis.call('ZCARD', K.buffer) + #b.buffer / 2 end
  if b.size >= cfg.max_completed_groups then
    flush_completions(b)
    local victim = redis.call('ZRANGE', K.bufver, 0, 0, 'WITHSCORES')
    if victim[1] and tonumber(victim[2]) < score then
      evict_buffered(victim[1], 'overflow', cfg, batch_now(b))
      evicted = victim[1]
      -- Counted again rather than decremented: a victim that was garbage in bufver alone (a ghost)
      -- frees no buffer place, and the next completion must see the size complete would see.
      b.size = redis.call('ZCARD', K.buffer)
    else
      redis.call('HINCRBY', K.counters, 'evicted_overflow', 1)
      if tokens > 0 then redis.call('HINCRBY', K.counters, 'tokens_overflow', tokens) end
      requeue_entry(id, attempt, worker, 'overflow', 'overflow', false, cfg, batch_now(b))
      drop_payloads({{id = id, attempt = attempt}})
      ledger_set(id, ledger_attempt(attempt, worker, 'completed'))
      return {'ok', 'evicted_self', id}
    end
  end
  table.insert(b.claims, {id = id, attempt = attempt})
  table.insert(b.buffer, arrival)
  table.insert(b.buffer, id)
  table.insert(b.bufver, fmt_score(score))
  table.insert(b.bufver, id)
  table.insert(b.ledger, id)
  table.insert(b.ledger, ledger_attempt(attempt, worker, 'completed'))
  table.insert(b.tokens, id .. ':' .. attempt)
  table.insert(b.tokens, tokens)
  b.pending[id] = true
  b.size = b.size + 1
  b.delta.completed_total = b.delta.completed_total + 1
  b.buffered = true
  return {'ok', 'buffered', evicted}
end
