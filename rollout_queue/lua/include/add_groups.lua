--[[
add_groups: backlog source groups (one XADD each); a source_id already submitted adds nothing.
Uses: K.src, K.ids, K.meta, K.wake_work. g holds 5 values per group: source_id, n, parents JSON,
body (orjson), schema version; check it with oversized_group first (this helper writes).
Why: every path that adds groups (submit, produce) must keep one rule, "a source_id maps to exactly
one entry ID", so a group enqueued twice by two paths (or a producer restarted) is stored once.
Returns the entry IDs in order and how many were new.
]]
-- @include wake
local function add_groups(g)
  local ids, new = {}, 0
  for i = 1, #g, 5 do
    local sid = g[i]
    local id = redis.call('HGET', K.ids, sid)
    if not id then
      id = redis.call('XADD', K.src, '*', 'v', g[i + 4], 'sid', sid, 'n', g[i + 1], 'p', g[i + 2], 'g', g[i + 3])
      redis.call('HSET', K.ids, sid, id)
      new = new + 1
    end
    table.insert(ids, id)
  end
  if new > 0 then
    redis.call('HINCRBY', K.meta, 'submitted', new)
    wake(K.wake_work)
  end
  return ids, new
end
