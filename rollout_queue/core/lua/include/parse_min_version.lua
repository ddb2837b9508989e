-- @include bug
--[[
parse_min_version: a completion's ARGV min_version, 'oldest' or 'oldest:newest', as the version the
queue judges the group by (a number), or a ROLLOUTQ error.
oldest is the oldest policy version any sample was generated with; newest, the newest one any
sample's tokens were (its last segment, a trajectory's newest model turn; oldest when absent).
Uses: cfg.staleness_mode. Why: versions are integers < 2^21 (docs/DESIGN.md; the bufver score packs
them exactly), and Sample refuses anything else, so any other value is a client bug, refused before
the first write. 'drop' and 'pace' judge a group by its oldest token; 'continue' by its samples'
newest tokens, the older ones being the trainer's to mask or correct (DESIGN: Staleness modes).
]]
local MAX_VERSION = 2097152
local function parse_version(raw, whole)
  local v = tonumber(raw)
  if not v or v < 0 or v >= MAX_VERSION or v ~= math.floor(v) then bug('bad min_version: ' .. tostring(whole)) end
  return v
end
local function parse_min_version(raw, cfg)
  local oldest, newest = string.match(tostring(raw), '^(%d+):(%d+)$')
  if not oldest then return parse_version(raw, raw) end
  oldest, newest = parse_version(oldest, raw), parse_version(newest, raw)
  if newest < oldest then bug('bad min_version: ' .. raw .. ' (newest below oldest)') end
  if cfg.staleness_mode == 'continue' then return newest end
  return oldest
end
