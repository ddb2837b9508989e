-- @include append_histories
--[[
append_history: record why one attempt ended without a completion; returns the entry's counted
failures. Never dead-letters (restore records a move back to ready here, not a failure).
Uses: K.history (entry id -> JSON {"f": counted failures, "h": last 32 attempts}).
Why: DESIGN, every attempt's reason reaches the dead letter; a batch of one of append_histories.
]]
local function append_history(id, attempt, worker, terminal, reason, counted, now, completer)
  local e = {id = id, attempt = attempt, c = completer}
  append_histories({e}, worker, terminal, reason, counted, nil, now)
  return e.failures
end
