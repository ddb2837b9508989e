--[[
validate_reservation: nil when the stream fields form a well-formed group, else a reason string.
Why: DESIGN rule 3, a reservation without exactly n parents with complete, unique identities is
settled dead (malformed_reservation) before any worker sees it, so garbage written into the stream
never crashes a worker and never blocks the entries behind it. Only the parents field is decoded;
the body is the worker's to decode (the client dead-letters it if it is not valid orjson).
]]
local SCHEMA_VERSION = '1'
local MAX_PARENTS = 65536
local function validate_reservation(f, cfg)
  if f == nil then return 'malformed_reservation: entry vanished' end
  if f.v ~= SCHEMA_VERSION then return 'malformed_reservation: unknown schema version ' .. tostring(f.v) end
  if type(f.sid) ~= 'string' or f.sid == '' then return 'malformed_reservation: no source_id' end
  if type(f.g) ~= 'string' then return 'malformed_reservation: no body' end
  local n = tonumber(f.n)
  if not n or n < 1 or n > MAX_PARENTS or n ~= math.floor(n) then
    return 'malformed_reservation: bad parent count ' .. tostring(f.n)
  end
  local ok, parents = pcall(cjson.decode, f.p or '')
  if not ok or type(parents) ~= 'table' then return 'malformed_reservation: parents are not a JSON list' end
  if #parents ~= n then return 'malformed_reservation: ' .. #parents .. ' parents for n=' .. n end
  local slots, uids = {}, {}
  for i = 1, #parents do
    local p = parents[i]
    if type(p) ~= 'table' then return 'malformed_reservation: parent ' .. i .. ' is not an object' end
    local s, uid = p.slot, p.uid
    if type(s) ~= 'number' or s < 0 or s >= n or s ~= math.floor(s) then
      return 'malformed_reservation: bad slot ' .. tostring(s)
    end
    if type(uid) ~= 'string' or uid == '' then return 'malformed_reservation: parent without uid' end
    if slots[s] or uids[uid] then return 'malformed_reservation: duplicate parent identity' end
    slots[s] = true
    uids[uid] = true
  end
  if n > cfg.max_executing_samples then
    return 'malformed_reservation: n=' .. n .. ' exceeds max_executing_samples=' .. cfg.max_executing_samples
  end
  return nil
end
