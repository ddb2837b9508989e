--[[
publish_version: record a new policy version (and where its weights are); stale groups follow from it.
KEYS:
  meta       config, policy version
  holds      admission hold ids by deadline
  wake_work  wake stream for blocked reservers
  wake_done  wake stream for blocked trainers
  Publishes on the channel rollout:{q}:versions (built from meta's prefix) so workers learn it fast.
READS:
  counters   counters (read only: load_config checks they are integers)
ARGV:
  version      integer, 0 <= version < 2^21
  weights_uri  string or ''
  hold_id      '' or the hold this update is recorded through (it must still be active)
Returns:
  {'ok', 'published' | 'replay', version}
  {'version_regression', current}   a lower version, or the same one with another uri; nothing written
  {'hold_lost'}                     the named hold expired or was released; nothing written
Invariant:
  the policy version never decreases.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include wake
local now = now_ms()
local cfg = load_config()
local v = tonumber(A.version)
if not v or v < 0 or v >= 2097152 or v ~= math.floor(v) then bug('bad version: ' .. tostring(A.version)) end
if A.hold_id ~= '' then
  local deadline = tonumber(redis.call('ZSCORE', K.holds, A.hold_id))
  if not deadline or deadline < due_now(cfg, now) then return {'hold_lost'} end
end
local uri = redis.call('HGET', K.meta, 'weights_uri') or ''
if cfg.has_version then
  if v == cfg.version and uri == A.weights_uri then return {'ok', 'replay', v} end
  if v <= cfg.version then return {'version_regression', cfg.version} end
end
redis.call('HSET', K.meta, 'version', v, 'weights_uri', A.weights_uri, 'version_ms', now)
redis.call('PUBLISH', string.sub(K.meta, 1, -5) .. 'versions', v .. '|' .. A.weights_uri)
wake(K.wake_work)
wake(K.wake_done)
return {'ok', 'published', v}
