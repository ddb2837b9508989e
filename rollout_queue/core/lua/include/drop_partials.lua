-- @include partial_keys
-- @include hmget_many
-- @include call_batched
--[[
drop_partials: forget the progress records of `ids` (entry IDs; those without one are skipped) and
return how many there were. One HLEN when no record exists at all (the common case), else one HMGET
of the heads and one HDEL per hash.
Uses: K.meta (partial_keys), K.counters (partial_bytes goes down by the recorded lengths; a garbage
head counts 0).
Why: a record is attached to an entry only while the entry is unsettled and its group unfinished:
complete drops it (the completion holds every token the record had, and a later requeue of that
completion, stale or rolled back, must start from the prompt, not from an older prefix), and so does
every settlement of an executing or ready entry (filter and every dead letter, both parked through
park_many). Commit needs none: a committed group was completed, and only a receipt's owner
writes a record (save_partial, abort), never for a completed or leased entry.
]]
local function drop_partials(ids)
  if #ids == 0 or redis.call('HLEN', PARTIAL_HEAD_KEY) == 0 then return 0 end
  local heads = hmget_many(PARTIAL_HEAD_KEY, ids)
  local gone, bytes = {}, 0
  for i, raw in ipairs(heads) do
    if raw then
      table.insert(gone, ids[i])
      local h = partial_head(raw)
      bytes = bytes + (h and h.bytes or 0)
    end
  end
  if #gone == 0 then return 0 end
  call_batched({'HDEL', PARTIAL_KEY}, gone)
  call_batched({'HDEL', PARTIAL_HEAD_KEY}, gone)
  if bytes > 0 then redis.call('HINCRBY', K.counters, 'partial_bytes', -bytes) end
  return #gone
end
