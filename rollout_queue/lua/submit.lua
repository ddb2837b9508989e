--[[
submit: new source groups -> backlog (one XADD each), idempotent by source_id.
KEYS:
  src        the reservations stream
  meta       config and counters
  ids        hash source_id -> entry ID
  wake_work  wake stream for blocked reservers
ARGV:
  *groups    5 values per group: source_id, n, parents JSON, body (orjson), schema version
Returns:
  {'ok', new_count, entry_id, ...}           one entry ID per group, in order
  {'payload_too_large', index, bytes, limit} nothing written
Invariant:
  each source_id maps to exactly one entry ID; a source_id already submitted stores nothing.
]]
-- @include load_config
-- @include wake
local cfg = load_config()
local g = A.groups
if #g % 5 ~= 0 then bug('submit takes 5 values per group, got ' .. #g) end
for i = 1, #g, 5 do
  local size = #g[i] + #g[i + 2] + #g[i + 3]
  if size > cfg.max_payload_bytes then
    return {'payload_too_large', (i - 1) / 5, size, cfg.max_payload_bytes}
  end
end
local out = {'ok', 0}
local new = 0
for i = 1, #g, 5 do
  local sid = g[i]
  local id = redis.call('HGET', K.ids, sid)
  if not id then
    id = redis.call('XADD', K.src, '*', 'v', g[i + 4], 'sid', sid, 'n', g[i + 1], 'p', g[i + 2], 'g', g[i + 3])
    redis.call('HSET', K.ids, sid, id)
    new = new + 1
  end
  table.insert(out, id)
end
if new > 0 then
  redis.call('HINCRBY', K.meta, 'submitted', new)
  wake(K.wake_work)
end
out[2] = new
return out
