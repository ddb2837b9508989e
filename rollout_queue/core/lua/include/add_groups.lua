--[[
add_groups: backlog source groups (one XADD each); a source_id already submitted adds nothing.
Uses: K.src, K.ids, K.intake, K.wake_work (not K.meta: the producer's ACL role may only read meta). g holds 5 values per group: source_id, n, parents JSON,
body (orjson), schema version; check it with oversized_group first (this helper writes).
Why: every path that adds groups (submit, produce) must keep one rule, "a source_id maps to exactly
one entry ID", so a group enqueued twice by two paths (or a producer restarted) is stored once.
The known source_ids are read with one HMGET and the new pairs written with one HSET (instead of an
HGET and an HSET per group); a source_id named twice in one batch gets the entry its first mention
added, as if each group were added in turn.
Returns the entry IDs in order and how many were new.
]]
-- @include wake
-- @include hmget_many
-- @include call_batched
local function add_groups(g)
  local sids = {}
  for i = 1, #g, 5 do table.insert(sids, g[i]) end
  local known = hmget_many(K.ids, sids)
  local ids, added, pairs_, new = {}, {}, {}, 0
  for j, sid in ipairs(sids) do
    local id = known[j] or added[sid]
    if not id then
      local i = 5 * (j - 1) + 1
      id = redis.call('XADD', K.src, '*', 'v', g[i + 4], 'sid', sid, 'n', g[i + 1], 'p', g[i + 2], 'g', g[i + 3])
      added[sid] = id
      table.insert(pairs_, sid)
      table.insert(pairs_, id)
      new = new + 1
    end
    table.insert(ids, id)
  end
  if new > 0 then
    call_batched({'HSET', K.ids}, pairs_)  -- chunks of 1000 items: whole pairs, since 1000 is even
    redis.call('HINCRBY', K.intake, 'submitted', new)
    wake(K.wake_work)
  end
  return ids, new
end
