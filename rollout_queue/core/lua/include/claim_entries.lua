--[[
claim_entries: give pending entries to one of the queue's own owners (@ready, @done, @lease:<id>),
each keeping its delivery count. Returns the set of the ids claimed.
Uses: K.src. Why: the attempt a receipt names is the PEL delivery count, and only reserve raises it.
XCLAIM with JUSTID and no RETRYCOUNT leaves every count as it is (t_stream.c xclaimCommand:
"autoincrement unless JUSTID option provided"; tests/contract/test_lease.py checks it on redis and
valkey), so one command moves members of different counts. An entry deleted from the stream is
dropped from the PEL by XCLAIM (Redis >= 7.0) and is not in the set. Chunks of 1000 ids keep
unpack() far below Lua's C-stack limit.
]]
local function claim_entries(owner, ids)
  local claimed = {}
  for start = 1, #ids, 1000 do
    local args = {'XCLAIM', K.src, 'rollout', owner, 0}
    for i = start, math.min(#ids, start + 999) do table.insert(args, ids[i]) end
    table.insert(args, 'JUSTID')
    for _, id in ipairs(redis.call(unpack(args))) do claimed[id] = true end
  end
  return claimed
end
