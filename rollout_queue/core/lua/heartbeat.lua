--[[
heartbeat: refresh a worker's liveness; read the policy version and admission state it must follow.
KEYS:
  workers    worker ids by last heartbeat
  holds      admission hold ids by deadline
  progress   worker id -> its own counts: groups|tokens|uptime_ms|server_ms[|sample_tokens|sample_seconds]
READS:
  meta       config, policy version (read only: the worker role may not write meta)
  counters   counters (read only: load_config checks they are integers)
ARGV:
  worker_id  the worker
  groups     groups it completed since its process started ('': it reports no progress)
  tokens     tokens it generated since then
  uptime_ms  how long its process has run
  sample_tokens   its samples per length bucket since then, comma-joined counts ('': none reported)
  sample_seconds  its samples per duration bucket since then, comma-joined counts ('': none reported)
Returns:
  {'ok', version, version_published 0|1, weights_uri, held 0|1, server_ms}
Invariant:
  the worker's score in workers is the server time of its last heartbeat; the reaper treats it as
  lost only after worker_timeout without one. A progress line exists only for a registered worker
  (reaping and close_worker delete it with the registration), so the hash is bounded by the fleet.
  A progress line is one short value: three counts of at most 16 digits, a time, and two count lists
  of at most MAX_BUCKETS counts each, so a heartbeat's work is bounded whatever its ARGV. A line
  without count lists keeps the four-field form older clients wrote.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include hold_active
--: Most counts one list may hold (the library's bucket edges give 13; the buckets themselves are
--: the client's, core/histograms.py), and the largest count (2^53 - 1, exact in a Lua number).
local MAX_BUCKETS, MAX_DIGITS, MAX_COUNT = 64, 16, 9007199254740991

local function count(raw, what)
  local n = #raw <= MAX_DIGITS and string.match(raw, '^%d+$') and tonumber(raw)
  if not n or n > MAX_COUNT then bug('bad progress ' .. what .. ': ' .. string.sub(raw, 1, 40)) end
  return n
end

-- A comma-joined count list, checked and written back canonically ('' stays ''). Its length is
-- checked before anything else looks at it: a huge ARGV costs one comparison.
local function counts(raw, what)
  if raw == '' then return '' end
  if #raw > MAX_BUCKETS * (MAX_DIGITS + 1) then bug('bad progress ' .. what .. ': too long') end
  if not string.match(raw, '^%d[%d,]*$') or string.sub(raw, -1) == ',' or string.find(raw, ',,', 1, true) then
    bug('bad progress ' .. what .. ': not comma-joined counts')
  end
  local out = {}
  for c in string.gmatch(raw, '%d+') do
    if #out == MAX_BUCKETS then bug('bad progress ' .. what .. ': more than ' .. MAX_BUCKETS .. ' counts') end
    out[#out + 1] = string.format('%d', count(c, what))
  end
  return table.concat(out, ',')
end

local now = now_ms()
local cfg = load_config()
if A.worker_id == '' or string.sub(A.worker_id, 1, 1) == '@' then bug('bad worker id') end
redis.call('ZADD', K.workers, now, A.worker_id)
if A.groups ~= '' then
  local g, t, up = count(A.groups, 'groups'), count(A.tokens, 'tokens'), count(A.uptime_ms, 'uptime_ms')
  local line = string.format('%d|%d|%d|%d', g, t, up, now)
  local lengths, durations = counts(A.sample_tokens, 'sample_tokens'), counts(A.sample_seconds, 'sample_seconds')
  if lengths ~= '' or durations ~= '' then line = line .. '|' .. lengths .. '|' .. durations end
  redis.call('HSET', K.progress, A.worker_id, line)
elseif A.tokens ~= '' or A.uptime_ms ~= '' or A.sample_tokens ~= '' or A.sample_seconds ~= '' then
  bug('bad progress: counts without groups')
end
local uri = redis.call('HGET', K.meta, 'weights_uri') or ''
return {'ok', cfg.version_eff, cfg.has_version and 1 or 0, uri, hold_active(due_now(cfg, now)) and 1 or 0, now}
