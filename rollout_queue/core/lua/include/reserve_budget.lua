--[[
reserve_budget: the budget `r` one reserve call spends (see reserve_fit), and the HMGET of
executing_samples, retained, committed it was sized from (reserve_backlog's admission check).
`max_groups`, `max_samples`: the checked ARGV (max_samples 0: only the queue's bound).
Uses: K.counters. Why: at most RESERVE_MAX_GROUPS groups per call, whatever max_groups asks, bounds the
script's time and its reply; the queue's free samples are read once, before either path grants.
]]
local RESERVE_MAX_GROUPS = 64
local function reserve_budget(cfg, max_groups, max_samples, overcommit)
  local counters = redis.call('HMGET', K.counters, 'executing_samples', 'retained', 'committed')
  local r = {grants = {}, taken = 0, bytes = 0, dead = 0, skipped = 0, oversized = 0,
    groups = math.min(max_groups, RESERVE_MAX_GROUPS), overcommit = overcommit,
    queue_free = cfg.max_executing_samples - (tonumber(counters[1]) or 0),
    call_cap = max_samples > 0 and max_samples or math.huge}
  return r, counters
end
