-- @include receipt_refusal
-- @include replayed
-- @include ledger_settled
-- @include read_entry
-- @include check_slots
-- @include end_attempt
-- @include completion_batch
-- @include flush_completions
-- @include buffer_completion
-- @include payloads
--[[
complete_attempt: settle one completion named by a receipt, inside a batch, exactly as a complete
call of its own would. Returns complete's reply for it (see complete.lua's header).
Uses: K.src, K.ledger and what end_attempt, buffer_completion use. `slots` '' means no outputs at all:
the attempt ends malformed as fail(terminal='malformed') ends it (the reason and the replay rule of
flows.complete's empty-completion path), so complete_many needs no second call for it; nothing was
staged for it. Otherwise the payload (`size` bytes, as the client counted them) was staged at
payload_key(id, attempt) in the same MULTI with SET NX, which never replaces a key: buffered, the
payload stays there; refused, the key is deleted, unless the entry is buffered or leased under this
very attempt (a replay, or a receipt forged with another worker's name): that key is the live
payload, and the NX left it as it was.
Why: DESIGN rule 1 (exact receipts: a stale one changes nothing), rule 3 (outputs must fit the group,
else the attempt ends malformed, counted, and the group is requeued) and rule 5 (the same receipt
completed again answers 'replay'). An entry already pending in this batch is flushed first, so its
second mention sees the first one's outcome.
]]
local NO_OUTPUTS = 'completion has no samples'
local function complete_attempt(b, cfg, id, attempt, worker, size, min_version, slots, tokens)
  if b.pending[id] then flush_completions(b) end
  local empty = slots == ''
  local kind = empty and 'malformed' or 'completed'
  local refused, last, owner, count = receipt_refusal(id, attempt, worker, function(line)
    return replayed(id, attempt, worker, kind, line)
  end)
  if refused then
    if not holds_payload(owner, count, attempt) then drop_payloads({{id = id, attempt = attempt}}) end
    if refused[1] == 'stale_receipt' then return refused end
    if not empty then return {'ok', 'replay', ''} end
    -- An empty completion ended malformed; at max_attempts that settled the group dead.
    local dead = last == ledger_settled('dead', attempt, worker, 'max_attempts')
    return {'malformed', NO_OUTPUTS, dead and 'dead' or 'ready'}
  end
  if size > cfg.max_payload_bytes then
    drop_payloads({{id = id, attempt = attempt}})
    return {'payload_too_large', size, cfg.max_payload_bytes}
  end
  local n, detail = 0, NO_OUTPUTS
  if not empty then
    local f = read_entry(id)
    n = tonumber(f and f.n) or 0
    detail = check_slots(slots, n)
  end
  if detail then  -- end_attempt deletes the staged payload with the attempt
    b.dirty = b.base ~= nil  -- end_attempt moves executing_* itself
    return {'malformed', detail, end_attempt(id, attempt, worker, 'malformed', detail, true, cfg, batch_now(b))}
  end
  -- The completion holds every token of the entry's progress record: a later requeue of it (stale,
  -- overflow, rollback) starts from the prompt, never from an older prefix. Dropped once per call
  -- (finish_completions: drop_partials), so an item costs no command more.
  b.partials = b.partials or {}
  table.insert(b.partials, id)
  return buffer_completion(b, cfg, id, attempt, worker, min_version, n, tokens)
end
