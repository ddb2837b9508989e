-- @include call_batched
-- @include claim_counted
-- @include payloads
--[[
flush_completions: write a batch's pending completions: one XCLAIM to @done per distinct attempt,
one ZADD per buffer index and one HSET of the ledger, whatever the batch size (the payloads are
already in their keys: payloads.lua).
Uses: K.src, K.buffer, K.bufver, K.ledger and the token records (payloads.lua: record_tokens).
Why: per-member commands dominated complete's cost (benchmarks/README.md P3/P4). claim_counted's
RETRYCOUNT keeps each delivery count at the attempt the receipt named (only reserve raises it), as
complete's single-id XCLAIM did. Callers flush before anything reads these keys back (an overflow
victim, an entry named twice in one batch), so every completion sees what the completions before it
left, as if each had been its own complete call.
]]
local function flush_completions(b)
  claim_counted('@done', b.claims, false)
  if b.buffer[1] then
    call_batched({'ZADD', K.buffer}, b.buffer)  -- 1000 values a chunk: whole pairs
    call_batched({'ZADD', K.bufver}, b.bufver)
    call_batched({'HSET', K.ledger}, b.ledger)
    record_tokens(b.tokens)
  end
  b.claims, b.pending, b.tokens = {}, {}, {}
  b.buffer, b.bufver, b.ledger = {}, {}, {}
end
