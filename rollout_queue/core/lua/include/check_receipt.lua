-- @include pel_entry
--[[
check_receipt: true when the PEL still gives entry `id` to `worker` at delivery count `attempt`.
Also returns the actual owner and count for the refusal reply.
Why: DESIGN rule 1, exact receipts. A worker paused past its timeout whose work was requeued and
re-reserved (attempt + 1) can never settle it: the owner or the count no longer match.
]]
local function check_receipt(id, attempt, worker)
  local owner, count = pel_entry(id)
  return owner == worker and count == attempt, owner or '', count or 0
end
