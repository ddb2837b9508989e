--[[
hmget_many: the values of `fields` in hash `key`, in order (false where absent), in one HMGET per
1000 fields; with `command` 'ZMSCORE', the scores of members `fields` of sorted set `key` (the same
shape of reply). Uses: nothing but its arguments.
Why: one command instead of one HGET per member (submit's source_id lookups, attempt histories,
the errored-lease marks of a rollback batch); chunked so unpack() stays far below Lua's C-stack limit.
]]
local function hmget_many(key, fields, command)
  local out = {}
  for start = 1, #fields, 1000 do
    local part = redis.call(command or 'HMGET', key, unpack(fields, start, math.min(#fields, start + 999)))
    for _, v in ipairs(part) do table.insert(out, v) end
  end
  return out
end
