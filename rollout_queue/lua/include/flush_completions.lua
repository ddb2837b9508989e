-- @include call_batched
--[[
flush_completions: write a batch's pending completions: one XCLAIM to @done per distinct attempt,
one ZADD per buffer index, one HSET of results and one of the ledger, whatever the batch size.
Uses: K.src, K.buffer, K.bufver, K.results, K.ledger.
Why: per-member commands dominated complete's cost (benchmarks/README.md P3/P4). RETRYCOUNT sets the
delivery count to the attempt the receipt named (only reserve raises it), as complete's single-id
XCLAIM did. Callers flush before anything reads these keys back (an overflow victim, an entry named
twice in one batch), so every completion sees what the completions before it left, as if each had
been its own complete call.
]]
local function flush_completions(b)
  for _, attempt in ipairs(b.attempts) do
    local ids = b.claims[attempt]
    for start = 1, #ids, 1000 do  -- chunked like call_batched: unpack() has a C-stack limit
      local args = {'XCLAIM', K.src, 'rollout', '@done', 0}
      for i = start, math.min(#ids, start + 999) do table.insert(args, ids[i]) end
      table.insert(args, 'RETRYCOUNT')
      table.insert(args, attempt)
      table.insert(args, 'JUSTID')
      redis.call(unpack(args))
    end
  end
  if b.buffer[1] then
    call_batched({'ZADD', K.buffer}, b.buffer)  -- 1000 values a chunk: whole pairs
    call_batched({'ZADD', K.bufver}, b.bufver)
    call_batched({'HSET', K.results}, b.results)
    call_batched({'HSET', K.ledger}, b.ledger)
  end
  b.attempts, b.claims, b.pending = {}, {}, {}
  b.buffer, b.bufver, b.results, b.ledger = {}, {}, {}, {}
end
