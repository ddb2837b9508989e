--[[
lease_limit: the most groups that can ever be completed at once under the queue's bounds as they
stand, and the bound that sets it: ('max_completed_groups' | 'max_retained_groups' | 'batch_groups',
limit).
Uses: K.counters (retained, committed). Why (issue 12 item 3): a lease asking for more can only wait for
ever, so it is refused at once with the bound to raise. Completed groups are at most
max_completed_groups and at most the retained ones; retained groups are at most max_retained_groups
(or what a restore put back, which may be more) and, with admission control, at most
(version + max_staleness + 1) * batch_groups - committed until the next publish_version.
]]
local function lease_limit(cfg)
  local c = redis.call('HMGET', K.counters, 'retained', 'committed')
  local retained, committed = tonumber(c[1]) or 0, tonumber(c[2]) or 0
  local bound, possible = 'max_retained_groups', cfg.max_retained_groups
  if cfg.batch_groups > 0 then
    local admitted = (cfg.version_eff + cfg.staleness_bound + 1) * cfg.batch_groups - committed
    if admitted < possible then bound, possible = 'batch_groups', admitted end
  end
  if retained > possible then possible = retained end
  if cfg.max_completed_groups < possible then return 'max_completed_groups', cfg.max_completed_groups end
  return bound, possible
end
