-- @include hmget_many
-- @include claim_counted
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

-- hand_back: each {id =, lease =, attempt =} to its lease's consumer (claim_counted per lease: one
-- XCLAIM per distinct (lease, count)), counted in leased_reclaimed.
local function hand_back(rows)
  local by_lease, order = {}, {}
  for _, row in ipairs(rows) do
    if not by_lease[row.lease] then
      by_lease[row.lease] = {}
      table.insert(order, row.lease)
    end
    table.insert(by_lease[row.lease], row)
  end
  local n = 0
  for _, lease in ipairs(order) do n = n + claim_counted('@lease:' .. lease, by_lease[lease]) end
  if n > 0 then redis.call('HINCRBY', K.counters, 'leased_reclaimed', n) end
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
