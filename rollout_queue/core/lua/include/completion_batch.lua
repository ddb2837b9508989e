-- @include now_ms
--[[
completion_batch / batch_now: what one script call's completions still have to write, and its clock.
Uses: nothing by itself (flush_completions and write_completion_counters apply it; batch_now calls
TIME). Why: complete_many settles a worker's batch with one multi-member command per key and one
counters write instead of ~12 commands per completion (benchmarks/README.md P4); complete runs the
same code as a batch of one. The server clock is read only when a requeue records it in the history:
the common path never needs it, and TIME is one more command.
]]
local function completion_batch()
  return {
    claims = {},     -- {id, attempt} of each pending completion, to give to @done (claim_counted)
    buffer = {}, bufver = {}, ledger = {},  -- flat score/member or field/value lists
    pending = {},    -- entry ID -> true while its writes wait in this batch
    tokens = {},     -- flat '<id>:<attempt>', token count pairs of the pending completions (record_tokens)
    delta = {arrivals = 0, completed_total = 0, executing_groups = 0, executing_samples = 0, tokens_generated = 0},
    base = nil,      -- those counters as read from K.counters (read_completion_counters)
    dirty = false,   -- another helper moved executing_* after that read: read again before writing
    size = nil,      -- the buffer's size counting the pending completions (one ZCARD, when needed)
    released = false, buffered = false, now = nil,
  }
end
local function batch_now(b)
  if not b.now then b.now = now_ms() end
  return b.now
end
