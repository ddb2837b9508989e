--[[
produce: a producer's next source groups -> backlog, with its cursor advanced in the same step.
KEYS:
  src        the reservations stream
  ids        hash source_id -> entry ID
  intake     counters of what was submitted (the only key a producer writes besides ids and src)
  wake_work  wake stream for blocked reservers
  producers  hash producer name -> '<cursor>|<plan>'
READS:
  meta       config (read only: the producer's ACL role may only read meta)
  counters   the counters (read only)
ARGV:
  producer     the producer's name (its field in producers)
  plan         digest of what the producer enumerates (dataset, order, n, prompt); fixed per name
  start        count: the cursor this batch starts at (groups this producer enqueued before it)
  stop         count: the cursor after this batch, start + the number of groups
  max_backlog  count: refuse while backlog + this batch would exceed it; 0: no bound
  *groups      5 values per group: source_id, n, parents JSON, body (orjson), schema version
Returns:
  {'ok', new_count, stop, backlog}                 the groups are in the backlog, the cursor is `stop`
  {'replay', stop, backlog}                        the cursor already is `stop` (this call ran before and
                                                   its reply was lost); nothing written
  {'cursor_moved', cursor}                         the cursor is neither `start` nor `stop` (another
                                                   instance of this producer moved it); nothing written
  {'plan_mismatch', stored plan}                   this name was used with another plan; nothing written
  {'backlog_full', backlog, max_backlog}           nothing written; retry once workers reserved some
  {'payload_too_large', index, bytes, limit}       nothing written
Invariant:
  the cursor and the groups move together: every group before the cursor is in the source stream
  (or already consumed) exactly once, and this producer added none after it. Backlog is counted as
  in stats: stream length - retained - kept.
]]
-- @include bug
-- @include load_config
-- @include oversized_group
-- @include add_groups
local cfg = load_config()
local from, to, bound = tonumber(A.start), tonumber(A.stop), tonumber(A.max_backlog)
local g = A.groups
if not from or not to or not bound or from < 0 or bound < 0 then bug('produce: bad start/stop/max_backlog') end
if #g % 5 ~= 0 or to - from ~= #g / 5 then bug('produce: stop - start must equal the number of groups') end
if not string.match(A.plan, '^[%w%-_.:]+$') then bug('produce: bad plan digest') end
local stored = redis.call('HGET', K.producers, A.producer)
local cursor, plan = 0, nil
if stored then
  local c, p = string.match(stored, '^(%d+)|(.*)$')
  if not c then bug('corrupt producer cursor for ' .. A.producer .. ': ' .. stored) end
  cursor, plan = tonumber(c), p
end
if plan and plan ~= A.plan then return {'plan_mismatch', plan} end
local counters = redis.call('HMGET', K.counters, 'retained', 'kept')
local backlog = redis.call('XLEN', K.src) - (tonumber(counters[1]) or 0) - (tonumber(counters[2]) or 0)
if cursor == to and from ~= to then return {'replay', to, backlog} end
if cursor ~= from then return {'cursor_moved', cursor} end
if bound > 0 and backlog + #g / 5 > bound and #g > 0 then return {'backlog_full', backlog, bound} end
local too_large = oversized_group(g, cfg.max_payload_bytes)
if too_large then return too_large end
local _, new = add_groups(g)
redis.call('HSET', K.producers, A.producer, to .. '|' .. A.plan)
return {'ok', new, to, backlog + new}
