--[[
claim_counted: give entries to one of the queue's own owners (@ready ...) with their delivery counts
unchanged: one XCLAIM ... RETRYCOUNT <count> per distinct count (chunks of 1000 ids). With `bodies`,
JUSTID is left out and each claimed record gets e.kv = its pristine field list (false when the entry
is gone from the stream: XCLAIM drops such an id from the PEL and does not return it). Returns how
many entries were claimed (those gone from the stream are not).
Uses: K.src. Why: the attempt a receipt names is the PEL delivery count, and only reserve raises it
(docs/DESIGN.md, attempt numbers): RETRYCOUNT sets each count to what it was, so neither form raises
it. A batch of a silent worker's entries mostly shares one count, so this is one command for the
batch instead of one per entry, and the bodies come back with it instead of one XRANGE per entry.
]]
local function claim_counted(owner, entries, bodies)
  local by_count, counts, claimed_n = {}, {}, 0
  for _, e in ipairs(entries) do
    local group = by_count[e.attempt]
    if not group then
      group = {}
      by_count[e.attempt] = group
      table.insert(counts, e.attempt)
    end
    table.insert(group, e)
  end
  for _, count in ipairs(counts) do
    local group = by_count[count]
    for start = 1, #group, 1000 do
      local args = {'XCLAIM', K.src, 'rollout', owner, 0}
      local by_id = {}
      for i = start, math.min(#group, start + 999) do
        table.insert(args, group[i].id)
        by_id[group[i].id] = group[i]
      end
      table.insert(args, 'RETRYCOUNT')
      table.insert(args, count)
      if not bodies then table.insert(args, 'JUSTID') end
      local claimed = redis.call(unpack(args))
      claimed_n = claimed_n + #claimed
      if bodies then
        for _, e in pairs(by_id) do e.kv = false end
        for _, c in ipairs(claimed) do by_id[c[1]].kv = c[2] end
      end
    end
  end
  return claimed_n
end
