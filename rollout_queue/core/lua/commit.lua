--[[
commit: leased -> settled(committed): the lease's groups were trained; XACK them and record the commit.
KEYS:
  src        the reservations stream
  meta       config and policy version
  leases     lease ids by deadline
  ledger     entry ID -> last terminal or settlement
  commits    capped stream, one line per committed lease
  kept       committed entry IDs kept for checkpoint restore, scored by step
  wake_work  wake stream for blocked reservers
  settled    settle times of settled groups (entry ID -> source_id), for prune
  The lease record rollout:{q}:lease:<lease_id> is built from meta's prefix (same hash tag), as are the
  members' payload keys and their token records rollout:{q}:tokens (counted in tokens_trained, dropped).
  counters   counters (apart from meta: the worker role writes these, never the config or version)
  leased     entry ID -> '<lease_id>|<attempt>' of each leased group (leased_guard)
  ready      requeued entry IDs
  history    counted failures and attempt reasons
  parked     entry ID -> settlement record (park_many: reached only through requeue_entries' guard)
ARGV:
  lease_id   the lease
  token      its fencing token
  step       the trainer step this data was consumed at, or '' (then the payload is deleted now)
Returns:
  {'ok', 'committed' | 'replay', commit stream ID, groups}
  {'lease_lost', state}   state: 'unknown', 'token', 'expired', 'rolled_back' ...; nothing written
  {'restore_in_progress', step}   a restore is unfinished (its rest could requeue this commit); nothing written
  a ROLLOUTQ error when the lease record names other members than the PEL gives it; nothing written
Invariant:
  every member is XACKed exactly once; it appears in exactly one commits line; with a step its
  pristine entry stays in the stream (indexed in kept) until a checkpoint covers the step; without
  one (or a step a checkpoint already covers) the members are recorded in settled, with their
  source_ids, for prune (when settled_retention_s is set); a kept member is recorded by checkpoint.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include lease_record
-- @include ledger
-- @include ledger_settled
-- @include call_batched
-- @include hmget_many
-- @include wake
-- @include pending_sids
-- @include record_settled
-- @include payloads
-- @include requeue_lease
-- @include requeue_entries
local now = now_ms()
local cfg = load_config()
local lease_key = string.sub(K.meta, 1, -5) .. 'lease:' .. A.lease_id
local L, refusal = lease_fenced(lease_key, A.token)
if not L then return refusal end
if L.state == 'committed' then return {'ok', 'replay', L.commit_id, 0} end
if L.state ~= 'active' then return {'lease_lost', L.state} end
if L.deadline < due_now(cfg, now) then return {'lease_lost', 'expired'} end
local restoring = redis.call('HGET', K.meta, 'restoring')
if restoring then return {'restore_in_progress', tonumber(restoring) or -1} end
local step = tonumber(A.step)
if A.step ~= '' and (not step or step < 0 or step ~= math.floor(step)) then bug('bad step: ' .. A.step) end
-- A step already covered by a checkpoint needs no kept copy.
local keep = step ~= nil and (cfg.checkpoint == nil or step > cfg.checkpoint)
local owner = '@lease:' .. A.lease_id
local members = {}
for id in string.gmatch(L.members or '', '[^,]+') do table.insert(members, id) end
-- Members a hostile XCLAIM moved elsewhere come home first (K.leased names them: leased_guard).
-- The record must then name what the PEL gives to this lease: a member it does not hold is corrupt
-- state (a record edited by hand, an entry deleted), refused before the first write: the lease then
-- expires and the reaper requeues from the PEL. Entries the consumer holds that are not members (moved
-- in by a hostile XCLAIM) are no part of the commit: up to STRAYS go back to ready (or home to their
-- own lease) below, and the consumer is kept while more remain (sweep_owners finds it; reap_lease
-- requeues the rest).
local STRAYS = 64
reclaim_members(lease_key, A.lease_id)
local held, strays = {}, {}
local owned = redis.call('XPENDING', K.src, 'rollout', '-', '+', #members + STRAYS, owner)
local is_member = {}
for _, id in ipairs(members) do is_member[id] = true end
local attempts = {}  -- {id, attempt} of each member, for its payload key (read before anything bumps a count)
for _, p in ipairs(owned) do
  if is_member[p[1]] then
    held[p[1]] = true
    table.insert(attempts, {id = p[1], attempt = tonumber(p[4])})
  else
    table.insert(strays, {id = p[1], attempt = tonumber(p[4])})
  end
end
for _, id in ipairs(members) do
  if not held[id] then bug('corrupt lease record ' .. A.lease_id .. ': member ' .. id .. ' is not leased') end
end
local more_strays = #owned >= #members + STRAYS
local ids = members
local k = #ids
if k > 0 then
  -- Batched: one command per kind over all members, instead of six per member.
  local lasts = hmget_many(K.ledger, ids)
  local settled, kept = {}, {}
  for i, id in ipairs(ids) do
    local attempt, worker = ledger_attempt_of(lasts[i] or '')
    table.insert(settled, id)
    table.insert(settled, ledger_settled('committed', attempt or '0', worker or '', A.lease_id .. '|' .. A.step))
    table.insert(kept, step)
    table.insert(kept, id)
  end
  if not keep and cfg.settled_retention_ms then
    -- pending_sids' history read bumps the members' delivery counts (harmless: they are XACKed
    -- below), so the XADD after it must not fail: a settled key of the wrong type fails here first.
    redis.call('XLEN', K.settled)
    -- Read before the XACK (history reads list pending entries only) and the XDEL (it drops the fields).
    local sids, record = pending_sids(owner, k), {}
    for _, id in ipairs(ids) do
      table.insert(record, id)
      table.insert(record, sids[id] or '')
    end
    record_settled(cfg, record)
  end
  call_batched({'XACK', K.src, 'rollout'}, ids)
  call_batched({'HDEL', K.leased}, ids)
  if keep then call_batched({'ZADD', K.kept}, kept) else call_batched({'XDEL', K.src}, ids) end
  drop_payloads(attempts, 'trained')
  call_batched({'HSET', K.ledger}, settled)
end
local commit_id = redis.call('XADD', K.commits, 'MAXLEN', '~', cfg.commits_maxlen, '*', 'lease', A.lease_id,
  'trainer', L.trainer or '', 'ids', table.concat(ids, ','), 'step', A.step, 'ms', now)
redis.call('HINCRBY', K.counters, 'committed', k)
redis.call('HSET', K.meta, 'last_commit_ms', now)  -- stats: is the trainer stalled? (queue clock)
redis.call('HINCRBY', K.counters, 'leased', -k)
redis.call('HINCRBY', K.counters, 'retained', -k)
if keep then redis.call('HINCRBY', K.counters, 'kept', k) end
redis.call('HSET', lease_key, 'state', 'committed', 'commit_id', commit_id, 'step', A.step, 'closed_ms', now)
redis.call('PEXPIRE', lease_key, cfg.lease_record_ttl_ms)
redis.call('ZREM', K.leases, A.lease_id)
if strays[1] then requeue_entries(strays, owner, 'stray', 'stray', false, cfg, now) end
if not more_strays then redis.call('XGROUP', 'DELCONSUMER', K.src, 'rollout', owner) end
wake(K.wake_work)
return {'ok', 'committed', commit_id, k}
