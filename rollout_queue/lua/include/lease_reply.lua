-- @include pel_entry
-- @include read_entry
-- @include buffer_score
--[[
lease_reply: the members of a lease with their attempt, oldest sample version, completion payload and
pristine fields. Uses: K.src, K.results, K.bufver is NOT used (min_version is stored in the lease).
Why: lease and its replay (a retry with the same lease id) must answer identically.
]]
local function lease_reply(lease_id, deadline, version, members_csv, versions_csv)
  local items = {}
  local versions = {}
  for v in string.gmatch(versions_csv or '', '[^,]+') do table.insert(versions, v) end
  local i = 0
  for id in string.gmatch(members_csv or '', '[^,]+') do
    i = i + 1
    local _, count = pel_entry(id)
    local _, kv = read_entry(id)
    table.insert(items, {id, count or 0, versions[i] or '0', redis.call('HGET', K.results, id) or '', kv or {}})
  end
  return {'ok', lease_id, deadline, version, items}
end
