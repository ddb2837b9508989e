--[[
hmget_many / zmscore_many: the values of `fields` in hash `key` (one HMGET per 1000 fields), or the
scores of `members` in sorted set `key` (one ZMSCORE per 1000), in order, false where absent.
Uses: nothing but its arguments.
Why: one command instead of one HGET per member (submit's source_id lookups, attempt histories,
the errored-lease marks of a rollback batch); chunked so unpack() stays far below Lua's C-stack limit.
Each command is spelt at its call, with its key, so acl.py's reader (ops/script_access.py) grants it
on the keys it is used on and no other.
]]
local function hmget_many(key, fields)
  local out = {}
  for start = 1, #fields, 1000 do
    local part = redis.call('HMGET', key, unpack(fields, start, math.min(#fields, start + 999)))
    for _, v in ipairs(part) do table.insert(out, v) end
  end
  return out
end
local function zmscore_many(key, members)
  local out = {}
  for start = 1, #members, 1000 do
    local part = redis.call('ZMSCORE', key, unpack(members, start, math.min(#members, start + 999)))
    for _, v in ipairs(part) do table.insert(out, v) end
  end
  return out
end
