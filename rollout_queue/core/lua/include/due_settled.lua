-- @include record_settled
--[[
due_settled: the oldest whole records of K.settled written at or before `cutoff` (ms), holding at most
`count` groups in all (at least one record). Returns the record IDs, the entry IDs and source_ids they
name (two aligned lists), and done = true when no due record is left after them.
Uses: K.settled. Why: a record holds 1 (filter) to SETTLED_CHUNK (commit) groups, so a fixed XRANGE
COUNT either reads records it cannot take (a page of 32 full records converted into Lua to use one:
~150 µs of a 270 µs call) or too few; pages are sized by the last record seen instead (one or two
XRANGEs when the sizes are alike), each starting after the previous one.
]]
local function due_settled(cutoff, count)
  local records, ids, sids, taken = {}, {}, {}, 0
  local start, size = '-', nil
  while true do
    local n = size and math.max(1, math.floor((count - taken) / size)) or 1
    local page = redis.call('XRANGE', K.settled, start, cutoff, 'COUNT', n)
    for _, e in ipairs(page) do
      local kv = e[2]
      if #records > 0 and taken + #kv / 2 > count then return records, ids, sids, false end
      table.insert(records, e[1])
      for i = 1, #kv - 1, 2 do
        table.insert(ids, kv[i])
        table.insert(sids, kv[i + 1])
      end
      taken, size, start = taken + #kv / 2, math.max(1, #kv / 2), '(' .. e[1]
    end
    if #page < n then return records, ids, sids, true end
    if taken >= count then return records, ids, sids, false end
  end
end
