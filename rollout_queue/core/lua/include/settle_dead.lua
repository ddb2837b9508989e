-- @include ledger
-- @include settle_dead_many
--[[
settle_dead: PEL (any owner) -> settled(dead) for one entry: XACK, XDEL, one dlq entry with the
reason, the attempt history and the pristine fields (prefixed f:).
Uses: K.src, K.dlq, K.history, K.ledger, K.meta. The caller has already released any executing or
buffer capacity the entry held; this releases the retained slot (DESIGN: settlement only).
Why: reject and reserve dead-letter one entry at a time; a batch of one of settle_dead_many, so
the dead letter is written by one piece of code.
Also includes ledger for the scripts that reach it through this file.
]]
local function settle_dead(id, kv, reason, history_json, attempt, worker, now)
  settle_dead_many({{id = id, kv = kv, history = history_json, attempt = attempt}}, reason, worker, now)
end
