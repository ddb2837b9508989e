--[[
stale_floor: the lowest min_version a buffered group may have and still be fresh, or nil.
Why: a group is stale when version - min_version > max_staleness (None counts as 0: strictly
on-policy). Before the first published version staleness is unknown and nothing is stale.
]]
local function stale_floor(cfg)
  if not cfg.has_version then return nil end
  return cfg.version - cfg.staleness_bound
end
