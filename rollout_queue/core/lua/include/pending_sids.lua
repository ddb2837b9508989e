--[[
pending_sids: entry ID -> source_id of every entry `owner` holds in the PEL (at most `count`), read
with one XREADGROUP of the owner's history (ID 0), which returns the fields of pending entries. It
also counts as a delivery: each entry's delivery count goes up by one and its idle time restarts
(t_stream.c, streamReplyWithRangeFromConsumerPEL), so call it only on entries this script XACKs
right after, with nothing that can fail in between. An entry deleted from the stream maps to ''.
Uses: K.src. The owner must exist (it holds the entries), so XREADGROUP creates no consumer.
Why: commit deletes its members' stream entries, and record_settled needs their source_ids for
prune: one command for the whole lease instead of one XRANGE per member.
]]
local function pending_sids(owner, count)
  local sids = {}
  local r = redis.call('XREADGROUP', 'GROUP', 'rollout', owner, 'COUNT', count, 'STREAMS', K.src, '0')
  for _, stream in ipairs(r or {}) do
    for _, e in ipairs(stream[2]) do
      local sid = ''
      local kv = e[2] or {}
      for i = 1, #kv, 2 do
        if kv[i] == 'sid' then sid = kv[i + 1] end
      end
      sids[e[1]] = sid
    end
  end
  return sids
end
