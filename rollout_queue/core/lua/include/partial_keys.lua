--[[
partial_keys / partial_head: where the progress records of unfinished attempts live (partial
rollouts), and how a record's head reads.
PARTIAL_KEY (keys.py role `partial`): entry ID -> the record, what the next attempt continues from
(codec.encode_partial: the samples so far, as a completion blob); the scripts never look inside it.
PARTIAL_HEAD_KEY (role `partial_head`): entry ID -> 'attempt|tokens|min_version|bytes|worker', the
attempt that wrote the record, its token count, its oldest policy version and its length, which
scripts read without copying the record. Both are built from K.meta's prefix (same hash tag, same
slot), as payloads.lua builds the payload keys, so the settlement scripts that drop records need no
new KEYS. Uses: K.meta.
Why a head apart from the record: reserve judges and counts up to 64 records per call, and copying
records of up to max_partial_bytes into Lua would hold Redis for the copy (DESIGN: bounded scripts).
partial_head(raw) -> {attempt, tokens, min_version, bytes, worker}, or nil for an absent or garbage head.
]]
-- Each spelled out from K.meta's prefix, the one shape ops/script_access.py reads to grant per key.
local PARTIAL_KEY = string.sub(K.meta, 1, -5) .. 'partial'
local PARTIAL_HEAD_KEY = string.sub(K.meta, 1, -5) .. 'partial:head'
local function partial_head(raw)
  if not raw then return nil end
  local a, t, v, b, w = string.match(raw, '^(%d+)|(%d+)|(%d+)|(%d+)|(.+)$')
  if not a then return nil end
  return {attempt = tonumber(a), tokens = tonumber(t), min_version = tonumber(v), bytes = tonumber(b), worker = w}
end
