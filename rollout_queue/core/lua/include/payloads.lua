-- @include call_batched
-- @include pel_entry
-- @include hmget_many
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
Token accounting (DESIGN, Token accounting) lives beside the payload and has its lifetime: the
`tokens` hash (built from K.meta's prefix) holds '<entry ID>:<attempt>' -> the completion's
token count, written when a completion is adopted into the buffer (record_tokens) and read and
deleted by the same drop that deletes the payload. A drop that names a `reason` (the adopted
completion is trained or thrown away) adds those tokens to counters.tokens_<reason>; a drop without
one only deletes payloads staged and never adopted, which have no token record. So no settlement can
leave a record behind that its payload did not also leave.
]]
local PAYLOAD_PREFIX = string.sub(K.meta, 1, -5) .. 'payload:'
local TOKENS_KEY = string.sub(K.meta, 1, -5) .. 'tokens'
local function payload_key(id, attempt)
  return PAYLOAD_PREFIX .. id .. ':' .. attempt
end
-- record_tokens: flat '<id>:<attempt>', count pairs of adopted completions (one HSET per batch).
local function record_tokens(items)
  call_batched({'HSET', TOKENS_KEY}, items)
end
local function drop_payloads(entries, reason)
  local keys, fields = {}, {}
  for i, e in ipairs(entries) do
    keys[i] = payload_key(e.id, e.attempt)
    fields[i] = e.id .. ':' .. e.attempt
  end
  call_batched({'DEL'}, keys)
  if not reason or not fields[1] then return end
  local tokens = 0
  for _, n in ipairs(hmget_many(TOKENS_KEY, fields)) do tokens = tokens + (tonumber(n) or 0) end
  call_batched({'HDEL', TOKENS_KEY}, fields)
  if tokens > 0 then redis.call('HINCRBY', K.counters, 'tokens_' .. reason, tokens) end
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
