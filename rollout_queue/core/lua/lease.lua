--[[
lease: completed -> leased: hand `groups` completed groups (never a stale one) to one trainer.
KEYS:
  src        the reservations stream
  meta       config and policy version
  ready      requeued entry IDs
  buffer     completed entry IDs by arrival
  bufver     completed entry IDs by (min_version, arrival)
  workers    worker ids by last heartbeat
  reserves   worker id -> last reserve
  leases     lease ids by deadline
  holds      admission hold ids by deadline
  history    counted failures and attempt reasons
  ledger     entry ID -> last terminal or settlement
  dlq        dead letters
  parked     entry ID -> settlement record (park_many); what this call parks it settles at once
  settled    prune records (settle_parked_entries writes them for filtered groups, never parked here)
  suspects   entry ID -> leases rolled back on a trainer error that held it
  wake_work  wake stream for blocked reservers
  wake_done  wake stream for blocked trainers
  progress   worker id -> reported counts (a reaped worker's is deleted)
  reaped     capped stream of reaped workers
  retired    worker ids deregistered while their consumer may remain, by when
  The lease record rollout:{q}:lease:<lease_id> (a hash) is built from meta's prefix (same hash tag).
  counters   counters (apart from meta: the worker role writes these, never the config or version)
  leased     entry ID -> '<lease_id>|<attempt>' of each leased group (leased_guard)
ARGV:
  lease_id    string, chosen by the client (a retry with the same id and token replays the answer)
  token       string, the lease's fencing token
  trainer_id  string, who holds the lease
  groups      count, exactly this many groups (or 1..groups when partial)
  partial     0 or 1
  timeout_ms  lease duration in ms (0: the queue's lease_timeout)
Returns:
  {'ok', lease_id, deadline_ms, version, {{entry_id, attempt, min_version, fields}, ...}}
                                         no payloads: the client reads them with one MGET of
                                         rollout:{q}:payload:<entry_id>:<attempt>
  {'held', available, wake_id}           an admission hold is active; nothing leased
  {'insufficient', available, wake_id}   fewer fresh groups than asked (and not partial)
  {'lease_lost', state}                  the lease id exists with another token
  {'unsatisfiable', bound, limit}        the bounds can never let `groups` (or, partial, one) group
                                         be completed at once: bound names what to raise
Invariant:
  each member is owned by @lease:<lease_id>, is in no other index, and was fresh at lease time:
  version - min_version <= max_staleness (None: 0); stale groups met on the way went back to ready;
  buffer members the PEL does not give to @done (garbage) were dropped from buffer and bufver.
  At most one member is in suspects (a group of a lease rolled back on a trainer error), unless no
  attempt is executing or the buffer is full (no other group can come), or more than 1024 were
  passed over: then the passed-over ones fill the lease, in the order walked.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include settle_parked_entries
-- @include hold_active
-- @include reap_some_lease
-- @include reap_some_worker
-- @include evict_stale_some
-- @include lease_limit
-- @include stale_floor
-- @include buffer_score
-- @include evict_buffered
-- @include lease_reply
-- @include owned_counts
-- @include claim_entries
-- @include call_batched
-- @include wake
-- @include leased_guard
-- @include hmget_many
local HELD_APART = 1024  -- suspects passed over per call at most: the walk stays bounded
local now = now_ms()
local cfg = load_config()
local lease_id, groups = A.lease_id, tonumber(A.groups)
if not string.match(lease_id, '^[%w%-_%.]+$') then bug('bad lease id: ' .. lease_id) end
if not groups or groups < 1 then bug('groups must be >= 1') end
local lease_key = string.sub(K.meta, 1, -5) .. 'lease:' .. lease_id
local prior = redis.call('HMGET', lease_key, 'token', 'state', 'deadline', 'version', 'members', 'versions')
if prior[1] then
  if prior[1] ~= A.token then return {'lease_lost', 'token'} end
  if prior[2] ~= 'active' then return {'lease_lost', prior[2]} end
  return lease_reply(lease_id, tonumber(prior[3]), tonumber(prior[4]), prior[5], prior[6])
end

local bound, limit = lease_limit(cfg)
if limit < (A.partial == '1' and 1 or groups) then return {'unsatisfiable', bound, limit} end

reap_some_lease(cfg, now, 16)
reap_some_worker(cfg, now, 16)
evict_stale_some(cfg, now, 32)

local floor = stale_floor(cfg)
local stale_count = 0
if floor then
  stale_count = redis.call('ZCOUNT', K.bufver, '-inf', '(' .. fmt_score(buffer_version_score(floor, 0)))
end
local buffered = redis.call('ZCARD', K.buffer)
local available = buffered - stale_count
if hold_active(due_now(cfg, now)) then return {'held', available, wake_id(K.wake_done)} end
local want = groups
if available < groups then
  if A.partial ~= '1' or available < 1 then return {'insufficient', available, wake_id(K.wake_done)} end
  want = available
end

-- Walk the buffer in the queue's order; stale groups met on the way go back to ready. Per batch of
-- the buffer: one XPENDING (owned_counts) and one ZMSCORE, so a member costs no command of its own.
-- Suspects (groups of a lease a trainer rolled back because it raised on the data) are held apart:
-- one per lease, the others passed over (a ZMSCORE per batch, only while any group is marked), so a
-- group that breaks the trainer meets new companions each time (DESIGN rule 4).
local members, versions, counts = {}, {}, {}
local marked = redis.call('ZCARD', K.suspects) > 0
local apart, took_suspect = {}, false
local lifo = cfg.buffer_order == 'lifo'
local offset = 0
while #members < want do
  local need = math.min(want - #members, 1000)  -- keeps ZMSCORE's unpack() within Lua's C stack
  local batch
  if lifo then
    batch = redis.call('ZREVRANGE', K.buffer, offset, offset + need + 15)
  else
    batch = redis.call('ZRANGE', K.buffer, offset, offset + need + 15)
  end
  if not batch[1] then break end  -- ghosts dropped on the way made the buffer shorter than counted
  local done = owned_counts(batch, '@done')
  local held = hmget_many(K.leased, batch)  -- leased elsewhere: moved to @done by a hostile XCLAIM
  local scores = redis.call('ZMSCORE', K.bufver, unpack(batch))
  local suspect = marked and redis.call('ZMSCORE', K.suspects, unpack(batch)) or {}
  local ghosts = {}
  for i, id in ipairs(batch) do
    if #members >= want then break end
    if not done[id] or held[i] then
      -- A member the PEL does not give to @done was written by hand (a ghost): drop it, so garbage
      -- in the buffer never blocks the completed groups behind it. One a lease holds goes home to it.
      table.insert(ghosts, id)
      if done[id] then leased_one(id) end
    else
      local minv = score_min_version(scores[i] or 0)
      if floor and minv < floor then
        evict_buffered(id, 'stale', cfg, now)
      elseif suspect[i] and took_suspect and #apart < HELD_APART then
        table.insert(apart, {id, minv, done[id]})
        offset = offset + 1
      else
        took_suspect = took_suspect or (suspect[i] and true or false)
        table.insert(members, id)
        table.insert(versions, minv)
        counts[id] = done[id]
        offset = offset + 1
      end
    end
  end
  if ghosts[1] then
    -- Dropped before the next ZRANGE, so `offset` (members taken, still in buffer) stays exact.
    redis.call('ZREM', K.buffer, unpack(ghosts))
    redis.call('ZREM', K.bufver, unpack(ghosts))
    redis.call('HINCRBY', K.counters, 'ghosts', #ghosts)
  end
end
if #members < want and apart[1] then
  -- Held apart only while another group can come: an attempt is executing and the buffer has room
  -- (reserve's backpressure stops at a full one). Otherwise nothing else would ever fill the lease.
  local executing = tonumber(redis.call('HGET', K.counters, 'executing_groups')) or 0
  if executing <= 0 or buffered >= cfg.max_completed_groups then
    for _, a in ipairs(apart) do
      if #members >= want then break end
      table.insert(members, a[1])
      table.insert(versions, a[2])
      counts[a[1]] = a[3]
    end
  end
end
if #members == 0 or (#members < groups and A.partial ~= '1') then
  settle_parked_now(cfg)
  return {'insufficient', #members, wake_id(K.wake_done)}
end

local timeout = tonumber(A.timeout_ms)
if not timeout or timeout <= 0 then timeout = cfg.lease_timeout_ms end
local deadline = now + timeout
-- Read before the stale and ghost drops: waking reservers once too often is harmless, and any
-- stale eviction has already woken them.
local was_full = buffered >= cfg.max_completed_groups
-- One XCLAIM, ZREM buffer and ZREM bufver for all members; JUSTID keeps each delivery count.
local claimed = claim_entries('@lease:' .. lease_id, members)
for _, id in ipairs(members) do
  -- An entry deleted from the stream by hand leaves the PEL on XCLAIM: answer as the replay will.
  if not claimed[id] then counts[id] = nil end
end
call_batched({'ZREM', K.buffer}, members)
call_batched({'ZREM', K.bufver}, members)
-- K.leased: what trusts this lease's ownership (leased_guard), with the attempt of each payload.
local held_by = {}
for _, id in ipairs(members) do
  if counts[id] then
    table.insert(held_by, id)
    table.insert(held_by, lease_id .. '|' .. counts[id])
  end
end
call_batched({'HSET', K.leased}, held_by)
local members_csv, versions_csv = table.concat(members, ','), table.concat(versions, ',')
redis.call('HSET', lease_key, 'token', A.token, 'trainer', A.trainer_id, 'state', 'active',
  'deadline', deadline, 'created_ms', now, 'version', cfg.version_eff, 'members', members_csv,
  'versions', versions_csv)
redis.call('ZADD', K.leases, deadline, lease_id)
redis.call('HINCRBY', K.counters, 'leased', #members)
redis.call('HINCRBY', K.counters, 'leases_total', 1)
if was_full then wake(K.wake_work) end
settle_parked_now(cfg)
return lease_reply(lease_id, deadline, cfg.version_eff, members_csv, versions_csv, counts)
