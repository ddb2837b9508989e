-- @include requeue_lease
-- @include pending_entries
-- @include requeue_entries
-- @include append_histories
-- @include hmget_many
-- @include read_entry
-- @include park_many
-- @include claim_entries
-- @include call_batched
-- @include buffer_score
-- @include payloads
-- @include wake
--[[
requeue_errored_members: the bounded steps of a rollback its trainer made because it raised on the
lease's data (`reason`, kept in the lease record's `error`): up to `budget` members per call go back
to the head of the buffer with their completions, each marked in K.suspects (entry ID -> how many
such leases held it); a member whose mark reaches max_attempts is dead-lettered instead, with reason
'trainer_error: <reason>'. Returns (members handed back, dead-lettered, done).
Uses: K.src, K.counters, K.ready, K.buffer, K.bufver, K.leases, K.history, K.ledger, K.dlq, K.suspects,
K.wake_work, K.wake_done and the members' payload keys; the lease hash is `lease_key`.
Why: DESIGN rule 4. A group whose data makes the trainer raise would otherwise come back for ever; a
lease holds many groups, so the error is not attributed to one: every member is counted, and the
lease script holds marked groups apart (at most one per lease while more groups can come), so the
poison group meets new companions each time and reaches the bound alone, its innocent companions at
one mark each. The completions stay (no regeneration of innocent groups); a buffer without room for
the batch sends it to ready instead (regenerated, marks kept). Each call counts only its own batch, so
a resent call (the batch already moved) counts nothing twice. The history records terminal
'trainer_error', not counted toward max_attempts' failures: worker failures and trainer errors are
two bounds of the same size.
]]
local TRAINER_ERROR = 'trainer_error'

-- min_version of each member, from the lease record (lease wrote members and versions in step).
local function lease_versions(lease_key)
  local v = redis.call('HMGET', lease_key, 'members', 'versions')
  local ids, out, i = {}, {}, 0
  for id in string.gmatch(v[1] or '', '[^,]+') do table.insert(ids, id) end
  for version in string.gmatch(v[2] or '', '[^,]+') do
    i = i + 1
    if ids[i] then out[ids[i]] = tonumber(version) or 0 end
  end
  return out
end

-- `n` buffer scores that the lease walk meets before every group buffered now, first to last. In
-- fifo they may go below 0: bufver's arrival part (mod 2^32) then wraps, so such a group counts as
-- the latest arrival of its version for the overflow victim and the stale order (harmless).
local function head_scores(n, cfg)
  local scores = {}
  local arrivals = tonumber(redis.call('HGET', K.counters, 'arrivals')) or 0
  if cfg.buffer_order == 'lifo' then
    local top = redis.call('ZREVRANGE', K.buffer, 0, 0, 'WITHSCORES')
    local base = top[2] and tonumber(top[2]) or arrivals
    for i = 1, n do scores[i] = base + n - i + 1 end
  else
    local head = redis.call('ZRANGE', K.buffer, 0, 0, 'WITHSCORES')
    local base = head[2] and tonumber(head[2]) or arrivals + 1
    for i = 1, n do scores[i] = base - n + i - 1 end
  end
  return scores
end

local function rebuffer(entries, lease_key, cfg)
  local ids = {}
  for i, e in ipairs(entries) do ids[i] = e.id end
  local claimed = claim_entries('@done', ids)  -- JUSTID: each delivery count (its payload's attempt) is kept
  local versions, scores = lease_versions(lease_key), head_scores(#entries, cfg)
  local buffer, bufver, gone = {}, {}, {}
  for i, e in ipairs(entries) do
    if claimed[e.id] then
      table.insert(buffer, scores[i])
      table.insert(buffer, e.id)
      table.insert(bufver, fmt_score(buffer_version_score(versions[e.id] or 0, scores[i])))
      table.insert(bufver, e.id)
    else
      table.insert(gone, e)  -- deleted from the stream by hand: XCLAIM dropped it; nothing to buffer
    end
  end
  call_batched({'ZADD', K.buffer}, buffer)
  call_batched({'ZADD', K.bufver}, bufver)
  drop_payloads(gone, 'trainer_error')
  wake(K.wake_done)
end

local function requeue_errored_members(lease_key, lease_id, reason, budget, cfg, now)
  local owner = '@lease:' .. lease_id
  local entries = pending_entries(owner, budget)
  local n = #entries
  local dead, back, marks, ids = {}, {}, {}, {}
  if n > 0 then
    release_leased(entries, lease_id)
    for i, e in ipairs(entries) do ids[i] = e.id end
    local seen = zmscore_many(K.suspects, ids)
    for i, e in ipairs(entries) do
      e.errors, e.pos = (tonumber(seen[i]) or 0) + 1, i
      if e.errors >= cfg.max_attempts then
        e.dies = true
        table.insert(dead, e)
      else
        table.insert(back, e)
        table.insert(marks, e.errors)
        table.insert(marks, e.id)
      end
    end
    -- The most marked first: the likeliest poison group is the next lease's one marked member, beside
    -- fresh groups, before the fresh groups run out (then held-apart groups would share leases).
    table.sort(back, function(x, y) return x.errors > y.errors or (x.errors == y.errors and x.pos < y.pos) end)
    completers(entries)
    if #back <= cfg.max_completed_groups - redis.call('ZCARD', K.buffer) then
      append_histories(entries, owner, TRAINER_ERROR, reason, false, nil, now)
      if back[1] then rebuffer(back, lease_key, cfg) end
    else
      if dead[1] then append_histories(dead, owner, TRAINER_ERROR, reason, false, nil, now) end
      requeue_entries(back, owner, TRAINER_ERROR, reason, false, cfg, now)
      drop_payloads(back, 'trainer_error')
    end
    if marks[1] then call_batched({'ZADD', K.suspects}, marks) end
    if dead[1] then
      local gone = {}
      for i, e in ipairs(dead) do
        local _, kv = read_entry(e.id)
        e.kv = kv or false
        gone[i] = e.id
      end
      park_many(dead, 'dead', TRAINER_ERROR .. ': ' .. reason, owner, now)
      drop_payloads(dead, 'dead')
      call_batched({'ZREM', K.suspects}, gone)
    end
    redis.call('HINCRBY', K.counters, 'leased', -n)
    redis.call('HINCRBY', K.counters, 'rolled_back', n)
  end
  local done = n < budget
  if done then lease_emptied(lease_key, lease_id, cfg) end
  return n - #dead, #dead, done
end
