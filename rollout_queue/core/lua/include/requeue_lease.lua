-- @include now_ms
-- @include requeue_entry
-- @include pel_entry
-- @include pending_entries
-- @include requeue_entries
-- @include call_batched
-- @include payloads
-- @include leased_guard
-- @include owned_counts
-- @include hmget_many
--[[
close_lease / requeue_lease_members: leased -> ready for a lease that is being rolled back or has
expired, in bounded steps.
Uses: K.src, K.meta, K.counters, K.ready, K.history, K.dlq, K.ledger, K.leases, K.leased, K.parked, K.wake_work and the members' payload keys; the lease
hash key is built from K.meta's prefix (same hash tag).
Why: rollback and expiry are not the group's fault, so they do not count toward max_attempts; the
completion is dropped and the pristine reservation is generated again. close_lease flips the record
first (state = terminal, due at once in the deadline index), so a commit racing the rest of the requeue is
refused; requeue_lease_members then moves at most `budget` members per call (a 4096-group lease
never blocks Redis in one script), one command per batch for each kind of write (requeue_entries),
and, once the @lease consumer owns nothing, deletes it.
Also includes requeue_entry and pel_entry for the scripts that reach them through this file.
]]
-- release_leased: the members among `entries` that K.leased gives to `lease_id` leave it (their lease's
-- own transition moves them next). An entry K.leased gives to another lease is left to the guard of
-- that move (requeue_entries, park_many: handed back to its own lease).
local function release_leased(entries, lease_id)
  if #entries == 0 then return end
  local ids = {}
  for i, e in ipairs(entries) do ids[i] = e.id end
  local values, ours = hmget_many(K.leased, ids), {}
  for i, id in ipairs(ids) do
    if leased_record(values[i]) == lease_id then table.insert(ours, id) end
  end
  call_batched({'HDEL', K.leased}, ours)
end

-- reclaim_members: the members of a lease that a hostile XCLAIM moved to another consumer are given
-- back to @lease:<lease_id> (leased_guard), so the lease's own transition finds every member it holds
-- in its consumer, and a parked record forged for one is dropped (no park of a leased group is
-- genuine). One XPENDING of the lease's consumer (owned_counts), one HMGET for the strays.
local function reclaim_members(lease_key, lease_id)
  local members = {}
  for id in string.gmatch(redis.call('HGET', lease_key, 'members') or '', '[^,]+') do table.insert(members, id) end
  if not members[1] then return end
  local owned, strays = owned_counts(members, '@lease:' .. lease_id), {}
  for _, id in ipairs(members) do
    if not owned[id] then table.insert(strays, id) end
  end
  if not strays[1] then return end
  local values, homes, ids = hmget_many(K.leased, strays), {}, {}
  for i, id in ipairs(strays) do
    local lease, attempt = leased_record(values[i])
    if lease == lease_id then
      table.insert(homes, {id = id, lease = lease, attempt = attempt})
      table.insert(ids, id)
    end
  end
  if homes[1] then
    hand_back(homes)
    call_batched({'HDEL', K.parked}, ids)  -- a record forged beside a claim to a parking consumer
  end
end

local function close_lease(lease_key, lease_id, terminal, now)
  reclaim_members(lease_key, lease_id)
  redis.call('HSET', lease_key, 'state', terminal, 'closed_ms', now)
  -- Score 0: due at once, so the reaper (or reap_some) finishes the requeue if this caller dies.
  redis.call('ZADD', K.leases, 0, lease_id)
end

-- The lease's last step, once its @lease consumer owns nothing: out of the deadline index, the
-- consumer deleted, the record kept lease_record_ttl_ms (a repeated commit still answers).
local function lease_emptied(lease_key, lease_id, cfg)
  redis.call('ZREM', K.leases, lease_id)
  redis.call('XGROUP', 'DELCONSUMER', K.src, 'rollout', '@lease:' .. lease_id)
  if redis.call('EXISTS', lease_key) == 1 then redis.call('PEXPIRE', lease_key, cfg.lease_record_ttl_ms) end
end

local function requeue_lease_members(lease_key, lease_id, terminal, budget, cfg, now)
  local owner = '@lease:' .. lease_id
  local entries = pending_entries(owner, budget)
  local n = #entries
  if n > 0 then
    release_leased(entries, lease_id)
    drop_payloads(entries, terminal)  -- counters.tokens_rolled_back / tokens_expired
    requeue_entries(entries, owner, terminal, terminal, false, cfg, now)
    redis.call('HINCRBY', K.counters, 'leased', -n)
    redis.call('HINCRBY', K.counters, terminal, n)
  end
  local done = n < budget
  if done then lease_emptied(lease_key, lease_id, cfg) end
  return n, done
end

-- requeue_strays: entries a hostile XCLAIM moved into the consumer of a lease that is committed
-- (commit requeues a bounded number of them and leaves the consumer while more remain: sweep_owners
-- finds it): up to `budget` go back to ready pristine (or home to their own lease: requeue_entries'
-- guard), not counted toward max_attempts; the consumer goes once it owns nothing. nil: none left.
local function requeue_strays(lease_key, lease_id, budget, cfg, now)
  local owner = '@lease:' .. lease_id
  local strays = pending_entries(owner, budget)
  if not strays[1] then return nil end
  requeue_entries(strays, owner, 'stray', 'stray', false, cfg, now)
  local done = #strays < budget
  if done then lease_emptied(lease_key, lease_id, cfg) end
  return #strays, done
end

--[[
reap_lease: the reaper's step for one lease id found due in K.leases (or as an orphan consumer):
close it as expired if it is active and due (its K.leases score: the deadline, or sooner once its
holder stopped beating, lease_due.lua; none: an orphan, due now), then requeue up to `budget` members;
a lease already closed by a rollback is finished with its own terminal. Returns n, done; or nil when
there is nothing to do (alive, or committed).
]]
local function reap_lease(lease_id, budget, cfg, now)
  local lease_key = string.sub(K.meta, 1, -5) .. 'lease:' .. lease_id
  local state = redis.call('HGET', lease_key, 'state')
  if state == 'active' then
    -- The index holds the deadline (lease and extend write it with the record), so a record edited by
    -- hand cannot keep a lease alive; an active lease that is not indexed (an orphan) is due now.
    local deadline = tonumber(redis.call('ZSCORE', K.leases, lease_id))
    if deadline and deadline >= due_now(cfg, now) then return nil end
    close_lease(lease_key, lease_id, 'expired', now)
    -- Due before its recorded deadline: the score was its holder's silence (lease_beat.lua). Said so
    -- in the record, for an operator reading it (redis-cli HGETALL).
    local recorded = tonumber(redis.call('HGET', lease_key, 'deadline'))
    if deadline and recorded and deadline < recorded then redis.call('HSET', lease_key, 'expired_by', 'silence') end
    state = 'expired'
  elseif state == 'committed' then
    redis.call('ZREM', K.leases, lease_id)
    return requeue_strays(lease_key, lease_id, budget, cfg, now)
  end
  if state ~= 'rolled_back' then state = 'expired' end
  return requeue_lease_members(lease_key, lease_id, state, budget, cfg, now)
end
