-- @include check_receipt
--[[
receipt_refusal: nil when the receipt still owns its entry (go on), else the refusal reply and the
entry's ledger line: {'ok', 'replay'} when this attempt already ended the way this call would end
it, else {'stale_receipt', owner, delivery count}; then the entry's PEL owner and delivery count
('' and 0 when it is pending nowhere). The one receipt/replay check of every settlement
named by a receipt (fail, abort, requeue, filter, reject, and complete's complete_attempt).
`replay` judges the ledger line: the exact settled line the call writes (filter, reject: only that
line is its replay), or a function(line) -> boolean (the others: replayed.lua's rule, which also
reads K.history, so only the scripts that declare history include it).
Uses: K.ledger. Why: DESIGN rule 1 (a stale receipt changes nothing) and rule 5 (a settlement resent
after a lost reply answers as it did). The ledger is read only on this refusal path, never while the
receipt still owns its entry.
]]
local function receipt_refusal(id, attempt, worker, replay)
  local owns, owner, count = check_receipt(id, attempt, worker)
  if owns then return nil end
  local last = redis.call('HGET', K.ledger, id) or ''
  local again
  if type(replay) == 'string' then again = last == replay else again = replay(last) end
  if again then return {'ok', 'replay'}, last, owner, count end
  return {'stale_receipt', owner, count}, last, owner, count
end
