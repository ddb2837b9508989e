--[[
reserve_fit: whether one more group of `n` samples fits a reserve call: 'grant', 'skip' (leave it
for another caller and look further), 'full' (the call is served: end it here) or 'stop' (the
queue's own bound). `r` is the call's budget: r.taken samples granted so far, r.queue_free
(max_executing_samples minus the samples executing), r.call_cap (the caller's max_samples,
math.huge for none), r.overcommit and r.grants. Counts r.oversized and r.skipped.
Why (docs/DESIGN.md, "Groups larger than a caller's slots"; issue 12 item 2): a group that does not fit
the *caller* must not stop the groups behind it when the caller has nothing yet, or one group whose
n exceeds every worker's free slots freezes the fleet. It is skipped (left in its place) for a caller
that can take it: one with enough free slots, or one that queues samples internally (overcommit),
which gets it as the first grant of its call. A call that already has grants just ends there, as
before. The *queue's* own bound stays first come, first served: it frees as attempts end, so a large
group at the head is never starved by smaller ones behind it.
]]
-- Both paths stop after this many skipped groups (and as many garbage members): a call's work is
-- bounded by what it can grant, whatever the size of ready or the backlog.
local RESERVE_LOOKAHEAD = 32
local function reserve_fit(r, n)
  if r.taken + n > r.queue_free then return 'stop' end
  if r.taken + n <= r.call_cap then return 'grant' end
  if #r.grants > 0 then return 'full' end
  if r.overcommit then
    r.oversized = r.oversized + 1
    return 'grant'
  end
  r.skipped = r.skipped + 1
  return 'skip'
end

--[[
reserve_full: true once the call may grant nothing more (the group cap, or the byte cap with at
least one grant), so a script never copies more than RESERVE_MAX_BYTES of reservations into its reply.
]]
local RESERVE_MAX_BYTES = 8 * 1024 * 1024
local function reserve_full(r)
  return #r.grants >= r.groups or (r.bytes >= RESERVE_MAX_BYTES and #r.grants > 0)
end

local function entry_bytes(kv)
  local b = 0
  for i = 1, #kv do b = b + #kv[i] end
  return b
end
