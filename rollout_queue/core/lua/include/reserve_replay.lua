-- @include pel_entry
-- @include read_entry
-- @include wake
--[[
reserve_replay: the reply of a reserve call resent with the request id of `worker`'s last call, or
nil when `request_id` is '' or names another call (then grant as usual). Replays {entry_id, attempt,
fields} for each entry that call granted and the worker still owns; when none is left, answers
'empty' with a wake ID. `version`, `published`: the reply's version fields.
Uses: K.reserves, K.src, K.wake_work. Why: a reserve whose reply was lost on the wire is resent
with the same request id; granting again would give the worker work it is not executing (it never
saw the first grants). An empty replay carries a wake ID, so a blocking caller waits from here
instead of missing a wake. Writes nothing.
]]
local function reserve_replay(worker, request_id, version, published)
  if request_id == '' then return nil end
  local prev = redis.call('HGET', K.reserves, worker)
  local rid, rest = string.match(prev or '', '^([^|]*)|(.*)$')
  if rid ~= request_id then return nil end
  local grants = {}
  for id in string.gmatch(rest, '[^,]+') do
    local owner, count = pel_entry(id)
    local _, kv = read_entry(id)
    if owner == worker and kv then table.insert(grants, {id, count, kv}) end
  end
  if grants[1] then return {'ok', version, published, '', 0, grants} end
  return {'empty', version, published, wake_id(K.wake_work), 0, {}}
end
