-- @include call_batched
-- @include pel_entry
--[[
payload_key / drop_payloads: where an attempt's completion payload lives, and its removal.
The key is rollout:{q}:payload:<entry ID>:<attempt> (keys.py QueueKeys.payload spells it the same),
built from K.meta's prefix (same hash tag, same slot). The worker writes it with SET NX in the same
MULTI as the complete / complete_many call that adopts it (transport.py: a Call's `stage`), so the
payload never passes through ARGV into Lua and out again into a hash: Redis copies it once, from the
socket into the key (benchmarks/README.md P1). MULTI makes the SET and the script one step: no
client can die between them, so a staged key without its script call (a leak) cannot happen that
way. Named by the receipt's attempt, a stale worker's staged payload never lands on the live one,
and NX keeps a resent call (a replay) from replacing the payload it already handed in.
Uses: K.meta. Why: the payload is kept exactly while its group is buffered or leased (the attempt
is the entry's PEL delivery count there: @done and @lease claims keep it), and deleted by whatever
ends that: commit, eviction, rollback and expiry (`entries` are {id =, attempt =} records); a complete
call that refuses it, and every end of an executing attempt (end_attempts, filter, reject), delete
one that was staged but never adopted.
]]
local PAYLOAD_PREFIX = string.sub(K.meta, 1, -5) .. 'payload:'
local function payload_key(id, attempt)
  return PAYLOAD_PREFIX .. id .. ':' .. attempt
end
local function drop_payloads(entries)
  local keys = {}
  for i, e in ipairs(entries) do keys[i] = payload_key(e.id, e.attempt) end
  call_batched({'DEL'}, keys)
end

-- Whether an entry whose PEL owner and delivery count are these is buffered or leased under
-- `attempt`: its payload key is then the live one (payload_live reads them itself).
local function holds_payload(owner, count, attempt)
  return count ~= nil and count == attempt and (owner == '@done' or string.sub(owner or '', 1, 7) == '@lease:')
end
local function payload_live(id, attempt)
  local owner, count = pel_entry(id)
  return holds_payload(owner, count, tonumber(attempt))
end

-- parse_staged(parse, named): run `parse` (the call's argument checks, before its first write); if
-- it raises, delete the payloads the call's transaction staged (`named`: {entry ID, attempt} as the
-- client spelt them in ARGV, the names it staged under), except live ones, then raise the same
-- error. A call refused for a bad argument thus leaves no bytes that a later completion of the same
-- attempt would find under NX and adopt in place of its own.
local function parse_staged(parse, named)
  local ok, err = pcall(parse)
  if ok then return end
  for _, n in ipairs(named) do
    if n[1] and n[2] and not payload_live(n[1], n[2]) then redis.call('DEL', payload_key(n[1], n[2])) end
  end
  error(err)
end
