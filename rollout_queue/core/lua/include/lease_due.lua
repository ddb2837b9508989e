--[[
lease_due: when a lease falls due for the reaper: its deadline, or sooner, `trainer_silence_ms` after
its holder's last beat (beat nil: the lease never beat, and the deadline alone decides).
Uses: nothing but its arguments. Why: the `leases` index is scored by this instant, so the reaper's
scan (reap_scan), the trainers' inline reaping (reap_some_lease) and reap_lease judge a silent
holder and a passed deadline by the one score they already read; the record keeps the deadline.
]]
local function lease_due(cfg, deadline, beat)
  if beat and cfg.trainer_silence_ms then return math.min(deadline, beat + cfg.trainer_silence_ms) end
  return deadline
end
