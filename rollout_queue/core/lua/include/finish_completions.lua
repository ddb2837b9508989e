-- @include flush_completions
-- @include completion_counters
-- @include wake
-- @include drop_partials
--[[
finish_completions: the end of every complete / complete_many call: the pending writes, the
counters, the progress records of the completed entries (b.partials: drop_partials, one HLEN when
there are none), and one wake per stream.
Uses: K.meta, K.wake_work, K.wake_done and what flush_completions uses.
Why: executing capacity reopened (DESIGN, Capacity: at the attempt's terminal transition), so blocked
reservers and hold waiters re-run their script; a buffered group may complete a blocked trainer's
lease. One event per stream and call is enough: a woken caller re-runs its script and sees them all.
]]
local function finish_completions(b)
  flush_completions(b)
  write_completion_counters(b)
  if b.partials then drop_partials(b.partials) end
  if b.released then wake(K.wake_work) end
  if b.buffered then wake(K.wake_done) end
end
