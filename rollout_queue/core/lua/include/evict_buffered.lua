-- @include requeue_entry
-- @include pel_entry
-- @include evict_buffered_many
--[[
evict_buffered: completed -> ready for one buffered group (reason 'stale' or 'overflow').
Uses: K.buffer, K.bufver, K.meta and what requeue_entries uses.
Why: complete's overflow victim and lease's stale members are evicted one at a time: a batch of one
of evict_buffered_many, so the single and the batched paths cannot drift apart.
Also includes requeue_entry and pel_entry for the scripts that reach them through this file.
]]
local function evict_buffered(id, reason, cfg, now)
  evict_buffered_many({id}, reason, cfg, now)
end
