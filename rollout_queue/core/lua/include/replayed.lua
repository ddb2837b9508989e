-- @include ledger
-- @include ledger_settled
--[[
replayed: whether the attempt a receipt names already ended the way this settlement would end it, so
the call answers 'replay' instead of stale_receipt, whatever happened to the entry since.
`kind`: 'completed' (complete: the attempt's completion was buffered) or the terminal the call
writes ('failed', 'malformed', 'aborted'); `last`: the entry's ledger line (the caller read it).
Uses: K.history. Why (DESIGN rule 5; issue 12 item 7): a settlement whose reply was lost is resent by
the transport, possibly after the entry moved on (attempt + 1 reserved and aborted; the completion
leased and rolled back; the group committed, restored or dead-lettered). The ledger line then names
the later event, but the attempt history (kept until prune, like the ledger line) still has this
attempt's record: its terminal by this worker, or, for a completion requeued from the buffer, a
lease or a restore, this worker as its completer (`c`). The history is read only on this refusal
path, never on the hot path of a receipt that still owns its entry.
]]
local function attempt_recorded(id, attempt, match)
  local raw = redis.call('HGET', K.history, id)
  if not raw then return false end
  local ok, h = pcall(cjson.decode, raw)
  if not ok or type(h) ~= 'table' or type(h.h) ~= 'table' then return false end
  for _, rec in ipairs(h.h) do
    if type(rec) == 'table' and tonumber(rec.a) == attempt and match(rec) then return true end
  end
  return false
end

local function replayed(id, attempt, worker, kind, last)
  if kind == 'completed' then
    local committed = ledger_settled('committed', attempt, worker, '')
    if last == ledger_attempt(attempt, worker, 'completed') or string.sub(last, 1, #committed) == committed then
      return true
    end
    return attempt_recorded(id, attempt, function(rec) return rec.c == worker end)
  end
  if last == ledger_attempt(attempt, worker, kind) then return true end
  if kind ~= 'aborted' and last == ledger_settled('dead', attempt, worker, 'max_attempts') then return true end
  return attempt_recorded(id, attempt, function(rec) return rec.w == worker and rec.t == kind end)
end

