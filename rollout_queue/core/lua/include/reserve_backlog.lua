-- @include reserve_fit
-- @include fields_of
-- @include last_delivered
-- @include validate_reservation
-- @include park_many
-- @include ready_score
-- @include call_batched
--[[
reserve_backlog: backlog -> executing for the rest of one reserve call, within max_retained_groups
and admission control. Returns a stop reason ('retained_full', 'admission', 'capacity') or nil.
Appends {entry_id, 1, fields} to r.grants. `counters` = HMGET of executing_samples, retained,
committed.
Uses: K.src, K.counters (admission_waits: a call admission control left with nothing), K.ready and what park_many uses (a dead reservation is parked: settle_parked finishes it).
Why: the backlog is peeked first (XRANGE after the group's cursor), so a refusal leaves the cursor
where it was; only what the peek accepted is delivered. A group too large for the caller cannot be
left in the stream behind the cursor, so it is delivered and parked in ready at attempt 0 (owner
@ready, delivery count 0: its first real grant is attempt 1), keeping its place by submission order;
it then counts as retained like any requeued group. Malformed reservations are dead-lettered. The
peek reads at most what the call can grant plus RESERVE_LOOKAHEAD entries.
]]
local function reserve_backlog(r, cfg, now, worker, counters)
  local retained = tonumber(counters[2]) or 0
  local allow = cfg.max_retained_groups - retained
  if allow <= 0 then return 'retained_full' end
  if cfg.batch_groups > 0 then
    local limit = (cfg.version_eff + cfg.staleness_bound + 1) * cfg.batch_groups
    local room = limit - retained - (tonumber(counters[3]) or 0)
    if room <= 0 then
      -- A call that gets nothing waits for admission: counted (what staleness_mode 'pace' measures).
      if #r.grants == 0 then redis.call('HINCRBY', K.counters, 'admission_waits', 1) end
      return 'admission'
    end
    if room < allow then allow = room end
  end
  -- `allow` bounds the groups delivered (granted or parked: both become retained), r.groups the grants.
  -- A group has at least one sample, so the free samples bound the grants too.
  local peek = math.min(r.groups - #r.grants, allow, r.queue_free - r.taken, r.call_cap - r.taken)
  peek = math.max(peek, 0) + RESERVE_LOOKAHEAD
  local cands = redis.call('XRANGE', K.src, '(' .. last_delivered(), '+', 'COUNT', peek)
  local m, delivered, verdicts, stop = 0, 0, {}, nil
  local before = #r.grants
  for i, e in ipairs(cands) do
    if delivered >= allow or reserve_full(r) or r.skipped >= RESERVE_LOOKAHEAD then break end
    local f = fields_of(e[2])
    local bad = validate_reservation(f, cfg)
    if bad then
      verdicts[e[1]] = bad
    else
      local n = tonumber(f.n)
      local verdict = reserve_fit(r, n)
      if verdict == 'stop' then stop = 'capacity' break end
      if verdict == 'full' then break end
      delivered = delivered + 1
      if verdict == 'skip' then
        verdicts[e[1]] = 'park'
      else
        r.taken = r.taken + n
        r.bytes = r.bytes + entry_bytes(e[2])
        table.insert(r.grants, false)  -- filled from XREADGROUP's reply below, in order
      end
    end
    m = i
  end
  for i = #r.grants, before + 1, -1 do r.grants[i] = nil end
  if m == 0 then return stop end
  local read = redis.call('XREADGROUP', 'GROUP', 'rollout', worker, 'COUNT', m, 'STREAMS', K.src, '>')
  local entries = read[1][2]
  redis.call('HINCRBY', K.counters, 'retained', #entries)
  local parked, scored = {}, {}
  for _, e in ipairs(entries) do
    local v = verdicts[e[1]]
    if v == 'park' then
      table.insert(parked, e[1])
      table.insert(scored, ready_score(e[1]))
      table.insert(scored, e[1])
    elseif v then
      park_many({{id = e[1], attempt = 1}}, 'dead', v, worker, now)
      r.dead = r.dead + 1
    else
      table.insert(r.grants, {e[1], 1, e[2]})
    end
  end
  if parked[1] then
    local args = {'XCLAIM', K.src, 'rollout', '@ready', 0}
    for _, id in ipairs(parked) do table.insert(args, id) end
    table.insert(args, 'RETRYCOUNT')
    table.insert(args, 0)
    table.insert(args, 'JUSTID')
    redis.call(unpack(args))
    call_batched({'ZADD', K.ready}, scored)
  end
  return stop
end
