-- @include pel_entry
--[[
owned_counts: id -> PEL delivery count for each of `ids` the PEL gives to `owner`; the others are
absent from the table.
Uses: K.src. Why: one XPENDING over the ids' span, filtered by owner, replaces one XPENDING per id
(lease paid three per member). The span may hold other entries of the same owner: when the reply is
cut at its limit, each id it did not list is asked alone (pel_entry), and so is an id that is not
in the canonical <ms>-<seq> form (no leading zero, at most 15 digits a part, so tonumber orders it
exactly); the answer is exact whatever else the owner holds.
]]
local function canonical_id(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  if not ms or #ms > 15 or #seq > 15 then return nil, nil end
  if (#ms > 1 and string.sub(ms, 1, 1) == '0') or (#seq > 1 and string.sub(seq, 1, 1) == '0') then return nil, nil end
  return tonumber(ms), tonumber(seq)
end

local function owned_counts(ids, owner)
  local counts, span, alone = {}, {}, {}
  local lo, hi
  for _, id in ipairs(ids) do
    local ms, seq = canonical_id(id)
    if ms then
      local s = {id, ms, seq}
      table.insert(span, s)
      if not lo or ms < lo[2] or (ms == lo[2] and seq < lo[3]) then lo = s end
      if not hi or ms > hi[2] or (ms == hi[2] and seq > hi[3]) then hi = s end
    else
      table.insert(alone, id)
    end
  end
  if lo then
    local limit = 2 * #span + 16
    local r = redis.call('XPENDING', K.src, 'rollout', lo[1], hi[1], limit, owner)
    for _, e in ipairs(r) do counts[e[1]] = tonumber(e[4]) end
    if #r >= limit then
      for _, s in ipairs(span) do
        if not counts[s[1]] then table.insert(alone, s[1]) end
      end
    end
  end
  for _, id in ipairs(alone) do
    local o, c = pel_entry(id)
    if o == owner then counts[id] = c end
  end
  return counts
end
