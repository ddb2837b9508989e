--[[
sweep_owners: the next `count` PEL entries after the sweep's cursor, and which of their owners are
orphans: consumers that hold entries but are neither a registered worker nor an active lease (a
registration removed by hand, garbage consumers written with XREADGROUP). The reaper's step; the
orphans it returns are reaped by reap_worker and expire_lease, which re-check them. Its cursor is
kept beside the queue clock (rollout:{q}:clock field owners: bookkeeping, not queue state).
KEYS:
  src        the reservations stream
  meta       config (only its key's prefix: the clock hash beside it)
  workers    worker ids by last heartbeat
  leases     lease ids by deadline
ARGV:
  count      PEL entries to look at in this call, 1..4096
Returns:
  {'ok', {orphan consumer names}, wrapped 0|1}   wrapped = 1 when this call reached the PEL's end
Invariant:
  none written but the cursor. Bounded whatever the PEL's size or the number of consumers: one
  XPENDING range of `count` entries (two when it wraps) and one ZMSCORE per index, so
  a PEL of n entries is swept every n / count calls. A PEL shorter than `count` is swept whole in
  every call (it wraps to its start after the cursor), so a small queue finds an orphan at once.
]]
-- @include bug
-- @include now_ms
local count = tonumber(A.count)
if not count or count < 1 or count > 4096 then bug('bad count: ' .. tostring(A.count)) end
local cursor = redis.call('HGET', clock_key(), 'owners') or ''
if not string.match(cursor, '^%d+%-%d+$') then cursor = '' end
local rows = redis.call('XPENDING', K.src, 'rollout', cursor == '' and '-' or ('(' .. cursor), '+', count)
local nxt, wrapped = '', 0
if #rows == count then
  nxt = rows[#rows][1]
else
  wrapped = 1
  if cursor ~= '' then
    -- The rest of this call's budget from the PEL's start, up to where the cursor was.
    local more = redis.call('XPENDING', K.src, 'rollout', '-', cursor, count - #rows)
    for _, row in ipairs(more) do rows[#rows + 1] = row end
    if #rows == count then nxt = rows[#rows][1] end
  end
end
-- The distinct owners, looked up in two ZMSCOREs (one per index) rather than one call each.
local seen, workers, leases = {}, {}, {}
for _, row in ipairs(rows) do
  local name = row[2]
  if not seen[name] and name ~= '@ready' and name ~= '@done' and name ~= '@dead' and name ~= '@filtered' then
    seen[name] = true
    if string.sub(name, 1, 7) == '@lease:' then leases[#leases + 1] = name else workers[#workers + 1] = name end
  end
end
local orphans = {}
local function unknown(index, names, from)
  if not names[1] then return end
  local ids = names
  if from > 1 then
    ids = {}
    for i, name in ipairs(names) do ids[i] = string.sub(name, from) end
  end
  local scores = redis.call('ZMSCORE', index, unpack(ids))
  for i, name in ipairs(names) do
    if not scores[i] then orphans[#orphans + 1] = name end
  end
end
unknown(K.workers, workers, 1)
unknown(K.leases, leases, 8)
redis.call('HSET', clock_key(), 'owners', nxt)
return {'ok', orphans, wrapped}
