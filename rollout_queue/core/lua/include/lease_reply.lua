-- @include owned_counts
-- @include read_entry
--[[
lease_reply: the members of a lease with their attempt, oldest sample version and pristine fields.
Uses: K.src (min_version is stored in the lease record, not read from bufver).
Why: lease and its replay (a retry with the same lease id) must answer identically. `counts` (id ->
delivery count) comes from lease, which read the PEL while walking the buffer; the replay passes nil
and reads the counts from the PEL entries of @lease:<lease_id> (one XPENDING). The completion
payloads are not in the reply: the client reads them with one MGET of their payload keys after the script
(returning ~30 KB per member from Lua cost more than the rest of the lease). The pristine fields stay
one XRANGE per member (a stream has no multi-id read).
]]
local function lease_reply(lease_id, deadline, version, members_csv, versions_csv, counts)
  local ids, versions = {}, {}
  for id in string.gmatch(members_csv or '', '[^,]+') do table.insert(ids, id) end
  for v in string.gmatch(versions_csv or '', '[^,]+') do table.insert(versions, v) end
  counts = counts or owned_counts(ids, '@lease:' .. lease_id)
  local items = {}
  for i, id in ipairs(ids) do
    local _, kv = read_entry(id)
    table.insert(items, {id, counts[id] or 0, versions[i] or '0', kv or {}})
  end
  return {'ok', lease_id, deadline, version, items}
end
