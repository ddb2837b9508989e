--[[
buffer_version_score / score_min_version: K.bufver orders buffered groups by (min_version, arrival).
Why: the overflow victim is the stalest group, ties broken by earliest arrival, and the reaper finds
stale groups with one ZRANGEBYSCORE. The score packs min_version * 2^32 + arrival mod 2^32, exact in
a double while min_version < 2^21 (publish_version refuses larger versions).
]]
local VERSION_SHIFT = 4294967296
local function buffer_version_score(min_version, arrival)
  return min_version * VERSION_SHIFT + (arrival % VERSION_SHIFT)
end
local function score_min_version(score)
  return math.floor(tonumber(score) / VERSION_SHIFT)
end
local function fmt_score(x)
  return string.format('%.17g', x)
end
