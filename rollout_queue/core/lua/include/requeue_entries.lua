-- @include append_histories
-- @include hmget_many
-- @include read_entry
-- @include park_many
-- @include claim_counted
-- @include ready_score
-- @include call_batched
-- @include wake
-- @include ledger
-- @include leased_guard
--[[
requeue_entries: PEL -> ready for a batch of entries owned by `owner`, same entry IDs, pristine
payload; or -> settled(dead) for each whose counted failures reach max_attempts. Each record is
{id, attempt (its delivery count), kv (optional: its pristine fields, false if gone)}; sets e.where
to 'ready' or 'dead' on each and returns (requeued, dead). With `bodies`, every record also gets
e.kv (the claim returns the requeued ones' fields; a dying one is read for its dead letter anyway).
Uses: K.src, K.ready, K.history, K.dlq, K.ledger, K.meta, K.wake_work.
Why: DESIGN rule 4, ownership is released only by settlement: work that ends without a completion
goes back to ready in the same script that ends it. The delivery counts are kept (claim_counted:
RETRYCOUNT), so the next reserve makes each attempt + 1. One HMGET/HSET of history, one XCLAIM per
distinct count and one ZADD cover the batch; only the dead letters are written per entry. A group
requeued from @done or a lease records which worker completed that attempt (one HMGET of the
ledger), so that worker's retried complete still answers 'replay' (replayed.lua).
]]
local function completers(entries)
  -- A completed group (owned by @done or a lease) carries the ledger line of its completion.
  local ids = {}
  for i, e in ipairs(entries) do ids[i] = e.id end
  for i, line in ipairs(hmget_many(K.ledger, ids)) do
    local attempt, worker, terminal = ledger_attempt_of(line or '')
    if terminal == 'completed' and tonumber(attempt) == entries[i].attempt then entries[i].c = worker end
  end
end

local function requeue_entries(entries, owner, terminal, reason, counted, cfg, now, bodies)
  local back
  entries, back = unleased(entries)  -- a leased entry moved here by a hostile XCLAIM goes home
  for _, e in ipairs(back) do e.where = 'lease' end
  if owner == '@done' or string.sub(owner, 1, 7) == '@lease:' then completers(entries) end
  append_histories(entries, owner, terminal, reason, counted, counted and cfg.max_attempts or nil, now)
  local ready, dead, scored = {}, {}, {}
  for _, e in ipairs(entries) do
    if e.dead then
      if e.kv == nil then
        local _, kv = read_entry(e.id)
        e.kv = kv or false
      end
      e.where = 'dead'
      table.insert(dead, e)
    else
      e.where = 'ready'
      table.insert(ready, e)
      table.insert(scored, ready_score(e.id))
      table.insert(scored, e.id)
    end
  end
  park_many(dead, 'dead', 'max_attempts', owner, now)
  if #ready > 0 then
    claim_counted('@ready', ready, bodies)
    call_batched({'ZADD', K.ready}, scored)
    wake(K.wake_work)
  end
  return #ready, #dead
end
