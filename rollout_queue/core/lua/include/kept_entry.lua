-- @include pel_entry
-- @include last_delivered
--[[
kept_entry: the entry's pristine field list (truthy) when `id` is a committed entry whose payload
is kept: a stream ID that is still in the stream, was delivered (at or before the consumer group's
cursor `last`) and is pending nowhere; false otherwise. (checkpoint reads the source_id from it.)
Only commit(step) leaves an entry so (dead and filtered entries are XDELed, live ones are pending,
the backlog is after the cursor). Uses: K.src. Why: checkpoint deletes kept payloads and restore
re-owns them with XCLAIM FORCE; a member written into K.kept by hand must make neither delete the
payload of a live group nor steal it from its owner.
]]
local function stream_id_le(a, b)
  local ams, aseq = string.match(a, '^(%d+)%-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)%-(%d+)$')
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams < bms or (ams == bms and aseq <= bseq)
end
local function kept_entry(id, last)
  if not string.match(id, '^%d+%-%d+$') or pel_entry(id) ~= nil or not stream_id_le(id, last) then
    return false
  end
  local e = redis.call('XRANGE', K.src, id, id)[1]
  return e ~= nil and e[2]
end
