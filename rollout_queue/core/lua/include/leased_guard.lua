-- @include hmget_many
--[[
leased_guard: an entry K.leased names belongs to that lease until the lease's own transition
(commit, rollback, expiry) ends it, whatever the PEL says owns it. K.leased maps entry ID ->
'<lease_id>|<attempt>' (lease.lua writes it with the lease; commit, rollback and expiry delete it).
Uses: K.src, K.leased (read), K.counters.
Why: issue 29 item 7. The worker role must XCLAIM in the source stream for its own scripts (reserve,
complete, fail, park), and Redis has no "only inside this script" permission, so a worker
credential can move any pending entry to any consumer directly: a leased group claimed to a worker,
to @ready, @done or a parking consumer would be requeued, leased again or dead-lettered while its
trainer trains it (trained twice, or committed and dead at once). So the PEL owner of a leased entry
is not trusted; K.leased, which only the trainer, reaper and admin roles write, is. Every transition
that is not the lease's own meets a leased entry through these functions and hands it back to its
lease (XCLAIM to @lease:<id> at the delivery count the lease recorded: one XCLAIM per distinct
(lease, count)) instead of moving it: a hostile XCLAIM can delay a leased group, never train it twice
or settle it. `leased_reclaimed` counts the entries handed back (nonzero only under such a credential).
]]
local function leased_record(value)
  if not value then return nil, nil end
  local lease, attempt = string.match(value, '^([%w%-_%.]+)|(%d+)$')
  if not lease then return nil, nil end
  return lease, tonumber(attempt)
end

-- hand_back: each {id =, lease =, attempt =} to its lease's consumer; returns the ids still pending.
local function hand_back(rows)
  local groups, order, pending = {}, {}, {}
  for _, row in ipairs(rows) do
    local key = row.lease .. '|' .. row.attempt
    if not groups[key] then
      groups[key] = {lease = row.lease, attempt = row.attempt, ids = {}}
      table.insert(order, key)
    end
    table.insert(groups[key].ids, row.id)
  end
  local n = 0
  for _, key in ipairs(order) do
    local g = groups[key]
    for start = 1, #g.ids, 1000 do
      local args = {'XCLAIM', K.src, 'rollout', '@lease:' .. g.lease, 0}
      for i = start, math.min(#g.ids, start + 999) do table.insert(args, g.ids[i]) end
      table.insert(args, 'RETRYCOUNT')
      table.insert(args, g.attempt)
      table.insert(args, 'JUSTID')
      local got = redis.call(unpack(args))
      for _, id in ipairs(got) do pending[id] = true end
      n = n + #got
    end
  end
  if n > 0 then redis.call('HINCRBY', K.counters, 'leased_reclaimed', n) end
  return pending
end

-- unleased: the records of `rows` ({id = ...}) that no lease holds, in order; the others are
-- handed back to their leases and returned second (the records themselves).
local function unleased(rows)
  if #rows == 0 then return rows, {} end
  local ids = {}
  for i, r in ipairs(rows) do ids[i] = r.id end
  local values = hmget_many(K.leased, ids)
  local kept, back, homes = {}, {}, {}
  for i, r in ipairs(rows) do
    local lease, attempt = leased_record(values[i])
    if lease then
      table.insert(back, r)
      table.insert(homes, {id = r.id, lease = lease, attempt = attempt})
    else
      table.insert(kept, r)
    end
  end
  if homes[1] then hand_back(homes) end
  return kept, back
end

-- leased_one: true (and the lease id) when a lease holds `id`, which is then handed back to it.
local function leased_one(id)
  local lease, attempt = leased_record(redis.call('HGET', K.leased, id))
  if not lease then return false, nil end
  hand_back({{id = id, lease = lease, attempt = attempt}})
  return true, lease
end
