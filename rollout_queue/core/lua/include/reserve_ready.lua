-- @include reserve_fit
-- @include pel_entry
-- @include read_entry
-- @include validate_reservation
-- @include park_many
-- @include leased_guard
--[[
reserve_ready: ready -> executing for the requeued groups of one reserve call, oldest submission
first; groups too large for the caller are skipped in place (reserve_fit). Returns a stop reason
('capacity', or 'full': the call is served) or nil. Appends {entry_id, attempt, fields} to r.grants.
Uses: K.src, K.ready, K.counters and what park_many uses (a dead reservation is parked: settle_parked finishes it).
Why: requeued work keeps its place (DESIGN, Buffer and staleness), and a call's work is bounded by
what it can grant: at most r.groups grants, RESERVE_LOOKAHEAD skipped groups and as many garbage
members (ghosts, malformed reservations dead-lettered on the way), whatever the size of ready.
]]
local function reserve_ready(r, cfg, now, worker)
  local offset, garbage = 0, 0
  while not reserve_full(r) and r.skipped < RESERVE_LOOKAHEAD and garbage < RESERVE_LOOKAHEAD do
    local head = redis.call('ZRANGE', K.ready, offset, offset)[1]
    if not head then return nil end
    local owner, count = pel_entry(head)
    local f, kv = read_entry(head)
    if owner ~= '@ready' or leased_one(head) then
      -- The index names an entry the PEL does not give to @ready (garbage written by hand), or one a
      -- lease holds (a hostile XCLAIM: leased_one handed it back): drop it.
      redis.call('ZREM', K.ready, head)
      redis.call('HINCRBY', K.counters, 'ghosts', 1)
      garbage = garbage + 1
    else
      local bad = validate_reservation(f, cfg)
      if bad then
        redis.call('ZREM', K.ready, head)
        park_many({{id = head, attempt = count}}, 'dead', bad, '@ready', now)
        r.dead = r.dead + 1
        garbage = garbage + 1
      else
        local n = tonumber(f.n)
        local verdict = reserve_fit(r, n)
        if verdict == 'stop' then return 'capacity' end
        if verdict == 'full' then return 'full' end
        if verdict == 'skip' then
          offset = offset + 1
        else
          redis.call('ZREM', K.ready, head)
          redis.call('XCLAIM', K.src, 'rollout', worker, 0, head, 'RETRYCOUNT', count + 1, 'JUSTID')
          r.taken = r.taken + n
          r.bytes = r.bytes + entry_bytes(kv)
          table.insert(r.grants, {head, count + 1, kv})
        end
      end
    end
  end
  return nil
end
