--[[
append_history: record why an attempt ended without a completion; returns (counted failures, history).
Uses: K.history (entry id -> JSON {f = counted failures, h = last 32 attempts}).
Why: DESIGN rule 4, failed/malformed/lost attempts count toward max_attempts and every attempt's reason
reaches the dead letter. The count is kept apart from the capped list so capping never resets it.
]]
local HISTORY_CAP = 32
local function append_history(id, attempt, worker, terminal, reason, counted, now)
  local raw = redis.call('HGET', K.history, id)
  local h = nil
  if raw then
    local ok, d = pcall(cjson.decode, raw)
    if ok and type(d) == 'table' then h = d end
  end
  if h == nil then h = {f = 0, h = {}} end
  if type(h.h) ~= 'table' then h.h = {} end
  h.f = tonumber(h.f) or 0
  if counted then h.f = h.f + 1 end
  table.insert(h.h, {a = attempt, w = worker, t = terminal, r = reason, ms = now})
  while #h.h > HISTORY_CAP do table.remove(h.h, 1) end
  local encoded = cjson.encode(h)
  redis.call('HSET', K.history, id, encoded)
  return h.f, cjson.encode(h.h)
end
