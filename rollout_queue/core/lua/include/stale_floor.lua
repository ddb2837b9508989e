--[[
stale_floor: the lowest judged version (bufver's) a buffered group may have and still be fresh, or nil.
Why: a group is stale when version - its judged version > max_staleness (None counts as 0: strictly
on-policy). Before the first published version staleness is unknown and nothing is stale; in
staleness_mode 'pace' nothing finished is ever stale (admission paces generation instead).
]]
local function stale_floor(cfg)
  if not cfg.has_version or cfg.staleness_mode == 'pace' then return nil end
  return cfg.version - cfg.staleness_bound
end
