-- @include hmget_many
-- @include call_batched
--[[
append_histories: record why each of a batch of attempts ended without a completion (all ended by
one owner, with one terminal and reason), in one HMGET and one HSET of K.history.
Sets on each record e: e.failures (its counted failures now) and, when `dead_at` is given and they
reach it (or the caller already set e.dies: a group dead-lettered for another bound, such as
max_attempts errored leases), e.dead = true and e.history = the JSON list of its attempts for the
dead letter. A dying
entry's history is written back too: it is kept after settlement until prune (issue 12 item 7: a
settlement retried after later attempts still finds its own). `e.c`, when set, is the worker whose
completion this attempt was (the group is requeued from @done, a lease or a restore), so a retried
complete of it answers 'replay' (replayed.lua).
Uses: K.history (entry id -> JSON {"f": counted failures, "h": last 32 attempts, "s": evictions for
staleness, absent while none: stale_protected}).
Why: DESIGN rule 4, failed/malformed/lost attempts count toward max_attempts and every attempt's
reason reaches the dead letter, so each entry's record is kept. The count is kept apart from the
capped list so capping never resets it. Most entries have no history yet (a first attempt): their
value is built by concatenation around the batch's one encoded record tail, so cjson runs only for
entries that already have a history (decode, append, encode once).
]]
local HISTORY_CAP = 32
local function append_histories(entries, worker, terminal, reason, counted, dead_at, now)
  local ids = {}
  for i, e in ipairs(entries) do ids[i] = e.id end
  local raws = hmget_many(K.history, ids)
  -- One record's fields after "a"; numbers print as cjson prints them (%.14g, exact for ms times).
  local tail = ',"w":' .. cjson.encode(worker) .. ',"t":' .. cjson.encode(terminal) .. ',"r":'
    .. cjson.encode(reason) .. ',"ms":' .. now .. '}'
  local writes = {}
  local stale = reason == 'stale'  -- the fairness rule's count, "s" (stale_protected)
  for i, e in ipairs(entries) do
    local h = nil
    if raws[i] then
      local ok, d = pcall(cjson.decode, raws[i])
      if ok and type(d) == 'table' then h = d end
    end
    local value, dying = nil, nil
    if h == nil then
      e.failures = counted and 1 or 0
      local record = '{"a":' .. e.attempt .. (e.c and (',"c":' .. cjson.encode(e.c)) or '') .. tail
      if e.dies or (dead_at and e.failures >= dead_at) then dying = '[' .. record .. ']' end
      value = '{' .. (stale and '"s":1,' or '') .. '"f":' .. e.failures .. ',"h":[' .. record .. ']}'
    else
      if type(h.h) ~= 'table' then h.h = {} end
      local f = tonumber(h.f) or 0
      if f ~= f or f == math.huge or f == -math.huge then f = 0 end  -- garbage: a NaN or infinite count
      h.f = f + (counted and 1 or 0)
      if stale then h.s = (tonumber(h.s) or 0) + 1 end
      e.failures = h.f
      table.insert(h.h, {a = e.attempt, w = worker, t = terminal, r = reason, ms = now, c = e.c})
      while #h.h > HISTORY_CAP do table.remove(h.h, 1) end
      local ok, encoded = pcall(cjson.encode, h)
      if not ok then  -- garbage that decodes but cannot encode (a number past 1e308): keep the count
        h = {f = h.f, s = tonumber(h.s), h = {h.h[#h.h]}}
        encoded = cjson.encode(h)
      end
      if e.dies or (dead_at and e.failures >= dead_at) then dying = cjson.encode(h.h) end
      value = encoded
    end
    e.dead, e.history = dying ~= nil, dying
    if value then
      table.insert(writes, e.id)
      table.insert(writes, value)
    end
  end
  if #writes > 0 then call_batched({'HSET', K.history}, writes) end
end
