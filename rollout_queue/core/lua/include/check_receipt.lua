-- @include pel_entry
-- @include leased_guard
--[[
check_receipt: true when the PEL still gives entry `id` to `worker` at delivery count `attempt`.
Also returns the actual owner and count for the refusal reply.
Why: DESIGN rule 1, exact receipts. A worker paused past its timeout whose work was requeued and
re-reserved (attempt + 1) can never settle it: the owner or the count no longer match. An entry a
lease holds (K.leased) is owned by no receipt, whatever the PEL says: a worker credential can XCLAIM
it to itself at any count directly, so such an entry is handed back to its lease (leased_guard).
]]
local function check_receipt(id, attempt, worker)
  local owner, count = pel_entry(id)
  if owner == worker and count == attempt then
    local held, lease = leased_one(id)
    if not held then return true, owner, count end
    return false, '@lease:' .. lease, count
  end
  return false, owner or '', count or 0
end
