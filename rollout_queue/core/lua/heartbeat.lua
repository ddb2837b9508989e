--[[
heartbeat: refresh a worker's liveness; read the policy version and admission state it must follow.
KEYS:
  meta       config, policy version
  workers    worker ids by last heartbeat
  holds      admission hold ids by deadline
  progress   worker id -> its own counts: groups|tokens|uptime_ms|server_ms
ARGV:
  worker_id  the worker
  groups     groups it completed since its process started ('': it reports no progress)
  tokens     tokens it generated since then
  uptime_ms  how long its process has run
Returns:
  {'ok', version, version_published 0|1, weights_uri, held 0|1, server_ms}
Invariant:
  the worker's score in workers is the server time of its last heartbeat; the reaper treats it as
  lost only after worker_timeout without one. A progress line exists only for a registered worker
  (reaping and close_worker delete it with the registration), so the hash is bounded by the fleet.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include hold_active
local now = now_ms()
local cfg = load_config()
if A.worker_id == '' or string.sub(A.worker_id, 1, 1) == '@' then bug('bad worker id') end
redis.call('ZADD', K.workers, now, A.worker_id)
if A.groups ~= '' then
  local g, t, up = tonumber(A.groups), tonumber(A.tokens), tonumber(A.uptime_ms)
  if not (g and t and up and g >= 0 and t >= 0 and up >= 0) then bug('bad progress counts') end
  redis.call('HSET', K.progress, A.worker_id, string.format('%d|%d|%d|%d', g, t, up, now))
end
local uri = redis.call('HGET', K.meta, 'weights_uri') or ''
return {'ok', cfg.version_eff, cfg.has_version and 1 or 0, uri, hold_active(due_now(cfg, now)) and 1 or 0, now}
