-- @include stale_floor
-- @include buffer_score
-- @include evict_buffered_many
--[[
evict_stale_some: completed -> ready for up to `budget` buffered groups that are stale now (their
oldest sample version is below the stale floor), stalest first. Returns (evicted, more 0|1).
Uses: K.bufver and what evict_buffered_many uses.
Why: DESIGN, lease never hands out a stale group and stale groups go back to ready; reserve and lease
run this inline (bounded), so a queue with no reaper process still moves: a buffer full of stale
groups can neither refuse reserve by backpressure nor make lease answer 'insufficient' for ever
(issue 12 item 1). The reaper's reap_stale is the same step in a loop.
]]
local function evict_stale_some(cfg, now, budget)
  local floor = stale_floor(cfg)
  if not floor then return 0, 0 end
  local ids = redis.call('ZRANGEBYSCORE', K.bufver, '-inf', '(' .. fmt_score(buffer_version_score(floor, 0)),
    'LIMIT', 0, budget)
  evict_buffered_many(ids, 'stale', cfg, now)
  return #ids, #ids >= budget and 1 or 0
end
